"""Sandbox backends. ``open_sandbox`` picks one from the configuration."""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import replace

from ..config import DaytonaKernelConfig, DaytonaSettings, LocalSettings, settings_from
from .base import Context, ExecResult, RunError, Sandbox, SandboxPolicy

__all__ = [
    "Context",
    "ExecResult",
    "RunError",
    "Sandbox",
    "SandboxPolicy",
    "open_sandbox",
    "open_engine_sandbox",
    "workspace_key",
    "workspace_key_for",
]


def workspace_key_for(folder: str) -> str:
    """A stable, readable key for a notebook folder: ``<name>-<hash of the path>``."""
    folder = os.path.abspath(folder)
    name = re.sub(r"[^a-z0-9]+", "-", os.path.basename(folder).lower()).strip("-")[:40] or "root"
    return f"{name}-{hashlib.sha256(folder.encode()).hexdigest()[:10]}"


def workspace_key(config: DaytonaKernelConfig, folder: str) -> str:
    """The configured workspace key, else the one derived from the notebook's folder."""
    return config.workspace_key or workspace_key_for(folder)


def open_sandbox(config: DaytonaKernelConfig, folder: str, kernel_id: str) -> Sandbox:
    """The configured backend's sandbox for the notebook in ``folder``."""
    key = workspace_key(config, folder)
    if config.backend == "local":
        from .local.sandbox import LocalSandbox

        return LocalSandbox(settings_from(LocalSettings, config), key)
    from .daytona.sandbox import DaytonaSandbox

    return DaytonaSandbox(settings_from(DaytonaSettings, config), key, kernel_id)


def open_engine_sandbox(config: DaytonaKernelConfig, folder: str, kernel_id: str, serial: int, main: Sandbox) -> Sandbox:
    """A ``%%daytona map`` engine for the notebook in ``folder``: a sandbox made like the ``main`` one,
    ephemeral, without the volume (its working directory is a copy, never kept)."""
    if config.backend == "local":
        from .local.sandbox import LocalSandbox

        settings = replace(settings_from(LocalSettings, config), sandbox_policy=SandboxPolicy.EPHEMERAL.value)
        return LocalSandbox(settings, workspace_key(config, folder), volume=False)
    from .daytona.sandbox import DaytonaSandbox

    lender = main if isinstance(main, DaytonaSandbox) else None
    return DaytonaSandbox(
        settings_from(DaytonaSettings, config), workspace_key(config, folder), kernel_id, worker=serial, main=lender
    )
