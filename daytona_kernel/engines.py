"""``%%daytona map N``: one cell run on N engines, each a sandbox of its own (see docs/fanout.md).

An engine is a sandbox made like the main one (a Daytona sandbox, or on the local
backend a folder with its own worker process), with the project's files and the
same runtime, driven by its own ``ContextSupervisor``. Engines keep their
variables between map cells, like ipyparallel's engines; a map cell with another
N grows or shrinks the pool, and ``%daytona map --close`` (or the kernel's
shutdown) deletes them.

Output is shown the way ipyparallel's ``%%px`` shows it: every stream line
prefixed ``[stdout:R] `` or ``[stderr:R] ``, rich outputs with ``worker: R`` in
their metadata (the key keeps its old name: notebooks and tools read it) after a one-line header, one status line while the cell runs,
and one error naming each engine that failed. ``--scatter`` and ``--gather`` move
values as pickles through the files API; the kernel never unpickles them.
"""

from __future__ import annotations

import argparse
import asyncio
import keyword
import logging
import posixpath
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .backends.base import RunError, Sandbox
from .cell import Cell, CellOutcome, Frontend, error_content, stderr
from .config import SessionSettings
from .engine_output import CellLines, EngineOutput
from .errors import BackendError, DaytonaKernelError, QuotaExceeded, SandboxNotRunning, UsageError
from .ladder import RunEnd, settle
from .mirror.mirror import WorkdirMirror
from .mirror.plan import SyncReport
from .outputs import OutputBudget, OutputPolicy
from .protocol import fanout_done
from .request import RUNTIME_CALL_TIMEOUT_S, Request, fetcher, run_in
from .runtime import call_source
from .runtime.calls import Dump, Gather, Prelude, RunCell, RuntimeOptions, Scatter, Synced
from .supervisor import ContextSupervisor, Live

INTERRUPT_EXEC_TIMEOUT_S = 10.0
AUTO_STOP_MARGIN_S = 60.0  # an engine idle this close to its auto-stop is checked before a cell
PICKLE_MAX_BYTES = 512 * 1024 * 1024  # one rank's pickled values in transit; a sandbox decides their size, the kernel holds them
TRANSFER_FOLDER = ".daytona-kernel/fanout"  # in the working directory, where neither the mirror nor the volume's copy looks
MAP_USAGE = (
    "Usage: %%daytona map N [--scatter NAME[,NAME...]] [--gather NAME[,NAME...]] (first line of a cell), or %daytona map --close"
)

Spawn = Callable[[int], "tuple[Sandbox, WorkdirMirror | None]"]
"""Makes engine number ``serial``'s sandbox (not started yet) and the mirror that gives it the project's files."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would print and exit
        raise UsageError(f"%%daytona map: {message}. {MAP_USAGE}")


def _names(value: str) -> list[str]:
    names = [n.strip() for n in value.split(",") if n.strip()]
    bad = [n for n in names if not n.isidentifier() or keyword.iskeyword(n)]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"{', '.join(bad) or repr(value)} is not a variable name")
    return names


@dataclass(frozen=True)
class MapSpec:
    """The arguments of one ``%%daytona map`` line."""

    engines: int
    scatter: tuple[str, ...] = ()
    gather: tuple[str, ...] = ()


def parse_map(args: str) -> MapSpec:
    """``map 4 --scatter xs --gather total`` (the words after ``%%daytona``). Raises UsageError."""
    parser = _Parser(prog="%%daytona map", add_help=False)
    parser.add_argument("command", choices=["map"])
    parser.add_argument("engines", type=int, metavar="engines")
    parser.add_argument("--scatter", type=_names, action="append", default=[])
    parser.add_argument("--gather", type=_names, action="append", default=[])
    ns = parser.parse_args(args.split())
    if ns.engines < 1:
        raise UsageError(f"%%daytona map: N must be 1 or more, not {ns.engines}. {MAP_USAGE}")
    scatter = tuple(dict.fromkeys(n for group in ns.scatter for n in group))
    gather = tuple(dict.fromkeys(n for group in ns.gather for n in group))
    return MapSpec(ns.engines, scatter, gather)


@dataclass
class Engine:
    """One engine: its sandbox, the supervisor of its context, and the mirror that gives it the project's files."""

    sandbox: Sandbox
    supervisor: ContextSupervisor
    mirror: WorkdirMirror | None
    state: str = "starting"
    request: Request | None = None  # the run in flight
    live: Live | None = None
    interrupted: bool = False
    restarted_by_watchdog: bool = False
    watchdog: asyncio.Future[None] | None = None
    last_used: float = field(default_factory=time.time)  # when it last ran a cell: wall clock, as Daytona counts idle time


