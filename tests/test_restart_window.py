"""A restart's loading window (docs/reattach.md, "The first cell after a restart"): what a kernel process does
after a quick start while the daytona SDK loads in the background. In process: no kernel, no emulator."""

from __future__ import annotations

import asyncio

import pytest

from daytona_kernel.backends.daytona import DaytonaSandbox
from daytona_kernel.config import DaytonaKernelConfig, DaytonaSettings, settings_from
from daytona_kernel.errors import BackendError


def sandbox() -> DaytonaSandbox:
    return DaytonaSandbox(settings_from(DaytonaSettings, DaytonaKernelConfig(backend="daytona")), "key", "k1")


async def test_a_failed_load_reaches_every_later_caller() -> None:
    """Not 'The sandbox is not ready yet.' from the second caller on: the first caller after a quick start is
    the supervisor's install in the left context, which falls back quietly, so the cell would show that."""
    box = sandbox()

    async def load() -> None:
        raise BackendError("Could not load the daytona SDK (boom). Reinstall it")

    box._loading = asyncio.ensure_future(load())
    for _ in range(3):
        with pytest.raises(BackendError, match="Could not load the daytona SDK"):
            await box.sdk_sandbox()
    with pytest.raises(BackendError, match="Could not load the daytona SDK"):
        await box.create_context()
