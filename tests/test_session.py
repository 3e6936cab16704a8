"""The session in-process, against a scripted sandbox: output order, the error ladder, recovery, input, interrupts."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from fakes import FakeSandbox, Run, frame

from daytona_kernel.backends.base import RunError
from daytona_kernel.cell import Cell, Recorder
from daytona_kernel.config import SessionSettings
from daytona_kernel.errors import BackendError, ContextDied, ContextTimeout, SandboxNotRunning
from daytona_kernel.runtime import HANDLE, RUNTIME_MISSING
from daytona_kernel.runtime.calls import Complete
from daytona_kernel.session import SandboxSession

LOG = logging.getLogger("test-session")


def session_for(sandbox: FakeSandbox, **settings: object) -> SandboxSession:
    return SandboxSession(sandbox, SessionSettings(**settings), LOG)  # type: ignore[arg-type]


def result(text: str, count: int = 1) -> object:
    return frame("result", {"data": {"text/plain": text}, "metadata": {}, "execution_count": count})


async def test_text_and_frames_reach_the_frontend_in_order() -> None:
    sandbox = FakeSandbox([Run(["hi\n", frame("display", {"data": {"text/plain": "d"}}), "there\n", result("3")])])
    front = Recorder()
    outcome = await session_for(sandbox).execute(Cell("x", 1), front)
    assert outcome.error is None
    assert [k for k, _ in front.outputs] == ["stream", "display_data", "stream", "execute_result"]
    assert front.text() == "hi\nthere\n" and front.of_type("execute_result")[0]["data"] == {"text/plain": "3"}
    assert "run_cell" in sandbox.codes[-1]


async def test_the_cells_error_is_emitted_once_in_its_place() -> None:
    """As with ipykernel, output after the error (the cell's figures, flushed after it) comes after it."""
    error = {"ename": "ZeroDivisionError", "evalue": "division by zero", "traceback": ["tb"]}
    sandbox = FakeSandbox([Run([frame("error", error), "after\n"])])
    front = Recorder()
    outcome = await session_for(sandbox).execute(Cell("1/0", 1), front)
    assert outcome.error == error
    assert [k for k, _ in front.outputs] == ["error", "stream"]


async def test_an_error_that_escaped_the_runtime_becomes_the_cells_error() -> None:
    sandbox = FakeSandbox([Run(error=RunError("MemoryError", "out of memory", ""))])
    outcome = await session_for(sandbox).execute(Cell("x", 1), Recorder())
    assert outcome.error is not None and outcome.error["ename"] == "MemoryError"


async def test_a_timeout_is_reported_as_the_timeout_not_as_the_interrupt_the_runtime_saw() -> None:
    interrupt = {"ename": "KeyboardInterrupt", "evalue": "", "traceback": []}
    sandbox = FakeSandbox([Run([frame("error", interrupt)], raises=ContextTimeout("timeout"))])
    front = Recorder()
    outcome = await session_for(sandbox, cell_timeout=2.0).execute(Cell("sleep", 1), front)
    assert outcome.error is not None and outcome.error["ename"] == "CellTimeoutError"
    assert len(front.of_type("error")) == 1


async def test_a_dead_context_is_replaced_before_the_next_cell() -> None:
    sandbox = FakeSandbox([Run(raises=ContextDied("exit code -9")), Run(["ok\n"])])
    session = session_for(sandbox)
    outcome = await session.execute(Cell("crash", 1), Recorder())
    assert outcome.error is not None and outcome.error["ename"] == "SandboxContextDied"
    front = Recorder()
    assert (await session.execute(Cell("print('ok')", 2), front)).error is None
    assert front.text() == "ok\n"
    assert len(sandbox.contexts) == 2 and sandbox.contexts[0].closed


async def test_a_stopped_sandbox_is_started_again_and_the_cell_runs_there() -> None:
    sandbox = FakeSandbox([Run(raises=SandboxNotRunning("The sandbox was stopped.")), Run(["ran\n"])])
    front = Recorder()
    outcome = await session_for(sandbox).execute(Cell("print('ran')", 1), front)
    assert outcome.error is None and "ran\n" in front.text()
    assert sandbox.starts == 2 and "fresh interpreter" in front.text("stderr")


async def test_a_failed_start_is_the_cells_error_and_the_next_cell_tries_again() -> None:
    sandbox = FakeSandbox([Run(["second\n"])])
    sandbox.start_errors.append(BackendError("Daytona is down. Try again later."))
    session = session_for(sandbox)
    outcome = await session.execute(Cell("x", 1), Recorder())
    assert outcome.error is not None and outcome.error["evalue"] == "Daytona is down. Try again later."
    front = Recorder()
    assert (await session.execute(Cell("x", 2), front)).error is None and front.text() == "second\n"


async def test_a_runtime_that_does_not_say_hello_is_a_clear_start_error() -> None:
    sandbox = FakeSandbox()
    sandbox.bootstrap_run = Run(["no hello here\n"])
    outcome = await session_for(sandbox).execute(Cell("x", 1), Recorder())
    assert outcome.error is not None and "did not report back" in outcome.error["evalue"]


async def test_provisioning_progress_is_shown_then_cleared() -> None:
    sandbox = FakeSandbox([Run()])
    front = Recorder()
    await session_for(sandbox).execute(Cell("x", 1), front)
    assert "creating sandbox…" in front.statuses and front.statuses[-1] == ""


async def test_input_asks_the_frontend_and_writes_the_answer_where_the_runtime_waits() -> None:
    answered = asyncio.Event()
    sandbox = FakeSandbox([Run([frame("input", {"prompt": "name? ", "password": False, "path": "/tmp/in/1"})], wait=answered)])
    front = Recorder(answers=["Ada"])
    session = session_for(sandbox)

    async def release_when_answered() -> None:
        while not sandbox.uploads:
            await asyncio.sleep(0.001)
        answered.set()

    releaser = asyncio.ensure_future(release_when_answered())
    outcome = await session.execute(Cell("input('name? ')", 1, allow_stdin=True), front)
    await releaser
    assert outcome.error is None and front.prompts == [("name? ", False)]
    assert sandbox.uploads == [(json.dumps({"value": "Ada"}).encode(), "/tmp/in/1")]


async def test_a_cell_that_ignores_the_interrupt_has_its_context_restarted() -> None:
    forever = asyncio.Event()
    sandbox = FakeSandbox([Run(["busy\n"], wait=forever), Run(["fresh\n"])])
    session = session_for(sandbox, interrupt_grace=0.05)
    front = Recorder()
    running = asyncio.ensure_future(session.execute(Cell("while True: pass", 1), front))
    while session.inflight.request is None:
        await asyncio.sleep(0.001)
    await session.interrupt()
    outcome = await running
    assert outcome.error is not None and outcome.error["ename"] == "KeyboardInterrupt"
    assert "did not stop within 0.05 s" in front.text("stderr")
    assert any(cmd.startswith("kill -INT 4242") for cmd in sandbox.commands)
    next_front = Recorder()
    await session.execute(Cell("print('fresh')", 2), next_front)
    assert next_front.text() == "fresh\n" and len(sandbox.contexts) == 2


async def test_shutdown_releases_the_sandbox_once() -> None:
    sandbox = FakeSandbox([Run()])
    session = session_for(sandbox)
    await session.execute(Cell("x", 1), Recorder())
    await session.shutdown()
    await session.shutdown()
    assert sandbox.shut_down


# -- a worker replaced between requests, a bootstrap that times out ----------------------

MISSING = Run(error=RunError(RUNTIME_MISSING, "the runtime is not installed in this worker", ""))


def boots(sandbox: FakeSandbox) -> int:
    return sum(f"{HANDLE} = " in code for code in sandbox.codes)


async def test_a_replaced_worker_is_bootstrapped_again_and_the_cell_runs_after_one_notice() -> None:
    sandbox = FakeSandbox([Run(["a\n"]), MISSING, Run([result("2", 2)]), Run(["c\n"])])
    session = session_for(sandbox)
    await session.execute(Cell("a", 1), Recorder())
    front = Recorder()
    outcome = await session.execute(Cell("1 + 1", 2), front)
    assert outcome.error is None and front.of_type("execute_result")[0]["data"] == {"text/plain": "2"}
    assert "variables were reset" in front.text("stderr") and front.text("stderr").count("\n") == 1
    assert boots(sandbox) == 2 and len(sandbox.contexts) == 1 and not sandbox.closed_contexts
    later = Recorder()
    assert (await session.execute(Cell("c", 3), later)).error is None
    assert later.text() == "c\n" and boots(sandbox) == 2


async def test_a_plain_cell_is_one_request_when_the_worker_is_fine() -> None:
    sandbox = FakeSandbox([Run(["a\n"]), Run(["b\n"])])
    session = session_for(sandbox)
    await session.execute(Cell("a", 1), Recorder())
    before = len(sandbox.codes)
    await session.execute(Cell("b", 2), Recorder())
    assert len(sandbox.codes) == before + 1


async def test_complete_after_a_replaced_worker_answers_and_the_next_cell_says_so() -> None:
    reply = frame("reply", {"matches": ["math"], "cursor_start": 0, "cursor_end": 3, "metadata": {}})
    sandbox = FakeSandbox([Run(["a\n"]), MISSING, Run([reply]), Run(["b\n"])])
    session = session_for(sandbox)
    await session.execute(Cell("a", 1), Recorder())
    answer = await session.query(Complete(code="mat", cursor=3))
    assert answer is not None and answer["matches"] == ["math"] and boots(sandbox) == 2
    front = Recorder()
    await session.execute(Cell("b", 2), front)
    assert front.text("stderr").startswith("The sandbox's Python process had ended") and front.text() == "b\n"


async def test_a_bootstrap_that_times_out_closes_its_context_and_the_retry_works() -> None:
    sandbox = FakeSandbox([Run(["ok\n"])])
    sandbox.bootstrap_run = Run(raises=ContextTimeout("timeout"))
    session = session_for(sandbox)
    first = await session.execute(Cell("x", 1), Recorder())
    assert first.error is not None
    assert [c.id for c in sandbox.contexts] == sandbox.closed_contexts  # nothing leaked
    sandbox.bootstrap_run = None
    front = Recorder()
    assert (await session.execute(Cell("x", 2), front)).error is None and front.text() == "ok\n"
    assert len(sandbox.contexts) == 2 and sandbox.closed_contexts == [sandbox.contexts[0].id]


async def test_output_outside_a_cell_is_logged_as_a_bounded_prefix(caplog) -> None:  # type: ignore[no-untyped-def]
    sandbox = FakeSandbox()
    sandbox.bootstrap_run = Run(["x" * 100_000 + "\n", frame("hello", {"pid": 1, "python": "3.12.1"})])
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        await session_for(sandbox).ready()
    logged = [r.getMessage() for r in caplog.records if "outside a cell" in r.getMessage()]
    assert logged and all(len(m) < 1000 for m in logged)


async def test_an_interrupt_while_the_sandbox_starts_ends_the_cell_and_provisioning_goes_on() -> None:
    provisioned = asyncio.Event()
    sandbox = FakeSandbox([Run(["later\n"])])
    sandbox.start_wait = provisioned
    session = session_for(sandbox)
    front = Recorder()
    first = asyncio.ensure_future(session.execute(Cell("x", 1), front))
    while "creating sandbox…" not in front.statuses:  # the cell waits for the sandbox
        await asyncio.sleep(0.001)
    await session.interrupt()
    outcome = await asyncio.wait_for(first, 5)
    assert outcome.error is not None and outcome.error["ename"] == "KeyboardInterrupt"
    assert front.of_type("error") == [outcome.error] and front.statuses[-1] == ""
    provisioned.set()
    next_front = Recorder()
    assert (await asyncio.wait_for(session.execute(Cell("print('later')", 2), next_front), 5)).error is None
    assert next_front.text() == "later\n" and sandbox.starts == 1  # the same provisioning, not a second one


def test_a_notice_queued_after_the_first_ones_were_shown_is_kept() -> None:
    """The installer queues its notices (IPython could not be installed, a repository cloned) through the
    supervisor's list: showing the first ones must not leave it writing to a list nobody reads any more."""
    from daytona_kernel.runtime.calls import RuntimeOptions
    from daytona_kernel.supervisor import ContextSupervisor

    supervisor = ContextSupervisor(
        FakeSandbox(), SessionSettings(), logging.getLogger("test"), RuntimeOptions(), notices=["first\n"]
    )
    assert supervisor.take_notices() == ["first\n"]
    supervisor._installer._notice("later\n")
    assert supervisor.take_notices() == ["later\n"]


async def restarting(events: list[str], volume_dir: str = "") -> SandboxSession:
    """A session after one cell whose restart logs, in ``events``, the next context's making (50 ms), the old
    context's deletion (50 ms: the daemon waits for the worker's exit) and the sandbox's detach."""

    class Restarting(FakeSandbox):
        async def leave_next_context(self, code: str, timeout: float) -> None:
            events.append("leave begins")
            await asyncio.sleep(0.05)
            events.append("leave ends")

        async def detach(self) -> None:
            events.append("detach")
            await super().detach()

    sandbox = Restarting([Run()])
    sandbox.volume_dir = volume_dir
    session = session_for(sandbox)
    await session.execute(Cell("x", 1), Recorder())
    live = session.supervisor.live
    assert live is not None
    close = live.context.close

    async def closing() -> None:
        events.append("close begins")
        await asyncio.sleep(0.05)
        await close()
        events.append("close ends")

    live.context.close = closing  # type: ignore[method-assign]
    return session


async def test_a_restart_finishes_the_volume_copy_before_the_old_context_goes_while_the_next_is_made() -> None:
    """The volume's copy is finished while the old interpreter lives (its exit copies only what it can finish in
    the daemon's 2 s: a copy cut off there would truncate the volume's file), and that round trip overlaps the
    making of the next context."""
    events: list[str] = []
    session = await restarting(events, volume_dir="/home/daytona/volume")

    async def query(call: Any, parse: Any) -> Any:
        events.append(f"{type(call).__name__} begins")
        await asyncio.sleep(0.03)
        events.append(f"{type(call).__name__} ends")
        return None

    session.supervisor.query = query  # type: ignore[method-assign]
    await session.shutdown(restart=True)
    assert events.index("SyncVolume ends") < events.index("close begins")
    assert events.index("SyncVolume begins") < events.index("leave ends")


async def test_a_restart_deletes_the_old_context_while_it_leaves_the_next_one() -> None:
    """The daemon answers a context's deletion only once its worker has exited, and the restart waits for the
    answer: the next context is made meanwhile, not after. The sandbox is let go of (detach) after both."""
    events: list[str] = []
    session = await restarting(events)
    await session.shutdown(restart=True)
    assert events.index("close begins") < events.index("leave ends")
    assert events[-1] == "detach" and "close ends" in events
