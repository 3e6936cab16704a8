"""Around a cell: the sandbox brought back (resumed when paused, started again or replaced when stopped) and
the workdir mirror's files up before the cell and down after it, each with its line for the user."""

from __future__ import annotations

import logging
import time

from .backends.base import Sandbox
from .cell import Frontend, stderr
from .errors import DaytonaKernelError
from .idle import IdleCheckpoint, resumed_notice
from .protocol import FileChanges
from .runtime.calls import Synced
from .supervisor import ContextSupervisor, Live
from .sync import WorkdirMirror, notify

AUTO_PAUSE_MARGIN_S = 60.0  # a cell this close to the sandbox's auto-pause checks for a pause first


class Upkeep:
    """See the module docstring. ``busy()`` notes that this kernel kept the sandbox busy just now."""

    def __init__(
        self,
        sandbox: Sandbox,
        supervisor: ContextSupervisor,
        mirror: WorkdirMirror | None,
        idle_checkpoint: IdleCheckpoint,
        log: logging.Logger,
    ) -> None:
        self._sandbox = sandbox
        self._supervisor = supervisor
        self._mirror = mirror
        self._idle_checkpoint = idle_checkpoint
        self._log = log
        # When this kernel last kept the sandbox busy, by the wall clock: Daytona counts idle time by it, and a
        # monotonic clock stands still while a laptop sleeps (the sandbox may pause meanwhile).
        self.last_busy = time.time()

    def busy(self) -> None:
        self.last_busy = time.time()

    def may_have_paused(self) -> bool:
        """Idle long enough for the sandbox's auto-pause? (A cell that comes sooner pays no request for this.)"""
        pause_s = self._sandbox.auto_pause_s
        return bool(pause_s) and time.time() - self.last_busy >= pause_s - AUTO_PAUSE_MARGIN_S

    async def resume(self, frontend: Frontend) -> bool:
        """Resume a paused sandbox, with one line saying so; False if it was not paused. Raises
        DaytonaKernelError if it cannot."""
        try:
            took = await self._supervisor.resume(frontend.progress)
        finally:
            frontend.progress("")
        if took is not None:
            frontend.emit("stream", stderr(resumed_notice(took)))
        return took is not None

    async def recover(self, cause: DaytonaKernelError, frontend: Frontend) -> Live:
        generation = self._sandbox.generation
        live = await self._supervisor.recover(cause, frontend.progress)
        self._supervisor.show_notices(frontend)  # what bringing it back took (a recovery from an error ...)
        if self._sandbox.generation != generation:  # gone (deleted, ephemeral auto-stop): another sandbox now
            frontend.notice(
                f"{cause} Your cell runs in another sandbox ({self._sandbox.id}): variables were reset, "
                "packages installed with %pip are gone; files on the volume are intact.\n"
            )
            return live
        restore = " Your variables were checkpointed before the stop: `%daytona restore` brings them back."
        frontend.notice(
            f"{cause} It was started again and your cell runs in a fresh interpreter: "
            "variables were reset; files in the working directory are intact."
            + (restore if self._idle_checkpoint.saved else "")
            + "\n"
        )
        return live

    async def push(self, frontend: Frontend, resumed: bool = False) -> Synced | None:
        """Upload local changes before a cell; returns the mirror's note for the runtime. Never fails the cell.

        An upload that fails because the sandbox was paused meanwhile (from the dashboard, or by auto-pause
        while this laptop slept) resumes it and uploads again, so the cell sees the files edited meanwhile.
        """
        if self._mirror is None:
            return None
        try:
            report = await self._mirror.push(frontend.progress)
        except (DaytonaKernelError, OSError) as exc:
            frontend.progress("")
            if not resumed and isinstance(exc, DaytonaKernelError) and await self._resume_after(exc, frontend):
                return await self.push(frontend, resumed=True)
            frontend.emit("stream", stderr(f"Could not sync your folder to the sandbox: {exc}\n"))
            return self._mirror.handover()
        finally:
            frontend.progress("")
        notify(report, frontend)
        return self._mirror.handover()

    async def _resume_after(self, failure: DaytonaKernelError, frontend: Frontend) -> bool:
        """Did ``failure`` come from a sandbox that was paused? Then it is resumed now."""
        try:
            return await self.resume(frontend)
        except DaytonaKernelError as exc:
            self._log.warning("after %s, the sandbox could not be resumed: %s", failure, exc)
            return False

    async def pull(self, changes: FileChanges, frontend: Frontend) -> None:
        """Download what the cell changed, before the cell's reply."""
        if self._mirror is None:
            return
        try:
            report = await self._mirror.pull(changes)
        except (DaytonaKernelError, OSError) as exc:
            frontend.emit("stream", stderr(f"Could not copy the cell's files back from the sandbox: {exc}\n"))
            return
        notify(report, frontend)
