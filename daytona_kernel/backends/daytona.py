"""The Daytona backend: cells run in a Daytona sandbox through the async SDK.

All SDK calls go through this module, and every SDK error is translated here,
in ``_translate``, into the project's own exceptions with a message that says
what to do. Transient failures (429, 5xx, connection errors) are retried with
jittered backoff for a bounded time, with the status line showing progress;
401/403, a refused connection and an unknown host fail at once, and after one
exhausted budget the next calls fail fast until Daytona answers again.

The lifecycle follows the control plane (``apps/api/src/sandbox/services/
sandbox.service.ts``, FACTS.md "Control plane"): a sandbox that is ``stopping``
is waited for and then started, one that is ``archiving`` is started, a 409
"state change in progress" is waited out within a bounded time, and a 404,
``destroying`` or ``destroyed`` means the sandbox is gone (``SandboxGone``): it
is found or created again. A kernel restart keeps the sandbox (``detach``); a
shutdown stops it only when no other kernel has a context in it.

Idle mode (``IdleMode``, docs/idle.md): with ``idle_action='pause'`` a reused
sandbox whose class can pause gets an auto-pause interval (and auto-stop off)
at creation, so Daytona pauses it when idle even after this process is gone,
and a shutdown pauses it. Any other sandbox (a class that cannot pause,
ephemeral sandboxes, ``idle_action='stop'``) stops, as before, and a pause
that Daytona refuses (400) becomes a stop. A paused sandbox
(``pausing``/``paused``/``resuming``) is ``SandboxPaused``: it is resumed with
``start()`` and its contexts carry on with their variables.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import posixpath
import random
import re
import shlex
import socket
import time
from datetime import datetime
from typing import Any, Awaitable, Callable, TypeVar
from urllib.parse import urlparse

import aiohttp
from daytona import (
    AsyncDaytona,
    CreateSandboxFromImageParams,
    CreateSandboxFromSnapshotParams,
    DaytonaConfig,
    FileDownloadRequest,
    FileUpload,
    ListSandboxesQuery,
    Resources,
    VolumeMount,
)
from daytona.common.errors import (
    DaytonaAuthenticationError,
    DaytonaConflictError,
    DaytonaConnectionError,
    DaytonaError,
    DaytonaForbiddenError,
    DaytonaNotFoundError,
    DaytonaRateLimitError,
    DaytonaTimeoutError,
)

from ..config import DEFAULT_MOUNT_PATH, SANDBOX_WORKDIR, DaytonaSettings
from ..errors import (
    AuthError,
    BackendError,
    ConnectionLost,
    ContextDied,
    ContextTimeout,
    SandboxGone,
    SandboxNotRunning,
    SandboxPaused,
)
from ..identity import owner_id
from .base import Context, ExecResult, FileError, IdleMode, OutputCallback, ProgressCallback, RunError, Sandbox, SandboxPolicy

log = logging.getLogger("daytona_kernel.daytona")
T = TypeVar("T")

RETRY_BUDGET_S = 30.0
RETRY_FIRST_DELAY_S = 0.5
RETRY_MAX_DELAY_S = 8.0
VOLUME_READY_TIMEOUT_S = 120.0
VOLUME_POLL_S = 0.5
SANDBOX_START_TIMEOUT_S = 300
API_REQUEST_TIMEOUT_S = 60
STATE_POLL_S = 0.25  # how often a transition (stopping, starting ...) is checked
DEFAULT_API_URL = "https://app.daytona.io/api"
GIT_DEFAULT_USERNAME = "x-access-token"  # GIT_TOKEN alone: hosts that take a token accept any username
FULL_SHA = re.compile(r"[0-9a-fA-F]{40}")
DEFAULT_CONTEXT_ID = "default"  # the daemon's own context (interpreter/manager.go); never a kernel's

LABEL_APP = "daytona-kernel"
LABEL_WORKSPACE = "daytona-kernel-workspace"
LABEL_OWNER = "daytona-kernel-owner"
LABEL_KERNEL = "daytona-kernel-kernel-id"
LABEL_POLICY = "daytona-kernel-policy"
WS_DONE = 1000
WS_GOING_AWAY = 1001  # the daemon: the worker process ended, or the context was deleted
WS_TIMEOUT = 4008  # the daemon: timeout, or a KeyboardInterrupt escaped the code
STARTABLE_STATES = ("stopped", "archived", "archiving", "paused")  # start() accepts these (and resumes a paused one)
PAUSED_STATES = ("pausing", "paused", "resuming")  # the processes are frozen, not gone
HELD = {"started": "all of it", "paused": "memory and disk", "stopped": "disk only", "archived": "none (in object storage)"}
GONE_STATES = ("destroying", "destroyed")
FAILED_STATES = ("error", "build_failed")


def parse_time(value: Any) -> float | None:
    """An API timestamp (ISO 8601) as epoch seconds, or None."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _duration(seconds: float) -> str:
    minutes, sec = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes}m" if hours else f"{minutes}m {sec}s"


def _status(exc: BaseException | None) -> int | None:
    return getattr(exc, "status_code", None)


def _is_retryable(exc: DaytonaError) -> bool:
    """Worth another try: a connection problem (checked first: the SDK's connection timeout is also a
    DaytonaTimeoutError), a 429 or a 5xx. Any other timeout means we already waited long enough."""
    if isinstance(exc, (DaytonaRateLimitError, DaytonaConnectionError)):
        return True
    if isinstance(exc, DaytonaTimeoutError):
        return False
    status = _status(exc)
    return status is None or status >= 500


