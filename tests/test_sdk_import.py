"""What a start waits for: a kernel process answers Jupyter before the daytona SDK's client has loaded
(about 1 s of imports, most of it pydantic models and the API clients): building the session leaves it
out, and the sandbox's start loads it in a thread, so the event loop answers kernel_info meanwhile; and
the start's independent lookups go at once."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from daytona_kernel.backends.base import SandboxPolicy
from daytona_kernel.backends.daytona import DaytonaSandbox
from daytona_kernel.config import DaytonaKernelConfig, DaytonaSettings, settings_from

SCRIPT = textwrap.dedent(
    """
    import asyncio, logging, sys, tempfile, threading
    from daytona_kernel.compose import build_session
    from daytona_kernel.config import DaytonaKernelConfig

    config = DaytonaKernelConfig(backend="daytona")
    session = build_session(config, tempfile.mkdtemp(), "k1", logging.getLogger())
    assert "daytona._async.daytona" not in sys.modules, "building the session imported the SDK's client"

    async def main():
        ticks = []
        async def tick():
            while True:
                ticks.append(1)
                await asyncio.sleep(0.005)
        ticker = asyncio.ensure_future(tick())
        await session.sandbox._workspace.open_client()
        ticker.cancel()
        return len(ticks)

    ticks = asyncio.run(main())
    assert "daytona._async.daytona" in sys.modules and session.sandbox._workspace._client is not None
    assert ticks > 3, f"the event loop was blocked while the SDK loaded ({ticks} ticks)"
    print("ok")
    """
)


def test_the_sdk_client_loads_in_a_thread_after_the_session_is_built() -> None:
    env = {**os.environ, "DAYTONA_API_KEY": "key", "DAYTONA_API_URL": "http://127.0.0.1:9/api"}  # never called
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


class Found(Exception):
    """Where the start is stopped: the lookups are what this test is about."""


class Lookups:
    """The workspace's two lookups: ready_volume cannot finish until find has started."""

    policy = None
    notices: list[str] = []

    def __init__(self) -> None:
        self.finding = asyncio.Event()

    async def open_client(self) -> None:
        return None

    async def check_gpu(self) -> str:
        return ""

    async def ready_volume(self, progress: Any) -> str:
        await self.finding.wait()
        return "volume"

    async def find(self) -> None:
        self.finding.set()
        raise Found


async def test_the_volume_and_the_sandbox_are_looked_up_at_once() -> None:
    """On a real network each is a round trip to Daytona's API, on every start: they do not depend on each
    other (the volume is needed only to create a sandbox, or to compare a found one with the settings)."""
    config = DaytonaKernelConfig(backend="daytona")
    sandbox = DaytonaSandbox(settings_from(DaytonaSettings, config), "key", "k1")
    lookups = Lookups()
    sandbox._workspace = lookups  # type: ignore[assignment]
    sandbox._policy = SandboxPolicy.REUSE
    with pytest.raises(Found):
        await asyncio.wait_for(sandbox.start(lambda text: None), 10)  # one after the other, they would wait forever
