"""The session: runs cells in the sandbox, through the runtime installed there.

It builds the parts for one kernel, each with what it needs, and runs a cell through
them: the ``ContextSupervisor`` (the live context), ``Upkeep`` (the sandbox resumed
or recovered, the mirror's files up before a cell and down after it), a ``Request``
per run (decodes the output into typed events), the error ``ladder`` (how a bad
ending is shown), ``Interrupts`` (SIGINT and the watchdog), ``CommDelivery`` and the
``CommBridge`` (widgets), the ``Attacher`` and the ``KernelMagics``. It knows nothing
about Jupyter messages: output goes to a ``Frontend`` as ``(msg_type, content)``.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any

from .backends.base import IdleMode, RunError, Sandbox
from .cell import Cell, CellOutcome, Frontend, error_content, stderr
from .comms import CommBridge, Publisher
from .config import SessionSettings
from .context_client import ContextClient
from .debugger import DebugRelay
from .delivery import CommDelivery, comm_options
from .engines import EnginePool, failed_cell, parse_map
from .errors import BackendError, DaytonaKernelError, FolderNotSynced, SandboxNotRunning, SandboxPaused, UsageError
from .idle import IdleCheckpoint
from .interrupts import Interrupts
from .journal import KernelIdentity, SessionJournal
from .ladder import RunEnd, settle
from .magics import KernelMagics
from .mirror.mirror import WorkdirMirror
from .outputs import OutputBudget, OutputPolicy
from .protocol import completion, inspection, volume_synced
from .reattach import Attacher
from .request import InFlight, InputBridge, Request, fetcher, run_in
from .runtime import call_source
from .runtime.calls import CommOptions, Complete, Inspect, RunCell, RuntimeOptions, Synced, SyncVolume
from .supervisor import ContextSupervisor, Live
from .upkeep import LivePulls, Upkeep
from .widgetrules import WidgetPolicy

GAVE_UP_QUEUED = (
    "This cell had not started: it waited behind a cell whose connection was cut, which still runs in the sandbox "
    "and ignores the interrupt. This cell will not run; your variables are kept. The next cell waits until that "
    "cell ends; restart the kernel to end it now (variables are lost then).\n"
)
STILL_STARTING = "The sandbox is still starting in the background; the next cell waits for it.\n"


class SandboxSession:
    """Runs cells in one sandbox, one context at a time. See the module docstring."""

    def __init__(
        self,
        sandbox: Sandbox,
        settings: SessionSettings,
        log: logging.Logger,
        mirror: WorkdirMirror | None = None,
        start_in: str = "",
        identity: KernelIdentity | None = None,
        pool: EnginePool | None = None,
        publisher: Publisher | None = None,
    ) -> None:
        self.sandbox = sandbox
        self.pool = pool  # %%daytona map's engines
        self.mirror = mirror
        self._settings = settings
        self._log = log
        options = mirror.runtime_options() if mirror else RuntimeOptions()
        if start_in:  # the notebook's sub-folder of the mirrored folder: where cells start
            options = replace(options, start_in=start_in)
        self.outputs = OutputPolicy(settings.output_trusted)  # what the sandbox's output may do in the browser
        self.journal: SessionJournal | None = None  # sessions that outlive the kernel process (docs/reattach.md)
        if sandbox.supports_attach:
            self.journal = SessionJournal(sandbox, settings, identity or KernelIdentity("", ""), self.outputs, log)
        notices = [mirror.notice] if mirror is not None and mirror.notice else []
        self.supervisor = ContextSupervisor(sandbox, settings, log, options, self.journal, notices)
        self._idle_checkpoint = IdleCheckpoint(self.supervisor, settings, log)
        self.upkeep = Upkeep(sandbox, self.supervisor, mirror, self._idle_checkpoint, log)  # resume, recover, push, pull
        self.inflight = InFlight()  # what runs in the context now
        self.interrupts = Interrupts(sandbox, self.supervisor, settings, log, self.inflight)
        client = ContextClient(sandbox, self.supervisor, settings, self.outputs, self.inflight, log)  # calls beside cells
        self.delivery = CommDelivery(client)  # widgets
        self.debugger = DebugRelay(client)  # debug_request
        self.interrupts.debugged = self.debugger.started_on
        self.comms: CommBridge | None = None  # widgets: the comm bridge (comms.py), when a kernel publishes them
        if publisher is not None:
            self.comms = CommBridge(publisher, WidgetPolicy(self.outputs, frozenset(settings.widget_modules)), log, self.delivery)
        self.attacher = Attacher(sandbox, self.supervisor, self.journal, self.comms, settings.attach)
        self.magics = KernelMagics(self.supervisor, mirror, settings, log, self.attacher.attach, pool)
        self._stop_waiting: asyncio.Event | None = None  # set by an interrupt while a cell waits for the sandbox
        self._live_pulls: LivePulls | None = None  # the running cell's files, copied while it runs
        self._shut_down = False

    # -- lifecycle -------------------------------------------------------

    def start(self) -> None:
        """Begin provisioning in the background, so the first cell rarely waits."""
        self.supervisor.start()

    async def ready(self) -> Live:
        return await self.supervisor.ready()

    @property
    def python_version(self) -> str | None:
        return self.supervisor.python_version

    async def shutdown(self, restart: bool = False) -> None:
        """Stop the timers, then release the sandbox (kept for the next process on a restart). Safe to call twice."""
        self._shut_down = True
        self.delivery.close()
        self._idle_checkpoint.disarm()
        if self.pool is not None:
            await self.pool.close()  # engines never outlive their kernel, a restart included
        flush = None
        if self.sandbox.volume_dir and self.supervisor.live is not None and self.inflight.request is None:
            flush = self._flush_volume
        await self.supervisor.shutdown(restart, before_ending=flush)

    async def _flush_volume(self) -> None:
        """Finish the volume's copy of the working directory while its interpreter lives, before the context goes
        (at a restart, while the next context is made). The interpreter's exit copies only what it can finish."""
        reply = await self.supervisor.query(SyncVolume(), volume_synced)
        if reply is not None and not reply.done:
            self._log.warning("the volume's copy of the working directory was still being written at shutdown")

    # -- requests --------------------------------------------------------

    async def execute(self, cell: Cell, frontend: Frontend) -> CellOutcome:
        """Run one cell. Every failure becomes the cell's one error output."""
        self._idle_checkpoint.disarm()
        self.inflight.in_cell = True
        try:
            return await self._execute(cell, frontend)
        finally:
            self.inflight.in_cell, self.inflight.cell_inbox = False, None
            self.upkeep.busy()
            if not self._shut_down:
                self._idle_checkpoint.arm()

    async def kernel_magics(self, lines: list[tuple[str, str]], frontend: Frontend) -> dict[str, Any] | None:
        """Run %sync / %upload / %download / %daytona here in the kernel. Returns the error, if any."""
        return await self.magics.run(lines, frontend)

    async def fan_out(self, args: str, body: str, cell: Cell, frontend: Frontend) -> CellOutcome:
        """A ``%%daytona map`` cell: ``body`` on the engines (docs/fanout.md). The main namespace is
        touched only by ``--gather``."""
        self._idle_checkpoint.disarm()
        try:
            spec = parse_map(args)
            if self.pool is None:
                raise UsageError("%%daytona map is not available in this session.")
            if spec.scatter or spec.gather:  # they run in the main sandbox: a paused one is resumed first
                self.upkeep.busy()  # (only they keep it from being idle)
                if self.sandbox.idle_mode is IdleMode.PAUSE:
                    await self.upkeep.resume(frontend)
            return await self.pool.run(spec, body, cell, frontend, self.supervisor)
        except DaytonaKernelError as exc:
            return failed_cell(exc, frontend)
        finally:
            if not self._shut_down:
                self._idle_checkpoint.arm()

    async def query(self, call: Complete | Inspect) -> dict[str, Any] | None:
        """A quiet runtime call (complete, inspect): its reply's fields, cleaned by the output policy, or None."""
        if isinstance(call, Complete):
            return self.outputs.reply(await self.supervisor.query(call, completion))
        return self.outputs.reply(await self.supervisor.query(call, inspection))

    async def _execute(self, cell: Cell, frontend: Frontend) -> CellOutcome:
        try:
            live = await self._ready_unless_interrupted(frontend)
            if live is not None and self.upkeep.may_have_paused():
                await self.upkeep.resume(frontend)  # before the cell's files go up: a paused sandbox refuses them
        except DaytonaKernelError as exc:
            return _failed(exc, frontend)
        if live is None:
            frontend.emit("stream", stderr(STILL_STARTING))
            content = error_content("KeyboardInterrupt", "Interrupted by user")
            frontend.emit("error", content)
            return CellOutcome(error=content)
        try:
            synced = await self.upkeep.push(frontend)
        except FolderNotSynced as exc:  # the cell would see a partial folder
            self.supervisor.show_notices(frontend)
            return _failed(exc, frontend)
        self.supervisor.show_notices(frontend)  # after the sync: its status line shows only before any output
        comms = comm_options(self.comms, live, self.sandbox.temp_dir)
        code = cell_code(cell, synced, comms)
        bridge = InputBridge(self.sandbox, frontend, self._log)  # input() in the cell asks the frontend
        budget = OutputBudget(self._settings.output_limit_chars)
        self._live_pulls = self.upkeep.live_pulls(frontend)  # files the cell writes, copied while it runs
        async with self.inflight.lock:
            self.inflight.cell_inbox = comms.inbox if comms is not None else None
            self.interrupts.begin(cell.count)
            request, end = await self._run(live, code, frontend, bridge if cell.allow_stdin else None, budget)
        request.finish()
        held = await self._finish_live_pulls()
        if self.comms is not None:
            self.comms.cell_ended()
        verdict = settle(end, self._settings.run_timeout or 0.0, self._settings.interrupt_grace)
        if verdict.restart_context:
            self.supervisor.restart_context()
            if self.comms is not None:
                self.comms.closed_all()
        for notice in self.comms.take_notices() if self.comms is not None else ():
            frontend.notice(notice)
        if verdict.notice:
            frontend.notice(verdict.notice)
        if verdict.error is not None:
            request.fail(verdict.error, overrides=verdict.overrides)
        if request.files is not None:
            await self.upkeep.pull(request.files, frontend, held)
        if request.error is not None and not request.error_shown:
            frontend.emit("error", request.error)
        return CellOutcome(error=request.error, user_expressions=request.user_expressions, payload=request.payload)

    async def _finish_live_pulls(self) -> list[str]:
        """Wait for the copies made while the cell ran; the new files they left in the sandbox, for the last notice."""
        live, self._live_pulls = self._live_pulls, None
        return await live.finish() if live is not None else []

    async def _ready_unless_interrupted(self, frontend: Frontend) -> Live | None:
        """The live context, or None if the user interrupted the wait for it (provisioning goes on)."""
        stop = self._stop_waiting = asyncio.Event()
        waiting = asyncio.ensure_future(self.supervisor.ready(frontend.progress))
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({waiting, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._stop_waiting = None
            stopped.cancel()
            if not waiting.done():
                waiting.cancel()  # only this wait: ready() shields the provisioning itself
                await asyncio.wait({waiting})  # its cleanup clears the status line
        return None if waiting.cancelled() else waiting.result()

    async def _run(
        self, live: Live, code: str, frontend: Frontend, bridge: InputBridge | None, budget: OutputBudget
    ) -> tuple[Request, RunEnd]:
        """Run the cell's code; a sandbox found stopped is started again and the cell run there."""
        run_error: RunError | None = None
        exception: BackendError | None = None
        started = asyncio.get_running_loop().time()
        try:
            try:
                run_error = await self.interrupts.attempt(self._attempt(live, code, frontend, bridge, budget))
            except SandboxPaused:  # nothing ran: resume the sandbox; the context and its variables carry on
                await self.upkeep.resume(frontend)
                run_error = await self.interrupts.attempt(self._attempt(live, code, frontend, bridge, budget))
            except SandboxNotRunning as exc:  # nothing ran: bring the sandbox back, then run the cell there
                live = await self.upkeep.recover(exc, frontend)
                await self.upkeep.push(frontend, strict=False)  # a new sandbox lacks what was only in the old one
                run_error = await self.interrupts.attempt(self._attempt(live, code, frontend, bridge, budget))
        except BackendError as exc:
            exception = exc
        except asyncio.CancelledError:
            if not self.interrupts.gave_up():
                raise  # not the watchdog's doing
            frontend.emit("stream", stderr(GAVE_UP_QUEUED))
            run_error = RunError("KeyboardInterrupt", "Interrupted by user", "")
        finally:
            request = self.inflight.request
            self.inflight.request = None
            if bridge is not None:
                bridge.cancel()
        assert request is not None
        await self.interrupts.ran(exception)
        await request.settle()
        request.finish()
        end = RunEnd(
            exception,
            run_error,
            request.interrupted,
            request.restarted_by_watchdog,
            cell_error=(request.error or {}).get("ename"),
            elapsed_s=asyncio.get_running_loop().time() - started,
        )
        return request, end

    async def _attempt(
        self, live: Live, code: str, frontend: Frontend, bridge: InputBridge | None, budget: OutputBudget
    ) -> RunError | None:
        """One run in ``live``, in a worker that has the runtime (``ContextSupervisor.run_installed``)."""

        async def run(live: Live) -> RunError | None:
            request = self._new_request(live, frontend, bridge, budget)
            return await run_in(  # finished once its large strings are fetched (_run)
                live.context, code, request, self._settings.run_timeout, heard=self.interrupts.heard_via, finish=False
            )

        def replaced() -> (
            None
        ):  # the first run's request ends; the notice that the variables were reset comes before the cell's output
            if self.inflight.request is not None:
                self.inflight.request.finish()
            self.supervisor.show_notices(frontend)

        return await self.supervisor.run_installed(live, run, replaced)

    def _new_request(self, live: Live, frontend: Frontend, bridge: InputBridge | None, budget: OutputBudget) -> Request:
        on_input = bridge.request if bridge is not None else None
        request = self.inflight.request = Request(
            live.token, frontend.emit, on_input, self.outputs, budget, self.comms, fetcher(self.sandbox), self.debugger.receive
        )
        if self._live_pulls is not None:
            request.on_partial_files = self._live_pulls.add
        self.interrupts.new_request()
        return request

    # -- interrupts --------------------------------------------------------

    async def interrupt(self) -> None:
        """Stop what runs: a map cell's engines, the wait for the sandbox, an attach that follows a cell,
        or the run in the context (``interrupts.Interrupts``). Returns once the signal is sent."""
        if self.pool is not None and self.pool.running:  # a %%daytona map cell: every engine
            await self.pool.interrupt()
            return
        if self._stop_waiting is not None:  # the cell still waits for the sandbox: stop waiting
            self._stop_waiting.set()
            return
        if self.attacher.stop_following():  # %daytona attach follows a cell: it stops following it
            return
        await self.interrupts.interrupt()


def cell_code(cell: Cell, synced: Synced | None, comms: CommOptions | None) -> str:
    """The code that runs ``cell`` in the runtime: a ``RunCell`` call, with the mirror's note and the comm inbox."""
    return call_source(
        RunCell(
            code=cell.code,
            count=cell.count,
            store_history=cell.store_history,
            silent=cell.silent,
            allow_stdin=cell.allow_stdin,
            user_expressions=cell.user_expressions,
            synced=synced,
            comms=comms,
        )
    )


def _failed(exc: DaytonaKernelError, frontend: Frontend) -> CellOutcome:
    """A cell that did not run: its one error."""
    content = error_content(exc.ename, str(exc))
    frontend.emit("error", content)
    return CellOutcome(error=content)