@dataclass
class EngineRun:
    """How one engine's part of a map cell ended."""

    rank: int
    error: dict[str, Any] | None = None
    dump: str = ""  # the file holding its gathered values, in its sandbox
    interrupted: bool = False


def in_transit(token: str, what: str, rank: int) -> str:
    """A pickle in transit, relative to a sandbox's working directory (as the runtime takes it)."""
    return posixpath.join(TRANSFER_FOLDER, f"{token}-{what}-{rank}.pkl")


def full_path(sandbox: Sandbox, rel: str) -> str:
    """The same file for the files API."""
    return posixpath.join(sandbox.workdir, rel)


async def read_pickles(sandbox: Sandbox, paths: list[str], what: Callable[[int], str]) -> list[bytes]:
    """The pickles at ``paths`` (relative to the working directory), each at most PICKLE_MAX_BYTES: the
    sandbox writes them, so the download stops at that size instead of holding whatever it wrote.
    ``what(i)`` names the i-th for a message (``--gather: engine 2's values``)."""
    full = [full_path(sandbox, p) for p in paths]
    got = await sandbox.toolbox.download(full, limits=dict.fromkeys(full, PICKLE_MAX_BYTES))
    out = []
    for i, path in enumerate(full):
        value = got.get(path)
        if getattr(value, "over_limit", False):
            raise UsageError(
                f"{what(i)} are more than {PICKLE_MAX_BYTES // 2**20} MB pickled: too much to pass through the kernel. "
                "Write them to a file in the engine (a volume, or %download) instead."
            )
        if not isinstance(value, bytes):
            raise BackendError(f"{what(i)}: could not be read back from the sandbox ({getattr(value, 'message', 'missing')}).")
        out.append(value)
    return out


