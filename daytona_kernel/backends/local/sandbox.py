"""The embedded local backend: a directory plus one worker process per context.

Each context is a ``local/worker.py`` subprocess that speaks the same plain-exec
protocol as Daytona's interpreter worker, so whatever works here works the
same on Daytona. It needs no account and no network. It is NOT a security
boundary: cells run as the user, on the user's machine.

Layout, under ``jupyter_data_dir()/daytona-kernel/``, the same as on Daytona:
- ``sandboxes/<id>/workspace/``: the working directory, on the sandbox's "disk".
  An ephemeral sandbox's folder is deleted at shutdown.
- ``volumes/<volume>/<workspace key>/``: the volume, a plain folder. The runtime
  keeps the same volume copy of the working directory there as on a Daytona
  volume and restores a new sandbox from it, so both backends run one code path.
"""

from __future__ import annotations

import asyncio
import enum
import errno
import fcntl
import json
import logging
import os
import re
import shutil
import signal
import stat
import uuid
from pathlib import Path
from typing import Callable

import orjson
from jupyter_core.paths import jupyter_data_dir

from ...config import SECRET_ENV_VARS, LocalSettings
from ...errors import BackendError, ContextDied, ContextTimeout
from ..base import Context, ExecResult, FileError, NotShared, OutputCallback, ProgressCallback, RunError, Sandbox, SandboxPolicy

WORKER_SCRIPT = Path(__file__).with_name("worker.py")
PRIVATE_DIR_MODE = 0o700
PIPE_READ_BYTES = 64 * 1024
PIPE_BYTES = 1024 * 1024  # the worker's stdout pipe: a whole 384 KiB stream line fits, so the worker need not wait for us
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)  # Linux; in fcntl from Python 3.10
LINE_CAP_BYTES = 1024 * 1024  # the daemon's bufio.Scanner cap: a line this long stops its reader
KILL_GRACE_S = 2.0  # the daemon's gracePeriod: SIGINT, then SIGKILL this much later
STREAM_FIELDS = ("type", "text", "name", "value", "traceback")
LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # after decoding, a pair is one character: what is left is alone
INLINE_READ_BYTES = 16 * 1024 * 1024  # one file this small is read in the event loop: less than a hop to a thread and back
FICLONE = 0x40049409  # _IOW(0x94, 9, int) in linux/fs.h (fcntl.FICLONE from Python 3.12)

log = logging.getLogger("daytona_kernel.local")

Chunk = dict[str, str]
ChunkSink = Callable[[Chunk], None]


def share_file(src: str | Path, dst: str | Path, link: bool, copy: bool = True) -> str:
    """Make ``dst`` hold ``src``'s content without a second copy where the file system allows.

    In order: a reflink (a copy-on-write clone: FICLONE on Linux btrfs, XFS, bcachefs ...), whose
    blocks are shared until either side writes; else, when ``link``, a hard link (one file under two
    names: a cell writing into it in place changes the user's file at once, which the mirror would
    bring down after the cell anyway); else, when ``copy``, a copy made by the OS (sendfile, never in
    memory), and otherwise ``NotShared``. ``src`` must be a regular file (a symlink is not followed).
    ``dst`` is replaced by a rename, never truncated (it may be a hard link of something else).
    Returns how: "clone", "link" or "copy".
    """
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.daytona-kernel-{uuid.uuid4().hex[:8]}")
    how = "copy"
    try:
        with open(os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK), "rb") as fin:
            source = os.fstat(fin.fileno())
            if not stat.S_ISREG(source.st_mode):
                raise OSError(errno.EINVAL, "not a regular file", str(src))
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                fcntl.ioctl(fd, getattr(fcntl, "FICLONE", FICLONE), fin.fileno())
                how = "clone"
            except OSError:
                pass  # this file system cannot clone (ext4, tmpfs, another disk ...)
            finally:
                os.close(fd)
            if how != "clone" and link:
                os.unlink(tmp)
                how = _hard_link(src, tmp, source)
            if how == "copy" and not copy:
                raise NotShared(errno.EXDEV, "the file system can neither clone nor link it here")
        if how == "copy":
            shutil.copyfile(src, tmp)
        if how != "link":
            shutil.copymode(src, tmp)
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)  # left only by a failure: a rename took it otherwise
    return how


