"""The toolbox of a Daytona sandbox: files, processes, git and the interpreter, as the daemon in the
sandbox offers them (``apps/daemon/pkg/toolbox``).

These calls need a started sandbox; which sandbox that is, and what to make of a failure (did the
sandbox stop? was it deleted?), is the lifecycle's business (``daytona/sandbox.py``). The toolbox reaches it
through ``ToolboxHost``, so it does not import the lifecycle class.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import posixpath
import re
import shlex
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Protocol, TypeVar

from daytona.common.errors import DaytonaConnectionError, DaytonaError, DaytonaRateLimitError

from ...config import masked
from ...errors import (
    AuthError,
    BackendError,
    ConnectionLost,
    ContextDied,
    ContextTimeout,
    SandboxGone,
    SandboxNotRunning,
    SandboxPaused,
)
from ..base import Context, ExecResult, FileError, OutputCallback, RunError, Toolbox, read_capped
from .api import API_REQUEST_TIMEOUT_S, PAUSED_STATES, call_api
from .states import StateLadder

if TYPE_CHECKING:
    import aiohttp

    from .restart_socket import HandedOverToolbox

log = logging.getLogger("daytona_kernel.daytona")
WS_CLOSE_WAIT_S = 1.0  # websocket.go: the reader that answers a close starts when the job leaves the queue
T = TypeVar("T")
DOWNLOAD_WATCH_S = 0.05  # how often a download's files are measured while they arrive
DOWNLOAD_MAX_BYTES = 4 * 1024**3  # a file the caller gave no limit stops its download here
DOWNLOAD_STALL_S = 20.0  # a download that brings no byte for this long is stuck (a FIFO, a blocked read)
DOWNLOAD_DEADLINE_S = 600.0  # one download call, however it was split

GIT_DEFAULT_USERNAME = "x-access-token"  # GIT_TOKEN alone: hosts that take a token accept any username
FULL_SHA = re.compile(r"[0-9a-fA-F]{40}")
DEFAULT_CONTEXT_ID = "default"  # the daemon's own context (interpreter/manager.go); never a kernel's
WS_DONE = 1000
WS_GOING_AWAY = 1001  # the daemon: the worker process ended, or the context was deleted
WS_TIMEOUT = 4008  # the daemon: timeout, or a KeyboardInterrupt escaped the code
WS_TEXT, WS_BINARY, WS_CLOSE = 0x1, 0x2, 0x8  # a message's type: aiohttp's WSMsgType (the frame's opcode, RFC 6455)


class InterpreterSocket(Protocol):
    """The interpreter websocket as a context reads it: aiohttp's (the SDK's session, ``open_interpreter_socket``)
    or, while the SDK loads after a restart, tornado's (``restart_socket.HandedOverSocket``)."""

    @property
    def closed(self) -> bool: ...

    @property
    def close_code(self) -> int | None: ...

    async def send_str(self, data: str) -> None: ...

    async def receive(self) -> Any: ...

    async def close(self) -> Any: ...


def socket_errors() -> tuple[type[BaseException], ...]:
    """What a broken websocket raises: OSError and timeouts from either client, and aiohttp's errors once it is
    loaded (with the SDK: before, no socket of its exists). Evaluated where it is caught, so that nothing imports
    aiohttp before the SDK."""
    client_error = loaded_error("ClientError")
    return (asyncio.TimeoutError, OSError, ValueError) + ((client_error,) if client_error is not None else ())


class HandshakeRefused(ConnectionError):
    """The toolbox answered the websocket's handshake with ``status`` instead of switching protocols: nothing ran
    (tornado's client, ``restart_socket``; aiohttp's is ``WSServerHandshakeError``)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


def handshake_status(exc: BaseException) -> int | None:
    """The HTTP status the toolbox refused the websocket's handshake with (None: it did not answer)."""
    if isinstance(exc, HandshakeRefused):
        return exc.status
    refused = loaded_error("WSServerHandshakeError")
    return getattr(exc, "status", None) if refused is not None and isinstance(exc, refused) else None


def loaded_error(name: str) -> type[BaseException] | None:
    """aiohttp's error class ``name`` once aiohttp is loaded (with the SDK), else None: also while the SDK's thread
    is still importing it, when the module is there but half made."""
    found = getattr(sys.modules.get("aiohttp"), name, None)
    return found if isinstance(found, type) and issubclass(found, BaseException) else None