class EnginePool:
    """The engines of one kernel. See the module docstring."""

    def __init__(
        self,
        spawn: Spawn,
        settings: SessionSettings,
        log: logging.Logger,
        outputs: OutputPolicy,
        start_in: str = "",
        scratch: Path | None = None,
    ) -> None:
        self._spawn = spawn
        self._scratch = scratch  # this machine's folder of the engines' mirror records, deleted at close
        self._settings = settings
        self._log = log
        self._outputs = outputs
        self._start_in = start_in
        self.engines: list[Engine] = []
        self._serials = 0
        self._running = False
        self._interrupted = False
        self._starting = ""  # what the status line says while engines start
        self.undeleted: list[str] = []  # engines Daytona would not delete, for the next line the user reads

    # -- the pool ----------------------------------------------------------

    def describe(self) -> str:
        """One line for ``%daytona status``."""
        if not self.engines:
            return "none (`%%daytona map N` starts them)"
        listed = ", ".join(f"{rank}: {w.sandbox.id} ({w.state})" for rank, w in enumerate(self.engines))
        return f"{len(self.engines)} ({listed}); `%daytona map --close` ends them"

    async def resize(self, n: int, size: str, frontend: Frontend) -> None:
        """Grow or shrink the pool to ``n`` engines (each ``size`` as configured: the status line says so while they start).
        Engines that cannot start (the organisation's quota, or any other failure) are left out, with
        one line saying so; raises if none is left."""
        if n > self._settings.fan_out_max:
            raise UsageError(
                f"%%daytona map {n}: at most fan_out_max={self._settings.fan_out_max} engines. Raise "
                "DaytonaKernel.fan_out_max (each engine is a sandbox of its own, billed while it runs)."
            )
        extra, self.engines = self.engines[n:], self.engines[:n]  # the highest ranks go, all at once
        await asyncio.gather(*(self._end(w) for w in extra))
        missing = n - len(self.engines)
        if missing <= 0:
            return
        new = [self._new_engine() for _ in range(missing)]
        more = "" if not self.engines else f" more (the pool had {len(self.engines)})"
        self._starting = f"starting {missing} engine{'s' if missing > 1 else ''}{more}, each {size}"
        self.engines.extend(new)
        self._show_states(frontend)
        try:
            results = await asyncio.gather(*(self._start(w, frontend) for w in new), return_exceptions=True)
        finally:
            self._starting = ""
        failed = [(w, r) for w, r in zip(new, results) if isinstance(r, BaseException)]
        for engine, _ in failed:
            if engine in self.engines:  # else the pool was closed meanwhile (a shutdown)
                self.engines.remove(engine)
        running = [w for w, r in zip(new, results) if not isinstance(r, BaseException)]
        if running:  # said once they run: before, the status line says it (docs/status.md)
            plural = "s" if len(running) > 1 else ""
            size = running[0].sandbox.size_text  # as created (the main sandbox's may not be fetched yet)
            frontend.notice(
                f"daytona-kernel: started {len(running)} engine{plural}{more}; each is {size}. `%daytona map --close` ends them.\n"
            )
        reports = [r for r in results if isinstance(r, SyncReport)]
        if reports and reports[0].notices():  # every engine gets the same files: said once
            frontend.notice(reports[0].notices())
        if failed:
            await asyncio.gather(*(self._end(w) for w, _ in failed))
            undeleted = self.take_undeleted()
            if undeleted:
                frontend.notice(undeleted)
            for _, exc in failed:
                if not isinstance(exc, Exception):
                    raise exc  # a cancellation goes on, once the half-started engines are gone
            self._say_short(n, [exc for _, exc in failed], frontend)

    def _new_engine(self) -> Engine:
        sandbox, mirror = self._spawn(self._serials)  # a new number each: never the labels of one being deleted
        self._serials += 1
        supervisor = ContextSupervisor(  # nothing comes down from an engine
            sandbox, self._settings, self._log, RuntimeOptions(sync_down=False, start_in=self._start_in)
        )
        return Engine(sandbox, supervisor, mirror)

    async def _start(self, engine: Engine, frontend: Frontend) -> SyncReport:
        """Start an engine's sandbox and runtime, and give it the project's files."""

        def show(text: str) -> None:  # what the engine waits for (creating, a rate limit ...) in the status line
            if text:
                engine.state = text.rstrip("…")
                self._show_states(frontend)

        await engine.supervisor.ready(show)
        report = await engine.mirror.push() if engine.mirror is not None else SyncReport()
        engine.state = "ready"
        self._show_states(frontend)
        return report

    def _say_short(self, wanted: int, failures: list[BaseException], frontend: Frontend) -> None:
        """One line: how many engines run, and why the others did not start; raises when none does."""
        reasons = list(dict.fromkeys(_first_line_of(exc) for exc in failures if isinstance(exc, Exception)))
        if not self.engines:
            first = failures[0]
            raise first if isinstance(first, DaytonaKernelError) else BackendError(f"No engine could start: {reasons[0]}")
        why = (
            "the organisation's quota is used up"
            if any(isinstance(e, QuotaExceeded) for e in failures)
            else "the others could not start"
        )
        n = len(self.engines)
        frontend.emit(
            "stream",
            stderr(
                f"daytona-kernel: {n} of {wanted} engines started; {why}: {'; '.join(reasons)}. The cell runs on {n} (world = {n}).\n"
            ),
        )

    async def _end(self, engine: Engine) -> None:
        """Delete an engine's sandbox (stop its process), whatever state its start reached: the supervisor has the
        backend look for a sandbox a start cut short made all the same, and wait out a change of state under way."""
        try:
            await engine.supervisor.shutdown()
        except DaytonaKernelError as exc:
            self._log.warning("could not delete engine %s: %s", engine.sandbox.id, exc)
            self.undeleted.append(f"engine {engine.sandbox.id}: {exc}")

    async def close(self) -> str:
        """``%daytona map --close`` and the kernel's shutdown: delete every engine."""
        engines, self.engines = self.engines, []
        await asyncio.gather(*(self._end(w) for w in engines))
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
        text = f"closed {len(engines)} engine{'s' if len(engines) != 1 else ''}\n" if engines else "no engines to close\n"
        return text + self.take_undeleted()

    def take_undeleted(self) -> str:
        """The engines Daytona would not delete since the last call (each may still be billed), with the way out."""
        undeleted, self.undeleted = self.undeleted, []
        return "".join(f"daytona-kernel: could not delete {line}\n" for line in undeleted)

    def _show_states(self, frontend: Frontend) -> None:
        states = "  ".join(f"[{rank}] {w.state}" for rank, w in enumerate(self.engines))
        frontend.progress(f"{self._starting}: {states}" if self._starting else f"engines: {states}")

    # -- a map cell -----------------------------------------------------------

    async def run(self, spec: MapSpec, body: str, cell: Cell, frontend: Frontend, main: ContextSupervisor) -> CellOutcome:
        """Run ``body`` on ``spec.engines`` engines. Every failure becomes the cell's one error."""
        self._interrupted = False
        self._running = True
        try:
            await main.ready(frontend.progress)  # engines are made like the main sandbox, so it comes first
            if not self._interrupted:
                await self.resize(spec.engines, main.sandbox.size_text, frontend)
            if self._interrupted:
                return _interrupted_before_start(frontend)
            mapped = MapCell(spec, body, cell, list(self.engines), frontend, self._settings, self._outputs, self._log)
            return await mapped.run(main)
        except DaytonaKernelError as exc:
            return failed_cell(exc, frontend)
        finally:
            self._running = False
            frontend.progress("")

    # -- interrupt -------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._running

    async def interrupt(self) -> None:
        """SIGINT to every engine that runs the cell (their variables are kept); an engine that ignores it
        for ``interrupt_grace`` seconds has its context restarted, as the main sandbox's would."""
        self._interrupted = True
        await asyncio.gather(*(self._interrupt(w) for w in self.engines if w.request is not None))

    async def _interrupt(self, engine: Engine) -> None:
        request, live = engine.request, engine.live
        if request is None or live is None:
            return
        engine.interrupted = True
        try:
            result = await engine.sandbox.toolbox.exec(f"kill -INT {live.pid}", timeout=INTERRUPT_EXEC_TIMEOUT_S)
            sent = result.exit_code == 0
        except DaytonaKernelError as exc:
            self._log.warning("could not interrupt engine %s: %s", engine.sandbox.id, exc)
            sent = False
        if engine.watchdog is None or engine.watchdog.done():
            engine.watchdog = asyncio.ensure_future(
                self._watchdog(engine, request, live, self._settings.interrupt_grace if sent else 0.0)
            )

    async def _watchdog(self, engine: Engine, request: Request, live: Live, grace: float) -> None:
        try:
            await asyncio.wait_for(request.done.wait(), grace)
            return
        except asyncio.TimeoutError:
            self._log.warning("engine %s ignored the interrupt for %ss; restarting its context", engine.sandbox.id, grace)
        engine.restarted_by_watchdog = True
        await engine.supervisor.close_quietly(live.context)


