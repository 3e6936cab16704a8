"""The state ladder of a Daytona sandbox: from whatever state the API reports to ``started``, within a
bounded time (docs/daytona-platform.md, "Control plane"). ``DaytonaSandbox`` climbs it at every start;
it holds no sandbox of its own."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from typing import Any, Callable

from daytona.common.errors import DaytonaConflictError, DaytonaNotFoundError

from ...errors import BackendError, SandboxGone
from ..base import ProgressCallback
from .api import (
    API_REQUEST_TIMEOUT_S,
    FAILED_STATES,
    GONE_STATES,
    SANDBOX_START_TIMEOUT_S,
    STARTABLE_STATES,
    STATE_POLL_S,
    call_api,
    quiet,
    state_name,
    status_of,
)
from .workspace import ApiCall

log = logging.getLogger("daytona_kernel.daytona")
DELETE_SETTLE_S = 180.0  # how long a delete refused with 409 is tried again while the sandbox's state changes
# as the kernelspec's launch code: the notebook's folder (the kernel's cwd) is never on the import path
REAP_CODE = "import sys; sys.path[0] == '' and sys.path.pop(0); from daytona_kernel.cli import main; sys.exit(main())"
SETTLED_STATES = ("started", "stopped", "archived", "paused", *FAILED_STATES)  # no change of state under way


class StillChanging(BackendError):
    """Daytona still refuses to delete a sandbox because its state is changing."""


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

    async def delete(self, sandbox: Any, progress: ProgressCallback = quiet, patience_s: float = DELETE_SETTLE_S) -> None:
        """Delete the sandbox, whatever change of state is under way. Daytona refuses a delete with 409 "Sandbox
        state change in progress" while the state differs from the desired one (``destroy()`` in sandbox.service.ts:
        creating, starting, stopping, pausing, resuming, and destroying, a second delete); it is tried again once the
        state settles, for ``patience_s``. A sandbox already gone or being destroyed needs nothing more. Raises
        StillChanging, naming the sandbox and how to end it, if Daytona still refuses."""
        deadline = time.monotonic() + patience_s
        while True:
            try:
                await self._api("delete the sandbox", lambda: sandbox.delete(timeout=API_REQUEST_TIMEOUT_S))
                return
            except BackendError as exc:
                if isinstance(exc.__cause__, DaytonaNotFoundError):
                    return
                if not isinstance(exc.__cause__, DaytonaConflictError):
                    raise
                refusal = exc
            try:
                state = await self.refresh(sandbox)
            except SandboxGone:
                return  # destroying already: an ephemeral sandbox that stopped, or a delete that came first
            if time.monotonic() > deadline:
                raise StillChanging(
                    f"Daytona kept refusing to delete the sandbox {sandbox.id} for {patience_s:g} s ({refusal}; it is "
                    f"{state}): it may still run and be billed. Delete it in the Daytona dashboard, or run `daytona-kernel gc`."
                ) from refusal.__cause__
            progress(f"sandbox {sandbox.id} is {state}; deleting it once that ends…")
            log.info("delete of %s refused while it is %s; trying again", sandbox.id, state)
            await asyncio.sleep(STATE_POLL_S)

    async def settled(self, sandbox: Any, patience_s: float = SANDBOX_START_TIMEOUT_S) -> str:
        """The sandbox's state once no change of state is under way (``starting``, ``creating``, ``resuming`` ...),
        or as it is after ``patience_s``: what a shutdown acts on. ``destroyed`` if it is gone."""
        deadline = time.monotonic() + patience_s
        try:
            state = await self.refresh(sandbox)
            while state not in SETTLED_STATES and time.monotonic() < deadline:
                await asyncio.sleep(STATE_POLL_S)
                state = await self.refresh(sandbox)
        except SandboxGone:
            return "destroyed"
        return state


def hand_over_deletion(sandbox_id: str, api_url: str, target: str) -> None:
    """A sandbox whose state still changes when this process must end (Jupyter gives a kernel's shutdown 5 s): a
    process of its own (``daytona-kernel reap``, in a session of its own so that the kernel's end does not take it
    along) waits for the state to settle and deletes it. The key goes in its environment, never in its arguments."""
    argv = [sys.executable, "-c", REAP_CODE, "reap", sandbox_id, "--api-url", api_url, "--target", target]
    subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True
    )  # stderr: the kernel's log
    log.warning("sandbox %s is still changing state; a background process deletes it once Daytona allows", sandbox_id)


async def reap(sandbox_id: str, api_url: str, target: str, out: Callable[[str], None]) -> int:
    """``daytona-kernel reap``: delete one sandbox once its change of state has ended (``StateLadder.delete``)."""
    from daytona import AsyncDaytona, DaytonaConfig

    async def api(what: str, fn: Callable[[], Any], *, retry: bool = True) -> Any:
        return await call_api(what, fn, retry=retry, api_url=api_url)

    client = AsyncDaytona(
        DaytonaConfig(api_key=os.environ.get("DAYTONA_API_KEY") or None, api_url=api_url, target=target or None)
    )
    try:
        try:
            sandbox = await api("look up the sandbox", lambda: client.get(sandbox_id))
        except BackendError as exc:
            if isinstance(exc.__cause__, DaytonaNotFoundError):
                return 0
            raise
        await StateLadder(api, out).delete(sandbox, out)
        out(f"daytona-kernel: deleted sandbox {sandbox_id} once its change of state had ended")
        return 0
    except BackendError as exc:
        out(f"daytona-kernel: could not delete sandbox {sandbox_id}: {exc}")
        return 1
    finally:
        await client.close()