def _hard_link(src: str | Path, tmp: Path, opened: os.stat_result) -> str:
    """Hard-link ``src`` as ``tmp`` if it is still the file that was opened: "link", else "copy"."""
    try:
        os.link(src, tmp, follow_symlinks=False)
    except OSError:  # another disk, or a file system without hard links
        return "copy"
    now = os.lstat(tmp)
    if (now.st_dev, now.st_ino) != (opened.st_dev, opened.st_ino):  # replaced (by a symlink ...) since it was opened
        tmp.unlink()
        return "copy"
    return "link"


def local_root() -> Path:
    """Where local sandboxes and volumes live."""
    return Path(jupyter_data_dir()) / "daytona-kernel"


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
                return
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


class LocalSandbox(Sandbox):
    """A local stand-in for a Daytona sandbox. See the module docstring."""

    blob_chars = 64 * 1024  # a file on this machine costs less than a JSON pass over 64 KiB (docs/benchmarks.md)

    def __init__(self, config: LocalSettings, workspace_key: str, volume: bool = True) -> None:
        """``volume=False``: no volume copy of the working directory (a ``%%daytona map`` worker)."""
        self._config = config
        self._policy = SandboxPolicy(config.sandbox_policy)
        root = local_root()
        sandbox_name = workspace_key if self._policy is SandboxPolicy.REUSE else uuid.uuid4().hex[:12]
        self.id = f"local-{sandbox_name}"
        self.path = root / "sandboxes" / self.id
        self._tmp = self.path / "tmp"
        self.temp_dir = str(self._tmp)
        self.workdir = str(self.path / "workspace")
        self.volume_dir = str(root / "volumes" / config.volume_name / workspace_key) if volume else ""
        self._contexts: list[LocalContext] = []

    @property
    def description(self) -> str:
        return f"local sandbox {self.id} (workdir {self.workdir})"

    async def info(self) -> dict[str, str]:
        return {
            "sandbox": f"{self.id} (local worker processes; not a security boundary)",
            "state": "started" if self.path.is_dir() else "not created",
            "policy": self._policy.value,
            "volume": f"{self._config.volume_name} (local folder {self.volume_dir})",
            "working directory": f"{self.workdir} (the sandbox's folder; the volume keeps a copy)",
            "idle mode": "none (local): the workers run until the kernel shuts down",
        }

    async def start(self, progress: ProgressCallback) -> None:
        try:  # private to the user: these are copies of their files
            for folder in (local_root(), local_root() / "volumes", local_root() / "sandboxes"):
                folder.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
                folder.chmod(PRIVATE_DIR_MODE)
            self.path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
            Path(self.workdir).mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
            if self.volume_dir:
                Path(self.volume_dir).mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
            self._tmp.mkdir(exist_ok=True, mode=PRIVATE_DIR_MODE)
        except OSError as exc:
            raise BackendError(
                f"Could not create the local sandbox directories under {local_root()}: {exc}. "
                "Set JUPYTER_DATA_DIR to a writable folder."
            ) from exc

    def volume_relpath(self) -> str:
        return os.path.relpath(self.volume_dir, self.workdir) if self.volume_dir else ""

    def _worker_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in SECRET_ENV_VARS and not k.startswith("JPY_")}
        env.update(self._config.env)
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONIOENCODING"] = "utf-8"
        env["TMPDIR"] = str(self._tmp)  # temporary files (input() inboxes ...) go when the kernel does
        return env

    async def create_context(self) -> LocalContext:
        ctx = await LocalContext.spawn(self._config.local_python, self.workdir, self._worker_env())
        self._contexts.append(ctx)
        return ctx

    async def exec(self, command: str, timeout: float | None = None) -> ExecResult:
        proc = await asyncio.create_subprocess_shell(
            command,
            cwd=self.workdir,
            env=self._worker_env(),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout)
        except asyncio.TimeoutError as exc:
            proc.kill()
            await proc.wait()
            raise BackendError(f"Command timed out after {timeout} s: {command}") from exc
        return ExecResult(proc.returncode or 0, out.decode("utf-8", "replace"))

    def _local_path(self, path: str) -> Path:
        p = Path(path)
        return p if p.is_absolute() else Path(self.workdir) / p

    async def upload(self, files: list[tuple[bytes, str]]) -> None:
        await asyncio.to_thread(self._write_files, files)

    def _write_files(self, files: list[tuple[bytes, str]]) -> None:
        for content, dest in files:
            target = self._local_path(dest)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)

    async def download(self, paths: list[str], limits: dict[str, int] | None = None) -> dict[str, bytes | FileError]:
        """Each file's bytes, read in a thread. One file of at most ``INLINE_READ_BYTES`` in the sandbox's
        temporary folder (a cell's large output strings, in the runtime's private folder there: written moments
        ago, still in the page cache, 0.3 ms for 2.7 MB) is read at once instead: only there, since a forged
        frame can name any file, and reading one on a network file system that hangs would stop the event loop."""
        limits = limits or {}
        if len(paths) == 1 and limits.get(paths[0], INLINE_READ_BYTES + 1) <= INLINE_READ_BYTES:
            content = self._read_temporary(paths[0], limits[paths[0]])
            if content is not None:
                return {paths[0]: content}
        return await asyncio.to_thread(lambda: {p: self._read_file(p, limits.get(p)) for p in paths})

    def _read_temporary(self, path: str, limit: int) -> bytes | FileError | None:
        """``_read_file`` for a file in the sandbox's temporary folder, reached from it without a symlink or
        ``..`` (each folder opened relative to the last, O_NOFOLLOW): nothing outside that folder is touched.
        None when ``path`` is not such a file (then it is read in a thread, as any other)."""
        tmp = str(self._tmp)
        full = str(self._local_path(path))
        parts = full[len(tmp) + 1 :].split(os.sep) if full.startswith(tmp + os.sep) else [""]
        if any(part in ("", ".", "..") for part in parts):
            return None
        folder_flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
        try:
            folder = os.open(tmp, folder_flags)
        except OSError:
            return None
        try:
            for part in parts[:-1]:
                inner = os.open(part, folder_flags, dir_fd=folder)
                os.close(folder)
                folder = inner
        except OSError:  # a symlink (or not a folder) on the way
            os.close(folder)
            return None
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
        except OSError as exc:
            return FileError(f"{exc.strerror or exc}", retry=False)
        finally:
            os.close(folder)
        return self._read_fd(fd, limit)

    def _read_file(self, path: str, limit: int | None = None) -> bytes | FileError:
        """A regular file's bytes, at most ``limit``: never through a final symlink, never blocking on a FIFO."""
        try:
            fd = os.open(self._local_path(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as exc:
            return FileError(f"{exc.strerror or exc}", retry=False)
        return self._read_fd(fd, limit)

    @staticmethod
    def _read_fd(fd: int, limit: int | None) -> bytes | FileError:
        """An opened file's bytes, at most ``limit``, if it is a regular file; the fd is closed."""
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                return FileError("not a regular file", retry=False)
            with os.fdopen(fd, "rb") as f:
                content = f.read() if limit is None else f.read(limit + 1)
        except OSError as exc:
            return FileError(f"{exc.strerror or exc}", retry=False)
        if limit is not None and len(content) > limit:
            return FileError(f"it is more than {limit} bytes", retry=False, over_limit=True)
        return content

    async def clone(self, url: str, ref: str | None, dest: str, username: str | None, password: str | None) -> None:
        argv = ["git", "clone", "--quiet"] + (["--branch", ref] if ref else []) + [url, dest]
        env = self._worker_env()
        if password:  # handed to git by an askpass helper, never on a command line
            helper = self.path / "git-askpass.sh"
            helper.write_text('#!/bin/sh\ncase "$1" in Username*) echo "$GIT_USERNAME";; *) echo "$GIT_TOKEN";; esac\n')
            helper.chmod(0o700)
            env.update(GIT_ASKPASS=str(helper), GIT_TERMINAL_PROMPT="0", GIT_USERNAME=username or "git", GIT_TOKEN=password)
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=self.workdir, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        out, _ = await proc.communicate()
        if proc.returncode:
            text = out.decode("utf-8", "replace").strip()
            raise BackendError(f"git clone of the repository failed: {text.replace(password, '***') if password else text}")

    async def remove(self, paths: list[str]) -> None:
        for p in paths:
            self._local_path(p).unlink(missing_ok=True)

    on_this_disk = True

    async def place(self, local: str, dest: str, link: bool) -> None:
        await asyncio.to_thread(share_file, local, self._local_path(dest), link)

    async def fetch(self, path: str, local: str, link: bool) -> None:
        await asyncio.to_thread(share_file, self._local_path(path), local, link, False)

    def same_file(self, path: str, local: str) -> bool:
        try:
            return os.path.samefile(self._local_path(path), local)
        except OSError:
            return False

    async def shutdown(self) -> None:
        for ctx in self._contexts:
            await ctx.close()
        self._contexts.clear()
        shutil.rmtree(self._tmp, ignore_errors=True)
        if self._policy is SandboxPolicy.EPHEMERAL:
            shutil.rmtree(self.path, ignore_errors=True)
