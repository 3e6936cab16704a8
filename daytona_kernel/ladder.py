"""The cell error ladder: how a run that ended badly is shown to the user.

A pure function from how a run ended (an exception from the backend, or an
error that escaped the runtime, plus what the interrupt watchdog did) to a
``Verdict``: the cell's error, a notice, and whether the context must be
replaced. The session applies it; the tests check it without a kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .backends.base import RunError
from .cell import error_content
from .errors import BackendError, ContextDied, ContextTimeout

STATE_LOST = "Its variables were lost; files in the working directory are intact."


@dataclass(frozen=True)
class RunEnd:
    """How a run ended, as the session saw it."""

    exception: BackendError | None = None
    run_error: RunError | None = None
    interrupted: bool = False  # the user asked to interrupt this cell
    restarted_by_watchdog: bool = False  # the cell ignored the interrupt; its context was closed
    cell_error: str | None = None  # the ename of the error the runtime reported for the cell, if any
    elapsed_s: float = 0.0  # how long the run took, as the kernel measured it


@dataclass(frozen=True)
class Verdict:
    """What to do about it: ``error`` is the cell's error (it ``overrides`` one the runtime
    reported when set), ``notice`` is stderr text, ``restart_context`` replaces the context."""

    error: dict[str, Any] | None = None
    overrides: bool = False
    notice: str = ""
    restart_context: bool = False


def settle(end: RunEnd, cell_timeout: float, interrupt_grace: float) -> Verdict:
    """The verdict for one run. ``cell_timeout`` (0 = none) and ``interrupt_grace`` are in seconds.

    A SIGINT (the user's interrupt, or the timeout's, which both backends send first) ends a run
    one of two ways: the runtime catches the KeyboardInterrupt and reports it as the cell's error
    (the run completes normally, close 1000), or it escapes (``ContextTimeout``, close 4008). Both
    read the same: an interrupt by the user is a KeyboardInterrupt, anything else a timeout.
    Variables are kept in both; a worker the timeout had to kill is found replaced by the next request.
    """
    exc = end.exception
    caught_timeout = (
        exc is None
        and not end.interrupted
        and cell_timeout > 0
        and end.cell_error == "KeyboardInterrupt"
        and end.elapsed_s >= cell_timeout
    )
    if isinstance(exc, ContextTimeout) or caught_timeout:
        if end.interrupted:
            return Verdict(error_content("KeyboardInterrupt", "Interrupted by user"))
        # the runtime saw the SIGINT as a KeyboardInterrupt; say what really happened
        message = (
            f"The cell exceeded `cell_timeout`={cell_timeout:g} s and was stopped. "
            "Raise DaytonaKernel.cell_timeout (0 = no limit) if it needs longer."
        )
        return Verdict(error_content("CellTimeoutError", message), overrides=True)
    if isinstance(exc, ContextDied):
        if end.restarted_by_watchdog:
            notice = (
                f"The cell did not stop within {interrupt_grace:g} s of the interrupt, so its sandbox "
                f"context was restarted. {STATE_LOST}\n"
            )
            return Verdict(error_content("KeyboardInterrupt", "Interrupted by user"), notice=notice, restart_context=True)
        message = f"The sandbox context died while running this cell ({exc}). It was restarted. {STATE_LOST}"
        return Verdict(error_content(exc.ename, message), restart_context=True)
    if exc is not None:  # connection lost, sandbox gone, auth ...
        return Verdict(error_content(exc.ename, str(exc)))
    if end.run_error is not None:
        return Verdict(run_error_content(end.run_error))
    return Verdict()


def run_error_content(error: RunError) -> dict[str, Any]:
    """An error the runtime did not catch itself (it escaped the runtime)."""
    if error.name == "KeyboardInterrupt":
        return error_content("KeyboardInterrupt", error.value or "Interrupted by user")
    tb = [f"\x1b[0;31m{error.name}\x1b[0m: {error.value}"]
    if error.traceback:
        tb.insert(0, error.traceback)
    return {"ename": error.name, "evalue": error.value, "traceback": tb}