class ToolboxHost(Protocol):
    """What the toolbox needs from the lifecycle that owns it."""

    async def sdk_sandbox(self) -> Any:
        """The SDK's sandbox in use, once there is one (raises SandboxNotRunning before): after a restart's
        quick start, every SDK call waits here for the SDK's load (``DaytonaSandbox``)."""

    def without_sdk(self) -> HandedOverToolbox | None:
        """While the SDK loads after a restart, the sandbox's toolbox without it (``restart_socket``); else None."""

    async def api(self, what: str, fn: Callable[[], Awaitable[T]], *, retry: bool = True) -> T:
        """Run an SDK call through the one retry loop and error translation."""

    @property
    def id(self) -> str:
        """The sandbox's id, for messages."""

    async def refresh_state(self) -> str:
        """The sandbox's state now (raises SandboxGone when it no longer exists)."""

    async def start_again(self) -> bool:
        """A context could not be made: False if the sandbox is started (the failure stands), else start it
        again (found or created again if it is gone) and True."""


class FoundSandbox:
    """A ``ToolboxHost`` for a started sandbox this process found but does not run (``daytona-kernel gc``):
    its toolbox, through the one retry loop, with no lifecycle of its own."""

    def __init__(self, sandbox: Any, api_url: str) -> None:
        self._sandbox = sandbox
        self.id: str = sandbox.id
        self._api_url = api_url

    async def sdk_sandbox(self) -> Any:
        return self._sandbox

    def without_sdk(self) -> HandedOverToolbox | None:
        return None

    async def api(self, what: str, fn: Callable[[], Awaitable[T]], *, retry: bool = True) -> T:
        return await call_api(what, fn, retry=retry, api_url=self._api_url)

    async def refresh_state(self) -> str:
        return await StateLadder(self.api, log.info).refresh(self._sandbox)

    async def start_again(self) -> bool:
        return False  # not this process's to start


async def open_interpreter_socket(sandbox: Any) -> aiohttp.ClientWebSocketResponse[bool]:
    """The interpreter websocket, opened exactly as the SDK's ``run_code`` opens it.

    ``AsyncCodeInterpreter.run_code`` appends every stdout piece to one growing
    string (quadratic in the output), so the kernel reads the socket itself. The
    SDK has no public call for the socket's URL and auth headers, so this small
    adapter takes them, and the HTTP session, from the SDK's own clients, as
    ``daytona/_async/code_interpreter.py`` does (the same from 0.207.1 to 0.226.1).
    """
    try:
        from daytona.internal.shared_session import http_session_of

        api = sandbox.code_interpreter._api_client
        _, url, headers, *_ = api._execute_interpreter_code_serialize(
            _request_auth=None, _content_type=None, _headers=None, _host_index=None
        )
        session = http_session_of(api.api_client)
    except (ImportError, AttributeError, TypeError) as exc:
        raise BackendError(
            f"This version of the daytona package opens the interpreter differently ({exc}). "
            "Install a daytona release between 0.207.1 and 0.226.1, or report it to daytona-kernel."
        ) from exc
    return await session.ws_connect(re.sub(r"^http", "ws", url), headers=headers)