def _unreachable_cause(exc: BaseException) -> str | None:
    """"connection refused" or "unknown host" when that is why the request failed: retrying will not help."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, ConnectionRefusedError):
            return "connection refused"
        if isinstance(current, (socket.gaierror, aiohttp.ClientConnectorDNSError)):
            return "unknown host"
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def is_daytona_cloud(api_url: str) -> bool:
    host = urlparse(api_url).hostname or ""
    return host == "daytona.io" or host.endswith(".daytona.io")


def _where_to_look(api_url: str) -> str:
    if is_daytona_cloud(api_url):
        return "Check your network and https://status.daytona.io"
    return f"Check that the Daytona server at {api_url} is running and reachable (DaytonaKernel.api_url or DAYTONA_API_URL)"


class RetriesExhausted(BackendError):
    """Daytona kept failing for the whole retry budget (or is still failing after that)."""


def _unreachable(api_url: str, cause: str) -> BackendError:
    fix = _where_to_look(api_url)
    if cause == "unknown host" and not is_daytona_cloud(api_url):
        fix = f"Check the host name in DaytonaKernel.api_url or DAYTONA_API_URL ({api_url})"
    return BackendError(f"Cannot reach the Daytona API at {api_url} ({cause}). {fix}, then run the cell again.")


def _overlaps(a: str, b: str) -> bool:
    """Is one of two sandbox folders the other, or inside it?"""
    a, b = posixpath.normpath(a), posixpath.normpath(b)
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


def volume_mount_path(configured: str) -> tuple[str, str]:
    """Where to mount the volume, and a notice when the configured mount_path cannot be used.

    The working directory is on the sandbox's disk; a volume mounted at it (or
    above it) would put it back on mount-s3, so such a mount_path (what it
    meant in earlier versions) is replaced by the default.
    """
    if not _overlaps(configured, SANDBOX_WORKDIR):
        return configured, ""
    return DEFAULT_MOUNT_PATH, (
        f"mount_path={configured} would put the working directory on the volume, where renames, appends and "
        f"seeks fail. The working directory is now {SANDBOX_WORKDIR} on the sandbox's disk and the volume, which "
        f"keeps a durable copy of it, is mounted at {DEFAULT_MOUNT_PATH}. Remove mount_path from your configuration.\n"
    )


def state_name(resource: Any) -> str:
    """The state of an SDK sandbox or volume as plain text (the SDK gives an enum, or a str for unknown states)."""
    state = resource.state
    return str(getattr(state, "value", state))


def client_config(config: DaytonaSettings) -> DaytonaConfig:
    """The SDK's config: the kernel's api_url/target, else DAYTONA_API_URL/DAYTONA_TARGET."""
    return DaytonaConfig(
        api_key=os.environ.get("DAYTONA_API_KEY") or None,
        api_url=(config.api_url or os.environ.get("DAYTONA_API_URL") or "").rstrip("/") or None,
        target=config.target or os.environ.get("DAYTONA_TARGET") or None,
    )


def translate_error(exc: DaytonaError, what: str, then: str = "then restart the kernel") -> BackendError:
    """The one place where SDK errors become ours. ``then`` is the last step of the fix."""
    if isinstance(exc, (DaytonaAuthenticationError, DaytonaForbiddenError)):
        return AuthError(
            f"Daytona refused to {what} ({_status(exc) or 'auth'}): check DAYTONA_API_KEY and DAYTONA_TARGET "
            f"(and DAYTONA_API_URL for a self-hosted Daytona), {then}."
        )
    if isinstance(exc, DaytonaNotFoundError):
        return BackendError(f"Could not {what}: not found ({exc}).")
    return BackendError(f"Could not {what}: {exc}")


def _refused(exc: BackendError) -> bool:
    """Daytona refused the request itself (400/422: this sandbox cannot do that), as opposed to failing."""
    return _status(exc.__cause__) in (400, 422)


def _quiet(text: str) -> None:
    log.info("%s", text)


async def call_api(
    what: str,
    fn: Callable[[], Awaitable[T]],
    *,
    retry: bool = True,
    api_url: str = DEFAULT_API_URL,
    progress: ProgressCallback = _quiet,
    budget_s: float = RETRY_BUDGET_S,
) -> T:
    """Call the SDK; retry transient failures with jittered backoff within ``budget_s``; translate errors.

    A refused connection or an unknown host fails at once with the URL and the fix.
    """
    started = time.monotonic()
    delay = RETRY_FIRST_DELAY_S
    while True:
        try:
            return await fn()
        except DaytonaError as exc:
            cause = _unreachable_cause(exc)
            if cause is not None:
                raise _unreachable(api_url, cause) from exc
            if not (retry and _is_retryable(exc)):
                raise translate_error(exc, what) from exc
            wait = delay * random.uniform(0.5, 1.5)
            elapsed = time.monotonic() - started
            if elapsed + wait >= budget_s:
                kept = f"kept failing for {budget_s:g} s" if budget_s else "still fails"
                raise RetriesExhausted(
                    f"Could not {what}: Daytona at {api_url} {kept} ({exc}). {_where_to_look(api_url)}, "
                    "then run the cell again."
                ) from exc
            host = urlparse(api_url).netloc or api_url
            trouble = f"can't reach {host}" if isinstance(exc, DaytonaConnectionError) else f"Daytona answered {_status(exc) or exc}"
            progress(f"{trouble}, retrying {elapsed + wait:.0f}/{budget_s:g} s…")
            log.warning("%s failed (%s); retrying in %.1fs", what, exc, wait)
            await asyncio.sleep(wait)
            delay = min(delay * 2, RETRY_MAX_DELAY_S)


async def open_interpreter_socket(sandbox: Any) -> aiohttp.ClientWebSocketResponse[bool]:
    """The interpreter websocket, opened exactly as the SDK's ``run_code`` opens it.

    ``AsyncCodeInterpreter.run_code`` appends every stdout piece to one growing
    string (quadratic in the output), so the kernel reads the socket itself. The
    URL, auth headers and HTTP session still come from the SDK's own clients, as
    in ``daytona/_async/code_interpreter.py`` (the same from 0.207.1 to 0.226.1).
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
    """An interpreter context in a Daytona sandbox."""

    def __init__(self, owner: DaytonaSandbox, context: Any) -> None:
        self._owner = owner
        self._context = context
        self.id = context.id

    async def run_code(
        self,
        code: str,
        on_stdout: OutputCallback,
        on_stderr: OutputCallback,
        timeout: float | None = None,
    ) -> RunError | None:
        sandbox = self._owner.sdk_sandbox
        try:
            ws = await open_interpreter_socket(sandbox)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:  # nothing ran: find out why
            raise await self._owner.why_unreachable(exc) from exc
        # The daemon reads "timeout" as whole seconds (0 = none; absent = 10 minutes).
        request = {"code": code, "contextId": self.id, "timeout": math.ceil(timeout) if timeout else 0}
        error: RunError | None = None
        try:
            await ws.send_str(json.dumps(request))
            while True:
                msg = await ws.receive()
                if msg.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                    chunk = json.loads(msg.data)
                    kind = chunk.get("type")
                    if kind == "stdout":
                        on_stdout(chunk.get("text", ""))
                    elif kind == "stderr":
                        on_stderr(chunk.get("text", ""))
                    elif kind == "error":
                        error = RunError(chunk.get("name", ""), chunk.get("value", ""), chunk.get("traceback") or "")
                    continue
                close_code = msg.data if msg.type == aiohttp.WSMsgType.CLOSE else ws.close_code
                reason = msg.extra if msg.type == aiohttp.WSMsgType.CLOSE else None
                break
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
            raise await self._owner.why_cut_off(self.id, f"{type(exc).__name__}: {exc}") from exc
        finally:
            if not ws.closed:
                await ws.close()
        if close_code in (WS_DONE, None):
            return error
        if close_code == WS_TIMEOUT:  # a KeyboardInterrupt escaped, or the daemon killed the worker
            raise ContextTimeout("timeout")
        if close_code == WS_GOING_AWAY:  # the worker process ended, or the context was deleted
            raise ContextDied("the interpreter process ended")
        raise await self._owner.why_cut_off(self.id, f"{reason or 'the websocket closed'} (close code {close_code})")

    async def close(self) -> None:
        self._owner.forget(self)
        sandbox = self._owner.sdk_sandbox
        try:
            await sandbox.code_interpreter.delete_context(self._context)
        except DaytonaError as exc:
            log.info("could not delete context %s (%s); it goes away with the sandbox", self.id, exc)


