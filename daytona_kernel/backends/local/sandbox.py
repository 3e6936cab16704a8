"""The embedded local backend: a directory plus one worker process per context.

Each context is a ``local/worker.py`` subprocess (``interpreter.py``) that speaks the same plain-exec
protocol as Daytona's interpreter worker, so whatever works here works the
same on Daytona. It needs no account and no network. It is NOT a security
boundary: cells run as the user, on the user's machine. This module is the lifecycle (the folders, the
end by policy); what runs in the folder is ``toolbox.LocalToolbox``.

Layout, under ``jupyter_data_dir()/daytona-kernel/``, the same as on Daytona:
- ``sandboxes/<id>/workspace/``: the working directory, on the sandbox's "disk".
  An ephemeral sandbox's folder is deleted at shutdown.
- ``volumes/<volume>/<workspace key>/``: the volume, a plain folder. The runtime
  keeps the same volume copy of the working directory there as on a Daytona
  volume and restores a new sandbox from it, so both backends run one code path.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from jupyter_core.paths import jupyter_data_dir

from ...config import LocalSettings
from ...errors import BackendError
from ..base import ProgressCallback, Sandbox, SandboxPolicy
from .toolbox import LocalToolbox

PRIVATE_DIR_MODE = 0o700


def local_root() -> Path:
    """Where local sandboxes and volumes live."""
    return Path(jupyter_data_dir()) / "daytona-kernel"


class LocalSandbox(Sandbox):
    """A local stand-in for a Daytona sandbox. See the module docstring."""

    toolbox: LocalToolbox
    blob_chars = 64 * 1024  # a file on this machine costs less than a JSON pass over 64 KiB (docs/benchmarks.md)

    def __init__(self, config: LocalSettings, workspace_key: str, volume: bool = True) -> None:
        """``volume=False``: no volume copy of the working directory (a ``%%daytona map`` engine)."""
        self._config = config
        self._policy = SandboxPolicy(config.sandbox_policy)
        root = local_root()
        sandbox_name = workspace_key if self._policy is SandboxPolicy.REUSE else uuid.uuid4().hex[:12]
        self.id = f"local-{sandbox_name}"
        self.path = root / "sandboxes" / self.id
        self._tmp = self.path / "tmp"
        self.temp_dir = str(self._tmp)
        self.workdir = str(self.path / "workspace")
        self.volume_dir = str(root / "volumes" / config.volume_name / workspace_key) if volume else ""
        self.toolbox = LocalToolbox(config, self.path, self.workdir, self._tmp)

    @property
    def description(self) -> str:
        return f"local sandbox {self.id} (workdir {self.workdir})"

    async def info(self) -> dict[str, str]:
        return {
            "sandbox": f"{self.id} (local worker processes; not a security boundary)",
            "state": "started" if self.path.is_dir() else "not created",
            "policy": self._policy.value,
            "volume": f"{self._config.volume_name} (local folder {self.volume_dir})",
            "working directory": f"{self.workdir} (the sandbox's folder; the volume keeps a copy)",
            "idle mode": "none (local): the workers run until the kernel shuts down",
        }

    async def start(self, progress: ProgressCallback) -> None:
        try:  # private to the user: these are copies of their files
            for folder in (local_root(), local_root() / "volumes", local_root() / "sandboxes"):
                folder.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
                folder.chmod(PRIVATE_DIR_MODE)
            self.path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
            Path(self.workdir).mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
            if self.volume_dir:
                Path(self.volume_dir).mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
            self._tmp.mkdir(exist_ok=True, mode=PRIVATE_DIR_MODE)
        except OSError as exc:
            raise BackendError(
                f"Could not create the local sandbox directories under {local_root()}: {exc}. "
                "Set JUPYTER_DATA_DIR to a writable folder."
            ) from exc

    def volume_relpath(self) -> str:
        return os.path.relpath(self.volume_dir, self.workdir) if self.volume_dir else ""

    async def shutdown(self) -> None:
        for ctx in self.toolbox.contexts:
            await ctx.close()
        self.toolbox.contexts.clear()
        shutil.rmtree(self._tmp, ignore_errors=True)
        if self._policy is SandboxPolicy.EPHEMERAL:
            shutil.rmtree(self.path, ignore_errors=True)
