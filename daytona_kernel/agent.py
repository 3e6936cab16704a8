"""The Python API for agents: a sandboxed kernel you can drive from code.

``AsyncAgentKernel`` starts a real daytona-kernel through jupyter_client (kernel ``daytona``,
or ``daytona-local``, which is not isolation) in a project folder, or attaches to one that runs,
and offers ``run``, ``interrupt``, ``restart``, ``variables``, ``upload``/``download``, ``status``
and ``shutdown``. ``AgentKernel`` is the same object for synchronous code: every method runs the
async one on a private event loop thread (so ``interrupt()`` from another thread reaches a ``run``
in flight). Both are context managers::

    with AgentKernel("daytona", folder="project") as kernel:
        result = kernel.run("import sys; print(sys.version)", timeout=60)
        print(result.text)

What the kernel does is its own: the mirror's rules for files, the output policy for output. The
connection file (the kernel's HMAC key) and its sockets live in a private temporary folder, never
in the project. ``input()`` is refused (the call would wait for a human), with a clear error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import posixpath
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

from jupyter_client.asynchronous.client import AsyncKernelClient
from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
from jupyter_client.manager import AsyncKernelManager

from .agent_calls import INTERRUPT_RETRY_S, INTERRUPT_WAIT_S, Call, parse_status, parse_variables, variables_code
from .agent_results import RunResult, Variable, redact
from .config import ENV_PREFIX
from .errors import MirrorError
from .mirror.down import local_landing
from .mirror.localfs import LocalFolder, safe_relpath
from .mirror.plan import code_refusal

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self from Python 3.11

    from .transcript import Transcript

__all__ = ["AgentKernel", "AsyncAgentKernel", "KernelStatus", "LOCAL_WARNING", "RESTARTED"]

log = logging.getLogger(__name__)
T = TypeVar("T")

STARTUP_TIMEOUT_S = 180.0  # the kernel's reply to kernel_info: the sandbox itself starts with the first cell
SHUTDOWN_TIMEOUT_S = 60.0
DEFAULT_OUTPUT_CHARS = 20_000
BACKEND_VAR = ENV_PREFIX + "BACKEND"
RESTARTED = "The context was restarted; variables are lost."
LOCAL_WARNING = (
    "daytona-local runs code in a worker process on this machine, as you: it is not isolation. "
    "Use the daytona kernel to keep the agent's code off this machine."
)


class KernelStatus(dict[str, str]):
    """``status()``: the kernel's ``%daytona status`` lines (backend, sandbox, state ...) and the client's own
    (kernel, folder, kernel uptime), as a mapping of name to text."""

    def text(self) -> str:
        width = max((len(k) for k in self), default=0) + 1
        return "".join(f"{k + ':':<{width}} {v}\n" for k, v in self.items())


class AsyncAgentKernel:
    """See the module docstring."""

    def __init__(
        self,
        kernel_name: str = "daytona",
        folder: str | os.PathLike[str] = ".",
        *,
        notebook: str | os.PathLike[str] | None = None,
        output_chars: int = DEFAULT_OUTPUT_CHARS,
        connection_file: str | os.PathLike[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        """``connection_file`` attaches to a running kernel instead of starting one (``restart`` then needs
        the process that started it). ``notebook`` appends every run to that .ipynb (the transcript)."""
        self.kernel_name = kernel_name
        self.folder = Path(folder).expanduser().resolve()
        self.output_chars = output_chars
        self._attach_to = Path(connection_file) if connection_file else None
        self._env = env
        self.transcript: Transcript | None = None
        if notebook is not None:
            from .transcript import Transcript  # nbformat: the [mcp] extra

            self.transcript = Transcript(notebook, kernel_name, _display_name(kernel_name))  # refuses a file it cannot append to
        self._km: AsyncKernelManager | None = None
        self._kc: AsyncKernelClient | None = None
        self._private: Path | None = None
        self._started_at = 0.0
        self._calls: Call | None = None
        self._forwarder: threading.Thread | None = None

    @property
    def connection_file(self) -> Path | None:
        """The running kernel's connection file (private: it holds the kernel's key), for another client to attach."""
        if self._attach_to is not None:
            return self._attach_to
        return Path(self._km.connection_file) if self._km is not None else None

    @property
    def is_local(self) -> bool:
        """Whether the kernelspec runs the local backend (this machine: not isolation)."""
        return _spec_backend(self.kernel_name, os.environ if self._env is None else self._env) == "local"

    async def start(self) -> Self:
        """Start the kernel (or connect to it) and wait until it answers."""
        if self.is_local:
            log.warning(LOCAL_WARNING)
        if self._attach_to is not None:
            kc = AsyncKernelClient()
            kc.load_connection_file(str(self._attach_to))
        else:
            kc = await self._start_kernel()
        kc.start_channels()
        self._kc = kc
        try:
            await kc.wait_for_ready(timeout=STARTUP_TIMEOUT_S)
        except RuntimeError:
            await self.shutdown()
            raise
        self._started_at = time.monotonic()
        self._calls = Call(kc, self._send_interrupt, self._alive)
        return self

    async def _start_kernel(self) -> AsyncKernelClient:
        if not self.folder.is_dir():
            raise FileNotFoundError(f"the project folder {self.folder} does not exist")
        # The connection file holds the kernel's HMAC key: it lives here (mode 0700), outside the project, with
        # the kernel's unix sockets; nothing else on the machine can reach them.
        self._private = Path(tempfile.mkdtemp(prefix="dk-agent-"))
        km = AsyncKernelManager(kernel_name=self.kernel_name, transport="ipc", ip=str(self._private / "k"))
        km.connection_file = str(self._private / "kernel.json")
        env = dict(os.environ if self._env is None else self._env)
        self._km = km
        # The kernel's own output (its log) goes to this process's stderr with credentials masked; never to
        # stdout, which is the MCP server's protocol channel.
        await km.start_kernel(env=env, cwd=str(self.folder), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        pipe = getattr(km.provisioner, "process", None)
        if pipe is not None and pipe.stdout is not None:
            self._forwarder = threading.Thread(target=_forward, args=(pipe.stdout,), name="daytona-kernel-log", daemon=True)
            self._forwarder.start()
        return km.client()

    @property
    def _call(self) -> Call:
        if self._calls is None:
            raise RuntimeError("the kernel is not started: use `async with AsyncAgentKernel(...)` or await start()")
        return self._calls

    async def run(self, code: str, timeout: float | None = None, on_output: Callable[[str], None] | None = None) -> RunResult:
        """Run code; the state persists between runs. Past ``timeout`` seconds the run is interrupted
        (the variables stay) and the result says so. ``on_output(text)`` gets the cell's stdout and stderr as
        they come (on the event loop; with ``AgentKernel``, on its loop thread)."""
        execution = await self._call.execute(code, timeout=timeout, on_output=on_output)
        result = execution.result(self.output_chars, self._overflow_file)
        if self.transcript is not None:
            await asyncio.to_thread(self.transcript.append, code, result.outputs, result.execution_count)
        return result

    async def _alive(self) -> bool:
        """Whether the kernel process runs (a kernel this client attached to is taken to)."""
        return self._km is None or bool(await self._km.is_alive())

    @property
    def busy(self) -> bool:
        """Whether a ``run`` (or another call) of this client is in flight."""
        return self._calls is not None and self._calls.running is not None

    async def interrupt(self, wait: float = INTERRUPT_WAIT_S) -> bool:
        """Interrupt the run in flight (a ``run`` from another task or thread; its variables stay) and wait up to
        ``wait`` seconds for it to end, interrupting again every few seconds (an interrupt that reaches the kernel
        before the cell starts stops nothing). True if a run of this client ended; False if none was in flight
        (the interrupt is sent anyway, for a run another client started) or it did not end in time."""
        running = self._calls.running if self._calls is not None else None
        await self._send_interrupt()
        if running is None:
            return False
        give_up = time.monotonic() + wait
        while True:
            try:
                await asyncio.wait_for(running.wait(), INTERRUPT_RETRY_S)
                return True
            except asyncio.TimeoutError:
                if time.monotonic() >= give_up:
                    return False
                await self._send_interrupt()

    async def _send_interrupt(self) -> None:
        if self._km is not None:
            await self._km.interrupt_kernel()
        elif self._kc is not None:
            self._kc.control_channel.send(self._kc.session.msg("interrupt_request", {}))

    async def restart(self) -> str:
        """A new interpreter in the same sandbox; returns RESTARTED (every variable is gone)."""
        if self._km is None:
            raise RuntimeError("restart needs the kernel's manager: this client attached to a kernel another process started")
        await self._call.close()
        await self._km.restart_kernel(now=False)
        assert self._kc is not None
        await self._kc.wait_for_ready(timeout=STARTUP_TIMEOUT_S)
        self._started_at = time.monotonic()
        self._calls = Call(self._kc, self._send_interrupt, self._alive)
        return RESTARTED

    async def variables(self) -> list[Variable]:
        """The interpreter's names (no modules, functions, classes or _private names), with type and a short repr."""
        execution = await self._call.execute(variables_code(), silent=True)
        return parse_variables(execution)

    async def upload(self, path: str, dest: str | None = None) -> str:
        """Copy a file or folder of the project into the sandbox (``%upload``: the mirror's rules and limits)."""
        return await self._magic("upload", path, dest)

    async def download(self, path: str, dest: str | None = None) -> str:
        """Copy a file from the sandbox into the project (``%download``). Unlike a person's ``%download``, no
        file the mirror would refuse as code this machine may run (``plan.code_refusal``: hidden names such
        as .vscode/, a .pth, AGENTS.md ...) is written: the agent's word is not the user's."""
        local = dest or (posixpath.basename(path) if path.startswith("/") else path)
        why = await asyncio.to_thread(download_refusal, self.folder, local)
        if why is not None:
            raise PermissionError(
                f"download: {local} is not written here: {why}. A person can fetch it with %download in a notebook."
            )
        return await self._magic("download", path, dest)

    async def _magic(self, name: str, path: str, dest: str | None) -> str:
        words = [path] if dest is None else [path, dest]
        if any(not w or any(c.isspace() for c in w) for w in words):
            raise ValueError(f"{name}: paths may not be empty or contain whitespace: {words}")
        execution = await self._call.execute(f"%{name} {' '.join(words)}", silent=True)
        result = execution.result(self.output_chars, self._overflow_file)
        if result.error is not None:
            raise RuntimeError(result.error.text)
        return (result.text + "".join(result.notices)).strip() or f"{name}: nothing to copy"

    async def status(self) -> KernelStatus:
        """Backend, sandbox id and state, resources (``%daytona status``), and this kernel's uptime."""
        execution = await self._call.execute("%daytona status", silent=True)
        info = KernelStatus(kernel=self.kernel_name, folder=str(self.folder))
        info.update(parse_status(execution))
        since = "started" if self._km is not None else "attached"
        info["kernel uptime"] = f"{time.monotonic() - self._started_at:.0f} s (since this client {since} it)"
        if self.is_local:
            info["isolation"] = "none: " + LOCAL_WARNING
        return info

    def _overflow_file(self, text: str) -> str:
        """Where a result's full text goes when it passes the cap: a private file that outlives the kernel."""
        fd, path = tempfile.mkstemp(prefix="daytona-kernel-output-", suffix=".txt")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(redact(text))
        return path

    async def shutdown(self) -> None:
        """Shut the kernel down (if this client started it) and remove its private folder."""
        if self._calls is not None:
            await self._calls.close()
            self._calls = None
        if self._kc is not None:
            self._kc.stop_channels()
            self._kc = None
        if self._km is not None:
            with contextlib.suppress(RuntimeError):  # never started: nothing to shut down
                if await self._km.is_alive():
                    await asyncio.wait_for(self._km.shutdown_kernel(now=False), SHUTDOWN_TIMEOUT_S)
            self._km = None
        if self._private is not None:
            shutil.rmtree(self._private, ignore_errors=True)
            self._private = None

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()