class DaytonaSandbox(Sandbox):
    """A Daytona sandbox found by its workspace labels (``reuse``) or made for this kernel."""

    def __init__(self, config: DaytonaSettings, workspace_key: str, kernel_id: str) -> None:
        self._config = config
        self._key = workspace_key
        self._owner_id = owner_id()
        self._kernel_id = kernel_id
        self._policy = SandboxPolicy(config.sandbox_policy)
        self._notices: list[str] = []
        if config.gpu > 0 and self._policy is not SandboxPolicy.EPHEMERAL:
            # FACTS.md "Control plane": the API refuses a GPU sandbox without autoDeleteInterval=0.
            self._policy = SandboxPolicy.EPHEMERAL
            self._notices.append(
                "GPU sandboxes must be ephemeral on Daytona: this kernel gets a sandbox of its own, kept across "
                "restarts and deleted at shutdown (sandbox_policy 'reuse' does not apply). Files on the volume stay.\n"
            )
        self._client: AsyncDaytona | None = None
        self._sandbox: Any = None
        self._contexts: list[DaytonaContext] = []  # ours, deleted at shutdown and restart
        self._progress: ProgressCallback = _quiet
        self._degraded = False  # the last call exhausted its retries: fail fast until Daytona answers
        self.api_url = (config.api_url or os.environ.get("DAYTONA_API_URL") or DEFAULT_API_URL).rstrip("/")
        self.id = "(not created yet)"
        self.workdir = SANDBOX_WORKDIR
        self._mount_path, notice = volume_mount_path(config.mount_path)
        self.volume_dir = self._mount_path
        if notice:
            self._notices.append(notice)
        self.generation = 0  # +1 for every sandbox found or created: a new one has lost the old one's state
        self._idle_why = ""  # why this sandbox stops rather than pauses, when this kernel created it

    @property
    def description(self) -> str:
        source = self._config.image or self._config.snapshot or "default snapshot"
        return f"Daytona sandbox {self.id} ({source}, {self._policy.value})"

    @property
    def sdk_sandbox(self) -> Any:
        if self._sandbox is None:
            raise SandboxNotRunning("The sandbox is not ready yet.")
        return self._sandbox

    def _labels(self) -> dict[str, str]:
        labels = dict(self._config.labels)
        labels.update(
            {
                LABEL_APP: "true",
                LABEL_WORKSPACE: self._key,
                LABEL_OWNER: self._owner_id,
                LABEL_KERNEL: self._kernel_id,
                LABEL_POLICY: self._policy.value,
            }
        )
        return labels

    def take_notices(self) -> list[str]:
        notices, self._notices = self._notices, []
        return notices

    def forget(self, context: DaytonaContext) -> None:
        if context in self._contexts:
            self._contexts.remove(context)

    async def _api(self, what: str, fn: Callable[[], Awaitable[T]], *, retry: bool = True) -> T:
        """``call_api`` with this sandbox's URL and status line; one exhausted budget makes the next calls
        try once, so a Daytona that is down does not cost every following cell another 30 s."""
        budget = 0.0 if self._degraded else RETRY_BUDGET_S
        try:
            result = await call_api(what, fn, retry=retry, api_url=self.api_url, progress=self._progress, budget_s=budget)
        except RetriesExhausted:
            self._degraded = True
            raise
        self._degraded = False
        return result

    def _client_config(self) -> DaytonaConfig:
        return client_config(self._config)

    @property
    def _subpath(self) -> str:
        """This workspace's sub-folder of the volume, inside this installation's own folder."""
        return f"{self._owner_id}/{self._key}"

    async def start(self, progress: ProgressCallback) -> None:
        self._progress = progress
        try:
            await self._start(progress)
        finally:
            self._progress = _quiet

    async def _start(self, progress: ProgressCallback) -> None:
        if self._client is None:
            try:
                self._client = AsyncDaytona(self._client_config())
            except DaytonaError as exc:
                raise translate_error(exc, "connect to Daytona") from exc
        if self._sandbox is not None:
            try:
                await self.refresh_state()
                await self._ensure_started(progress)
                return
            except SandboxGone as exc:
                log.warning("%s; finding or creating another", exc)
                progress(f"sandbox {self.id} is gone; finding or creating another…")
                self._sandbox = None
                self._contexts.clear()
        volume = await self._ready_volume(progress)
        self._idle_why = ""  # set by _create, when this kernel makes the sandbox
        self._sandbox = await self._find()
        if self._sandbox is not None:
            # a list item lacks the volumes and env that drift and the volume copy are judged by
            found = self._sandbox
            try:
                await self._api("check the sandbox", lambda: found.refresh_data(request_timeout=API_REQUEST_TIMEOUT_S))
                self._check_drift(volume)
            except BackendError as exc:
                if not isinstance(exc.__cause__, DaytonaNotFoundError):
                    raise
                self._sandbox = None  # deleted since the list: make another
        if self._sandbox is None:
            self._sandbox = await self._create(volume, progress)
        self.id = self._sandbox.id
        self.generation += 1
        try:
            await self._ensure_started(progress)
        except SandboxGone:  # deleted between the list and the start
            self._sandbox = await self._create(volume, progress)
            self.id = self._sandbox.id
            await self._ensure_started(progress)
        self._note_idle_mode()
        await self._prepare_workdir()
        if self._policy is SandboxPolicy.REUSE and self._sandbox.labels.get(LABEL_KERNEL) != self._kernel_id:
            labels = dict(self._sandbox.labels, **{LABEL_KERNEL: self._kernel_id})
            await self._api("label the sandbox with this kernel", lambda: self._sandbox.set_labels(labels))

    async def info(self) -> dict[str, str]:
        if self._sandbox is None:
            return {"sandbox": "not created yet", "policy": self._policy.value}
        state = await self.refresh_state()
        sb = self._sandbox
        info = {
            "sandbox": f"{sb.id} ({self._config.image or sb.snapshot or 'default snapshot'}, target {sb.target})",
            "state": state,
            "policy": self._policy.value,
            "resources": f"{sb.cpu} CPU, {sb.memory} GiB RAM, {sb.disk} GiB disk"
            + (f", {sb.gpu} GPU" if sb.gpu else "")
            + f" (held now: {HELD.get(state, 'see the Daytona dashboard')})",
        }
        created = parse_time(sb.created_at)
        if created is not None:
            info["uptime"] = _duration(time.time() - created)
        info["idle mode"] = self._idle_text()
        info["last activity"] = self._activity_text(state)
        info["volume"] = f"{self._config.volume_name} at {self.volume_dir or '(not mounted)'} (sub-folder {self._subpath})"
        info["working directory"] = f"{self.workdir} (on the sandbox's disk; the volume keeps a copy)"
        if state == "started":
            info["disk"] = await self._disk_use()
        return info

    def _idle_text(self) -> str:
        """The idle mode in effect and why (``%daytona status``)."""
        sb, cfg = self._sandbox, self._config
        if self.idle_mode is IdleMode.PAUSE:
            text = f"pause after {sb.auto_pause_interval} min idle and at shutdown: variables survive; memory is billed while paused"
            if cfg.idle_action != IdleMode.PAUSE.value:
                text += " (configured: idle_action 'stop'; `%daytona recreate` applies it)"
            return text
        minutes = sb.auto_stop_interval or 0
        text = (f"stop after {minutes} min idle" if minutes else "never stops by itself") + ": only the disk is kept, variables are lost"
        text += " (checkpoint_on_idle saves them first)" if cfg.checkpoint_on_idle else " (checkpoint_on_idle is off)"
        why = self._idle_why or self._why_not_pause()
        if not why:  # this kernel would pause, but found a sandbox made to stop
            why = "the sandbox was created to stop (by an earlier kernel, or where it cannot pause); `%daytona recreate` asks for pausing again"
        return f"{text}; not paused because {why}"

    def _activity_text(self, state: str) -> str:
        """Time since the last activity, and when auto-pause or auto-stop will act."""
        sb = self._sandbox
        last = parse_time(sb.last_activity_at) or parse_time(sb.updated_at)
        idle_s = max(time.time() - last, 0.0) if last is not None else None
        text = f"{_duration(idle_s)} ago" if idle_s is not None else "unknown"
        if state != "started":
            return f"{text}; {state} now" + ("; the next cell resumes it" if state in PAUSED_STATES else "")
        action, minutes = ("auto-pause", sb.auto_pause_interval) if self.idle_mode is IdleMode.PAUSE else ("auto-stop", sb.auto_stop_interval)
        if not minutes or idle_s is None:
            return f"{text}; {action} off"
        return f"{text}; {action} in about {_duration(max(minutes * 60 - idle_s, 0))} if idle from now"

    async def _disk_use(self) -> str:
        """Use of the sandbox's own disk; stopped sandboxes keep counting against the organisation's quota."""
        result = await self.exec("df -Pk /", timeout=API_REQUEST_TIMEOUT_S)
        fields = result.output.strip().splitlines()[-1].split() if result.exit_code == 0 else []
        if len(fields) < 4 or not (fields[1].isdigit() and fields[2].isdigit()):
            return f"unknown ({result.output.strip()[:80]})"
        used_gib, size_gib = int(fields[2]) / 2**20, int(fields[1]) / 2**20
        return (
            f"{used_gib:.1f} of {size_gib:.1f} GiB used; stopped sandboxes count against your quota too "
            "(`daytona-kernel gc` lists them)"
        )

    async def _prepare_workdir(self) -> None:
        """Make the working directory on the sandbox's disk (a context's cwd must exist), once per sandbox.

        A sandbox made before the working directory moved to the disk has the
        volume mounted at it; it keeps working there, without a separate copy.
        """
        mounts = [v.mount_path for v in (self._sandbox.volumes or [])]
        self.volume_dir = self._mount_path if self._mount_path in mounts else ""  # mounts are fixed at creation
        if any(_overlaps(m, self.workdir) for m in mounts):
            self.volume_dir = ""
            self._notices.append(
                f"This sandbox was made with the volume mounted at the working directory {self.workdir}, where "
                "renames, appends, zip files and sqlite fail. Delete the sandbox (or `%daytona recreate`) to get the "
                "working directory on the sandbox's disk.\n"
            )
            return
        sandbox = self._sandbox
        command = f"mkdir -p {shlex.quote(self.workdir)}"
        result = await self._api("make the working directory", lambda: sandbox.process.exec(command, timeout=int(API_REQUEST_TIMEOUT_S)))
        if result.exit_code:
            raise BackendError(f"Could not make the working directory {self.workdir} in the sandbox: {result.result}")

    async def _ready_volume(self, progress: ProgressCallback) -> Any:
        client = self._client
        assert client is not None
        name = self._config.volume_name
        volume = await self._api(f"get or create the volume {name!r}", lambda: client.volume.get(name, create=True))
        deadline = time.monotonic() + VOLUME_READY_TIMEOUT_S
        while state_name(volume) != "ready":
            state = state_name(volume)
            if state == "error":
                raise BackendError(
                    f"The volume {name!r} is in the error state ({volume.error_reason or 'no reason given'}). "
                    "Delete it in the Daytona dashboard or set DaytonaKernel.volume_name to another name."
                )
            if time.monotonic() > deadline:
                raise BackendError(f"The volume {name!r} did not become ready within {VOLUME_READY_TIMEOUT_S:g} s (state {state}).")
            progress(f"waiting for volume {name}… ({state})")
            await asyncio.sleep(VOLUME_POLL_S)
            volume = await self._api(f"check the volume {name!r}", lambda: client.volume.get(name))
        return volume

    def _identity(self, mine: bool) -> dict[str, str]:
        """The labels that find this folder's sandbox, or (``mine``) the one this kernel created."""
        labels = self._labels()
        keys = (LABEL_APP, LABEL_OWNER, LABEL_WORKSPACE) + ((LABEL_KERNEL,) if mine else ())
        return {key: labels[key] for key in keys}

    async def _find(self) -> Any:
        """'reuse': the folder's sandbox. 'ephemeral': the one this kernel made before a restart (the
        Jupyter kernel id, in a label, is the same across a restart)."""
        return await self._find_by(self._identity(mine=self._policy is SandboxPolicy.EPHEMERAL))

    async def _find_by(self, labels: dict[str, str]) -> Any:
        client = self._client
        assert client is not None
        query = ListSandboxesQuery(labels=labels)

        async def first() -> Any:
            async for sandbox in client.list(query):
                if state_name(sandbox) not in GONE_STATES:
                    return sandbox
            return None

        return await self._api("look for this notebook's sandbox", first)

    def _why_not_pause(self) -> str:
        """Why this kernel does not ask Daytona to pause its sandbox when idle ("" when it does)."""
        if self._config.idle_action != IdleMode.PAUSE.value:
            return "idle_action is 'stop'"
        if self._policy is SandboxPolicy.EPHEMERAL:
            return "ephemeral sandboxes cannot pause"
        if not self._config.auto_pause_interval:
            return "auto_pause_interval is 0"
        return ""

    def _note_idle_mode(self) -> None:
        """The idle mode of the sandbox in use: what it was created with (settings are fixed at creation)."""
        minutes = self._sandbox.auto_pause_interval or 0
        self.idle_mode = IdleMode.PAUSE if minutes else IdleMode.STOP
        self.auto_pause_s = minutes * 60.0

    async def _create(self, volume: Any, progress: ProgressCallback) -> Any:
        """Create the sandbox. To pause when idle it is created with neither idle interval: Daytona then
        gives a class that can pause auto-pause (with auto-stop off) and any other class auto-stop
        (CreateSandbox.autoPauseInterval), so nothing is refused; the configured minutes are set after."""
        self._idle_why = self._why_not_pause()
        sandbox = await self._create_with(volume, progress, self._config.auto_stop_interval if self._idle_why else None)
        if not self._idle_why:
            await self._set_idle_interval(sandbox)
        return sandbox

    async def _set_idle_interval(self, sandbox: Any) -> None:
        """Set the configured auto-pause minutes, or, on a sandbox Daytona gave auto-stop, the auto-stop minutes."""
        cfg = self._config
        if sandbox.auto_pause_interval:
            if sandbox.auto_pause_interval != cfg.auto_pause_interval:
                try:
                    await self._api("set the auto-pause interval", lambda: sandbox.set_auto_pause_interval(cfg.auto_pause_interval))
                except BackendError as exc:
                    if not _refused(exc):
                        raise
                    log.warning("Daytona refused auto_pause_interval=%s (%s); it stays %s min", cfg.auto_pause_interval, exc, sandbox.auto_pause_interval)
            return
        self._idle_why = f"Daytona does not pause sandboxes of class {sandbox.sandbox_class or '(unknown)'}"
        if (sandbox.auto_stop_interval or 0) != cfg.auto_stop_interval:
            await self._api("set the auto-stop interval", lambda: sandbox.set_autostop_interval(cfg.auto_stop_interval))

    async def _create_with(self, volume: Any, progress: ProgressCallback, auto_stop_interval: int | None) -> Any:
        client = self._client
        assert client is not None
        cfg = self._config
        common: dict[str, Any] = dict(
            labels=self._labels(),
            env_vars={k: v for k, v in cfg.env.items()},
            auto_stop_interval=auto_stop_interval,  # None: Daytona's default for the sandbox's class
            auto_archive_interval=cfg.auto_archive_interval,  # 0 = the API's maximum, as the help text says
            auto_delete_interval=0 if self._policy is SandboxPolicy.EPHEMERAL else cfg.auto_delete_interval,
            volumes=[VolumeMount(volume_id=volume.id, mount_path=self._mount_path, subpath=self._subpath)],
            network_block_all=cfg.network_block_all or None,
        )
        if cfg.image:
            resources = Resources(cpu=cfg.cpu or None, memory=cfg.memory or None, disk=cfg.disk or None, gpu=cfg.gpu or None)
            params: Any = CreateSandboxFromImageParams(image=cfg.image, resources=resources, **common)
            progress(f"creating sandbox… (image {cfg.image}; building it can take minutes)")
        else:
            params = CreateSandboxFromSnapshotParams(snapshot=cfg.snapshot or None, **common)
            progress(f"creating sandbox… (snapshot {cfg.snapshot or 'default'})")
        sandbox = await self._create_once(lambda: client.create(params, timeout=SANDBOX_START_TIMEOUT_S), progress)
        log.info("created sandbox %s for workspace %s", sandbox.id, self._key)
        return sandbox

    async def _create_once(self, create: Callable[[], Awaitable[Any]], progress: ProgressCallback) -> Any:
        """Create is not idempotent (FACTS.md "Control plane"): after a 5xx or a lost connection the
        sandbox may exist all the same, so look it up by this kernel's labels before trying again."""
        started = time.monotonic()
        delay = RETRY_FIRST_DELAY_S
        while True:
            try:
                return await create()
            except DaytonaError as exc:
                cause = _unreachable_cause(exc)
                if cause is not None:
                    raise _unreachable(self.api_url, cause) from exc
                if not _is_retryable(exc):
                    raise translate_error(exc, "create a sandbox") from exc
                failure = exc
            found = await self._find_by(self._identity(mine=True))
            if found is not None:
                log.warning("creating a sandbox failed (%s) but it was created: using %s", failure, found.id)
                return found
            wait = delay * random.uniform(0.5, 1.5)
            elapsed = time.monotonic() - started
            if elapsed + wait >= RETRY_BUDGET_S:
                raise RetriesExhausted(
                    f"Could not create a sandbox: Daytona at {self.api_url} kept failing for {RETRY_BUDGET_S:g} s "
                    f"({failure}). {_where_to_look(self.api_url)}, then run the cell again."
                ) from failure
            progress(f"creating sandbox… ({_status(failure) or 'no answer'}, retrying {elapsed + wait:.0f}/{RETRY_BUDGET_S:g} s)")
            await asyncio.sleep(wait)
            delay = min(delay * 2, RETRY_MAX_DELAY_S)

    def _state(self) -> str:
        return state_name(self._sandbox)

    def _check_drift(self, volume: Any) -> None:
        """Settings are fixed at creation (FACTS.md "Control plane"): name what a reused sandbox no
        longer matches, once, with the way out. A volume mounted elsewhere moves the working directory
        there, so the kernel keeps working."""
        sb, cfg = self._sandbox, self._config
        drift = []
        if cfg.snapshot and not cfg.image and sb.snapshot != cfg.snapshot:
            drift.append(f"snapshot {sb.snapshot} (configured: {cfg.snapshot})")
        for name, want, have in (("cpu", cfg.cpu, sb.cpu), ("memory", cfg.memory, sb.memory), ("disk", cfg.disk, sb.disk), ("gpu", cfg.gpu, sb.gpu)):
            if cfg.image and want and want != have:
                drift.append(f"{name} {have} (configured: {want})")
        env = sb.env or {}
        changed = sorted(k for k, v in cfg.env.items() if env.get(k) != v)
        if changed:
            drift.append(f"environment variables {', '.join(changed)}")
        mounts = [v for v in (sb.volumes or []) if v.volume_id == volume.id]
        if not mounts:
            drift.append(f"no volume {cfg.volume_name}")
        elif all(v.mount_path != self._mount_path for v in mounts):
            drift.append(f"the volume mounted at {mounts[0].mount_path} (configured: {self._mount_path})")
        if drift:
            self._notices.append(
                f"The sandbox {sb.id} was created with other settings: {'; '.join(drift)}. It keeps its old "
                "settings; run `%daytona recreate` to rebuild it with the current configuration (variables and "
                "the sandbox's own disk are lost; the volume is kept).\n"
            )

    async def recreate(self, progress: ProgressCallback) -> None:
        """Delete this sandbox and make a new one with the current configuration (``%daytona recreate``)."""
        if self._sandbox is not None:
            await self._close_contexts()
            old = self._sandbox
            progress(f"deleting sandbox {old.id}…")
            await self._api("delete the sandbox", lambda: old.delete(timeout=API_REQUEST_TIMEOUT_S, wait=True))
            self._sandbox = None
        await self.start(progress)

    async def _ensure_started(self, progress: ProgressCallback) -> None:
        """Bring the sandbox to ``started`` from whatever state the API reports, within a bounded time.

        ``stopping``/``starting``/``creating``...: wait (the SDK's wait for a start never resolves on a
        stopping sandbox). ``stopped``/``archived``/``archiving``: start it; a 409 "state change in
        progress" (another kernel or the dashboard is changing it) means wait and look again.
        ``destroying``/``destroyed``: SandboxGone.
        """
        sandbox = self._sandbox
        began = time.monotonic()
        while True:
            state = self._state()
            if state == "started":
                return
            if state in GONE_STATES:
                raise SandboxGone(f"The sandbox {sandbox.id} was deleted ({state}).")
            if state in FAILED_STATES:
                raise BackendError(
                    f"The sandbox {sandbox.id} is in the {state} state ({sandbox.error_reason or 'no reason given'}). "
                    "Fix the snapshot or image, or delete the sandbox in the Daytona dashboard, then restart the kernel."
                )
            waited = time.monotonic() - began
            if waited > SANDBOX_START_TIMEOUT_S:
                raise BackendError(
                    f"The sandbox {sandbox.id} stayed {state} for {SANDBOX_START_TIMEOUT_S} s. Look at it in the "
                    "Daytona dashboard (or delete it), then run the cell again."
                )
            if state in STARTABLE_STATES:
                progress(f"{'resuming' if state == 'paused' else 'starting'} {state} sandbox {sandbox.id}…")
                if await self._start_or_conflict(SANDBOX_START_TIMEOUT_S - waited):
                    return
            else:
                progress(f"waiting for sandbox {sandbox.id}: {state} ({waited:.0f} s)…")
            await asyncio.sleep(STATE_POLL_S)
            await self.refresh_state()

    async def _start_or_conflict(self, timeout_s: float) -> bool:
        """Start the sandbox and wait for ``started``; False if its state is already changing (409)."""
        sandbox = self._sandbox
        try:
            await self._api("start the sandbox", lambda: sandbox.start(timeout=max(timeout_s, 1.0)))
            return True
        except BackendError as exc:
            if isinstance(exc.__cause__, DaytonaConflictError):  # FACTS.md: 409 "state change in progress"
                log.info("start of %s: %s; waiting for the state change to finish", sandbox.id, exc.__cause__)
                return False
            # Newer API code answers the same conflict as a 400 (SandboxError): wait if the state moved on.
            if _status(exc.__cause__) == 400 and await self.refresh_state() not in ("stopped", "archived", "paused"):
                log.info("start of %s: %s; its state is changing, waiting", sandbox.id, exc.__cause__)
                return False
            raise

    async def refresh_state(self) -> str:
        """The sandbox's state now. Raises SandboxGone if it no longer exists or is being destroyed."""
        try:
            await self._api("check the sandbox", lambda: self._sandbox.refresh_data(request_timeout=API_REQUEST_TIMEOUT_S))
        except BackendError as exc:
            if isinstance(exc.__cause__, DaytonaNotFoundError):
                raise SandboxGone(f"The sandbox {self.id} no longer exists (deleted, or ephemeral and stopped).") from exc
            raise
        state = self._state()
        if state in GONE_STATES:
            raise SandboxGone(f"The sandbox {self.id} was deleted ({state}).")
        return state

    async def why_unreachable(self, exc: BaseException) -> BackendError:
        """The interpreter websocket did not open, so no code ran. Say why.

        A stopped sandbox refuses the handshake with 400, a vanished one with 404;
        the sandbox's state says which (FACTS.md, "Sandbox state seen from the websocket").
        """
        try:
            state = await self.refresh_state()
        except BackendError as inner:
            return inner
        if state in PAUSED_STATES:
            return SandboxPaused(f"The sandbox {self.id} is {state}.")
        if state != "started":
            return SandboxNotRunning(f"The sandbox {self.id} is {state}.")
        status = exc.status if isinstance(exc, aiohttp.WSServerHandshakeError) else None
        if status in (401, 403):
            return AuthError(
                f"Daytona refused to open the interpreter ({status}): check DAYTONA_API_KEY and DAYTONA_TARGET, "
                "then restart the kernel."
            )
        if status is None or status == 429 or status >= 500:
            return SandboxNotRunning(f"The sandbox {self.id} did not answer ({type(exc).__name__}: {exc}).")
        return BackendError(f"Could not reach the interpreter in sandbox {self.id}: {exc}")

    async def why_cut_off(self, context_id: str, detail: str) -> BackendError:
        """A running cell's stream broke. Did the sandbox stop, the worker die, or just the connection?"""
        try:
            state = await self.refresh_state()
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
        contexts = await self._api("list interpreter contexts", lambda: self._sandbox.code_interpreter.list_contexts())
        if not any(c.id == context_id and c.active for c in contexts):
            return ContextDied("the interpreter process is gone")
        return ConnectionLost(
            f"The connection to the sandbox was lost while the cell ran ({detail}). The cell may still be "
            "running there; its further output is lost. Your variables are kept."
        )

    async def create_context(self) -> DaytonaContext:
        sandbox = self.sdk_sandbox

        async def create() -> Any:
            return await self._api(
                "create an interpreter context", lambda: sandbox.code_interpreter.create_context(cwd=self.workdir)
            )

        try:
            context = await create()
        except BackendError:
            try:
                if await self.refresh_state() == "started":
                    raise
                await self._ensure_started(self._progress)  # it stopped since we last looked
            except SandboxGone:
                await self.start(self._progress)  # deleted since we last looked: find or create another
            sandbox = self.sdk_sandbox
            context = await create()
        ours = DaytonaContext(self, context)
        self._contexts.append(ours)
        return ours

    supports_attach = True  # the daemon keeps a context's worker when its client goes (docs/reattach.md)

    async def _contexts_by_id(self) -> dict[str, Any]:
        contexts = await self._api("list interpreter contexts", lambda: self.sdk_sandbox.code_interpreter.list_contexts())
        return {c.id: c for c in contexts if c.id != DEFAULT_CONTEXT_ID and c.active}

    async def live_contexts(self) -> set[str]:
        return set(await self._contexts_by_id())

    async def adopt_context(self, context_id: str) -> DaytonaContext:
        found = (await self._contexts_by_id()).get(context_id)
        if found is None:
            raise ContextDied(f"the interpreter context {context_id} is gone")
        ours = DaytonaContext(self, found)
        self._contexts.append(ours)
        return ours

    async def end_context(self, context_id: str) -> None:
        found = (await self._contexts_by_id()).get(context_id)
        if found is not None:
            sandbox = self.sdk_sandbox
            await self._api("delete an interpreter context", lambda: sandbox.code_interpreter.delete_context(found))

    async def exec(self, command: str, timeout: float | None = None) -> ExecResult:
        sandbox = self.sdk_sandbox
        response = await self._api(
            "run a command in the sandbox",
            lambda: sandbox.process.exec(command, cwd=self.workdir, timeout=int(timeout) if timeout else None),
            retry=False,
        )
        return ExecResult(int(response.exit_code or 0), response.result or "")

    async def upload(self, files: list[tuple[bytes, str]]) -> None:
        sandbox = self.sdk_sandbox
        uploads = [FileUpload(source=content, destination=dest) for content, dest in files]
        await self._api("upload files to the sandbox", lambda: sandbox.fs.upload_files(uploads))

    async def download(self, paths: list[str]) -> dict[str, bytes | FileError]:
        sandbox = self.sdk_sandbox
        results = await self._api(
            "download files from the sandbox",
            lambda: sandbox.fs.download_files([FileDownloadRequest(source=p) for p in paths]),
        )
        out: dict[str, bytes | FileError] = {}
        for item in results:
            if item.error:
                status = item.error_details.status_code if item.error_details is not None else None
                out[item.source] = FileError(str(item.error), retry=status is None or status >= 500 or status in (408, 429))
            else:
                out[item.source] = item.result if isinstance(item.result, bytes) else item.result.getvalue()
        return out

    async def clone(self, url: str, ref: str | None, dest: str, username: str | None, password: str | None) -> None:
        """Clone with the daemon's go-git (apps/daemon/pkg/git/clone.go): a ``branch`` is read as
        refs/heads/<branch>, ``commit_id`` is checked out after cloning the default branch, and
        credentials count only when both are given (so a token alone gets a default username)."""
        sandbox = self.sdk_sandbox
        path = posixpath.join(self.workdir, dest)
        if password and not username:
            username = GIT_DEFAULT_USERNAME

        async def clone(branch: str | None = None, commit_id: str | None = None) -> None:
            await self._api(
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
                log.info("cloning %s as branch %s failed (%s); trying it as a tag or commit", url, ref, exc)
            await clone()  # the default branch, with the tags that point into it
            result = await self.exec(f"git -C {shlex.quote(dest)} checkout --quiet {shlex.quote(ref)}", API_REQUEST_TIMEOUT_S)
            if result.exit_code:
                raise BackendError(
                    f"repo_ref {ref!r} is not a branch of {url}, and `git checkout {ref}` in the clone failed: "
                    f"{result.output.strip()}. Give a branch, a tag on the default branch, or a full 40-character commit id."
                )

    async def remove(self, paths: list[str]) -> None:
        if not paths:
            return
        command = "rm -f -- " + " ".join(shlex.quote(p) for p in paths)
        result = await self.exec(command, timeout=API_REQUEST_TIMEOUT_S)
        if result.exit_code:
            raise BackendError(f"Could not delete files in the sandbox: {result.output.strip()}")

    async def detach(self) -> None:
        """A kernel restart: delete this kernel's contexts and keep the sandbox running, so the next
        kernel process (same Jupyter kernel id) finds it started: %pip installs and files survive."""
        try:
            await self._close_contexts()
        finally:
            await self._close_client()

    async def shutdown(self) -> None:
        """Release by policy: 'ephemeral' deletes; 'reuse' stops, unless another kernel still has a
        context in the sandbox (two notebooks in one folder): then it stays up for that kernel, and
        auto-stop ends it once every kernel has gone quiet."""
        try:
            if self._sandbox is not None:
                await self._close_contexts()
                if self._policy is SandboxPolicy.EPHEMERAL:
                    await self._api("delete the sandbox", lambda: self._sandbox.delete(timeout=API_REQUEST_TIMEOUT_S))
                elif self._state() == "started":
                    others = await self._other_kernels()
                    if others:
                        log.info("sandbox %s left running: %d other kernel context(s) use it", self.id, others)
                    else:
                        await self._pause_or_stop()
        finally:
            await self._close_client()

    async def _pause_or_stop(self) -> None:
        """Pause the sandbox in pause mode (stop it if Daytona refuses), else stop it."""
        sandbox = self._sandbox
        if self.idle_mode is IdleMode.PAUSE:
            try:
                await self._api("pause the sandbox", lambda: sandbox.pause(timeout=API_REQUEST_TIMEOUT_S))
                return
            except BackendError as exc:
                if not _refused(exc):
                    raise
                log.warning("Daytona refused to pause sandbox %s (%s); stopping it instead", self.id, exc)
        await self._api("stop the sandbox", lambda: sandbox.stop(timeout=API_REQUEST_TIMEOUT_S))

    async def resume_if_paused(self, progress: ProgressCallback) -> bool:
        if self._sandbox is None or await self.refresh_state() not in PAUSED_STATES:
            return False
        self._progress = progress
        try:
            await self._ensure_started(progress)
        finally:
            self._progress = _quiet
        return True

    async def _close_contexts(self) -> None:
        for context in list(self._contexts):
            await context.close()

    async def _other_kernels(self) -> int:
        """How many interpreter contexts in the sandbox are not ours: each live kernel keeps one."""
        contexts = await self._api("list interpreter contexts", lambda: self._sandbox.code_interpreter.list_contexts())
        return sum(1 for c in contexts if c.id != DEFAULT_CONTEXT_ID)

    async def _close_client(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
