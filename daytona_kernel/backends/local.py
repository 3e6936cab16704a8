"""The embedded local backend: a directory plus one worker process per context.

Each context is a ``local_worker.py`` subprocess that speaks the same plain-exec
protocol as Daytona's interpreter worker, so whatever works here works the
same on Daytona. It needs no account and no network. It is NOT a security
boundary: cells run as the user, on the user's machine.

Layout, under ``jupyter_data_dir()/daytona-kernel/``, the same as on Daytona:
- ``sandboxes/<id>/workspace/``: the working directory, on the sandbox's "disk".
  An ephemeral sandbox's folder is deleted at shutdown.
- ``volumes/<volume>/<workspace key>/``: the volume, a plain folder. The runtime
  keeps the same durable copy of the working directory there as on a Daytona
  volume and restores a new sandbox from it, so both backends run one code path.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import stat
import time
import uuid
from pathlib import Path

from jupyter_core.paths import jupyter_data_dir

from ..config import SECRET_ENV_VARS, LocalSettings
from ..errors import BackendError, ContextDied, ContextTimeout
from .base import Context, ExecResult, FileError, OutputCallback, ProgressCallback, RunError, Sandbox, SandboxPolicy

WORKER_SCRIPT = Path(__file__).with_name("local_worker.py")
STREAM_LIMIT_BYTES = 64 * 1024 * 1024
TIMEOUT_KILL_GRACE_S = 2.0
PRIVATE_DIR_MODE = 0o700


def local_root() -> Path:
    """Where local sandboxes and volumes live."""
    return Path(jupyter_data_dir()) / "daytona-kernel"


class LocalContext(Context):
    """A worker subprocess with a persistent namespace."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc
        self.id = f"local-ctx-{proc.pid}"
        self.pid = proc.pid
        self._lock = asyncio.Lock()

    @property
    def alive(self) -> bool:
        return self._proc.returncode is None

    @classmethod
    async def spawn(cls, python: str, cwd: str, env: dict[str, str]) -> LocalContext:
        try:
            proc = await asyncio.create_subprocess_exec(
                python,
                str(WORKER_SCRIPT),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                cwd=cwd,
                env=env,
                limit=STREAM_LIMIT_BYTES,
                start_new_session=True,
            )
        except OSError as exc:
            raise BackendError(
                f"Could not start the local Python worker {python!r}: {exc}. "
                "Set DaytonaKernel.local_python to a working interpreter."
            ) from exc
        return cls(proc)

    async def run_code(
        self,
        code: str,
        on_stdout: OutputCallback,
        on_stderr: OutputCallback,
        timeout: float | None = None,
    ) -> RunError | None:
        async with self._lock:
            proc = self._proc
            assert proc.stdin is not None and proc.stdout is not None
            if proc.returncode is not None:
                raise self._died()
            try:
                proc.stdin.write(json.dumps({"code": code}).encode() + b"\n")
                await proc.stdin.drain()
            except (BrokenPipeError, ConnectionResetError) as exc:
                raise self._died() from exc
            deadline = None if not timeout else time.monotonic() + timeout
            timed_out = False
            error: RunError | None = None
            while True:
                line = await self._readline(deadline)
                if line is None:  # the deadline passed: SIGINT, then kill, like the daemon
                    if timed_out:
                        self._kill()
                        raise ContextTimeout("timeout")
                    timed_out = True
                    self._signal(signal.SIGINT)
                    deadline = time.monotonic() + TIMEOUT_KILL_GRACE_S
                    continue
                if not line:
                    await proc.wait()
                    raise self._died()
                msg = json.loads(line)
                kind = msg.get("type")
                if kind == "stdout":
                    on_stdout(msg["text"])
                elif kind == "stderr":
                    on_stderr(msg["text"])
                elif kind == "error":
                    error = RunError(msg["name"], msg["value"], msg["traceback"])
                elif kind == "control":
                    break
            if timed_out:
                raise ContextTimeout("timeout")
            return error

    async def _readline(self, deadline: float | None) -> bytes | None:
        assert self._proc.stdout is not None
        if deadline is None:
            return await self._proc.stdout.readline()
        try:
            return await asyncio.wait_for(self._proc.stdout.readline(), max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            return None

    def _died(self) -> ContextDied:
        return ContextDied(f"the interpreter process exited with code {self._proc.returncode}")

    def _signal(self, signum: int) -> None:
        if self._proc.returncode is None:
            try:
                os.kill(self._proc.pid, signum)
            except ProcessLookupError:
                pass  # it exited on its own in the meantime; the reader sees EOF

    def _kill(self) -> None:
        self._signal(signal.SIGKILL)

    async def close(self) -> None:
        self._kill()
        await self._proc.wait()


class LocalSandbox(Sandbox):
    """A local stand-in for a Daytona sandbox. See the module docstring."""

    def __init__(self, config: LocalSettings, workspace_key: str) -> None:
        self._config = config
        self._policy = SandboxPolicy(config.sandbox_policy)
        root = local_root()
        sandbox_name = workspace_key if self._policy is SandboxPolicy.REUSE else uuid.uuid4().hex[:12]
        self.id = f"local-{sandbox_name}"
        self.path = root / "sandboxes" / self.id
        self._tmp = self.path / "tmp"
        self.workdir = str(self.path / "workspace")
        self.volume_dir = str(root / "volumes" / config.volume_name / workspace_key)
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
            "auto-stop": "none (local)",
        }

    async def start(self, progress: ProgressCallback) -> None:
        try:  # private to the user: these are copies of their files
            for folder in (local_root(), local_root() / "volumes", local_root() / "sandboxes"):
                folder.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
                folder.chmod(PRIVATE_DIR_MODE)
            self.path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
            Path(self.workdir).mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
            Path(self.volume_dir).mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
            self._tmp.mkdir(exist_ok=True, mode=PRIVATE_DIR_MODE)
        except OSError as exc:
            raise BackendError(
                f"Could not create the local sandbox directories under {local_root()}: {exc}. "
                "Set JUPYTER_DATA_DIR to a writable folder."
            ) from exc

    def storage_options(self) -> dict[str, str]:
        return {"volume_dir": os.path.relpath(self.volume_dir, self.workdir)}

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

    async def download(self, paths: list[str]) -> dict[str, bytes | FileError]:
        return await asyncio.to_thread(lambda: {p: self._read_file(p) for p in paths})

    def _read_file(self, path: str) -> bytes | FileError:
        """A regular file's bytes: never through a final symlink, never blocking on a FIFO."""
        try:
            fd = os.open(self._local_path(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as exc:
            return FileError(f"{exc.strerror or exc}", retry=False)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                return FileError("not a regular file", retry=False)
            with os.fdopen(fd, "rb") as f:
                return f.read()
        except OSError as exc:
            return FileError(f"{exc.strerror or exc}", retry=False)

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

    async def shutdown(self) -> None:
        for ctx in self._contexts:
            await ctx.close()
        self._contexts.clear()
        shutil.rmtree(self._tmp, ignore_errors=True)
        if self._policy is SandboxPolicy.EPHEMERAL:
            shutil.rmtree(self.path, ignore_errors=True)