def _display_name(kernel_name: str) -> str:
    """The kernelspec's display name ("Python (Daytona)"), for the transcript's metadata; the name if unknown."""
    try:
        return str(KernelSpecManager().get_kernel_spec(kernel_name).display_name)
    except NoSuchKernel:
        return kernel_name


def _spec_backend(kernel_name: str, env: Mapping[str, str]) -> str:
    """The backend a kernelspec runs: its env's DAYTONA_KERNEL_BACKEND (which jupyter_client sets over the
    environment), else the environment's, else daytona."""
    try:
        spec_env = KernelSpecManager().get_kernel_spec(kernel_name).env
    except NoSuchKernel:
        spec_env = {}
    return str(spec_env.get(BACKEND_VAR) or env.get(BACKEND_VAR) or "daytona")


def download_refusal(folder: Path, local: str) -> str | None:
    """Why the sandbox's file may not be written at ``local`` (relative to ``folder``), by the mirror's rule."""
    try:
        rel = safe_relpath(local)
    except MirrorError as exc:
        return str(exc)
    return code_refusal(rel, local_landing(LocalFolder(folder), [rel]))


def _forward(stream: IO[bytes]) -> None:
    """Copy the kernel's log lines to stderr, credentials masked, until the kernel exits."""
    with stream:
        for line in iter(stream.readline, b""):
            sys.stderr.write(redact(line.decode("utf-8", "replace")))
            sys.stderr.flush()


