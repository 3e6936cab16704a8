"""Calls into the live context beside the cells: the client the comm bridge (``delivery.py``) and the
debugger (``debugger.py``) share.

What they send reaches the sandbox one of two ways: while a cell runs, as a file uploaded to the running
cell's inbox (never queued behind the cell); while no cell runs, in a call of its own, one at a time with
the cells (``InFlight.lock``), run as every call is (``request.run_in``) for as long as a cell may run.
"""

from __future__ import annotations

import asyncio
import logging
import posixpath
from typing import Callable

from .backends.base import RunError, Sandbox
from .config import SessionSettings
from .outputs import OutputPolicy
from .request import InFlight, Request, run_in
from .supervisor import ContextSupervisor, Live

WAIT_S = 0.01  # how often a message waits for the running cell's inbox, or for the end of another call


class ContextClient:
    """See the module docstring. ``outputs`` is the session's output policy, for the requests of its calls."""

    def __init__(
        self,
        sandbox: Sandbox,
        supervisor: ContextSupervisor,
        settings: SessionSettings,
        outputs: OutputPolicy,
        inflight: InFlight,
        log: logging.Logger,
    ) -> None:
        self.sandbox = sandbox
        self.supervisor = supervisor
        self.settings = settings
        self.outputs = outputs
        self.inflight = inflight
        self.log = log

    async def cell_inbox(self, ready: Callable[[], bool] = lambda: True) -> str | None:
        """Once a cell runs with an inbox (and ``ready()``): that inbox, where an upload reaches the running cell;
        None as soon as no cell runs and no other call holds the context (then a call of its own goes in)."""
        inflight = self.inflight
        while True:
            if inflight.in_cell and inflight.cell_inbox is not None and ready():
                return inflight.cell_inbox
            if not inflight.in_cell and not inflight.lock.locked():
                return None
            await asyncio.sleep(WAIT_S)

    async def upload(self, inbox: str, name: str, content: bytes) -> None:
        """One file into the running cell's inbox (``cell_inbox``)."""
        await self.sandbox.toolbox.upload([(content, posixpath.join(inbox, name))])

    @property
    def idle(self) -> bool:
        """No cell runs and no other call holds the context."""
        return not self.inflight.in_cell and not self.inflight.lock.locked()

    async def call(self, live: Live, code: str, request: Request) -> RunError | None:
        """``code`` in ``live`` while no cell runs (the caller holds ``inflight.lock``), read by ``request``, which
        is the request in flight meanwhile (an interrupt stops it as it would a cell)."""
        self.inflight.request = request
        try:
            return await run_in(live.context, code, request, self.settings.run_timeout)
        finally:
            self.inflight.request = None
