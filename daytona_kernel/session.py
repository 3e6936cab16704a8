"""The session: runs cells in the sandbox, through the runtime installed there.

It wires the parts together for one kernel: the ``ContextSupervisor`` (the live
context), a ``Request`` per run (decodes the output into typed events), the
error ``ladder`` (how a bad ending is shown), the ``WorkdirMirror`` (files up
before a cell, down after it), the ``KernelMagics`` and the interrupt
watchdog. It knows nothing about Jupyter messages: output goes to a
``Frontend`` as ``(kind, content)`` events.
"""

from __future__ import annotations

import asyncio
import json
import logging
import posixpath
import shlex
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable

from .attach import Adopted, KernelIdentity, SessionJournal
from .backends.base import LOCAL_ATTACH, IdleMode, RunError, Sandbox
from .cell import Cell, CellOutcome, Frontend, error_content, stderr
from .config import SessionSettings
from .errors import BackendError, ConnectionLost, DaytonaKernelError, Interrupted, SandboxNotRunning, SandboxPaused, UsageError
from .fanout import WorkerPool, failed_cell, parse_map
from .idle import IdleCheckpoint, resumed_notice
from .ladder import RunEnd, settle
from .magics import KernelMagics
from .outputs import OutputBudget, OutputPolicy
from .protocol import FileChanges, volume_synced
from .request import InputBridge, Request, fetcher
from .runtime import call_source
from .runtime.calls import Adopt, CommOptions, CommTable, Complete, Deliver, Inspect, RunCell, RuntimeOptions, Synced, SyncVolume
from .supervisor import ContextSupervisor, Live, runtime_missing
from .sync import WorkdirMirror, notify

if TYPE_CHECKING:
    from .comms import CommBridge

INTERRUPT_EXEC_TIMEOUT_S = 10.0
GAVE_UP_QUEUED = (
    "This cell had not started: it waited behind a cell whose connection was cut, which still runs in the sandbox "
    "and ignores the interrupt. This cell will not run; your variables are kept. The next cell waits until that "
    "cell ends; restart the kernel to end it now (variables are lost then).\n"
)
AUTO_PAUSE_MARGIN_S = 60.0  # a cell this close to the sandbox's auto-pause checks for a pause first
STILL_STARTING = "The sandbox is still starting in the background; the next cell waits for it.\n"
COMM_WAIT_S = 0.01  # how often a frontend message waits for the cell's inbox or the end of another call


