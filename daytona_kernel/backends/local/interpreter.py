"""The local backend's interpreters: one ``local/worker.py`` subprocess per context, run the way
Daytona's daemon runs its interpreter workers (``InterpreterWorker``, shared with the test emulator),
and read as the SDK reads Daytona's (``LocalContext``).
"""

from __future__ import annotations

import asyncio
import enum
import fcntl
import json
import logging
import os
import re
import signal
import uuid
from pathlib import Path
from typing import Callable

import orjson

from ...errors import BackendError, ContextDied, ContextTimeout
from ..base import Context, OutputCallback, RunError

WORKER_SCRIPT = Path(__file__).with_name("worker.py")
PIPE_READ_BYTES = 64 * 1024
PIPE_BYTES = 1024 * 1024  # the worker's stdout pipe: a whole 384 KiB stream line fits, so the worker need not wait for us
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)  # Linux; in fcntl from Python 3.10
LINE_CAP_BYTES = 1024 * 1024  # the daemon's bufio.Scanner cap: a line this long stops its reader
KILL_GRACE_S = 2.0  # the daemon's gracePeriod: SIGINT, then SIGKILL this much later
STREAM_FIELDS = ("type", "text", "name", "value", "traceback")
LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # after decoding, a pair is one character: what is left is alone

log = logging.getLogger("daytona_kernel.local")

Chunk = dict[str, str]
ChunkSink = Callable[[Chunk], None]


class WorkerEnd(enum.Enum):
    """How one request to an interpreter worker ended, as the daemon tells them apart."""

    COMPLETED = "completed"  # control "completed" (an error chunk may have come first); close 1000
    INTERRUPTED = "interrupted"  # a KeyboardInterrupt escaped the code; close 4008, state kept
    KILLED = "killed"  # still running 2 s after the timeout's SIGINT, so SIGKILLed; close 4008
    EXITED = "exited"  # the worker process ended mid-request; close 1001


def parse_chunk(line: bytes | bytearray) -> Chunk | None:
    """A worker line as the daemon reads it: a JSON object, else dropped (None).

    Like Go's json.Unmarshal into a map: ``null`` is an empty chunk, every other
    non-object is dropped, and a field that is not a string reads as "". orjson reads
    a line in half the time of the json module (a flood of output is one 384 KiB line
    after another); what it refuses (invalid UTF-8, a lone surrogate, deep nesting)
    the json module reads, a lone surrogate then U+FFFD and NaN or Infinity refused, as in Go.
    """
    lenient = False
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError:
        try:
            value = json.loads(line.rstrip(b"\r").decode("utf-8", "replace"), parse_constant=_refuse_constant)
        except (ValueError, RecursionError):  # nested too deep: an exception here would stop the reader for good
            return None
        lenient = True
    if value is None:
        value = {}
    if not isinstance(value, dict):
        return None
    chunk = {key: value[key] if isinstance(value.get(key), str) else "" for key in STREAM_FIELDS}
    if lenient:  # the json module keeps a lone surrogate escape; Go's decoder reads it as U+FFFD
        chunk = {key: LONE_SURROGATE.sub("\ufffd", text) for key, text in chunk.items()}
    return chunk


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")  # Go's decoder refuses NaN and Infinity: the line is dropped


class _WorkerProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """Tells when the worker process exits, even while its pipes are still open.

    (``Process.wait()`` also waits for the pipes; a worker whose reader stopped, or
    whose child still holds its fd 1, would never count as gone.)
    """

    def __init__(self, exited: asyncio.Event, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=PIPE_READ_BYTES, loop=loop)
        self._exited_event = exited

    def process_exited(self) -> None:
        super().process_exited()
        self._exited_event.set()


def _enlarge_pipe(transport: asyncio.SubprocessTransport, size: int) -> None:
    """Make the worker's stdout pipe hold ``size`` bytes (64 KiB by default on Linux), where the system allows it."""
    pipe = transport.get_pipe_transport(1)
    fileobj = pipe.get_extra_info("pipe") if pipe is not None else None
    if fileobj is None:
        return
    try:
        fcntl.fcntl(fileobj.fileno(), F_SETPIPE_SZ, size)
    except OSError as exc:  # not Linux, or over /proc/sys/fs/pipe-max-size: the default size works too
        log.debug("could not enlarge the worker's pipe: %s", exc)


