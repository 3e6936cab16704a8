"""Around a cell: the sandbox brought back (resumed when paused, started again or replaced when stopped) and
the workdir mirror's files up before the cell and down after it, each with its line for the user."""

from __future__ import annotations

import asyncio
import logging
import time

from .backends.base import Sandbox
from .cell import Frontend, stderr
from .errors import DaytonaKernelError, FolderNotSynced
from .idle import IdleCheckpoint, resumed_notice
from .mirror.mirror import WorkdirMirror, notify
from .mirror.plan import MAX_REPORTED_PATHS
from .protocol import FileChanges
from .runtime.calls import Synced
from .supervisor import ContextSupervisor, Live

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

    async def push(self, frontend: Frontend, resumed: bool = False, strict: bool = True) -> Synced | None:
        """Upload local changes before a cell; returns the mirror's note for the runtime.

        Raises FolderNotSynced (``strict``) when this sync's sync_max_total_mb left local files behind: the
        cell must not run on a partial folder. Any other failure is a notice, and the cell runs.
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
                return await self.push(frontend, resumed=True, strict=strict)
            frontend.emit("stream", stderr(f"Could not sync your folder to the sandbox: {exc}\n"))
            return self._mirror.handover()
        finally:
            frontend.progress("")
        waiting, report.waiting_note = report.waiting_note, ""
        notify(report, frontend)
        if waiting and strict:  # the files uploaded so far are the runtime's to learn with the next cell
            raise FolderNotSynced(f"This cell did not run: {waiting}")
        return self._mirror.handover()

    async def _resume_after(self, failure: DaytonaKernelError, frontend: Frontend) -> bool:
        """Did ``failure`` come from a sandbox that was paused? Then it is resumed now."""
        try:
            return await self.resume(frontend)
        except DaytonaKernelError as exc:
            self._log.warning("after %s, the sandbox could not be resumed: %s", failure, exc)
            return False

    async def pull(self, changes: FileChanges, frontend: Frontend, held: list[str] | None = None) -> None:
        """Download what the cell changed, before the cell's reply. ``held``: new files its running pulls left in
        the sandbox, named in this one notice."""
        if self._mirror is None:
            return
        try:
            report = await self._mirror.pull(changes)
        except (DaytonaKernelError, OSError) as exc:
            frontend.emit("stream", stderr(f"Could not copy the cell's files back from the sandbox: {exc}\n"))
            return
        report.held = (held or []) + report.held
        notify(report, frontend)

    def live_pulls(self, frontend: Frontend) -> LivePulls | None:
        """For one cell: copies the files it writes while it runs (the runtime's partial reports), or None."""
        if self._mirror is None or not self._mirror.syncs_down:
            return None
        return LivePulls(self._mirror, frontend)


class LivePulls:
    """A running cell's files, copied here as the runtime reports them (every few seconds: ``files.LiveReports``),
    one pull at a time: reports that come during a pull wait and go together in the next. ``finish`` waits for the
    last, before the cell's own report is pulled (which skips what came down already with the same stat)."""

    def __init__(self, mirror: WorkdirMirror, frontend: Frontend) -> None:
        self._mirror = mirror
        self._frontend = frontend
        self._pending: dict[str, tuple[int, ...]] = {}
        self._task: asyncio.Future[None] | None = None
        self.held: list[str] = []

    def add(self, changes: FileChanges) -> None:
        room = MAX_REPORTED_PATHS - len(self._pending)  # a hostile sandbox's flood of reports: the rest waits for the last
        self._pending.update(
            changes.changed if len(changes.changed) <= room else dict(list(changes.changed.items())[: max(room, 0)])
        )
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        while self._pending:
            changed, self._pending = self._pending, {}
            try:
                report = await self._mirror.pull(FileChanges(changed, [], False, partial=True))
            except (DaytonaKernelError, OSError) as exc:
                self._frontend.emit(
                    "stream", stderr(f"Could not copy the running cell's files yet: {exc}; they come when it ends.\n")
                )
                self._pending.clear()
                return
            self.held += report.held  # named once, with the cell's own report
            report.held = []
            notify(report, self._frontend)

    async def finish(self) -> list[str]:
        """Wait for the pull under way, if any; what was not pulled yet comes with the cell's own report.
        Returns the new files left in the sandbox so far (``NEW_FILES_PER_CELL``), for that report's notice."""
        self._pending.clear()
        if self._task is not None:
            await asyncio.wait({self._task})
        return self.held
