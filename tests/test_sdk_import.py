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
from pathlib import Path
from typing import Any

import pytest

from daytona_kernel.backends.base import SandboxPolicy
from daytona_kernel.backends.daytona.sandbox import DaytonaSandbox
from daytona_kernel.config import DaytonaKernelConfig, DaytonaSettings, settings_from

SCRIPT = textwrap.dedent(
    """
    import asyncio, logging, sys, tempfile, threading
    from daytona_kernel.compose import build_session
    from daytona_kernel.config import DaytonaKernelConfig

    config = DaytonaKernelConfig(backend="daytona")
    session = build_session(config, tempfile.mkdtemp(), "k1", logging.getLogger())
    assert "daytona._async.daytona" not in sys.modules, "building the session imported the SDK's client"
    assert "pydantic" not in sys.modules, "building the session imported pydantic (the SDK's models)"
    assert "aiohttp" not in sys.modules, "building the session imported aiohttp (0.15 s: it loads with the SDK)"
    assert "packaging.requirements" not in sys.modules, "building the session imported packaging's parsers (10 ms)"

    default = sys.getswitchinterval()

    async def main():
        ticks = []
        async def tick():
            while True:
                ticks.append(sys.getswitchinterval())
                await asyncio.sleep(0.005)
        ticker = asyncio.ensure_future(tick())
        await session.sandbox._workspace.open_client()
        ticker.cancel()
        return ticks

    ticks = asyncio.run(main())
    assert "daytona._async.daytona" in sys.modules and session.sandbox._workspace._client is not None
    import pydantic
    assert pydantic.BaseModel.model_config.get("defer_build"), "the SDK's models were built at import"
    assert len(ticks) > 3, f"the event loop was blocked while the SDK loaded ({len(ticks)} ticks)"
    assert max(ticks[1:]) < default, "the event loop waited the whole switch interval for the GIL while the SDK loaded"
    assert sys.getswitchinterval() == default, "the switch interval was not restored"
    print("ok")
    """
)


def test_the_sdk_client_loads_in_a_thread_after_the_session_is_built() -> None:
    env = {**os.environ, "DAYTONA_API_KEY": "key", "DAYTONA_API_URL": "http://127.0.0.1:9/api"}  # never called
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


async def test_an_sdk_that_cannot_be_loaded_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a generic 'unexpected error' at every cell: the kernel's error ladder shows a BackendError's text."""
    from daytona_kernel.errors import BackendError

    config = DaytonaKernelConfig(backend="daytona")
    sandbox = DaytonaSandbox(settings_from(DaytonaSettings, config), "key", "k1")
    monkeypatch.setitem(sys.modules, "daytona", None)  # `from daytona import AsyncDaytona` raises ImportError
    with pytest.raises(BackendError, match="Could not load the daytona SDK .*Reinstall it"):
        await sandbox._workspace.open_client()


class Found(Exception):
    """Where the start is stopped: the lookups are what this test is about."""


class Lookups:
    """The workspace's two lookups: ready_volume cannot finish until find has started."""

    policy = None
    notices: list[str] = []
    created_early = ""

    def __init__(self) -> None:
        self.finding = asyncio.Event()

    async def open_client(self) -> None:
        return None

    async def check_gpu(self) -> str:
        return ""

    def early_create_body(self, volume_id: str, name: str) -> None:
        return None  # the SDK's start (early applies to none here)

    async def ready_volume(self, progress: Any) -> str:
        await self.finding.wait()
        return "volume"

    async def find(self, sandbox_id: str = "") -> None:
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


WITNESS = textwrap.dedent(
    """
    import atexit, sys
    from pathlib import Path
    from daytona_kernel import __main__ as main

    folder = Path(sys.argv[1])
    main.end_quickly_after_a_clean_end()
    atexit.register(lambda: (folder / "atexit").touch())

    class Witness:
        def __del__(self):
            (folder / "teardown").touch()

    witness = Witness()  # a module global: deleted when Python finalizes its modules
    if sys.argv[2] == "clean":
        main.ended_cleanly()
    else:
        raise SystemExit(3)
    """
)


def test_a_kernel_process_that_ended_cleanly_skips_pythons_finalization(tmp_path: Path) -> None:
    """Tearing down the SDK's modules (pydantic models) kept a kernel process alive about 0.4 s after its
    shutdown, and a restart's new process starts only when the old one is gone. Once the kernel has ended
    cleanly, every atexit handler runs and the process ends without that teardown; any other end is
    Python's own, its exit status kept."""
    for how, status, torn_down in (("clean", 0, False), ("failed", 3, True)):
        folder = tmp_path / how
        folder.mkdir()
        done = subprocess.run([sys.executable, "-c", WITNESS, str(folder), how], capture_output=True, text=True, timeout=60)
        assert done.returncode == status, done.stderr
        assert (folder / "atexit").exists()
        assert (folder / "teardown").exists() is torn_down