class InterpreterWorker:
    """One interpreter context's worker slot, run the way the Daytona daemon runs it.

    This is the daemon side of ``apps/daemon/pkg/toolbox/process/interpreter``
    (repl_client.go, manager.go), shared by the local backend and the test
    emulator so that both show the daemon's traps (docs/daytona-platform.md, "The interpreter"):
    - one reader for the worker's whole life reads fd 1 line by line, drops every
      line that is not a JSON object, and stops for good at a line of 1 MiB or more;
    - requests run one at a time (FIFO); a request ends at the worker's control chunk;
    - a timeout sends SIGINT, then SIGKILL 2 s later if the request is still running;
    - a worker that exits mid-request ends it at once (EXITED), and a worker that
      is gone by the next request is silently replaced by a fresh one.
    """

    def __init__(self, python: str, cwd: str, env: dict[str, str], pipe_bytes: int | None = PIPE_BYTES) -> None:
        self._python = python
        self._pipe_bytes = pipe_bytes  # None: Linux's default, as the daemon's (the emulator imitates it)
        self._cwd = cwd
        self._env = env
        self._proc: asyncio.subprocess.Process | None = None
        self._queue = asyncio.Lock()
        self._inbox: asyncio.Queue[Chunk | WorkerEnd | None] | None = None
        self._exited = asyncio.Event()
        self._transport: asyncio.SubprocessTransport | None = None
        self._tasks: set[asyncio.Future[None]] = set()
        self.reader_stopped = False

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    async def start(self) -> None:
        """Start a fresh worker process (the daemon's Context.start)."""
        if self._transport is not None:
            self._transport.close()  # the old worker's pipes, never read again
        loop = asyncio.get_running_loop()
        exited = asyncio.Event()
        try:
            transport, protocol = await loop.subprocess_exec(
                lambda: _WorkerProtocol(exited, loop),
                self._python,
                str(WORKER_SCRIPT),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=None,
                cwd=self._cwd,
                env=self._env,
                start_new_session=True,  # a Ctrl-C in the kernel's terminal must not reach cells
            )
        except OSError as exc:
            raise BackendError(
                f"Could not start the local Python worker {self._python!r}: {exc}. "
                "Set DaytonaKernel.local_python to a working interpreter."
            ) from exc
        proc = asyncio.subprocess.Process(transport, protocol, loop)
        self._proc, self._transport = proc, transport
        if self._pipe_bytes is not None:
            _enlarge_pipe(transport, self._pipe_bytes)
        self._exited = exited
        self.reader_stopped = False
        for job in (self._read_loop(proc), self._watch_exit(proc, exited)):
            task = asyncio.ensure_future(job)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _read_loop(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        pending = bytearray()
        while True:
            data = await proc.stdout.read(PIPE_READ_BYTES)
            if not data:
                return None
            start = len(pending)
            pending += data
            begin = 0
            end = pending.find(b"\n", start)
            while end >= 0:
                if end - begin >= LINE_CAP_BYTES:
                    return self._stop_reading(proc)
                self._on_line(proc, pending[begin:end])
                begin = end + 1
                end = pending.find(b"\n", begin)
            del pending[:begin]
            if len(pending) >= LINE_CAP_BYTES:
                return self._stop_reading(proc)

    def _stop_reading(self, proc: asyncio.subprocess.Process) -> None:
        # bufio.Scanner's ErrTooLong: the daemon never reads this worker's pipe again.
        log.warning("worker %s wrote a line of 1 MiB or more; its output is no longer read", proc.pid)
        if proc is self._proc:
            self.reader_stopped = True

    def _on_line(self, proc: asyncio.subprocess.Process, line: bytearray) -> None:
        chunk = parse_chunk(line)
        if chunk is None:
            log.debug("dropped a worker line that is not JSON: %r", bytes(line[:200]))
        elif proc is self._proc and self._inbox is not None:
            self._inbox.put_nowait(chunk)

    async def _watch_exit(self, proc: asyncio.subprocess.Process, exited: asyncio.Event) -> None:
        await exited.wait()
        if proc is self._proc and self._inbox is not None:
            self._inbox.put_nowait(WorkerEnd.EXITED)

    async def execute(
        self,
        code: str,
        sink: ChunkSink,
        timeout: float | None = None,
        envs: dict[str, str] | None = None,
        started: Callable[[], None] | None = None,
    ) -> WorkerEnd:
        """Run one request; its chunks go to ``sink`` as they are read. ``timeout`` 0/None = none.

        ``sink`` runs in the caller's task (context variables and all). The daemon
        ends a request at an error chunk too (its poller sees the error status); the
        worker always follows an error with a control line at once, so waiting for
        that line changes nothing and keeps it from ending the next request. ``started`` is called when
        the request's turn comes (requests run one at a time, in order).
        """
        async with self._queue:
            if started is not None:
                started()
            if not self.alive:
                await self.start()  # silently, like the daemon's GetContext
            proc = self._proc
            assert proc is not None and proc.stdin is not None
            loop = asyncio.get_running_loop()
            inbox: asyncio.Queue[Chunk | WorkerEnd | None] = asyncio.Queue()
            self._inbox = inbox
            timer = loop.call_later(timeout, inbox.put_nowait, None) if timeout else None
            interrupted = False
            try:
                try:
                    request = {"id": uuid.uuid4().hex, "code": code, "envs": envs or {}}
                    proc.stdin.write(json.dumps(request).encode() + b"\n")
                    await proc.stdin.drain()
                except (BrokenPipeError, ConnectionResetError):
                    await self._exited.wait()
                    return WorkerEnd.EXITED
                while True:
                    item = await inbox.get()
                    if isinstance(item, WorkerEnd):
                        return item
                    if item is None:  # the timeout: SIGINT, then SIGKILL after the grace period
                        if interrupted:
                            self._signal(proc, signal.SIGKILL)
                            await self._exited.wait()  # so the next request finds it gone and starts a fresh one
                            return WorkerEnd.KILLED
                        interrupted = True
                        self._signal(proc, signal.SIGINT)
                        timer = loop.call_later(KILL_GRACE_S, inbox.put_nowait, None)
                        continue
                    sink(item)
                    if item["type"] == "control" and item["text"] in ("completed", "interrupted"):
                        return WorkerEnd.COMPLETED if item["text"] == "completed" else WorkerEnd.INTERRUPTED
            finally:
                self._inbox = None
                if timer is not None:
                    timer.cancel()

    def interrupt(self) -> None:
        """SIGINT to the worker, as ``kill -INT <pid>`` does."""
        if self._proc is not None:
            self._signal(self._proc, signal.SIGINT)

    @staticmethod
    def _signal(proc: asyncio.subprocess.Process, signum: int) -> None:
        if proc.returncode is None:
            try:
                os.kill(proc.pid, signum)
            except ProcessLookupError:
                log.debug("worker %s exited before signal %s", proc.pid, signum)

    async def kill(self) -> None:
        """SIGKILL to the worker's whole process group (its session) at once, as the kernel kills every process of
        a container whose PID 1 (the daemon) exits: no grace, no atexit, no signal handler runs."""
        proc = self._proc
        if proc is not None and proc.returncode is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                log.debug("worker %s exited before its SIGKILL", proc.pid)
            await self._exited.wait()
        if self._transport is not None:
            self._transport.close()

    async def shutdown(self) -> None:
        """SIGTERM, then SIGKILL 2 s later if the worker is still there (the daemon's shutdown)."""
        proc = self._proc
        if proc is not None and proc.returncode is None:
            self._signal(proc, signal.SIGTERM)
            try:
                await asyncio.wait_for(self._exited.wait(), KILL_GRACE_S)
            except asyncio.TimeoutError:
                self._signal(proc, signal.SIGKILL)
                await self._exited.wait()
        if self._transport is not None:
            self._transport.close()


class LocalContext(Context):
    """An interpreter context on this machine: an InterpreterWorker, read as the SDK reads Daytona's."""

    def __init__(self, worker: InterpreterWorker) -> None:
        self._worker = worker
        self.id = f"local-ctx-{uuid.uuid4().hex[:8]}"

    @property
    def alive(self) -> bool:
        return self._worker.alive

    @classmethod
    async def spawn(cls, python: str, cwd: str, env: dict[str, str]) -> LocalContext:
        worker = InterpreterWorker(python, cwd, env)
        await worker.start()
        return cls(worker)

    async def run_code(
        self,
        code: str,
        on_stdout: OutputCallback,
        on_stderr: OutputCallback,
        timeout: float | None = None,
    ) -> RunError | None:
        errors: list[RunError] = []

        def sink(chunk: Chunk) -> None:
            kind = chunk["type"]
            if kind == "stdout":
                on_stdout(chunk["text"])
            elif kind == "stderr":
                on_stderr(chunk["text"])
            elif kind == "error":
                errors.append(RunError(chunk["name"], chunk["value"], chunk["traceback"]))

        ending = await self._worker.execute(code, sink, timeout)
        if ending is WorkerEnd.EXITED:
            raise ContextDied("the interpreter process exited")
        if ending is not WorkerEnd.COMPLETED:  # what the SDK reports for close 4008
            raise ContextTimeout("timeout")
        return errors[-1] if errors else None

    async def close(self) -> None:
        await self._worker.shutdown()