class MapCell:
    """One map cell on the pool's engines: scatter, every engine's run, gather, the combined error."""

    def __init__(
        self,
        spec: MapSpec,
        body: str,
        cell: Cell,
        engines: list[Engine],
        frontend: Frontend,
        settings: SessionSettings,
        outputs: OutputPolicy,
        log: logging.Logger,
    ) -> None:
        self.spec = spec
        self.body = body
        self.cell = cell
        self.engines = engines
        self.world = len(engines)
        self.token = secrets.token_hex(6)  # names this cell's files in transit
        self._frontend = frontend
        self._settings = settings
        self._outputs = outputs
        self._log = log
        self._lines = CellLines(frontend)  # every output of the cell (engine_output.py)
        self._budget = OutputBudget(settings.output_limit_chars)  # the whole cell's, as for any cell
        self._scattered: dict[int, bytes] = {}

    def _status(self) -> None:
        self._frontend.progress("engines: " + "  ".join(f"[{rank}] {w.state}" for rank, w in enumerate(self.engines)))

    async def run(self, main: ContextSupervisor) -> CellOutcome:
        if self.spec.scatter:
            self._scattered = await self._scatter(main)
        for engine in self.engines:
            engine.state = "running"
        self._status()
        runs = await asyncio.gather(*(self._run_on(w, rank) for rank, w in enumerate(self.engines)))
        self._lines.end_line()
        failed = [r for r in runs if r.error is not None]
        if failed:
            content = combined_error(failed, self.world, any(r.interrupted for r in runs))
            self._lines.emit("error", content)
            return CellOutcome(error=content)
        if self.spec.gather:
            await self._gather(runs, main)
        return CellOutcome()

    async def _scatter(self, main: ContextSupervisor) -> dict[int, bytes]:
        """Pickle each rank's chunks in the main sandbox and bring them here (as bytes, never unpickled)."""
        await main.ready()
        paths = [in_transit(self.token, "scatter", rank) for rank in range(self.world)]
        scattered = await main.call(Scatter(names=list(self.spec.scatter), paths=paths), fanout_done)
        if scattered.error:
            raise UsageError(scattered.error)
        try:
            chunks = await read_pickles(main.sandbox, paths, lambda rank: f"--scatter: rank {rank}'s chunks")
        finally:
            await self._remove_quietly(main.sandbox, paths)
        return dict(enumerate(chunks))

    async def _gather(self, runs: list[EngineRun], main: ContextSupervisor) -> None:
        """Bring each engine's pickled values into the main sandbox, where they become lists in rank order."""

        def values_of(rank: int) -> Callable[[int], str]:
            return lambda _: f"--gather: engine {rank}'s values"

        got = await asyncio.gather(*(read_pickles(w.sandbox, [r.dump], values_of(r.rank)) for w, r in zip(self.engines, runs)))
        paths, files = [], []
        for run, (blob,) in zip(runs, got):
            path = in_transit(self.token, "gather", run.rank)
            paths.append(path)
            files.append((blob, full_path(main.sandbox, path)))
        await asyncio.gather(*(self._remove_quietly(w.sandbox, [r.dump]) for w, r in zip(self.engines, runs)))
        await main.ready()
        await main.sandbox.toolbox.upload(files)
        gathered = await main.call(Gather(names=list(self.spec.gather), paths=paths), fanout_done)
        if gathered.error:
            raise BackendError(gathered.error)

    async def _remove_quietly(self, sandbox: Sandbox, paths: list[str]) -> None:
        """Delete files in transit (paths relative to the working directory)."""
        try:
            await sandbox.toolbox.remove(paths)
        except DaytonaKernelError as exc:
            self._log.warning("could not remove %s from %s: %s", paths, sandbox.id, exc)

    def _code(self, rank: int, chunk: str, dump: str, synced: Synced | None) -> str:
        """One engine's request: the prelude (rank, world, its chunks), the cell, the dump of its gathered values."""
        c = self.cell
        code = call_source(Prelude(rank=rank, world=self.world, path=chunk))
        code += call_source(RunCell(code=self.body, count=c.count, store_history=c.store_history, silent=c.silent, synced=synced))
        if self.spec.gather:
            code += call_source(Dump(names=list(self.spec.gather), path=dump))
        return code

    async def _run_on(self, engine: Engine, rank: int) -> EngineRun:
        """One engine's part: its scattered chunks up, the cell, its values to gather written down. An engine
        whose sandbox stopped (or, being ephemeral, was deleted by auto-stop) is made again first."""
        out = EngineOutput(rank, self._lines)
        result = EngineRun(rank)
        engine.interrupted = engine.restarted_by_watchdog = False
        if self.spec.gather:
            result.dump = in_transit(self.token, "gather", rank)
        try:
            try:
                request = await self._attempt(engine, await self._live(engine), rank, result, out)
            except SandboxNotRunning as exc:  # nothing ran: a fresh sandbox, with the files and chunks again
                live = await self._recover(engine, exc, out)
                request = await self._attempt(engine, live, rank, result, out)
            result.error = request.error
            if result.error is None and self.spec.gather:
                result.error = _dump_error(request.reply)
        except DaytonaKernelError as exc:
            result.error = error_content(exc.ename, str(exc))
        finally:
            out.flush()
            engine.request = None
            engine.last_used = time.time()
        result.interrupted = engine.interrupted
        engine.state = ("interrupted" if engine.interrupted else "failed") if result.error else "done"
        self._status()
        return result

    async def _live(self, engine: Engine) -> Live:
        """The engine's context. After an idle time that auto-stop may have ended it in, one ``pass`` finds
        out first (a stopped sandbox refuses even the upload of the files, with a 404 once deleted)."""
        live = await engine.supervisor.ready()
        stop_s = self._settings.auto_stop_interval * 60.0
        if stop_s and time.time() - engine.last_used >= stop_s - AUTO_STOP_MARGIN_S:
            await live.context.run_code("pass", _drop, _drop, RUNTIME_CALL_TIMEOUT_S)
        return live

    async def _recover(self, engine: Engine, cause: SandboxNotRunning, out: EngineOutput) -> Live:
        live = await engine.supervisor.recover(cause, None)
        out.notice(f"{cause} It was started again: its variables were reset, the project's files copied in again.")
        return live

    async def _attempt(self, engine: Engine, live: Live, rank: int, result: EngineRun, out: EngineOutput) -> Request:
        synced = await self._push(engine, out)
        chunk = ""
        if rank in self._scattered:
            chunk = in_transit(self.token, "scatter", rank)
            await engine.sandbox.toolbox.upload([(self._scattered[rank], full_path(engine.sandbox, chunk))])
        return await self._execute(engine, live, self._code(rank, chunk, result.dump, synced), out)

    async def _push(self, engine: Engine, out: EngineOutput) -> Synced | None:
        if engine.mirror is None:
            return None
        try:
            self._lines.notice((await engine.mirror.push()).notices())  # the same files for each: said once
        except (DaytonaKernelError, OSError) as exc:
            out.notice(f"could not copy the project's files to this engine: {exc}")
        return engine.mirror.handover()

    async def _execute(self, engine: Engine, live: Live, code: str, out: EngineOutput) -> Request:
        """Run ``code`` in the engine, read as the session reads a cell (the error ladder, a worker the
        daemon replaced, a sandbox that stopped)."""
        timeout = self._settings.run_timeout
        started = time.monotonic()
        exception: BackendError | None = None
        run_error: RunError | None = None
        engine.live = live

        async def run(live: Live) -> RunError | None:
            request = engine.request = Request(
                live.token, out.emit, None, self._outputs, self._budget, fetch=fetcher(engine.supervisor.sandbox)
            )
            return await run_in(live.context, code, request, timeout, finish=False)  # finished once settled

        def finish() -> None:
            if engine.request is not None:
                engine.request.finish()

        def replaced() -> None:  # the first run read nothing: that the variables were reset comes before the output
            finish()
            for notice in engine.supervisor.take_notices():
                out.notice(notice)

        try:
            try:
                run_error = await engine.supervisor.run_installed(live, run, replaced)
            except SandboxNotRunning:  # nothing ran: the caller makes the engine again
                finish()
                raise
        except BackendError as exc:
            exception = exc
        request = engine.request
        assert request is not None  # run() made it
        await request.settle()  # the cell's large outputs, fetched from the engine's sandbox
        request.finish()
        for notice in engine.supervisor.take_notices():
            out.notice(notice)
        end = RunEnd(
            exception,
            run_error,
            engine.interrupted,
            engine.restarted_by_watchdog,
            cell_error=(request.error or {}).get("ename"),
            elapsed_s=time.monotonic() - started,
        )
        verdict = settle(end, timeout or 0.0, self._settings.interrupt_grace)
        if verdict.restart_context:
            engine.supervisor.restart_context()
        if verdict.notice:
            out.notice(verdict.notice)
        if verdict.error is not None:
            request.fail(verdict.error, overrides=verdict.overrides)
        return request


