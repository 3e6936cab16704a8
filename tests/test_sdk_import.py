"""A kernel process answers Jupyter before the daytona SDK's client has loaded (about 1 s of imports, most
of it pydantic models and the API clients): building the session leaves it out, and the sandbox's start
loads it in a thread, so the event loop answers kernel_info meanwhile."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import asyncio, logging, sys, tempfile, threading
    from daytona_kernel.compose import build_session
    from daytona_kernel.config import DaytonaKernelConfig
    from daytona_kernel.backends import daytona_workspace

    config = DaytonaKernelConfig(backend="daytona", api_key="k", api_url="http://127.0.0.1:9/api")
    session = build_session(config, tempfile.mkdtemp(), "k1", logging.getLogger())
    assert "daytona._async.daytona" not in sys.modules, "building the session imported the SDK's client"

    async def main():
        ticks = []
        async def tick():
            while True:
                ticks.append(1)
                await asyncio.sleep(0.005)
        ticker = asyncio.ensure_future(tick())
        await daytona_workspace.load_sdk()
        ticker.cancel()
        return len(ticks)

    ticks = asyncio.run(main())
    assert "daytona._async.daytona" in sys.modules
    assert ticks > 3, f"the event loop was blocked while the SDK loaded ({ticks} ticks)"
    print("ok")
    """
)


def test_the_sdk_client_loads_in_a_thread_after_the_session_is_built() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
