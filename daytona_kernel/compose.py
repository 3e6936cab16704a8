"""The composition root: builds a kernel's sandbox, mirror and session from its configuration.

The kernel, ``daytona-kernel doctor`` and the benchmarks all build their
sessions here. Each component gets only the settings it reads (frozen
dataclasses in ``config``), never the kernel.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from .attach import KernelIdentity
from .backends import open_sandbox
from .config import DaytonaKernelConfig, SessionSettings, settings_from
from .session import RuntimeSession
from .sync import mirror_root, open_mirror

KERNEL_FILE_PREFIX = "kernel-"
NOTEBOOK_ENV = "JPY_SESSION_NAME"  # jupyter_server gives a kernel its notebook's path here


def build_session(
    config: DaytonaKernelConfig, folder: str, kernel_id: str, log: logging.Logger, mirror: bool = True
) -> RuntimeSession:
    """The session for a notebook in ``folder``; ``mirror=False`` leaves the folder alone (doctor).

    The folder mirrored (and keyed) is the enclosing git repository's root, else ``folder``;
    cells start in the notebook's sub-folder of it, as they would with ipykernel.
    """
    root, start_in = mirror_root(folder)
    sandbox = open_sandbox(config, root, kernel_id)
    workdir_mirror = open_mirror(config, sandbox, root, log, start_in) if mirror else None
    identity = KernelIdentity(kernel_id, os.environ.get(NOTEBOOK_ENV, ""))
    return RuntimeSession(sandbox, settings_from(SessionSettings, config), log, workdir_mirror, start_in, identity)


def kernel_id_of(connection_file: str | os.PathLike[str]) -> str:
    """The id Jupyter gave a kernel, from its connection file ``kernel-<id>.json`` (the stem otherwise)."""
    stem = Path(connection_file).stem
    return stem[len(KERNEL_FILE_PREFIX) :] if stem.startswith(KERNEL_FILE_PREFIX) else stem