class RuntimeSession:
    """Runs cells in one sandbox, one context at a time. See the module docstring."""

    def __init__(
        self,
        sandbox: Sandbox,
        settings: SessionSettings,
        log: logging.Logger,
        mirror: WorkdirMirror | None = None,
        start_in: str = "",
        identity: KernelIdentity | None = None,
        pool: WorkerPool | None = None,
    ) -> None:
        self.sandbox = sandbox
        self.pool = pool  # %%daytona map's workers
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
        self.supervisor = ContextSupervisor(sandbox, settings, log, options, self.journal)
        if mirror is not None and mirror.notice:
            self.supervisor.notices.append(mirror.notice)
        self.adopted: Adopted | None = None  # set by an attach, taken by the kernel (execution count, history)
        self.magics = KernelMagics(self.supervisor, mirror, settings, log, self.attach, pool)
        self._idle_checkpoint = IdleCheckpoint(self.supervisor, settings, log)
        self._current: Request | None = None
        self.comms: CommBridge | None = None  # widgets: the kernel's comm bridge (comms.py), if it has one
        self.in_cell = False  # a cell's request is under way (frontend comm messages then go to its inbox)
        self._cell_inbox: str | None = None  # where frontend comm messages go while the cell runs
        self._run_lock = asyncio.Lock()  # one call in the context at a time: a cell, or a comm delivery
        self._watchdog: asyncio.Future[None] | None = None
        # After a cell's connection was cut while it ran on in the sandbox, the next cell's job waits behind it in
        # the daemon's queue (docs/reattach.md): an interrupt then reaches that cut cell, not the one the user sees.
        self._cut_cell_may_run = False
        self._heard = False  # the current run has received output: its job has left the queue
        self._attempt_task: asyncio.Future[RunError | None] | None = None
        self._gave_up_on: Request | None = None  # the run the watchdog ended while it still waited in the queue
        self._marker: str | None = None  # the note left for that run's job, until a later run shows it was read
        self._cell_count = 0
        self._stop_waiting: asyncio.Event | None = None  # set by an interrupt while a cell waits for the sandbox
        self._stop_following: asyncio.Event | None = None  # set by an interrupt while %daytona attach follows a cell
        self._shut_down = False
        # When this kernel last kept the sandbox busy, by the wall clock: Daytona counts idle time by it, and a
        # monotonic clock stands still while a laptop sleeps (the sandbox may pause meanwhile).
        self._last_cell_end = time.time()

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
        self._idle_checkpoint.disarm()
        if self.pool is not None:
            await self.pool.close()  # workers never outlive their kernel, a restart included
        if self.sandbox.volume_dir and self.supervisor.live is not None and self._current is None:
            # finish the volume's copy of the working directory before the sandbox goes
            reply = await self.supervisor.query(SyncVolume())
            if reply is not None and not volume_synced(reply).done:
                self._log.warning("the volume's copy of the working directory was still being written at shutdown")
        await self.supervisor.shutdown(restart)

    # -- requests --------------------------------------------------------

    async def execute(self, cell: Cell, frontend: Frontend) -> CellOutcome:
        """Run one cell. Every failure becomes the cell's one error output."""
        self._idle_checkpoint.disarm()
        self.in_cell = True
        try:
            return await self._execute(cell, frontend)
        finally:
            self.in_cell, self._cell_inbox = False, None
            self._last_cell_end = time.time()
            if not self._shut_down:
                self._idle_checkpoint.arm()

    async def kernel_magics(self, lines: list[tuple[str, str]], frontend: Frontend) -> dict[str, Any] | None:
        """Run %sync / %upload / %download / %daytona here in the kernel. Returns the error, if any."""
        return await self.magics.run(lines, frontend)

    async def fan_out(self, args: str, body: str, cell: Cell, frontend: Frontend) -> CellOutcome:
        """A ``%%daytona map`` cell: ``body`` on the workers (docs/fanout.md). The main namespace is
        touched only by ``--gather``."""
        self._idle_checkpoint.disarm()
        try:
            spec = parse_map(args)
            if self.pool is None:
                raise UsageError("%%daytona map is not available in this session.")
            if spec.scatter or spec.gather:  # they run in the main sandbox: a paused one is resumed first
                self._last_cell_end = time.time()  # (only they keep it from being idle)
                if self.sandbox.idle_mode is IdleMode.PAUSE:
                    await self._resume(frontend)
            return await self.pool.run(spec, body, cell, frontend, self.supervisor)
        except DaytonaKernelError as exc:
            return failed_cell(exc, frontend)
        finally:
            if not self._shut_down:
                self._idle_checkpoint.arm()

    async def query(self, call: Complete | Inspect) -> dict[str, Any] | None:
        """A quiet runtime call (complete, inspect): its reply, cleaned by the output policy, or None."""
        return self.outputs.reply(call.METHOD, await self.supervisor.query(call))

    async def _execute(self, cell: Cell, frontend: Frontend) -> CellOutcome:
        try:
            live = await self._ready_unless_interrupted(frontend)
            if live is not None and self._may_have_paused():
                await self._resume(frontend)  # before the cell's files go up: a paused sandbox refuses them
        except DaytonaKernelError as exc:
            content = error_content(exc.ename, str(exc))
            frontend.emit("error", content)
            return CellOutcome(error=content)
        if live is None:
            frontend.emit("stream", stderr(STILL_STARTING))
            content = error_content("KeyboardInterrupt", "Interrupted by user")
            frontend.emit("error", content)
            return CellOutcome(error=content)
        notices = self.supervisor.notices
        while notices:
            frontend.emit("stream", stderr(notices.pop(0)))
        synced = await self._push(frontend)
        comms = self._comm_options(live)
        code = call_source(
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
        bridge = InputBridge(self.sandbox, frontend, self._log)  # input() in the cell asks the frontend
        budget = OutputBudget(self._settings.output_limit_chars)
        async with self._run_lock:
            self._cell_inbox = comms.inbox if comms is not None else None
            self._cell_count = cell.count
            request, end = await self._run(live, code, frontend, bridge if cell.allow_stdin else None, budget)
        request.finish()
        if self.comms is not None:
            self.comms.cell_ended()
        verdict = settle(end, self._timeout() or 0.0, self._settings.interrupt_grace)
        if verdict.restart_context:
            self.supervisor.restart_context()
            if self.comms is not None:
                self.comms.closed_all()
        for notice in self.comms.take_notices() if self.comms is not None else ():
            frontend.emit("stream", stderr(notice))
        if verdict.notice:
            frontend.emit("stream", stderr(verdict.notice))
        if verdict.error is not None:
            request.fail(verdict.error, overrides=verdict.overrides)
        if request.files is not None:
            await self._pull(request.files, frontend)
        if request.error is not None and not request.error_shown:
            frontend.emit("error", request.error)
        return CellOutcome(error=request.error, user_expressions=request.user_expressions, payload=request.payload)

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
        self._gave_up_on = None
        try:
            try:
                run_error = await self._attempt_now(live, code, frontend, bridge, budget)
            except SandboxPaused:  # nothing ran: resume the sandbox; the context and its variables carry on
                await self._resume(frontend)
                run_error = await self._attempt_now(live, code, frontend, bridge, budget)
            except SandboxNotRunning as exc:  # nothing ran: bring the sandbox back, then run the cell there
                live = await self._recover(exc, frontend)
                await self._push(frontend)  # a new sandbox lacks what was only in the old one
                run_error = await self._attempt_now(live, code, frontend, bridge, budget)
        except BackendError as exc:
            exception = exc
        except asyncio.CancelledError:
            if self._gave_up_on is None or self._gave_up_on is not self._current:
                raise  # not the watchdog's doing
            frontend.emit("stream", stderr(GAVE_UP_QUEUED))
            run_error = RunError("KeyboardInterrupt", "Interrupted by user", "")
        finally:
            request = self._current
            self._current = None
            if bridge is not None:
                bridge.cancel()
        assert request is not None
        if isinstance(exception, ConnectionLost):
            self._cut_cell_may_run = True  # it may run on: the next job queues behind it
        elif exception is None and self._gave_up_on is None:
            # this run's job ran, so every job ahead of it (a cut cell, one given up on) has ended
            self._cut_cell_may_run = False
            await self._remove_marker()
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

    async def _attempt_now(
        self, live: Live, code: str, frontend: Frontend, bridge: InputBridge | None, budget: OutputBudget
    ) -> RunError | None:
        """``_attempt`` as a task the interrupt watchdog can end (a run that still waits in the queue)."""
        self._attempt_task = asyncio.ensure_future(self._attempt(live, code, frontend, bridge, budget))
        try:
            return await self._attempt_task
        finally:
            self._attempt_task = None

    async def _attempt(
        self, live: Live, code: str, frontend: Frontend, bridge: InputBridge | None, budget: OutputBudget
    ) -> RunError | None:
        """One run in ``live``. A fresh worker without the runtime (the daemon replaced a dead one)
        answers in the same round trip; the runtime is installed again and the cell run there."""
        request = self._new_request(live, frontend, bridge, budget)
        run_error = await live.context.run_code(code, self._heard_via(request.on_stdout), self._heard_via(request.on_stderr), self._timeout())
        if not runtime_missing(run_error):
            return run_error
        request.finish()
        live = await self.supervisor.rebootstrap(live)
        notices = self.supervisor.notices
        while notices:
            frontend.emit("stream", stderr(notices.pop(0)))
        request = self._new_request(live, frontend, bridge, budget)
        return await live.context.run_code(code, self._heard_via(request.on_stdout), self._heard_via(request.on_stderr), self._timeout())

    def _new_request(self, live: Live, frontend: Frontend, bridge: InputBridge | None, budget: OutputBudget) -> Request:
        on_input = bridge.request if bridge is not None else None
        self._current = Request(live.token, frontend.emit, on_input, self.outputs, budget, self.comms, fetcher(self.sandbox))
        self._heard = False
        return self._current

    def _heard_via(self, callback: Callable[[str], None]) -> Callable[[str], None]:
        """``callback``, noting that the run's job has started (it sends output)."""

        def heard(text: str) -> None:
            self._heard = True
            callback(text)

        return heard

    # -- widgets: frontend comm messages into the sandbox --------------------------

    def _comm_options(self, live: Live) -> CommOptions | None:
        """What the runtime's comm bridge needs for a call: the request's message id, and the inbox
        (named after the interpreter's pid, as input()'s inbox, so ``daytona-kernel gc`` knows it)."""
        if self.comms is None:
            return None
        self.comms.runtime_is(live.token)
        parent = self.comms.request_parent.get("header", {}).get("msg_id", "")
        inbox = posixpath.join(self.sandbox.temp_dir, f"daytona-kernel-inbox-{live.pid}-comms-{live.token[:12]}")
        return CommOptions(parent=parent, inbox=inbox)

    async def deliver_comms(self, batch: list[dict[str, Any]], bridge: CommBridge) -> None:
        """Frontend comm messages into the sandbox: while a cell runs, one file upload to its inbox
        (not queued behind the cell); while idle, a short call of their own, whose output goes under
        the messages. An empty batch while idle fetches what the sandbox holds (a background thread's updates)."""
        while True:
            if self.in_cell and self._cell_inbox is not None:
                if batch:
                    bridge.seq += 1
                    path = posixpath.join(self._cell_inbox, f"comms-{bridge.seq}.json")
                    await self.sandbox.upload([(json.dumps(batch).encode(), path)])
                    bridge.uploaded(bridge.seq, batch)
                return
            if not self.in_cell and not self._run_lock.locked():
                break
            await asyncio.sleep(COMM_WAIT_S)
        live = self.supervisor.live
        if live is None or self._shut_down:  # no interpreter (yet): no comm target is registered there
            bridge.unreachable(batch)
            return
        async with self._run_lock:
            try:
                try:
                    error = await self._deliver_once(live, batch, bridge)
                except SandboxPaused:  # a widget moved after the sandbox paused itself: resume it, as a cell would
                    await self.supervisor.resume(None)
                    error = await self._deliver_once(live, batch, bridge)
            finally:
                bridge.handled([m["header"]["msg_id"] for m in batch])
        if runtime_missing(error):
            bridge.closed_all()  # the interpreter was replaced: its widgets are gone
        elif error is not None:
            self._log.warning("widget messages failed in the sandbox: %s: %s", error.name, error.value)

    async def _deliver_once(self, live: Live, batch: list[dict[str, Any]], bridge: CommBridge) -> RunError | None:
        parent = bridge.request_parent
        budget = OutputBudget(self._settings.output_limit_chars)
        self._current = request = Request(
            live.token, lambda kind, content: bridge.output(kind, content, parent), None, self.outputs, budget, bridge
        )
        try:  # a callback may run as long as a cell may (an interrupt stops it)
            code = call_source(Deliver(messages=batch, comms=self._comm_options(live)))
            return await live.context.run_code(code, request.on_stdout, request.on_stderr, self._timeout())
        finally:
            self._current = None
            request.finish()

    def _timeout(self) -> float | None:
        return self._settings.cell_timeout or None

    def _may_have_paused(self) -> bool:
        """Idle long enough for the sandbox's auto-pause? (A cell that comes sooner pays no request for this.)"""
        pause_s = self.sandbox.auto_pause_s
        return bool(pause_s) and time.time() - self._last_cell_end >= pause_s - AUTO_PAUSE_MARGIN_S

    async def _resume(self, frontend: Frontend) -> bool:
        """Resume a paused sandbox, with one line saying so; False if it was not paused. Raises
        DaytonaKernelError if it cannot."""
        try:
            took = await self.supervisor.resume(frontend.progress)
        finally:
            frontend.progress("")
        if took is not None:
            frontend.emit("stream", stderr(resumed_notice(took)))
        return took is not None

    async def _recover(self, cause: DaytonaKernelError, frontend: Frontend) -> Live:
        generation = self.sandbox.generation
        live = await self.supervisor.recover(cause, frontend.progress)
        notices = self.supervisor.notices  # what bringing it back took (a recovery from an error ...)
        while notices:
            frontend.emit("stream", stderr(notices.pop(0)))
        if self.sandbox.generation != generation:  # gone (deleted, ephemeral auto-stop): another sandbox now
            frontend.emit(
                "stream",
                stderr(
                    f"{cause} Your cell runs in another sandbox ({self.sandbox.id}): variables were reset, "
                    "packages installed with %pip are gone; files on the volume are intact.\n"
                ),
            )
            return live
        restore = " Your variables were checkpointed before the stop: `%daytona restore` brings them back."
        frontend.emit(
            "stream",
            stderr(
                f"{cause} It was started again and your cell runs in a fresh interpreter: "
                "variables were reset; files in the working directory are intact."
                + (restore if self._idle_checkpoint.saved else "")
                + "\n"
            ),
        )
        return live

    # -- attaching to a session another kernel process left ---------------

    async def attach(self, frontend: Frontend, args: list[str]) -> str:
        """``%daytona attach``: replay the detached session's last cell, follow it to its end, then make
        its context this kernel's (namespace, execution count, inputs). See docs/reattach.md."""
        journal = self.journal
        if journal is None:
            raise UsageError(LOCAL_ATTACH)
        live = await self.supervisor.ready(frontend.progress)
        session = await journal.pick(args, live.context.id)
        await journal.claim(session)
        frontend.emit(
            "stream",
            stderr(f"daytona-kernel: attaching to {session.name or 'this folder'}'s session ({session.describe()}); its last cell's output follows.\n"),
        )
        self._stop_following = asyncio.Event()
        try:
            followed = await journal.follow(session, frontend, self._stop_following)
        except Interrupted:
            await journal.release(session)
            raise Interrupted(
                "Interrupted by user: stopped following the session's cell, which goes on in the sandbox. "
                "`%daytona attach` follows it again; this kernel keeps its fresh namespace."
            ) from None
        finally:
            self._stop_following = None
        if not followed:
            await journal.end(session, "its interpreter died")
            raise BackendError(
                "The session's interpreter ended while it ran detached (out of memory, or killed); its variables are gone. "
                "This kernel keeps its fresh namespace."
            )
        context = await self.sandbox.adopt_context(session.context_id)
        old = await self.supervisor.adopt(Live(context, session.token, session.pid, session.python))
        if old is not None:
            await journal.forget(old.id)
        reply = await self.supervisor.call_code("attach", call_source(Adopt(instance=journal.identity.instance)))
        self.adopted = journal.adopted(reply)
        return (
            f"attached: {reply.get('variables')} variable(s), execution count {self.adopted.count}{await self._adopt_comms()}; "
            "your next cells run in this session.\n"
        )

    async def _adopt_comms(self) -> str:
        """The attached session's widgets become this kernel's (reload the page to see them again)."""
        if self.comms is None:
            return ""
        self.comms.closed_all()
        count = self.comms.adopt(await self.supervisor.query(CommTable()))
        if self.supervisor.live is not None:
            self.comms.runtime_is(self.supervisor.live.token)
        return f", {count} widget(s) (reload the page to see them)" if count else ""

    async def auto_attach(self, frontend: Frontend) -> None:
        """With attach='auto', attach before the first cell when a session of this notebook was found."""
        if self.journal is None or self._settings.attach != "auto":
            return
        try:
            await self.supervisor.ready(frontend.progress)
        except DaytonaKernelError:
            return  # the cell itself reports it
        if not self.journal.take_auto():
            return
        try:
            frontend.emit("stream", stderr(await self.attach(frontend, [])))
        except DaytonaKernelError as exc:
            frontend.emit("stream", stderr(f"daytona-kernel: could not attach to the previous session: {exc}\n"))

    def take_adopted(self) -> Adopted | None:
        adopted, self.adopted = self.adopted, None
        return adopted

    # -- the workdir mirror ------------------------------------------------

    async def _push(self, frontend: Frontend, resumed: bool = False) -> Synced | None:
        """Upload local changes before a cell; returns the mirror's note for the runtime. Never fails the cell.

        An upload that fails because the sandbox was paused meanwhile (from the dashboard, or by auto-pause
        while this laptop slept) resumes it and uploads again, so the cell sees the files edited meanwhile.
        """
        if self.mirror is None:
            return None
        try:
            report = await self.mirror.push(frontend.progress)
        except (DaytonaKernelError, OSError) as exc:
            frontend.progress("")
            if not resumed and isinstance(exc, DaytonaKernelError) and await self._resume_after(exc, frontend):
                return await self._push(frontend, resumed=True)
            frontend.emit("stream", stderr(f"Could not sync your folder to the sandbox: {exc}\n"))
            return self.mirror.handover()
        finally:
            frontend.progress("")
        notify(report, frontend)
        return self.mirror.handover()

    async def _resume_after(self, failure: DaytonaKernelError, frontend: Frontend) -> bool:
        """Did ``failure`` come from a sandbox that was paused? Then it is resumed now."""
        try:
            return await self._resume(frontend)
        except DaytonaKernelError as exc:
            self._log.warning("after %s, the sandbox could not be resumed: %s", failure, exc)
            return False

    async def _pull(self, changes: FileChanges, frontend: Frontend) -> None:
        """Download what the cell changed, before the cell's reply."""
        if self.mirror is None:
            return
        try:
            report = await self.mirror.pull(changes.as_dict())
        except (DaytonaKernelError, OSError) as exc:
            frontend.emit("stream", stderr(f"Could not copy the cell's files back from the sandbox: {exc}\n"))
            return
        notify(report, frontend)

    # -- interrupts --------------------------------------------------------

    async def interrupt(self) -> None:
        """Send SIGINT to the worker; restart the context if the cell does not yield.

        Returns once the signal is sent; the watchdog waits in the background.
        """
        if self.pool is not None and self.pool.running:  # a %%daytona map cell: every worker
            await self.pool.interrupt()
            return
        if self._stop_waiting is not None:  # the cell still waits for the sandbox: stop waiting
            self._stop_waiting.set()
            return
        if self._stop_following is not None:  # %daytona attach follows a cell: stop following it
            self._stop_following.set()
            return
        request, live = self._current, self.supervisor.live
        if request is None or live is None:
            return
        request.interrupted = True
        sent = await self._send_sigint(live)
        grace = self._settings.interrupt_grace if sent else 0.0
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = asyncio.ensure_future(self._interrupt_watchdog(request, live, grace))

    async def _skip_when_dequeued(self, live: Live) -> None:
        """Leave the runtime's note that the current cell must not run (``run_cell`` looks for it first)."""
        from .runtime.runtime import CANCELLED_CELL

        marker = CANCELLED_CELL % (live.pid, self._cell_count)
        try:
            result = await self.sandbox.exec(f"touch {shlex.quote(marker)}", timeout=INTERRUPT_EXEC_TIMEOUT_S)
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
            await self.sandbox.exec(f"rm -f {shlex.quote(marker)}", timeout=INTERRUPT_EXEC_TIMEOUT_S)
        except DaytonaKernelError as exc:
            self._log.warning("could not remove %s: %s", marker, exc)

    async def _send_sigint(self, live: Live) -> bool:
        try:
            result = await self.sandbox.exec(f"kill -INT {live.pid}", timeout=INTERRUPT_EXEC_TIMEOUT_S)
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
        if self._cut_cell_may_run and not self._heard and request is self._current and attempt is not None:
            # Its job has not started: the SIGINT went to a cut cell that ignores it. End this run, leave the
            # context (and every variable) alone, and make the job return at once when its turn comes.
            self._log.warning("the cell waits behind a cut cell that ignores the interrupt; ending the wait, not the context")
            await self._skip_when_dequeued(live)
            self._gave_up_on = request
            attempt.cancel()
            return
        self._log.warning("the cell ignored the interrupt for %ss; restarting the context", grace)
        request.restarted_by_watchdog = True
        await self.supervisor.close_quietly(live.context)