class AgentKernel:
    """``AsyncAgentKernel`` for synchronous code: each method runs the async one on a private loop thread."""

    def __init__(self, kernel_name: str = "daytona", folder: str | os.PathLike[str] = ".", **options: Any) -> None:
        self.kernel = AsyncAgentKernel(kernel_name, folder, **options)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="daytona-kernel-agent", daemon=True)
        self._thread.start()

    def _wait(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def start(self) -> Self:
        try:
            self._wait(self.kernel.start())
        except BaseException:
            self.shutdown()  # the loop thread too
            raise
        return self

    def run(self, code: str, timeout: float | None = None, on_output: Callable[[str], None] | None = None) -> RunResult:
        return self._wait(self.kernel.run(code, timeout, on_output))

    def interrupt(self, wait: float = INTERRUPT_WAIT_S) -> bool:
        return self._wait(self.kernel.interrupt(wait))

    def restart(self) -> str:
        return self._wait(self.kernel.restart())

    def variables(self) -> list[Variable]:
        return self._wait(self.kernel.variables())

    def upload(self, path: str, dest: str | None = None) -> str:
        return self._wait(self.kernel.upload(path, dest))

    def download(self, path: str, dest: str | None = None) -> str:
        return self._wait(self.kernel.download(path, dest))

    def status(self) -> KernelStatus:
        return self._wait(self.kernel.status())

    def shutdown(self) -> None:
        try:
            self._wait(self.kernel.shutdown())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(SHUTDOWN_TIMEOUT_S)
            self._loop.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
