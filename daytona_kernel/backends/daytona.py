"""The Daytona backend: cells run in a Daytona sandbox through the async SDK.

All SDK calls go through this module, and every SDK error is translated here,
in ``_translate``, into the project's own exceptions with a message that says
what to do. Transient failures (429, 5xx, connection errors) are retried with
jittered backoff for a bounded time; 401/403 fail at once.
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
import time
from datetime import datetime
from typing import Any, Awaitable, Callable, TypeVar

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
    DaytonaConnectionError,
    DaytonaError,
    DaytonaForbiddenError,
    DaytonaNotFoundError,
    DaytonaRateLimitError,
    DaytonaTimeoutError,
)

from ..config import DEFAULT_MOUNT_PATH, SANDBOX_WORKDIR, DaytonaSettings
from ..errors import AuthError, BackendError, ConnectionLost, ContextDied, ContextTimeout, SandboxNotRunning
from ..identity import owner_id
from .base import Context, ExecResult, FileError, OutputCallback, ProgressCallback, RunError, Sandbox, SandboxPolicy

log = logging.getLogger("daytona_kernel.daytona")
T = TypeVar("T")

RETRY_BUDGET_S = 30.0
RETRY_FIRST_DELAY_S = 0.5
RETRY_MAX_DELAY_S = 8.0
VOLUME_READY_TIMEOUT_S = 120.0
VOLUME_POLL_S = 0.5
SANDBOX_START_TIMEOUT_S = 300
REQUEST_TIMEOUT_S = 60

LABEL_APP = "daytona-kernel"
LABEL_WORKSPACE = "daytona-kernel-workspace"
LABEL_OWNER = "daytona-kernel-owner"
LABEL_KERNEL = "daytona-kernel-kernel-id"
LABEL_POLICY = "daytona-kernel-policy"
WS_DONE = 1000
WS_GOING_AWAY = 1001  # the daemon: the worker process ended, or the context was deleted
WS_TIMEOUT = 4008  # the daemon: timeout, or a KeyboardInterrupt escaped the code
STARTABLE_STATES = ("stopped", "archived")
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


def _status(exc: DaytonaError) -> int | None:
    return getattr(exc, "status_code", None)


def _is_retryable(exc: DaytonaError) -> bool:
    status = _status(exc)
    if isinstance(exc, (DaytonaRateLimitError, DaytonaConnectionError)):
        return True
    return status is None or status >= 500


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


async def _call(what: str, fn: Callable[[], Awaitable[T]], *, retry: bool = True) -> T:
    """Call the SDK; retry transient failures with jittered backoff; translate errors."""
    deadline = time.monotonic() + RETRY_BUDGET_S
    delay = RETRY_FIRST_DELAY_S
    while True:
        try:
            return await fn()
        except DaytonaError as exc:
            if retry and _is_retryable(exc) and not isinstance(exc, DaytonaTimeoutError):
                wait = delay * random.uniform(0.5, 1.5)
                if time.monotonic() + wait < deadline:
                    log.warning("%s failed (%s); retrying in %.1fs", what, exc, wait)
                    await asyncio.sleep(wait)
                    delay = min(delay * 2, RETRY_MAX_DELAY_S)
                    continue
                raise BackendError(
                    f"Could not {what}: Daytona kept failing for {RETRY_BUDGET_S:g} s ({exc}). "
                    "Check https://status.daytona.io or your network, then run the cell again."
                ) from exc
            raise translate_error(exc, what) from exc


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
        self._client: AsyncDaytona | None = None
        self._sandbox: Any = None
        self.id = "(not created yet)"
        self.workdir = SANDBOX_WORKDIR
        self._mount_path, notice = volume_mount_path(config.mount_path)
        self.volume_dir = self._mount_path
        self._notices = [notice] if notice else []

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

    def _client_config(self) -> DaytonaConfig:
        return client_config(self._config)

    @property
    def _subpath(self) -> str:
        """This workspace's sub-folder of the volume, inside this installation's own folder."""
        return f"{self._owner_id}/{self._key}"

    async def start(self, progress: ProgressCallback) -> None:
        if self._client is None:
            try:
                self._client = AsyncDaytona(self._client_config())
            except DaytonaError as exc:
                raise translate_error(exc, "connect to Daytona") from exc
        if self._sandbox is not None:
            await self._ensure_started(progress)
            return
        volume = await self._ready_volume(progress)
        if self._policy is SandboxPolicy.REUSE:
            self._sandbox = await self._find()
        if self._sandbox is None:
            self._sandbox = await self._create(volume, progress)
        self.id = self._sandbox.id
        await self._ensure_started(progress)
        await self._prepare_workdir()
        if self._policy is SandboxPolicy.REUSE and self._sandbox.labels.get(LABEL_KERNEL) != self._kernel_id:
            labels = dict(self._sandbox.labels, **{LABEL_KERNEL: self._kernel_id})
            await _call("label the sandbox with this kernel", lambda: self._sandbox.set_labels(labels))

    async def info(self) -> dict[str, str]:
        if self._sandbox is None:
            return {"sandbox": "not created yet", "policy": self._policy.value}
        state = await self.refresh_state()
        sb = self._sandbox
        info = {
            "sandbox": f"{sb.id} ({self._config.image or sb.snapshot or 'default snapshot'}, target {sb.target})",
            "state": state,
            "policy": self._policy.value,
            "resources": f"{sb.cpu} CPU, {sb.memory} GiB RAM, {sb.disk} GiB disk" + (f", {sb.gpu} GPU" if sb.gpu else ""),
        }
        created = parse_time(sb.created_at)
        if created is not None:
            info["uptime"] = _duration(time.time() - created)
        interval = sb.auto_stop_interval or 0
        last = parse_time(sb.last_activity_at) or parse_time(sb.updated_at)
        if interval and last is not None:
            left = interval * 60 - (time.time() - last)
            info["auto-stop"] = f"after {interval} min idle; in about {_duration(max(left, 0))} if idle from now"
        else:
            info["auto-stop"] = "off"
        info["volume"] = f"{self._config.volume_name} at {self.volume_dir or '(not mounted)'} (sub-folder {self._subpath})"
        info["working directory"] = f"{self.workdir} (on the sandbox's disk; the volume keeps a copy)"
        return info

    def take_notices(self) -> list[str]:
        notices, self._notices = self._notices, []
        return notices

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
        result = await _call("make the working directory", lambda: sandbox.process.exec(command, timeout=int(REQUEST_TIMEOUT_S)))
        if result.exit_code:
            raise BackendError(f"Could not make the working directory {self.workdir} in the sandbox: {result.result}")

    async def _ready_volume(self, progress: ProgressCallback) -> Any:
        client = self._client
        assert client is not None
        name = self._config.volume_name
        volume = await _call(f"get or create the volume {name!r}", lambda: client.volume.get(name, create=True))
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
            volume = await _call(f"check the volume {name!r}", lambda: client.volume.get(name))
        return volume

    async def _find(self) -> Any:
        client = self._client
        assert client is not None
        query = ListSandboxesQuery(labels={LABEL_APP: "true", LABEL_OWNER: self._owner_id, LABEL_WORKSPACE: self._key})

        async def first() -> Any:
            async for sandbox in client.list(query):
                if state_name(sandbox) not in ("destroyed", "destroying"):
                    return sandbox
            return None

        return await _call("look for this notebook's sandbox", first)

    async def _create(self, volume: Any, progress: ProgressCallback) -> Any:
        client = self._client
        assert client is not None
        cfg = self._config
        common: dict[str, Any] = dict(
            labels=self._labels(),
            env_vars={k: v for k, v in cfg.env.items()},
            auto_stop_interval=cfg.auto_stop_interval,
            auto_archive_interval=cfg.auto_archive_interval or None,
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
        sandbox = await _call("create a sandbox", lambda: client.create(params, timeout=SANDBOX_START_TIMEOUT_S))
        log.info("created sandbox %s for workspace %s", sandbox.id, self._key)
        return sandbox

    def _state(self) -> str:
        return state_name(self._sandbox)

    async def _ensure_started(self, progress: ProgressCallback) -> None:
        sandbox = self._sandbox
        state = self._state()
        if state == "started":
            return
        if state in FAILED_STATES:
            raise BackendError(
                f"The sandbox {sandbox.id} is in the {state} state ({sandbox.error_reason or 'no reason given'}). "
                "Fix the snapshot or image, or delete the sandbox in the Daytona dashboard, then restart the kernel."
            )
        if state in STARTABLE_STATES:
            progress(f"starting {state} sandbox {sandbox.id}…")
            await _call("start the sandbox", lambda: sandbox.start(timeout=SANDBOX_START_TIMEOUT_S))
        else:
            progress(f"waiting for sandbox {sandbox.id} ({state})…")
            await _call("wait for the sandbox", lambda: sandbox.wait_for_sandbox_start(timeout=SANDBOX_START_TIMEOUT_S))

    async def refresh_state(self) -> str:
        await _call("check the sandbox", lambda: self._sandbox.refresh_data(request_timeout=REQUEST_TIMEOUT_S))
        return self._state()

    async def why_unreachable(self, exc: BaseException) -> BackendError:
        """The interpreter websocket did not open, so no code ran. Say why.

        A stopped sandbox refuses the handshake with 400, a vanished one with 404;
        the sandbox's state says which (FACTS.md, "Sandbox state seen from the websocket").
        """
        try:
            state = await self.refresh_state()
        except BackendError as inner:
            return inner
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
        except BackendError as inner:
            return ConnectionLost(f"The connection to the sandbox was lost ({detail}) and it cannot be reached: {inner}")
        if state != "started":
            return ContextDied(f"the sandbox stopped ({state})")
        contexts = await _call("list interpreter contexts", lambda: self._sandbox.code_interpreter.list_contexts())
        if not any(c.id == context_id and c.active for c in contexts):
            return ContextDied("the interpreter process is gone")
        return ConnectionLost(
            f"The connection to the sandbox was lost while the cell ran ({detail}). The cell may still be "
            "running there; its further output is lost. Your variables are kept."
        )

    async def create_context(self) -> DaytonaContext:
        sandbox = self.sdk_sandbox

        async def create() -> Any:
            return await _call(
                "create an interpreter context", lambda: sandbox.code_interpreter.create_context(cwd=self.workdir)
            )

        try:
            context = await create()
        except BackendError:
            if await self.refresh_state() == "started":
                raise
            await self._ensure_started(lambda text: log.info("%s", text))  # it stopped since we last looked
            context = await create()
        return DaytonaContext(self, context)

    async def exec(self, command: str, timeout: float | None = None) -> ExecResult:
        sandbox = self.sdk_sandbox
        response = await _call(
            "run a command in the sandbox",
            lambda: sandbox.process.exec(command, cwd=self.workdir, timeout=int(timeout) if timeout else None),
            retry=False,
        )
        return ExecResult(int(response.exit_code or 0), response.result or "")

    async def upload(self, files: list[tuple[bytes, str]]) -> None:
        sandbox = self.sdk_sandbox
        uploads = [FileUpload(source=content, destination=dest) for content, dest in files]
        await _call("upload files to the sandbox", lambda: sandbox.fs.upload_files(uploads))

    async def download(self, paths: list[str]) -> dict[str, bytes | FileError]:
        sandbox = self.sdk_sandbox
        results = await _call(
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
        sandbox = self.sdk_sandbox
        path = posixpath.join(self.workdir, dest)
        await _call(
            "clone the repository",
            lambda: sandbox.git.clone(url=url, path=path, branch=ref or None, username=username, password=password),
            retry=False,
        )

    async def remove(self, paths: list[str]) -> None:
        if not paths:
            return
        command = "rm -f -- " + " ".join(shlex.quote(p) for p in paths)
        result = await self.exec(command, timeout=REQUEST_TIMEOUT_S)
        if result.exit_code:
            raise BackendError(f"Could not delete files in the sandbox: {result.output.strip()}")

    async def shutdown(self) -> None:
        try:
            if self._sandbox is not None:
                if self._policy is SandboxPolicy.EPHEMERAL:
                    await _call("delete the sandbox", lambda: self._sandbox.delete(timeout=REQUEST_TIMEOUT_S))
                elif self._state() == "started":
                    await _call("stop the sandbox", lambda: self._sandbox.stop(timeout=REQUEST_TIMEOUT_S))
        finally:
            if self._client is not None:
                await self._client.close()
                self._client = None
