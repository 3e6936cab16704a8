"""Configuration: every knob is a traitlet on ``DaytonaKernel``, with help text.

Sources, later ones winning:
1. config files (``jupyter_config.*``, ``daytona_kernel_config.py``);
2. environment variables ``DAYTONA_KERNEL_<TRAIT_NAME_UPPER>``;
3. the command line (``--DaytonaKernel.backend=local``).

Credentials stay the SDK's own: DAYTONA_API_KEY, DAYTONA_API_URL, DAYTONA_TARGET.

A bad value never crashes the kernel: it is recorded, the default is kept, and
``validate()`` reports it so the first cell can show the user what to fix.
"""

from __future__ import annotations

import json
import os
import sys
from copy import deepcopy

from traitlets import Bool, Dict, Enum, Float, Int, List, TraitError, Unicode
from traitlets.config import Config, Configurable
from traitlets.config.loader import DeferredConfig, DeferredConfigString

ENV_PREFIX = "DAYTONA_KERNEL_"
SECTION = "DaytonaKernel"
SECRET_ENV_VARS = ("DAYTONA_API_KEY", "DAYTONA_JWT_TOKEN", "GIT_TOKEN")


class DaytonaKernelConfig(Configurable):
    """The typed, documented knobs. ``DaytonaKernel`` inherits them."""

    backend = Enum(
        ["daytona", "local"],
        default_value="daytona",
        help="Where cells run: 'daytona' (a Daytona sandbox) or 'local' "
        "(a worker process on this machine; for trying out, CI and offline work, "
        "NOT a security boundary).",
    ).tag(config=True)

    sandbox_policy = Enum(
        ["reuse", "ephemeral"],
        default_value="reuse",
        help="'reuse': find the sandbox of this notebook's folder again and stop it at "
        "shutdown. 'ephemeral': a new sandbox per kernel, deleted at shutdown.",
    ).tag(config=True)

    workspace_key = Unicode(
        "",
        help="Key that 'reuse' finds a sandbox by and that names the working directory "
        "on the volume. Empty: derived from the notebook's folder.",
    ).tag(config=True)

    volume_name = Unicode(
        "daytona-kernel",
        help="Volume that holds the working directory, so files outlive the sandbox.",
    ).tag(config=True)

    mount_path = Unicode(
        "/home/daytona/workspace",
        help="Where the volume is mounted in the sandbox; the working directory of every cell.",
    ).tag(config=True)

    snapshot = Unicode(
        "",
        help="Daytona snapshot to create the sandbox from (empty: Daytona's default Python snapshot).",
    ).tag(config=True)

    image = Unicode(
        "",
        help="Container image to build the sandbox from, e.g. 'python:3.12-slim'. Set this or "
        "snapshot, not both. cpu/memory/disk/gpu apply to image-based sandboxes.",
    ).tag(config=True)

    cpu = Int(0, min=0, help="CPU cores for an image-based sandbox (0 = Daytona's default).").tag(config=True)
    memory = Int(0, min=0, help="Memory in GiB for an image-based sandbox (0 = default).").tag(config=True)
    disk = Int(0, min=0, help="Disk in GiB for an image-based sandbox (0 = default).").tag(config=True)
    gpu = Int(0, min=0, help="GPUs for an image-based sandbox (0 = none).").tag(config=True)

    labels = Dict(
        value_trait=Unicode(),
        default_value={},
        help="Extra labels for the sandbox, e.g. {'team': 'research'}.",
    ).tag(config=True)

    auto_stop_interval = Int(
        15,
        min=0,
        help="Minutes of inactivity after which Daytona stops the sandbox (0 = never). This "
        "bounds the cost of a sandbox whose kernel was killed.",
    ).tag(config=True)

    auto_archive_interval = Int(
        0, min=0, help="Minutes a stopped sandbox waits before it is archived (0 = Daytona's maximum)."
    ).tag(config=True)

    auto_delete_interval = Int(
        -1, help="Minutes a stopped sandbox waits before it is deleted (-1 = never, 0 = at stop)."
    ).tag(config=True)

    network_block_all = Bool(False, help="Block all network access from the sandbox.").tag(config=True)

    api_url = Unicode(
        "",
        help="Daytona API URL (empty: DAYTONA_API_URL, else https://app.daytona.io/api).",
    ).tag(config=True)

    target = Unicode("", help="Daytona target region (empty: DAYTONA_TARGET, else the organization's default).").tag(
        config=True
    )

    sync = Enum(
        ["both", "up", "down", "off"],
        default_value="both",
        help="Mirror between the notebook's folder and the sandbox's working directory: 'both', "
        "'up' (local changes go to the sandbox), 'down' (files cells write come back) or 'off'.",
    ).tag(config=True)

    sync_exclude = List(
        Unicode(),
        default_value=[],
        help="More .gitignore-style patterns the mirror skips (on top of .gitignore and the "
        "defaults: .git, .ipynb_checkpoints, virtualenvs, __pycache__, node_modules ...).",
    ).tag(config=True)

    sync_deletes = Bool(False, help="Propagate deletions in both directions (off: a deleted file stays on the other side).").tag(
        config=True
    )

    sync_max_file_mb = Float(100.0, min=0.0, help="Files larger than this (MB) are not mirrored; a notice says so.").tag(
        config=True
    )

    sync_max_total_mb = Float(
        1024.0, min=0.0, help="At most this much (MB) is uploaded in one sync; the rest waits, with a notice."
    ).tag(config=True)

    repo_url = Unicode(
        "",
        help="Git repository cloned into the working directory when the sandbox first starts. "
        "Credentials come from GIT_USERNAME / GIT_TOKEN in the kernel's environment.",
    ).tag(config=True)

    repo_ref = Unicode("", help="Branch or tag of repo_url to clone (empty: the default branch).").tag(config=True)

    env = Dict(
        value_trait=Unicode(),
        default_value={},
        help="Environment variables set in the sandbox, e.g. {'MY_VAR': 'x'}. The Daytona "
        "API key is never passed unless you list it here.",
    ).tag(config=True)

    cell_timeout = Float(
        0.0,
        min=0.0,
        help="Seconds a cell may run before the sandbox stops it (0 = no limit).",
    ).tag(config=True)

    interrupt_grace = Float(
        3.0,
        min=0.1,
        help="Seconds to wait for a cell to yield to an interrupt before the context is "
        "restarted (which loses its variables).",
    ).tag(config=True)

    output_limit_mb = Float(
        20.0,
        min=0.0,
        help="Most stream output (MB) one cell may send; the rest is dropped with a notice, so a "
        "runaway print loop cannot swamp the browser (0 = no limit).",
    ).tag(config=True)

    checkpoint_on_idle = Bool(
        False,
        help="Checkpoint the variables (%daytona checkpoint) shortly before auto_stop_interval "
        "would stop an idle sandbox, so %daytona restore can bring them back.",
    ).tag(config=True)

    local_python = Unicode(
        sys.executable,
        help="Python interpreter that runs cells on the local backend.",
    ).tag(config=True)

    def _load_config(self, cfg, section_names=None, traits=None):  # type: ignore[no-untyped-def]
        """Load config leniently: a bad value is recorded as a problem, not raised."""
        problems = self.__dict__.setdefault("_config_problems", {})
        if traits is None:
            traits = self.traits(config=True)
        own = DaytonaKernelConfig.class_trait_names(config=True)
        good = Config()
        for name, value in self._find_my_config(cfg).items():
            if name in own and name in traits:
                try:
                    parsed = value.get_value(traits[name]) if isinstance(value, DeferredConfig) else value
                    traits[name].validate(self, deepcopy(parsed))
                except (TraitError, ValueError, SyntaxError) as exc:
                    problems[name] = f"{name} = {_shown(value)!r} is invalid: {exc}"
                    continue
                problems.pop(name, None)
            good[name] = value
        section = type(self).__name__
        super()._load_config(Config({section: good}), section_names=[section], traits=traits)

    def validate(self) -> list[str]:
        """Every problem with the configuration, each with what to set."""
        problems = [
            f"{msg}. Fix it with --DaytonaKernel.{name}=..., {ENV_PREFIX}{name.upper()}, "
            "or daytona_kernel_config.py."
            for name, msg in sorted(self.__dict__.get("_config_problems", {}).items())
        ]
        if self.backend == "daytona" and not (
            os.environ.get("DAYTONA_API_KEY") or os.environ.get("DAYTONA_JWT_TOKEN")
        ):
            problems.append(
                "No Daytona credentials: set DAYTONA_API_KEY (from https://app.daytona.io, "
                "Keys page) in the environment Jupyter starts kernels with, or choose the "
                "'Python (Daytona local)' kernel / DAYTONA_KERNEL_BACKEND=local to run locally."
            )
        if self.snapshot and self.image:
            problems.append(
                "Both snapshot and image are set; choose one (DAYTONA_KERNEL_SNAPSHOT or DAYTONA_KERNEL_IMAGE)."
            )
        if not self.mount_path.startswith("/"):
            problems.append(f"mount_path must be an absolute path, got {self.mount_path!r}.")
        return problems


def _shown(value: object) -> object:
    return str(value) if isinstance(value, DeferredConfigString) else value


def env_config(environ: dict[str, str] | None = None) -> Config:
    """Config from ``DAYTONA_KERNEL_<TRAIT>`` variables (values parsed like the CLI's)."""
    environ = os.environ if environ is None else environ
    section = Config()
    traits = DaytonaKernelConfig.class_traits(config=True)
    for name, trait in traits.items():
        raw = environ.get(ENV_PREFIX + name.upper())
        if raw is None:
            continue
        if isinstance(trait, (List, Dict)):
            try:
                section[name] = json.loads(raw)
            except ValueError:
                section[name] = [s.strip() for s in raw.split(",") if s.strip()] if isinstance(trait, List) else raw
        elif isinstance(trait, Bool):
            section[name] = DeferredConfigString(raw.strip().lower())
        else:
            section[name] = DeferredConfigString(raw)
    return Config({SECTION: section}) if section else Config()
