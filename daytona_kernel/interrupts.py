"""The interrupt of what runs in the context (a cell, or a widget callback): SIGINT to the worker, and
the watchdog for a run that ignores it.

If the run ignores the SIGINT for ``interrupt_grace`` seconds (at least ``DEBUGGED_GRACE_S`` while the
debugger traces the context), its context is closed and the ladder reports a ``KeyboardInterrupt``. After a cell's connection was cut while it ran on in the sandbox, the
next cell's job waits behind it in the daemon's queue (docs/reattach.md): the SIGINT then reaches that
cut cell, not the one the user sees. If the cut cell ignores it, the visible cell alone is ended, the
context (and every variable) is kept, and a note in the sandbox makes its job return at once when its
turn comes (``Runtime.run_cell`` looks for it first).
"""

from __future__ import annotations

import asyncio
import logging
import shlex
from typing import Callable, Coroutine

from .backends.base import RunError, Sandbox
from .config import SessionSettings
from .errors import BackendError, ConnectionLost, DaytonaKernelError
from .request import InFlight, Request
from .supervisor import ContextSupervisor, Live

INTERRUPT_EXEC_TIMEOUT_S = 10.0
DEBUGGED_GRACE_S = 30.0  # interrupt_grace's floor while the debugger traces the context (docs/debugger.md)


class Interrupts:
    """See the module docstring. The session runs each attempt of a cell through ``attempt`` and
    reports how the run ended to ``ran``."""

    def __init__(
        self, sandbox: Sandbox, supervisor: ContextSupervisor, settings: SessionSettings, log: logging.Logger, inflight: InFlight
    ) -> None:
        self._sandbox = sandbox
        self._supervisor = supervisor
        self._settings = settings
        self._log = log
        self._inflight = inflight
        self._watchdog: asyncio.Future[None] | None = None
        self._cut_cell_may_run = False  # a cut cell may still run ahead of the next job in the daemon's queue
        self._heard = False  # the current run has received output: its job has left the queue
        self._attempt_task: asyncio.Future[RunError | None] | None = None
        self._gave_up_on: Request | None = None  # the run the watchdog ended while it still waited in the queue
        self.debugged: Callable[[Live], bool] = lambda live: False  # the debugger traces this context (debugger.py)
        self._marker: str | None = None  # the note left for that run's job, until a later run shows it was read
        self._cell_count = 0  # the execution count of the cell that runs (the note names it)

    async def interrupt(self) -> None:
        """Send SIGINT to the worker; the watchdog waits in the background for the run to end."""
        request, live = self._inflight.request, self._supervisor.live
        if request is None or live is None:
            return
        request.interrupted = True
        sent = await self._send_sigint(live)
        grace = self._settings.interrupt_grace if sent else 0.0
        if sent and self.debugged(live):  # a traced cell (paused at a breakpoint, often) unwinds slowly: 2-3 s seen
            grace = max(grace, DEBUGGED_GRACE_S)
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = asyncio.ensure_future(self._interrupt_watchdog(request, live, grace))

    # -- the session's runs -----------------------------------------------

    def begin(self, count: int) -> None:
        """The run of cell ``count`` begins (it may take several attempts)."""
        self._cell_count = count
        self._gave_up_on = None

    async def attempt(self, run: Coroutine[None, None, RunError | None]) -> RunError | None:
        """One attempt of a run, as a task the watchdog can end (a run that still waits in the queue)."""
        self._attempt_task = asyncio.ensure_future(run)
        try:
            return await self._attempt_task
        finally:
            self._attempt_task = None

    def heard_via(self, callback: Callable[[str], None]) -> Callable[[str], None]:
        """``callback``, noting that the run's job has started (it sends output)."""

        def heard(text: str) -> None:
            self._heard = True
            callback(text)

        return heard

    def new_request(self) -> None:
        """A new request reads the run's output: nothing heard yet."""
        self._heard = False

    def gave_up(self) -> bool:
        """Was the run that was cancelled ended by the watchdog (it waited behind a cut cell)?"""
        return self._gave_up_on is not None and self._gave_up_on is self._inflight.request

    async def ran(self, exception: BackendError | None) -> None:
        """How the run ended: a cut connection may leave the cell running ahead of the next job."""
        if isinstance(exception, ConnectionLost):
            self._cut_cell_may_run = True  # it may run on: the next job queues behind it
        elif exception is None and self._gave_up_on is None:
            # this run's job ran, so every job ahead of it (a cut cell, one given up on) has ended
            self._cut_cell_may_run = False
            await self._remove_marker()

    # -- in the sandbox -----------------------------------------------------

    async def _skip_when_dequeued(self, live: Live) -> None:
        """Leave the runtime's note that the current cell must not run (``run_cell`` looks for it first)."""
        from .runtime.runtime import CANCELLED_CELL

        marker = CANCELLED_CELL % (live.pid, self._cell_count)
        try:
            result = await self._sandbox.toolbox.exec(f"touch {shlex.quote(marker)}", timeout=INTERRUPT_EXEC_TIMEOUT_S)
        except DaytonaKernelError as exc:
            self._log.warning("could not mark the queued cell as cancelled: %s", exc)
            return
        if result.exit_code:
            self._log.warning("could not mark the queued cell as cancelled: %s", result.output)
            return
        self._marker = marker

    async def _remove_marker(self) -> None:
        """The job given up on has been dequeued (and removed its note), unless its worker died first: then the
        note must not outlive it, or a later cell with the same pid and count would be skipped."""
        marker, self._marker = self._marker, None
        if marker is None:
            return
        try:
            await self._sandbox.toolbox.exec(f"rm -f {shlex.quote(marker)}", timeout=INTERRUPT_EXEC_TIMEOUT_S)
        except DaytonaKernelError as exc:
            self._log.warning("could not remove %s: %s", marker, exc)

    async def _send_sigint(self, live: Live) -> bool:
        try:
            result = await self._sandbox.toolbox.exec(f"kill -INT {live.pid}", timeout=INTERRUPT_EXEC_TIMEOUT_S)
        except DaytonaKernelError as exc:
            self._log.warning("could not send the interrupt: %s", exc)
            return False
        if result.exit_code != 0:
            self._log.warning("kill -INT %s failed: %s", live.pid, result.output)
        return result.exit_code == 0

    async def _interrupt_watchdog(self, request: Request, live: Live, grace: float) -> None:
        """Close the context of a cell that ignores the interrupt; the ladder then reports it."""
        try:
            await asyncio.wait_for(request.done.wait(), grace)
            return
        except asyncio.TimeoutError:
            pass  # the cell ignored the interrupt for the whole grace: its context is closed below
        attempt = self._attempt_task
        if self._cut_cell_may_run and not self._heard and request is self._inflight.request and attempt is not None:
            # Its job has not started: the SIGINT went to a cut cell that ignores it. End this run, leave the
            # context (and every variable) alone, and make the job return at once when its turn comes.
            self._log.warning("the cell waits behind a cut cell that ignores the interrupt; ending the wait, not the context")
            await self._skip_when_dequeued(live)
            self._gave_up_on = request
            attempt.cancel()
            return
        self._log.warning("the cell ignored the interrupt for %ss; restarting the context", grace)
        request.restarted_by_watchdog = True
        await self._supervisor.close_quietly(live.context)
