"""The composition root: builds a kernel's sandbox, mirror and session from its configuration.

The kernel, ``daytona-kernel doctor`` and the benchmarks all build their
sessions here. Each component gets only the settings it reads (frozen
dataclasses in ``config``), never the kernel.
"""

from __future__ import annotations

import logging
import os
import secrets
import tempfile
from dataclasses import replace
from pathlib import Path

from .backends import Sandbox, open_engine_sandbox, open_sandbox
from .comms import Publisher
from .config import DaytonaKernelConfig, MirrorSettings, SessionSettings, settings_from
from .engines import EnginePool, Spawn
from .journal import KernelIdentity
from .mirror.mirror import WorkdirMirror, open_mirror
from .mirror.project import project_root
from .outputs import OutputPolicy
from .session import SandboxSession

KERNEL_FILE_PREFIX = "kernel-"
NOTEBOOK_ENV = "JPY_SESSION_NAME"  # jupyter_server gives a kernel its notebook's path here


def build_session(
    config: DaytonaKernelConfig,
    folder: str,
    kernel_id: str,
    log: logging.Logger,
    mirror: bool = True,
    publisher: Publisher | None = None,
) -> SandboxSession:
    """The session for a notebook in ``folder``; ``mirror=False`` leaves the folder alone (doctor).
    With a ``publisher`` (the kernel's iopub), the session has a comm bridge: widgets work.

    The folder mirrored (and keyed) is the project's root (``project.project_root``: ``sync_root``,
    the git root, a project marker, else ``folder``); cells start in the notebook's sub-folder of it,
    as they would with ipykernel.
    """
    root, start_in = project_root(folder, config.sync_root)
    sandbox = open_sandbox(config, root, kernel_id)
    workdir_mirror = open_mirror(config, sandbox, root, log, start_in) if mirror else None
    identity = KernelIdentity(kernel_id, os.environ.get(NOTEBOOK_ENV, ""))
    settings = settings_from(SessionSettings, config)
    scratch = Path(tempfile.gettempdir()) / f"daytona-kernel-fanout-{os.getpid()}-{secrets.token_hex(4)}"
    spawn = worker_spawner(
        config, sandbox, root, kernel_id, start_in, scratch, log, workdir_mirror is not None and workdir_mirror.syncs_up
    )
    pool = EnginePool(spawn, settings, log, OutputPolicy(settings.output_trusted), start_in, scratch)
    return SandboxSession(sandbox, settings, log, workdir_mirror, start_in, identity, pool, publisher)


def worker_spawner(
    config: DaytonaKernelConfig,
    main: Sandbox,
    root: str,
    kernel_id: str,
    start_in: str,
    scratch: Path,
    log: logging.Logger,
    files: bool,
) -> Spawn:
    """How ``%%daytona map`` makes engine number ``serial``: a sandbox like the main one and, when the main
    sandbox gets the project's files, a one-way mirror that copies them into the engine (its record of what
    was sent is kept in ``scratch``, which the pool deletes)."""
    mirror_settings = replace(settings_from(MirrorSettings, config), sync="up")

    def spawn(serial: int) -> tuple[Sandbox, WorkdirMirror | None]:
        sandbox = open_engine_sandbox(config, root, kernel_id, serial, main)
        mirror = (
            WorkdirMirror(root, sandbox, mirror_settings, scratch / f"worker-{serial}.json", log, start_in) if files else None
        )
        return sandbox, mirror

    return spawn


def kernel_id_of(connection_file: str | os.PathLike[str]) -> str:
    """The id Jupyter gave a kernel, from its connection file ``kernel-<id>.json`` (the stem otherwise)."""
    stem = Path(connection_file).stem
    return stem[len(KERNEL_FILE_PREFIX) :] if stem.startswith(KERNEL_FILE_PREFIX) else stem
