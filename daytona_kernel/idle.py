"""What happens while a notebook is idle: the checkpoint taken before auto-stop would end an idle
sandbox (``checkpoint_on_idle``), where it is kept, and the line shown after a paused sandbox resumed."""

from __future__ import annotations

import asyncio
import logging
import posixpath

from .backends.base import IdleMode, Sandbox
from .config import SessionSettings
from .errors import DaytonaKernelError
from .protocol import checkpointed
from .runtime.calls import Checkpoint
from .supervisor import ContextSupervisor

IDLE_CHECKPOINT_LEAD_S = 60.0  # checkpoint this long before auto-stop would stop an idle sandbox
CHECKPOINT_FILE = ".daytona-kernel/checkpoint.pkl"  # in the working directory, on the sandbox's disk


def checkpoint_path(sandbox: Sandbox) -> str:
    """Where the checkpoint is, for the user; the runtime is sent CHECKPOINT_FILE, relative to its working directory."""
    return posixpath.join(sandbox.workdir, CHECKPOINT_FILE)


def resumed_notice(took_s: float) -> str:
    """The one line after a paused sandbox was resumed."""
    return f"resumed the paused sandbox in {took_s:.1f} s; your variables are intact\n"


class IdleCheckpoint:
    """With checkpoint_on_idle, save the variables shortly before an idle sandbox is auto-stopped.
    A sandbox that pauses instead keeps its variables, so it is not checkpointed.

    What it costs: the checkpoint is itself a toolbox request, so Daytona counts it as activity
    (the proxy reports every toolbox request as activity) and the auto-stop clock starts again. An idle sandbox with
    checkpoint_on_idle stops about 2 × auto_stop_interval after the last cell, not 1 ×. It fires
    once per idle period (the next cell re-arms it), so it never keeps a sandbox up for longer.
    """

    def __init__(self, supervisor: ContextSupervisor, settings: SessionSettings, log: logging.Logger) -> None:
        self._supervisor = supervisor
        self._settings = settings
        self._log = log
        self._timer: asyncio.Future[None] | None = None
        self.saved = False  # a checkpoint exists from this kernel: %daytona restore can bring it back

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def arm(self) -> None:
        minutes = self._settings.auto_stop_interval
        if self._supervisor.sandbox.idle_mode is IdleMode.PAUSE:
            return
        if self._settings.checkpoint_on_idle and minutes:
            delay = max(minutes * 60 - IDLE_CHECKPOINT_LEAD_S, IDLE_CHECKPOINT_LEAD_S)
            self._timer = asyncio.ensure_future(self._checkpoint_after(delay))

    async def _checkpoint_after(self, delay: float) -> None:
        await asyncio.sleep(delay)
        try:
            reply = await self._supervisor.call(Checkpoint(path=CHECKPOINT_FILE), checkpointed)
        except DaytonaKernelError as exc:
            self._log.warning("the idle checkpoint failed: %s", exc)
            return
        self._log.info("idle checkpoint: saved %s, skipped %s", reply.saved, reply.skipped)
        self.saved = True
