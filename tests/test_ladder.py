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
    assert "exceeded `cell_timeout`=5 s" in v.error["evalue"]
    assert v.overrides and not v.restart_context


def test_a_timeout_the_runtime_caught_reads_like_one_that_escaped() -> None:
    """SIGINT caught by the runtime (close 1000) and escaped (close 4008) are the same timeout."""
    caught = verdict(cell_error="KeyboardInterrupt", elapsed_s=5.2)
    assert caught == verdict(exception=ContextTimeout("timeout"))
    assert caught.error is not None and "exceeded `cell_timeout`=5 s" in caught.error["evalue"]


def test_a_fractional_timeout_is_shown_as_it_was_set() -> None:
    v = settle(RunEnd(cell_error="KeyboardInterrupt", elapsed_s=0.6), cell_timeout=0.5, interrupt_grace=3.0)
    assert v.error is not None and "`cell_timeout`=0.5 s" in v.error["evalue"]


def test_a_caught_interrupt_by_the_user_stays_the_runtime_s_keyboard_interrupt() -> None:
    assert verdict(cell_error="KeyboardInterrupt", elapsed_s=9.0, interrupted=True) == Verdict()
    assert verdict(exception=ContextTimeout("timeout"), interrupted=True) == verdict(
        exception=ContextTimeout("timeout"), interrupted=True, elapsed_s=9.0
    )


def test_a_keyboard_interrupt_before_the_timeout_or_without_one_is_the_cell_s_own() -> None:
    assert verdict(cell_error="KeyboardInterrupt", elapsed_s=1.0) == Verdict()
    assert settle(RunEnd(cell_error="KeyboardInterrupt", elapsed_s=99.0), cell_timeout=0, interrupt_grace=3.0) == Verdict()
    assert verdict(cell_error="ValueError", elapsed_s=9.0) == Verdict()


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
