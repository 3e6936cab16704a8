"""The cell error ladder as a pure function: how each bad ending is shown, without a kernel."""

from __future__ import annotations

from daytona_kernel.backends.base import RunError
from daytona_kernel.errors import ConnectionLost, ContextDied, ContextTimeout, SandboxNotRunning
from daytona_kernel.ladder import RunEnd, Verdict, run_error_content, settle


def verdict(**end: object) -> Verdict:
    return settle(RunEnd(**end), cell_timeout=5.0, interrupt_grace=3.0)  # type: ignore[arg-type]


def test_a_clean_run_has_no_verdict() -> None:
    assert verdict() == Verdict()


def test_a_timeout_overrides_the_keyboard_interrupt_the_runtime_saw() -> None:
    v = verdict(exception=ContextTimeout("timeout"))
    assert v.error is not None and v.error["ename"] == "CellTimeoutError"
    assert "5 s timeout" in v.error["evalue"] and "cell_timeout" in v.error["evalue"]
    assert v.overrides and not v.restart_context


def test_a_timeout_after_an_interrupt_is_the_interrupt() -> None:
    v = verdict(exception=ContextTimeout("timeout"), interrupted=True)
    assert v.error is not None and v.error["ename"] == "KeyboardInterrupt" and not v.overrides


def test_a_dead_context_is_restarted_and_says_state_was_lost() -> None:
    v = verdict(exception=ContextDied("worker exited with code -9"))
    assert v.restart_context
    assert v.error is not None and v.error["ename"] == "SandboxContextDied"
    assert "worker exited with code -9" in v.error["evalue"] and "variables were lost" in v.error["evalue"]


def test_a_context_closed_by_the_watchdog_is_an_interrupt_with_a_notice() -> None:
    v = verdict(exception=ContextDied("closed"), interrupted=True, restarted_by_watchdog=True)
    assert v.restart_context
    assert v.error is not None and v.error["ename"] == "KeyboardInterrupt"
    assert "did not stop within 3 s" in v.notice


def test_other_backend_failures_keep_their_own_name_and_message() -> None:
    for exc in (ConnectionLost("the stream broke"), SandboxNotRunning("stopped again")):
        v = verdict(exception=exc)
        assert v.error is not None and (v.error["ename"], v.error["evalue"]) == (exc.ename, str(exc))
        assert not v.restart_context


def test_an_error_that_escaped_the_runtime_keeps_its_traceback() -> None:
    v = verdict(run_error=RunError("MemoryError", "", "Traceback (most recent call last):\n  ..."))
    assert v.error == run_error_content(RunError("MemoryError", "", "Traceback (most recent call last):\n  ..."))
    assert v.error is not None and v.error["traceback"][0].startswith("Traceback")


def test_an_escaped_keyboard_interrupt_reads_like_ipykernel() -> None:
    content = run_error_content(RunError("KeyboardInterrupt", "", ""))
    assert (content["ename"], content["evalue"]) == ("KeyboardInterrupt", "Interrupted by user")
