"""The state ladder of a Daytona sandbox: from whatever state the API reports to ``started``, within a
bounded time (docs/daytona-platform.md, "Control plane"). ``DaytonaSandbox`` climbs it at every start;
it holds no sandbox of its own."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable

from daytona.common.errors import DaytonaConflictError, DaytonaNotFoundError

from ..errors import BackendError, SandboxGone
from .base import ProgressCallback
from .daytona_api import (
    API_REQUEST_TIMEOUT_S,
    FAILED_STATES,
    GONE_STATES,
    SANDBOX_START_TIMEOUT_S,
    STARTABLE_STATES,
    STATE_POLL_S,
    state_name,
    status_of,
)
from .daytona_workspace import ApiCall

log = logging.getLogger("daytona_kernel.daytona")


class StateLadder:
    """Waits, starts, resumes or recovers a sandbox until it is ``started``; says when it is gone."""

    def __init__(self, api: ApiCall, notice: Callable[[str], None]) -> None:
        self._api = api
        self._notice = notice

    async def ensure_started(self, sandbox: Any, progress: ProgressCallback) -> None:
        """Bring the sandbox to ``started`` from whatever state the API reports, within a bounded time.

        ``stopping``/``starting``/``creating``...: wait (the SDK's wait for a start never resolves on a
        stopping sandbox). ``stopped``/``archived``/``archiving``: start it; a 409 "state change in
        progress" (another kernel or the dashboard is changing it) means wait and look again.
        ``destroying``/``destroyed``: SandboxGone. ``error`` marked recoverable: ``recover()``, once.
        """
        began = time.monotonic()
        recovered = False
        while True:
            state = state_name(sandbox)
            if state == "started":
                return
            if state in GONE_STATES:
                raise SandboxGone(f"The sandbox {sandbox.id} was deleted ({state}).")
            if state == "error" and sandbox.recoverable and not recovered:
                recovered = True  # once: a recovery that ends in an error again is reported, not retried
                await self._recover(sandbox, progress)
                continue
            if state in FAILED_STATES:
                raise BackendError(
                    f"The sandbox {sandbox.id} is in the {state} state ({sandbox.error_reason or 'no reason given'}). "
                    "Fix the snapshot or image, or delete the sandbox in the Daytona dashboard, then restart the kernel."
                )
            waited = time.monotonic() - began
            if waited > SANDBOX_START_TIMEOUT_S:
                raise BackendError(
                    f"The sandbox {sandbox.id} stayed {state} for {SANDBOX_START_TIMEOUT_S} s. Look at it in the "
                    "Daytona dashboard (or delete it), then run the cell again."
                )
            if state in STARTABLE_STATES:
                progress(f"{'resuming' if state == 'paused' else 'starting'} {state} sandbox {sandbox.id}…")
                if await self._start_or_conflict(sandbox, SANDBOX_START_TIMEOUT_S - waited):
                    return
            else:
                progress(f"waiting for sandbox {sandbox.id}: {state} ({waited:.0f} s)…")
            await asyncio.sleep(STATE_POLL_S)
            await self.refresh(sandbox)

    async def _recover(self, sandbox: Any, progress: ProgressCallback) -> None:
        """A recoverable error (a pause job that failed, job-state-handler.service.ts): ``recover()`` starts
        the sandbox again; its disk is kept, its processes are new."""
        reason = sandbox.error_reason or "no reason given"
        progress(f"recovering sandbox {sandbox.id} from an error ({reason})…")
        log.warning("sandbox %s is in a recoverable error (%s); recovering it", sandbox.id, reason)
        await self._api("recover the sandbox", lambda: sandbox.recover(timeout=SANDBOX_START_TIMEOUT_S), retry=False)
        self._notice(f"The sandbox {sandbox.id} was in the error state ({reason}); Daytona recovered it.\n")
        await self.refresh(sandbox)

    async def _start_or_conflict(self, sandbox: Any, timeout_s: float) -> bool:
        """Start the sandbox and wait for ``started``; False if its state is already changing (409)."""
        try:
            await self._api("start the sandbox", lambda: sandbox.start(timeout=max(timeout_s, 1.0)))
            return True
        except BackendError as exc:
            if isinstance(exc.__cause__, DaytonaConflictError):  # 409 "state change in progress" (sandbox.service.ts start())
                log.info("start of %s: %s; waiting for the state change to finish", sandbox.id, exc.__cause__)
                return False
            # Newer API code answers the same conflict as a 400 (SandboxError): wait if the state moved on.
            if status_of(exc.__cause__) == 400 and await self.refresh(sandbox) not in ("stopped", "archived", "paused"):
                log.info("start of %s: %s; its state is changing, waiting", sandbox.id, exc.__cause__)
                return False
            raise

    async def refresh(self, sandbox: Any) -> str:
        """The sandbox's state now. Raises SandboxGone if it no longer exists or is being destroyed."""
        try:
            await self._api("check the sandbox", lambda: sandbox.refresh_data(request_timeout=API_REQUEST_TIMEOUT_S))
        except BackendError as exc:
            if isinstance(exc.__cause__, DaytonaNotFoundError):
                raise SandboxGone(f"The sandbox {sandbox.id} no longer exists (deleted, or ephemeral and stopped).") from exc
            raise
        state = state_name(sandbox)
        if state in GONE_STATES:
            raise SandboxGone(f"The sandbox {sandbox.id} was deleted ({state}).")
        return state