class DaytonaContext(Context):
    """An interpreter context in a Daytona sandbox. ``context`` is the SDK's object for it; None for the one a
    restart handed over (the SDK had not loaded when it was taken)."""

    def __init__(self, toolbox: DaytonaToolbox, context_id: str, context: Any = None) -> None:
        self._toolbox = toolbox
        self._host = toolbox.host
        self._context = context
        self.id = context_id

    async def run_code(
        self,
        code: str,
        on_stdout: OutputCallback,
        on_stderr: OutputCallback,
        timeout: float | None = None,
    ) -> RunError | None:
        ws = await self._open_socket()
        # The daemon reads "timeout" as whole seconds (0 = none; absent = 10 minutes).
        request = {"code": code, "contextId": self.id, "timeout": math.ceil(timeout) if timeout else 0}
        error: RunError | None = None
        try:
            await ws.send_str(json.dumps(request))
            while True:
                msg = await ws.receive()
                if msg.type in (WS_TEXT, WS_BINARY):
                    chunk = json.loads(msg.data)
                    kind = chunk.get("type")
                    if kind == "stdout":
                        on_stdout(chunk.get("text", ""))
                    elif kind == "stderr":
                        on_stderr(chunk.get("text", ""))
                    elif kind == "error":
                        error = RunError(chunk.get("name", ""), chunk.get("value", ""), chunk.get("traceback") or "")
                    continue
                close_code = msg.data if msg.type == WS_CLOSE else ws.close_code
                reason = msg.extra if msg.type == WS_CLOSE else None
                break
        except socket_errors() as exc:
            raise await self._toolbox.why_cut_off(self.id, f"{type(exc).__name__}: {exc}") from exc
        finally:
            if not ws.closed:  # the daemon answers a close only once its job runs: do not wait long for it
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(ws.close(), WS_CLOSE_WAIT_S)
        if close_code in (WS_DONE, None):
            return error
        if close_code == WS_TIMEOUT:  # a KeyboardInterrupt escaped, or the daemon killed the worker
            raise ContextTimeout("timeout")
        if close_code == WS_GOING_AWAY:  # the worker process ended, or the context was deleted
            raise ContextDied("the interpreter process ended")
        raise await self._toolbox.why_cut_off(self.id, f"{reason or 'the websocket closed'} (close code {close_code})")

    async def start_code(self, code: str, timeout: float) -> None:
        """Send ``code`` to run and go: the daemon reads the request, then runs it to its end with no client
        (websocket.go: output with no client attached is dropped)."""
        ws = await self._open_socket()
        try:
            await ws.send_str(json.dumps({"code": code, "contextId": self.id, "timeout": math.ceil(timeout)}))
        except socket_errors() as exc:
            raise await self._toolbox.why_cut_off(self.id, f"{type(exc).__name__}: {exc}") from exc
        finally:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(ws.close(), WS_CLOSE_WAIT_S)

    async def _open_socket(self) -> InterpreterSocket:
        """Open the interpreter websocket. Nothing has run before the handshake succeeds, so a 429 or 5xx
        (Daytona's proxy when busy) or a dropped connection is tried again by the one retry loop (``call_api``,
        through the host), as an SDK error of that status; then, or on any other failure, the sandbox's state says why."""
        quick = self._host.without_sdk()
        sandbox = await self._host.sdk_sandbox() if quick is None else None

        async def handshake() -> InterpreterSocket:
            try:
                return await (quick.connect() if quick is not None else open_interpreter_socket(sandbox))
            except socket_errors() as exc:  # nothing ran
                status = handshake_status(exc)
                if status == 429:
                    raise DaytonaRateLimitError(f"the interpreter's websocket: {exc}", status_code=status) from exc
                if (status or 0) >= 500 or _disconnected(exc):
                    raise DaytonaError(f"the interpreter's websocket: {exc}", status_code=status) from exc
                raise

        try:
            return await self._host.api("open the interpreter", handshake)
        except socket_errors() as exc:
            raise await self._toolbox.why_unreachable(exc) from exc
        except BackendError as exc:  # the retries ran out: the handshake's own failure says more
            failure = exc.__cause__.__cause__ if exc.__cause__ is not None else None
            raise await self._toolbox.why_unreachable(failure or exc) from exc

    async def close(self) -> None:
        self._toolbox.forget(self)
        quick = self._host.without_sdk()
        if quick is not None:  # a restart before the SDK has loaded
            try:
                await quick.delete_context(self.id)
                return
            except BackendError as exc:
                log.info("%s; deleting it through the SDK", exc)
        try:
            if self._context is None:  # handed over at a restart: found by its id
                await self._toolbox.end_context(self.id)
                return
            sandbox = await self._host.sdk_sandbox()
            await sandbox.code_interpreter.delete_context(self._context)
        except (DaytonaError, BackendError) as exc:
            log.info("could not delete context %s (%s); it goes away with the sandbox", self.id, exc)


