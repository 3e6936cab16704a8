"""A worker lost between requests, timeouts and slow bootstraps, on both backends.

The daemon (and the local worker, which imitates it) silently replaces a worker
that died between cells: the next request runs in a fresh interpreter without
our runtime. The kernel must notice in that same request, install the runtime
again, say once that the variables were reset, and run the cell.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from typing import Any

import pytest
from kernels import Kernel, result_text

from daytona_kernel import installer as installer_module
from daytona_kernel.compose import build_session
from daytona_kernel.config import DaytonaKernelConfig
from daytona_kernel.errors import DaytonaKernelError

RESET = "variables were reset"

# the cell's worker SIGKILLs itself from a thread shortly after the cell has returned
KILL_AFTER_THE_CELL = "import os, threading\nthreading.Timer(0.3, os.kill, (os.getpid(), 9)).start()\nprint(os.getpid())"


def stderr_of(run) -> str:  # type: ignore[no-untyped-def]
    return run.text("stderr")


def wait_gone(pid: int, timeout_s: float = 30.0) -> None:
    """Until the worker is reaped (not just a zombie): its parent has then seen it die."""
    deadline = time.monotonic() + timeout_s
    while os.path.exists(f"/proc/{pid}"):
        assert time.monotonic() < deadline, f"worker {pid} was not reaped"
        time.sleep(0.05)
    time.sleep(0.2)  # the parent's handler of the exit runs just after the reap


def test_a_worker_killed_between_cells_is_replaced_and_the_next_cells_run(kernel_name: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with Kernel(kernel_name, cwd=str(tmp_path)) as k:
        k.execute("lost = 1")
        killed = k.execute(KILL_AFTER_THE_CELL)
        assert killed.status == "ok", killed.errors
        wait_gone(int(killed.text()))
        first = k.execute("print('first')\n1 + 1")
        assert first.status == "ok", first.errors
        assert RESET in stderr_of(first) and stderr_of(first).count("\n") == 1
        assert first.text() == "first\n" and result_text(first) == "2"
        second = k.execute("print('second')\n'lost' in globals()")
        assert second.status == "ok", second.errors
        assert stderr_of(second) == "" and second.text() == "second\n" and result_text(second) == "False"


def test_a_worker_killed_from_outside_then_complete_and_inspect_answer(kernel_name: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with Kernel(kernel_name, cwd=str(tmp_path)) as k:
        pid = int(k.execute("import os\nprint(os.getpid())").text())
        os.kill(pid, signal.SIGKILL)
        wait_gone(pid)
        reply = k.request("complete", "pri", 3)
        assert reply["status"] == "ok" and "print" in reply["matches"]
        assert k.request("inspect", "len", 3)["status"] == "ok"
        run = k.execute("print('runs')")
        assert run.status == "ok" and run.text() == "runs\n" and RESET in stderr_of(run)


def test_a_kernel_magic_after_a_replaced_worker_shows_no_name_error(kernel_name: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with Kernel(kernel_name, cwd=str(tmp_path)) as k:
        killed = k.execute(KILL_AFTER_THE_CELL)
        wait_gone(int(killed.text()))
        run = k.execute("%daytona checkpoint")
        assert run.status == "ok", run.errors
        assert "NameError" not in run.text() + stderr_of(run)


def test_a_timeout_that_had_to_kill_the_worker_then_the_next_cell_says_variables_were_reset(kernel_name: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with Kernel(kernel_name, cwd=str(tmp_path), env={"DAYTONA_KERNEL_CELL_TIMEOUT": "1"}) as k:
        k.execute("lost = 1")
        stubborn = "import time\nwhile True:\n    try:\n        time.sleep(10)\n    except KeyboardInterrupt:\n        pass"
        run = k.execute(stubborn, timeout=60)
        assert run.errors[0]["ename"] == "CellTimeoutError"
        assert "exceeded `cell_timeout`=1 s" in run.errors[0]["evalue"]
        after = k.execute("print('after')")
        assert after.status == "ok" and after.text() == "after\n" and RESET in stderr_of(after)
        assert k.execute("lost").errors[0]["ename"] == "NameError"


async def test_a_bootstrap_that_times_out_leaks_no_context(kernel_name: str, tmp_path, monkeypatch, emulator) -> None:  # type: ignore[no-untyped-def]
    """Each retry of a slow start used to leave its context (and worker) behind."""
    monkeypatch.setattr(installer_module, "RUNTIME_CALL_TIMEOUT_S", 1.0)
    bootstrap = installer_module.bootstrap_code
    monkeypatch.setattr(installer_module, "bootstrap_code", lambda *a: "import time\ntime.sleep(30)\n" + bootstrap(*a))
    backend = "local" if kernel_name == "daytona-local" else "daytona"
    config = DaytonaKernelConfig(backend=backend, sandbox_policy="ephemeral")
    session = build_session(config, str(tmp_path), "bootstrap-timeout", logging.getLogger("test"), mirror=False)
    created: list[Any] = []
    create = session.sandbox.toolbox.create_context

    async def tracked() -> Any:
        created.append(await create())
        return created[-1]

    session.sandbox.toolbox.create_context = tracked  # type: ignore[method-assign]
    try:
        for _ in range(2):
            with pytest.raises(DaytonaKernelError):
                await session.ready()
        assert len(created) == 2
        if backend == "local":
            assert not [c for c in created if c.alive]
        else:
            # only this test's contexts: the shared emulator may hold other tests' live sandboxes
            ours = {c.id for c in created}
            live = [c for s in emulator.live_sandboxes() for c in s.contexts if c in ours]
            assert live == []
    finally:
        await session.shutdown()
