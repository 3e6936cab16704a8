"""Kernel-side magics: ``%sync``, ``%upload``, ``%download`` and ``%daytona``.

They act on the user's own files or on the kernel, so they run here, not in
the sandbox (a cell of only these lines never reaches the sandbox). Modelled on
ipykernel's ``KernelMagics``: one method per magic, registered by name in
``KERNEL_MAGICS``. The idle checkpoint timer lives here too, since it is
``%daytona checkpoint`` run by a clock.

To add a magic: add its name to ``runtime.framing.KERNEL_MAGICS`` (the sandbox
then tells a user who mixes it with code to give it a cell of its own) and a
``magic_<name>(args)`` method to ``KernelMagics`` that returns the text to show.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable

from .backends.base import IdleMode
from .cell import Frontend, error_content, stderr, stdout
from .config import SessionSettings
from .engines import MAP_USAGE, EnginePool
from .errors import BackendError, DaytonaKernelError, RuntimeCallError, UsageError
from .idle import CHECKPOINT_FILE, checkpoint_path, resumed_notice
from .mirror.mirror import WorkdirMirror, notify
from .mirror.plan import SyncReport
from .protocol import checkpointed, file_changes, restored
from .runtime.calls import Checkpoint, ListFileChanges, Restore
from .runtime.framing import KERNEL_MAGICS
from .supervisor import ContextSupervisor, Live

__all__ = ["KERNEL_MAGICS", "KernelMagics"]


class KernelMagics:
    """See the module docstring."""

    def __init__(
        self,
        supervisor: ContextSupervisor,
        mirror: WorkdirMirror | None,
        settings: SessionSettings,
        log: logging.Logger,
        attach: Callable[[Frontend, list[str]], Awaitable[str]] | None = None,
        pool: EnginePool | None = None,
    ) -> None:
        self._supervisor = supervisor
        self._pool = pool  # %%daytona map's engines
        self._attach = attach  # the session's %daytona attach
        self._sandbox = supervisor.sandbox
        self._mirror = mirror
        self._settings = settings
        self._log = log
        self._frontend: Frontend | None = None
        self._handlers: dict[str, Callable[[str], Any]] = {name: getattr(self, f"magic_{name}") for name in KERNEL_MAGICS}

    async def run(self, lines: list[tuple[str, str]], frontend: Frontend) -> dict[str, Any] | None:
        """Run a cell of kernel magics, line by line. Returns the error, if any (also emitted)."""
        self._frontend = frontend
        try:
            for name, args in lines:
                try:
                    text = await self._handlers[name](args)
                except UsageError as exc:  # as ipykernel shows one: a line on stderr, the reply says error
                    frontend.emit("stream", stderr(f"UsageError: {exc}\n"))
                    return {"ename": exc.ename, "evalue": str(exc), "traceback": []}
                except DaytonaKernelError as exc:
                    content = error_content(exc.ename, str(exc))
                    frontend.emit("error", content)
                    return content
                if text:
                    frontend.emit("stream", stdout(text))
            return None
        finally:
            self._frontend = None

    async def _ready(self) -> Live:
        """The live context, in a running sandbox: a sandbox that pauses when idle is resumed first
        (one state check; ``%daytona status`` does not call this, so it shows a paused sandbox as it is)."""
        live = await self._supervisor.ready()
        if self._sandbox.idle_mode is IdleMode.PAUSE:
            took = await self._supervisor.resume(None)
            if took is not None and self._frontend is not None:
                self._frontend.emit("stream", stderr(resumed_notice(took)))
        return live

    def _mirror_for(self, name: str) -> WorkdirMirror:
        if self._mirror is None:
            raise BackendError(f"%{name}: the mirror is not available (the sandbox did not start).")
        return self._mirror

    def _notify(self, report: SyncReport) -> None:
        if self._frontend is not None:
            notify(report, self._frontend)

    async def magic_sync(self, args: str) -> str:
        mirror = self._mirror_for("sync")
        await self._ready()
        if args.split()[:1] == ["status"]:
            return await asyncio.to_thread(mirror.status)
        report = await mirror.push()
        changes = await self._supervisor.call(ListFileChanges(synced=mirror.handover()), file_changes)
        if changes.changed or changes.deleted or changes.truncated or mirror.holds_files:
            report.merge(await mirror.pull(changes, retry_failed=True))
        self._notify(report)
        return report.summary() + "\n"

    async def magic_upload(self, args: str) -> str:
        mirror = self._mirror_for("upload")
        source, dest = _one_or_two(args, "upload")
        await self._ready()
        report = await mirror.upload_paths(source, dest)
        self._notify(report)
        return f"uploaded {len(report.up)} file(s), {report.bytes_up} bytes\n"

    async def magic_download(self, args: str) -> str:
        mirror = self._mirror_for("download")
        source, dest = _one_or_two(args, "download")
        await self._ready()
        report = await mirror.download_paths(source, dest)
        self._notify(report)
        return f"downloaded {len(report.down)} file(s), {report.bytes_down} bytes\n" if report.down else ""

    async def magic_daytona(self, args: str) -> str:
        command = args.split()[0] if args.split() else ""
        if command == "status":
            return await self._status_text()
        if command == "checkpoint":
            return await self._checkpoint()
        if command == "restore":
            return await self._restore()
        if command == "recreate":
            return await self._recreate()
        if command == "attach" and self._attach is not None and self._frontend is not None:
            return await self._attach(self._frontend, args.split()[1:])
        if command == "map" and self._pool is not None:
            if args.split()[1:] != ["--close"]:
                raise UsageError(f"%daytona map: as a line magic it only closes the engines. {MAP_USAGE}")
            return await self._pool.close()
        raise UsageError(
            "Usage: %daytona status | %daytona checkpoint | %daytona restore | %daytona recreate | %daytona attach [--force] [SESSION]"
            " | %daytona map --close"
        )

    async def _recreate(self) -> str:
        """Delete the sandbox and create one with the current configuration (after config drift)."""
        old = self._sandbox.id
        live = await self._supervisor.recreate(None)
        self._log.info("recreated sandbox %s as %s (pid %s)", old, self._sandbox.id, live.pid)
        return (
            f"recreated: {self._sandbox.description} replaces {old}. Variables were reset and packages "
            "installed with %pip are gone; files on the volume are intact.\n"
        )

    async def _checkpoint(self) -> str:
        live = await self._ready()
        path = checkpoint_path(self._sandbox)
        reply = await self._supervisor.call(Checkpoint(path=CHECKPOINT_FILE), checkpointed)
        text = f"checkpoint: saved {len(reply.saved)} variable(s) with {reply.pickler} ({reply.size} bytes) to {path}"
        if reply.skipped:
            text += "\nnot picklable, skipped: " + ", ".join(reply.skipped)
        self._log.info("checkpoint in context of pid %s", live.pid)
        return text + "\n"

    async def _restore(self) -> str:
        live = await self._ready()
        try:
            reply = await self._supervisor.call(Restore(path=CHECKPOINT_FILE), restored)
        except RuntimeCallError as exc:
            raise RuntimeCallError(
                f"%daytona restore: {exc}. Is there a checkpoint yet? `%daytona checkpoint` makes one."
            ) from exc
        text = f"restored {len(reply.restored)} variable(s): " + ", ".join(reply.restored)
        if reply.failed:
            text += "\ncould not restore: " + ", ".join(reply.failed)
        self._log.info("restore in context of pid %s", live.pid)
        return text + "\n"

    async def _status_text(self) -> str:
        info = {"backend": self._settings.backend}
        try:
            await self._supervisor.ready()  # the first cell may be this one: show the sandbox, not "not created yet"
            info.update(await self._sandbox.info())
        except DaytonaKernelError as exc:
            info["sandbox"] = f"unavailable: {exc}"
        live = self._supervisor.live
        info["interpreter"] = f"Python {live.python}, pid {live.pid}" if live is not None else "not started"
        if self._mirror is not None:
            info["mirror"] = f"{self._mirror.mode}: {self._mirror.local_root} <-> {self._sandbox.workdir}"
        if self._pool is not None:
            info["map engines"] = self._pool.describe()
        if self._supervisor.journal is not None:
            try:
                info["other sessions"] = await self._supervisor.journal.status(live.context.id if live else None)
            except DaytonaKernelError as exc:
                info["other sessions"] = f"unknown: {exc}"
        width = max(len(k) for k in info) + 1
        return "".join(f"{k + ':':<{width}} {v}\n" for k, v in info.items())


def _one_or_two(args: str, name: str) -> tuple[str, str | None]:
    words = args.split()
    if not words or len(words) > 2:
        raise UsageError(f"Usage: %{name} PATH [DEST]")
    return words[0], words[1] if len(words) > 1 else None