class DaytonaToolbox(Toolbox):
    """Files, processes, git and interpreter contexts in the sandbox its host has started."""

    def __init__(self, host: ToolboxHost, workdir: str) -> None:
        self.host = host
        self.workdir = workdir
        self.contexts: list[DaytonaContext] = []  # ours, deleted at shutdown and restart

    def forget(self, context: DaytonaContext) -> None:
        if context in self.contexts:
            self.contexts.remove(context)

    async def why_unreachable(self, exc: BaseException) -> BackendError:
        """The interpreter websocket did not open, so no code ran. Say why.

        A stopped sandbox refuses the handshake with 400, a vanished one with 404;
        the sandbox's state says which (the toolbox proxy finds no IP for a stopped sandbox).
        """
        try:
            state = await self.host.refresh_state()
        except BackendError as inner:
            return inner
        if state in PAUSED_STATES:
            return SandboxPaused(f"The sandbox {self.host.id} is {state}.")
        if state != "started":
            return SandboxNotRunning(f"The sandbox {self.host.id} is {state}.")
        status = handshake_status(exc)
        if status == 400:  # the proxy's "no IP ... is the Sandbox started?" (proxy.go): it ran again once the state was read
            return SandboxNotRunning(
                f"The sandbox {self.host.id} was not running when its interpreter was asked for (an auto-stop or a stop "
                "from the dashboard), and has been started again since."
            )
        if status in (401, 403):
            return AuthError(
                f"Daytona refused to open the interpreter ({status}): check DAYTONA_API_KEY and DAYTONA_TARGET, "
                "then restart the kernel."
            )
        if status is None or status == 429 or status >= 500:
            return SandboxNotRunning(f"The sandbox {self.host.id} did not answer ({type(exc).__name__}: {exc}).")
        return BackendError(f"Could not reach the interpreter in sandbox {self.host.id}: {exc}")

    async def why_cut_off(self, context_id: str, detail: str) -> BackendError:
        """A running cell's stream broke. Did the sandbox stop, the worker die, or just the connection?"""
        try:
            state = await self.host.refresh_state()
        except SandboxGone:
            return ContextDied("the sandbox was deleted")
        except BackendError as inner:
            return ConnectionLost(f"The connection to the sandbox was lost ({detail}) and it cannot be reached: {inner}")
        if state in PAUSED_STATES:
            return ConnectionLost(
                f"The sandbox was paused while the cell ran ({detail}). The cell carries on when the sandbox resumes; "
                "its further output is lost. Your variables are kept."
            )
        if state != "started":
            return ContextDied(f"the sandbox stopped ({state})")
        if not await self.is_active(context_id):
            return ContextDied("the interpreter process is gone")
        return ConnectionLost(
            f"The connection to the sandbox was lost while the cell ran ({detail}). The cell may still be "
            "running there; its further output is lost. Your variables are kept."
        )

    async def _list_contexts(self) -> list[Any]:
        sandbox = await self.host.sdk_sandbox()
        return await self.host.api("list interpreter contexts", lambda: sandbox.code_interpreter.list_contexts())

    async def create_context(self) -> DaytonaContext:
        """A new context; when that fails because the sandbox stopped or went since we last looked, the host
        starts it again (or finds or creates another) and the context is made there."""
        try:
            return await self.new_context()
        except BackendError:
            if not await self.host.start_again():
                raise
            return await self.new_context()

    async def new_context(self) -> DaytonaContext:
        """A new context, or the failure as it is."""
        sandbox = await self.host.sdk_sandbox()
        context = await self.host.api(
            "create an interpreter context", lambda: sandbox.code_interpreter.create_context(cwd=self.workdir)
        )
        ours = DaytonaContext(self, context.id, context)
        self.contexts.append(ours)
        return ours

    async def is_active(self, context_id: str) -> bool:
        """Whether the context still has a live worker process."""
        return any(c.id == context_id and c.active for c in await self._list_contexts())

    async def live_contexts(self) -> set[str]:
        return set(await self.contexts_by_id())

    async def contexts_by_id(self) -> dict[str, Any]:
        """The live contexts of every kernel, without the daemon's own."""
        return {c.id: c for c in await self._list_contexts() if c.id != DEFAULT_CONTEXT_ID and c.active}

    async def adopt_context(self, context_id: str) -> DaytonaContext:
        found = (await self.contexts_by_id()).get(context_id)
        if found is None:
            raise ContextDied(f"the interpreter context {context_id} is gone")
        ours = DaytonaContext(self, found.id, found)
        self.contexts.append(ours)
        return ours

    async def end_context(self, context_id: str) -> None:
        found = (await self.contexts_by_id()).get(context_id)
        if found is not None:
            sandbox = await self.host.sdk_sandbox()
            await self.host.api("delete an interpreter context", lambda: sandbox.code_interpreter.delete_context(found))

    async def close_contexts(self) -> None:
        for context in list(self.contexts):
            await context.close()

    async def other_kernels(self, besides: str = "") -> int:
        """How many interpreter contexts in the sandbox are not ours: each live kernel keeps one. ``besides``
        is one that no kernel uses (the next context this kernel's restart left and no process of it took)."""
        return sum(1 for c in await self._list_contexts() if c.id not in (DEFAULT_CONTEXT_ID, besides))

    async def exec(self, command: str, timeout: float | None = None) -> ExecResult:
        sandbox = await self.host.sdk_sandbox()
        response = await self.host.api(
            "run a command in the sandbox",
            lambda: sandbox.process.exec(command, cwd=self.workdir, timeout=int(timeout) if timeout else None),
            retry=False,
        )
        return ExecResult(int(response.exit_code or 0), response.result or "")

    async def upload(self, files: list[tuple[bytes, str]]) -> None:
        from daytona import FileUpload  # the SDK's models: loaded with its client

        sandbox = await self.host.sdk_sandbox()
        uploads = [FileUpload(source=content, destination=dest) for content, dest in files]
        await self.host.api("upload files to the sandbox", lambda: sandbox.fs.upload_files(uploads))

    async def download(self, paths: list[str], limits: dict[str, int] | None = None) -> dict[str, bytes | FileError]:
        """Bulk requests into private temporary files (so the kernel's memory holds none of it while it comes), each
        watched: a file past its limit (``DOWNLOAD_MAX_BYTES`` without one) stops its request at once, counted in
        bytes, never taken from the sandbox's report; a request that brings no byte for ``DOWNLOAD_STALL_S`` is
        stuck (the daemon opens before it stats, so a FIFO blocks it and a device streams, download_files.go); the
        whole call ends by ``DOWNLOAD_DEADLINE_S``. A request that fails as a whole (stuck, or a reply the SDK cannot
        parse) is split and asked for again, so one path that cannot come down fails alone."""
        sandbox = await self.host.sdk_sandbox()
        caps = {path: (limits or {}).get(path, DOWNLOAD_MAX_BYTES) for path in paths}
        out: dict[str, bytes | FileError] = {}
        deadline = time.monotonic() + DOWNLOAD_DEADLINE_S
        batches = [list(dict.fromkeys(paths))]
        while batches:
            batch = [p for p in batches.pop(0) if p not in out]
            if not batch:
                continue
            if time.monotonic() > deadline:
                out.update(
                    dict.fromkeys(batch, FileError(f"the download did not finish within {DOWNLOAD_DEADLINE_S:g} s", retry=True))
                )
                continue
            failure = await self._download_batch(sandbox, batch, caps, out, deadline)
            if failure is None:
                continue
            if len(batch) == 1:
                out[batch[0]] = failure
                continue
            log.info("a download of %d files failed as a whole (%s); asking for them in halves", len(batch), failure.message)
            batches[:0] = [batch[: len(batch) // 2], batch[len(batch) // 2 :]]
        return out

    async def _download_batch(
        self, sandbox: Any, paths: list[str], caps: dict[str, int], out: dict[str, bytes | FileError], deadline: float
    ) -> FileError | None:
        """One batch: None once ``out`` holds each of its paths, else why its request failed as a whole."""
        rest = list(paths)
        while rest:  # a file over its limit stops the request; the others are asked for again without it
            try:
                over = await self._download_limited(sandbox, rest, caps, out, deadline)
            except DownloadStuck as exc:
                return FileError(str(exc), retry=False)
            except BackendError as exc:
                return FileError(str(exc), retry=_is_transient(exc))
            if over is None:
                return None
            out[over] = FileError(f"it is more than {caps[over]} bytes", retry=False, over_limit=True)
            rest = [p for p in rest if p not in out]
        return None

    async def _download_limited(
        self, sandbox: Any, paths: list[str], caps: dict[str, int], out: dict[str, bytes | FileError], deadline: float
    ) -> str | None:
        """One bulk request into temporary files, watched; returns the path that passed its limit (the
        request was then stopped and ``out`` is left alone), or None with ``out`` filled in. Raises DownloadStuck
        when no byte came for ``DOWNLOAD_STALL_S`` or the deadline passed."""
        from daytona import FileDownloadRequest

        with tempfile.TemporaryDirectory(prefix="daytona-kernel-download-") as tmp:
            dests = {path: os.path.join(tmp, str(i)) for i, path in enumerate(paths)}
            requests = [FileDownloadRequest(source=p, destination=dests[p]) for p in paths]
            task = asyncio.ensure_future(
                self.host.api("download files from the sandbox", lambda: sandbox.fs.download_files(requests))
            )
            received, last_byte = 0, time.monotonic()
            try:
                while not task.done():
                    await asyncio.wait({task}, timeout=DOWNLOAD_WATCH_S)
                    sizes = {p: _file_size(dests[p]) for p in paths}
                    over = next((p for p in paths if sizes[p] > caps[p]), None)
                    if over is not None and not task.done():
                        return over
                    now = time.monotonic()
                    if sum(sizes.values()) != received:
                        received, last_byte = sum(sizes.values()), now
                    if not task.done() and (now - last_byte > DOWNLOAD_STALL_S or now > deadline):
                        why = (
                            "the download ran out of time"
                            if now > deadline
                            else f"the sandbox sent nothing for {DOWNLOAD_STALL_S:g} s"
                        )
                        raise DownloadStuck(f"{why} (a FIFO or a device in the sandbox blocks it, or it is too slow)")
            finally:
                if not task.done():
                    task.cancel()
                    await asyncio.wait({task})
            for item in task.result():
                if item.error or item.source not in dests:
                    out[item.source] = _download_result(item)
                else:
                    out[item.source] = await asyncio.to_thread(_read_limited, dests[item.source], caps.get(item.source))
            return None

    async def clone(self, url: str, ref: str | None, dest: str, username: str | None, password: str | None) -> None:
        """Clone with the daemon's go-git (apps/daemon/pkg/git/clone.go): a ``branch`` is read as
        refs/heads/<branch>, ``commit_id`` is checked out after cloning the default branch, and
        credentials count only when both are given (so a token alone gets a default username)."""
        sandbox = await self.host.sdk_sandbox()
        path = posixpath.join(self.workdir, dest)
        if password and not username:
            username = GIT_DEFAULT_USERNAME

        async def clone(branch: str | None = None, commit_id: str | None = None) -> None:
            await self.host.api(
                "clone the repository",
                lambda: sandbox.git.clone(
                    url=url, path=path, branch=branch, commit_id=commit_id, username=username, password=password
                ),
                retry=False,
            )

        if not ref:
            await clone()
        elif FULL_SHA.fullmatch(ref):
            await clone(commit_id=ref)
        else:
            try:
                await clone(branch=ref)
                return
            except AuthError:
                raise
            except BackendError as exc:
                log.info("cloning %s as branch %s failed (%s); trying it as a tag or commit", masked(url), ref, masked(str(exc)))
            await clone()  # the default branch, with the tags that point into it
            result = await self.exec(f"git -C {shlex.quote(dest)} checkout --quiet {shlex.quote(ref)}", API_REQUEST_TIMEOUT_S)
            if result.exit_code:
                raise BackendError(
                    f"repo_ref {ref!r} is not a branch of {masked(url)}, and `git checkout {ref}` in the clone failed: "
                    f"{result.output.strip()}. Give a branch, a tag on the default branch, or a full 40-character commit id."
                )

    async def remove(self, paths: list[str]) -> None:
        if not paths:
            return
        command = "rm -f -- " + " ".join(shlex.quote(p) for p in paths)
        result = await self.exec(command, timeout=API_REQUEST_TIMEOUT_S)
        if result.exit_code:
            raise BackendError(f"Could not delete files in the sandbox: {result.output.strip()}")


def _disconnected(exc: BaseException) -> bool:
    """The toolbox closed the connection before it answered the handshake (Daytona's proxy when busy): try again."""
    disconnected = loaded_error("ServerDisconnectedError")
    if disconnected is not None and isinstance(exc, disconnected):
        return True
    return isinstance(exc, ConnectionResetError)


class DownloadStuck(Exception):
    """A bulk download stopped bringing bytes, or ran past its deadline."""


def _is_transient(exc: BackendError) -> bool:
    """A whole request failed for a reason that a later attempt may not meet (the connection, a 5xx, a 429)."""
    status = getattr(exc.__cause__, "status_code", None)
    return isinstance(exc.__cause__, DaytonaConnectionError) or status in (408, 429) or (status is not None and status >= 500)


def _download_result(item: Any) -> bytes | FileError:
    if item.error:
        status = item.error_details.status_code if item.error_details is not None else None
        return FileError(str(item.error), retry=status is None or status >= 500 or status in (408, 429))
    return item.result if isinstance(item.result, bytes) else item.result.getvalue()


def _file_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _read_limited(path: str, limit: int | None) -> bytes | FileError:
    """A downloaded temporary file's bytes, at most ``limit`` (one byte more tells it is over)."""
    try:
        with open(path, "rb") as f:
            return read_capped(f, limit)
    except OSError as exc:
        return FileError(f"the downloaded copy could not be read: {exc.strerror or exc}", retry=True)