def failed_cell(exc: DaytonaKernelError, frontend: Frontend) -> CellOutcome:
    """The cell's one error. A UsageError is shown as ipykernel shows one: a line on stderr, and the
    reply says error."""
    if isinstance(exc, UsageError):
        frontend.emit("stream", stderr(f"UsageError: {exc}\n"))
        return CellOutcome(error={"ename": exc.ename, "evalue": str(exc), "traceback": []})
    content = error_content(exc.ename, str(exc))
    frontend.emit("error", content)
    return CellOutcome(error=content)


def _interrupted_before_start(frontend: Frontend) -> CellOutcome:
    frontend.emit(
        "stream",
        stderr("daytona-kernel: interrupted before the cell ran; engines that started are kept for the next map cell.\n"),
    )
    content = error_content("KeyboardInterrupt", "Interrupted by user")
    frontend.emit("error", content)
    return CellOutcome(error=content)


def _dump_error(reply: dict[str, Any] | None) -> dict[str, Any] | None:
    if reply is None:
        return error_content("RuntimeCallError", "--gather: the engine did not write its values.")
    dumped = fanout_done(reply)
    return error_content("GatherError", dumped.error) if dumped.error else None


def combined_error(failed: list[EngineRun], world: int, interrupted: bool) -> dict[str, Any]:
    """The cell's one error: each failed engine and its exception, then each one's traceback (ipyparallel's
    CompositeError); an interrupt is a KeyboardInterrupt, as in any other cell."""
    listed = "; ".join(f"[{r.rank}] {r.error['ename']}: {_first_line(r.error)}" for r in failed if r.error)
    if interrupted:
        ename, evalue = "KeyboardInterrupt", f"Interrupted by user; the engines keep their variables ({listed})"
    else:
        ename, evalue = "CompositeError", f"{len(failed)} of {world} engines failed: {listed}"
    traceback = [f"\x1b[0;31m{ename}\x1b[0m: {evalue}"]
    for run in failed:
        assert run.error is not None
        traceback.append(f"[{run.rank}:execute] {run.error['ename']}: {_first_line(run.error)}")
        traceback.extend(run.error.get("traceback") or [])
    return {"ename": ename, "evalue": evalue, "traceback": traceback}


def _drop(text: str) -> None:
    """Output of the liveness check: there is none to show."""


def _first_line_of(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0].rstrip(".") if lines else type(exc).__name__


def _first_line(error: dict[str, Any]) -> str:
    lines = str(error.get("evalue", "")).strip().splitlines()
    return lines[0] if lines else ""
