"""A loopback emulator of the Daytona REST and toolbox APIs, for the unmodified SDK.

It works the way moto works for boto3: point ``DAYTONA_API_URL`` at
``emulator.api_url`` and the real ``daytona`` SDK talks to it.

Fidelity:
- every request body is parsed with the SDK's own generated models; an unknown
  field or a wrong type is a 400, so a client bug fails loudly;
- every response DTO is checked against the SDK's models before it is sent;
- code runs in a worker that behaves like the daemon's (``local/worker.py``,
  driven by ``InterpreterWorker``: fd 1 is the protocol pipe, non-JSON lines are
  dropped, a 1 MiB line stops the reader, SIGINT then SIGKILL on timeout, a dead
  worker is replaced silently), over the interpreter websocket with the
  daemon's frames and close codes (1000, 4008, 1008, 1001, 1002) and its
  slow-consumer cut-off. See
  ``apps/daemon/pkg/toolbox/process/interpreter/`` (controller.go,
  repl_client.go, websocket.go) in Daytona's source.

Test controls: per-endpoint request counters and the requests in order (``sequence``), and faults: the next N calls of
an endpoint fail with a status, the next websocket is dropped mid-cell, a
sandbox is stopped underneath the kernel (losing its contexts), delays; the
next pause job fails (``fail_next_pause``), a pause or stop gets in just before
a request (``before_next``), the sandboxes' disks fill up (``upload_space``),
snapshots with resources (``snapshots``), sandbox classes (``sandbox_class``).

Control plane (``apps/api/src/sandbox/services/sandbox.service.ts``, and
``dto/sandbox.dto.ts`` getSandboxState() for the states the API reports):
transitions take time (``transition_s`` per transitional state: creating, starting, stopping, archiving, destroying, pausing, resuming);
a start, stop or delete during a transition answers 409 "Sandbox state change in progress"
(``exceptions/state-change-in-progress.exception.ts``; destroy() refuses any pending change, ``pending``
being state != desiredState except on the way to archived or in error, ``entities/sandbox.entity.ts``)
(start during ``archiving`` is accepted); an ephemeral sandbox
(autoDeleteInterval=0) is destroyed when it stops, after which GET is 404; a
GPU sandbox must be ephemeral (400), and for a snapshot create its resources,
the GPU count included, come from the snapshot (``snapshots``); every toolbox
request counts as activity and ``run_auto_stop`` / ``run_auto_pause`` do what
Daytona's auto-stop and auto-pause do to sandboxes idle past their interval.

Pausing, as ``pause()``, ``stop()``, ``start()`` and ``recover()`` in
sandbox.service.ts (v0.190.0) do it: ``pause()`` answers 400 "Sandbox must be in
started state to pause" for any sandbox not started (a paused one included),
409 while a change of a started sandbox is pending (``stopping``,
``destroying``), and 422 "Pausing is not supported for this sandbox" for a
class that cannot pause (only ``linux-vm`` and ``windows`` can:
``pausable_classes``; new sandboxes get the class ``sandbox_class``). Pausing
freezes every process of the sandbox (SIGSTOP to each worker's process group)
through ``pausing`` to ``paused``; ``start()`` resumes it through ``resuming``
and continues them (SIGCONT), so interpreter contexts keep their variables;
``stop()`` is accepted from ``paused``. While paused the toolbox answers as for
a stopped sandbox (400). A pause job that fails (``fail_next_pause``) leaves
the sandbox in ``error`` with ``recoverable`` as the runner said
(job-state-handler.service.ts); ``start()`` and ``stop()`` refuse an errored
sandbox (400) and ``recover()`` starts it again. What survives a failed pause
is not in the public source: the emulator assumes only the disk (its processes
die, as in a stop). Auto-pause is not in the public API: the SDK's docstrings
(``daytona`` 0.226.1) give its rules: at most one of autoStopInterval and
autoPauseInterval may be non-zero; auto-pause is refused for ephemeral
sandboxes and for classes that cannot pause; a pausable class given neither
interval auto-pauses after 60 minutes with auto-stop off.

State events (``apps/api/src/notification/gateways/notification.gateway.ts``):
a Socket.IO server at ``/api/socket.io/`` (websocket transport only) takes the
API key as its ``auth.token``, puts the client in its organization's room and
sends it ``sandbox.created`` and ``sandbox.state.updated`` (``{sandbox,
oldState, newState}``) and ``sandbox.desired-state.updated`` as the state
changes, so the SDK waits for a transition by its events instead of polling
``GET /sandbox/{id}`` once a second. ``state_events = False`` before ``start()``
turns them off (the SDK then polls, as against an API it cannot reach).

Stop, delete and the harsh paths (docs/daytona-platform.md has the sources): a stop, an auto-stop or a
delete SIGKILLs every process of the sandbox at once (each context's process group and each running
``process/execute`` command's: the daemon is PID 1, apps/runner/pkg/docker/container_configs.go), so no
atexit runs; a DELETE while a change is pending is a 409 "Sandbox state change in progress"; context create
and delete hold one lock per sandbox, which every execute handshake and list also takes
(interpreter/manager.go); ``list_lag_s`` keeps a new sandbox out of the (eventually consistent) list for a
while, and a second create with a name in use is a 409 "already exists"; ``failed_auth = (limit, ttl_s)`` is
Daytona's failed-auth throttler (off by default); ``lifecycle_rate`` the sandbox-lifecycle one; bulk download
streams, opens each path before it stats it (a FIFO blocks, a device streams, a directory is 400
INVALID_FILE_PATH) and names parts as download_files.go does; processes get the sandbox's environment, never
this machine's DAYTONA_* variables.

Processes: ``process/execute`` runs the command as the daemon does
(``apps/daemon/pkg/toolbox/process/execute.go``): the first of zsh and bash
listed in /etc/shells (else sh) reads the command on its stdin, in a process
group of its own; stdout and stderr come back combined; on timeout the whole
group is SIGKILLed and the answer is 408; a cwd that does not exist gives exit
code -1 with the error as the result. The sandbox's processes are this
machine's: a stop kills them and its contexts are gone, but PIDs do not start
again from 1 after a stop (no PID namespace per sandbox), so a test that needs
a pid recorded before a stop to name another process after it has to arrange
that itself.

Creates run concurrently, within the organisation's limits (``apps/api/src/sandbox/services/
sandbox.service.ts`` about lines 250-305, and the ``sandbox-create`` throttler on ``POST /sandbox``
in ``sandbox.controller.ts`` about line 233): ``create_rate = (limit, seconds)`` answers a create over
the limit with 429 and the seconds to wait in ``Retry-After-sandbox-create`` (@nestjs/throttler names
the header after the throttler), and ``quota`` (``{"cpu": 4, "memory": 8, "disk": 30, "gpu": 0}``, any
of them) refuses a create that would pass a total with 400 "Total CPU limit exceeded. Maximum
allowed: N." (CPU and memory count for the compute states, disk for those and stopped, paused and archiving:
``organization/constants/sandbox-states-consuming-*.constant.ts``; archived, error and destroying count nothing).

Paths inside a sandbox: a path under a volume's mount path is on that volume;
a path under /home/daytona (the sandbox user's home) or a relative path is in
the sandbox's own folder (its disk); any other absolute path is used as it is on
this machine.

Volumes: each volume is a folder (the bucket), and each sandbox mount of it is
the emulated mount-s3 filesystem of ``mounts3.py`` over the mount's sub-folder,
mounted at the mount path inside the sandbox's folder, as Daytona's runner
mounts mount-s3 (no rename, no append, no seek-back writes ...). Where FUSE is
missing the mount is a symlink to the plain folder, and ``volume_semantics``
says so (``fuse_missing`` says why).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import socketio
from aiohttp import WSMsgType, web
from daytona_api_client.models.create_sandbox import CreateSandbox
from daytona_api_client.models.create_volume import CreateVolume
from daytona_api_client.models.list_sandboxes_response import ListSandboxesResponse
from daytona_api_client.models.sandbox import Sandbox as SandboxModel
from daytona_api_client.models.sandbox_labels import SandboxLabels
from daytona_api_client.models.snapshot_dto import SnapshotDto
from daytona_api_client.models.volume_dto import VolumeDto
from daytona_toolbox_api_client.models.create_context_request import CreateContextRequest
from daytona_toolbox_api_client.models.execute_request import ExecuteRequest
from daytona_toolbox_api_client.models.execute_response import ExecuteResponse
from daytona_toolbox_api_client.models.files_download_request import FilesDownloadRequest
from daytona_toolbox_api_client.models.git_clone_request import GitCloneRequest
from daytona_toolbox_api_client.models.interpreter_context import InterpreterContext
from daytona_toolbox_api_client.models.list_contexts_response import ListContextsResponse
from mounts3 import MountS3, fuse_missing

from daytona_kernel.backends.local.interpreter import Chunk, InterpreterWorker, WorkerEnd

API_KEY = "dtn_emulator0123456789abcdefghij"
ORG_ID = "emulator-org"
WS_TIMEOUT = 4008
WS_POLICY = 1008  # context not found, code is required, slow consumer
WS_WORKER_EXITED = 1001  # the worker ended, or the context was deleted
WS_PROTOCOL_ERROR = 1002  # the first message is not a valid ExecuteRequest
WS_CLIENT_FRAMES = 1024  # websocket.go: the client's send channel; a full channel drops the client
DEFAULT_EXEC_TIMEOUT_S = 600  # controller.go: a request without "timeout" gets 10 minutes
WS_CLOSE_CODES = {
    WorkerEnd.COMPLETED: 1000,
    WorkerEnd.INTERRUPTED: WS_TIMEOUT,
    WorkerEnd.KILLED: WS_TIMEOUT,
    WorkerEnd.EXITED: WS_WORKER_EXITED,
}
VOLUME_READY_AFTER_S = 0.3
SANDBOX_HOME = "/home/daytona"  # the default snapshot's user (images/sandbox/Dockerfile)
TRANSITION_S = 0.1  # how long each transitional state lasts unless a test sets transition_s
# The states a start is accepted in (sandbox.service.ts start(): stopped, archived, archiving; and paused, which it resumes).
STARTABLE = ("stopped", "archived", "archiving", "paused")
DEFAULT_AUTO_PAUSE_MIN = 60  # CreateSandbox.autoPauseInterval: a pausable class given neither interval
DEFAULT_AUTO_STOP_MIN = 15
UPGRADE_TIER = (
    "To increase concurrency limits, upgrade your organization's Tier by visiting https://app.daytona.io/dashboard/limits."
)
QUOTA_NAMES = {"cpu": "CPU", "memory": "memory", "disk": "disk", "gpu": "GPU"}
QUOTA_UNITS = {"cpu": "", "memory": "GiB", "disk": "GiB", "gpu": ""}
# organization/constants/sandbox-states-consuming-compute.constant.ts and sandbox-states-consuming-disk.constant.ts
# (the states the emulator has): archived, error and destroying sandboxes count for nothing
CONSUMING_COMPUTE = ("creating", "started", "starting", "stopping", "pausing", "resuming")
CONSUMING_DISK = (*CONSUMING_COMPUTE, "stopped", "paused", "archiving")
PAUSABLE_CLASSES = ("linux-vm", "windows")  # sandbox.service.ts pause(): SandboxClass.LINUX_VM, SandboxClass.WINDOWS
PENDING_FROM_STARTED = ("stopping", "destroying")  # the API's state is still STARTED, with a change pending
GPU_MUST_BE_EPHEMERAL = "GPU sandboxes must be ephemeral - set autoDeleteInterval to 0"  # sandbox.service.ts 525, 867
STATE_CHANGE_IN_PROGRESS = "Sandbox state change in progress"  # exceptions/state-change-in-progress.exception.ts
SOCKETIO_PATH = "/api/socket.io/"  # notification.gateway.ts @WebSocketGateway({path, transports: ['websocket']})


@functools.lru_cache(maxsize=1)
def daemon_shell() -> str:
    """common/get_shell.go GetShell(): zsh, else bash, as listed in /etc/shells; else sh."""
    try:
        shells = Path("/etc/shells").read_text()
    except OSError:
        return "sh"
    for shell in ("/usr/bin/zsh", "/bin/zsh", "/usr/bin/bash", "/bin/bash"):
        if shell in shells:
            return shell
    return "sh"


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


class BadRequest(Exception):
    pass


def parse(model: Any, body: Any) -> Any:
    """Parse a request body with the SDK's model; unknown fields and bad types are errors."""
    if not isinstance(body, dict):
        raise BadRequest(f"{model.__name__}: expected a JSON object")
    try:
        obj = model.from_dict(body)
    except Exception as exc:  # pydantic.ValidationError and friends
        raise BadRequest(f"{model.__name__}: {exc}") from exc
    extra = sorted(getattr(obj, "additional_properties", {}) or {})
    if extra:
        raise BadRequest(f"{model.__name__}: unknown field(s) {extra}")
    return obj


def checked(model: Any, data: dict[str, Any]) -> dict[str, Any]:
    """Make sure the SDK accepts a DTO before it goes out."""
    model.from_dict(data)
    return data


@dataclass
class EmuVolume:
    id: str
    name: str
    created: float = field(default_factory=time.monotonic)
    state: str = "pending_create"
    error_reason: str | None = None

    def dto(self) -> dict[str, Any]:
        if self.state == "pending_create" and time.monotonic() - self.created > VOLUME_READY_AFTER_S:
            self.state = "ready"
        return checked(
            VolumeDto,
            {
                "id": self.id,
                "name": self.name,
                "organizationId": ORG_ID,
                "state": self.state,
                "createdAt": _now(),
                "updatedAt": _now(),
                "errorReason": self.error_reason,
            },
        )


@dataclass
class EmuContext:
    id: str
    cwd: str
    worker: InterpreterWorker
    created_at: str = field(default_factory=_now)


@dataclass
class EmuSandbox:
    id: str
    spec: dict[str, Any]
    labels: dict[str, str]
    home: Path
    mounts: list[tuple[str, Path]]  # (mount path in the sandbox, where it is on this machine)
    state: str = "started"
    error_reason: str | None = None
    recoverable: bool | None = None  # of an error: the runner said whether recover() can fix it
    contexts: dict[str, EmuContext] = field(default_factory=dict)
    created_at: str = field(default_factory=_now)
    fuse_mounts: list[MountS3] = field(default_factory=list)
    sockets: set[asyncio.BaseTransport] = field(default_factory=set)  # open interpreter websockets
    desired: str = "started"  # the API's desiredState; state != desired means a transition is under way
    last_activity: float = field(default_factory=time.time)  # epoch seconds of the last toolbox request
    sandbox_class: str = "container"
    pausable: bool = False  # its class supports pausing
    frozen: bool = False  # its processes are SIGSTOPped (pausing, paused, resuming)
    listed_from: float = 0.0  # monotonic time from which the (eventually consistent) list shows it
    context_lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # interpreter/manager.go: one lock for its contexts
    process_groups: set[int] = field(default_factory=set)  # the process groups of process/execute commands running

    @property
    def ephemeral(self) -> bool:
        return self.spec.get("autoDeleteInterval") == 0

    @property
    def auto_stop_min(self) -> int:
        return int(self.spec.get("autoStopInterval", DEFAULT_AUTO_STOP_MIN))

    @property
    def auto_pause_min(self) -> int:
        return int(self.spec.get("autoPauseInterval") or 0)


class DaytonaEmulator:
    """See the module docstring. Start it with ``start()``; it serves from a thread."""

    def __init__(self, root: Path, api_key: str = API_KEY, python: str = sys.executable, fuse: bool = True) -> None:
        self.root = Path(root)
        self.fuse_missing = fuse_missing() if fuse else "FUSE was turned off for this emulator"
        self.volume_semantics = "folder" if self.fuse_missing else "mount-s3"
        self.api_key = api_key
        self.python = python
        self.counts: Counter[str] = Counter()
        self.sequence: list[str] = []  # every request's "METHOD /route", in the order they came (since reset_counts)
        self.sandboxes: dict[str, EmuSandbox] = {}
        self.volumes: dict[str, EmuVolume] = {}
        self.delay_s = 0.0
        self.transition_s = dict.fromkeys(
            ("creating", "starting", "stopping", "archiving", "destroying", "pausing", "resuming"), TRANSITION_S
        )
        self.sandbox_class = "container"  # the class new sandboxes get (SandboxClass.CONTAINER, the default)
        self.pausable_classes: set[str] = set(PAUSABLE_CLASSES)  # the sandbox classes that support pausing
        # snapshots by name: their resources ({"cpu", "mem", "disk", "gpu"}); a snapshot create takes them
        self.snapshots: dict[str, dict[str, int]] = {}
        self.state_events = True  # the Socket.IO gateway; set before start()
        self.upload_space: int | None = None  # bytes the sandboxes' disks still take through bulk upload (None: no limit)
        self._failing_pauses: list[tuple[str, bool]] = []  # (errorReason, recoverable) for the next pause jobs
        self._fail_after_create: list[int] = []  # statuses for the next creates, answered after creating
        self.create_rate: tuple[int, float] | None = None  # (creates, seconds): Daytona's sandbox-create throttler
        # The list is eventually consistent (sandbox.controller.ts listSandboxes: "Eventually consistent", served by a
        # search index): a new sandbox shows in it only this many seconds after its create. GET by id or name is not.
        self.list_lag_s = 0.0
        self.lifecycle_rate: tuple[int, float] | None = None  # (calls, seconds): the sandbox-lifecycle throttler
        self._throttle_hits: dict[str, list[float]] = {}  # per throttler: when the calls within its window came
        self.throttled = 0  # creates and lifecycle calls answered 429
        self.failed_auth: tuple[int, float] | None = None  # (limit, ttl_s): Daytona's failed-auth throttler, off by default
        self._auth_hits: dict[str, tuple[float, int]] = {}  # client address -> (window start, failures in it)
        self._auth_blocked: dict[str, float] = {}  # client address -> blocked until (monotonic)
        self.quota: dict[str, int] = {}  # the organisation's totals: cpu, memory (GiB), disk (GiB), gpu
        self._pending: list[dict[str, int]] = []  # creates under way, counted as Daytona counts pending usage
        self.git_credentials: dict[str, tuple[str, str]] = {}  # url -> (username, password) a private repo wants
        self.git_auth_seen: list[tuple[str | None, str | None]] = []  # (username, password) of each clone
        self._faults: list[list[Any]] = []  # [route substring, status, remaining]
        self._before: list[tuple[str, Any]] = []  # (route substring, what happens first) for the next such request
        self._background: set[asyncio.Future[Any]] = set()
        self._drop_ws_after: int | None = None
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._sio: socketio.AsyncServer | None = None
        self._events: asyncio.Queue[tuple[str, dict[str, Any]]] | None = None
        self._pump: asyncio.Future[None] | None = None
        self.port = 0

    # -- lifecycle -----------------------------------------------------------

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    @property
    def toolbox_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/toolbox"

    def env(self) -> dict[str, str]:
        """Environment for a kernel that should talk to this emulator."""
        return {"DAYTONA_API_KEY": self.api_key, "DAYTONA_API_URL": self.api_url, "DAYTONA_TARGET": "us"}

    def start(self) -> DaytonaEmulator:
        ready = threading.Event()

        def serve() -> None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(self._serve())
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, name="daytona-emulator", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the Daytona emulator did not start")
        return self

    async def _serve(self) -> None:
        app = web.Application(middlewares=[self._middleware], client_max_size=1024**3)
        if self.state_events:
            self._sio = socketio.AsyncServer(async_mode="aiohttp", transports=["websocket"], logger=False, engineio_logger=False)
            self._sio.on("connect", self._socket_connect)
            self._sio.attach(app, socketio_path=SOCKETIO_PATH)
            self._events = asyncio.Queue()
            self._pump = asyncio.ensure_future(self._pump_events(self._sio, self._events))
        r = app.router
        r.add_post("/api/sandbox", self.create_sandbox)
        r.add_get("/api/sandbox", self.list_sandboxes)
        r.add_get("/api/sandbox/{sid}", self.get_sandbox)
        r.add_delete("/api/sandbox/{sid}", self.delete_sandbox)
        r.add_post("/api/sandbox/{sid}/start", self.start_sandbox)
        r.add_post("/api/sandbox/{sid}/stop", self.stop_sandbox_request)
        r.add_post("/api/sandbox/{sid}/pause", self.pause_sandbox_request)
        r.add_post("/api/sandbox/{sid}/recover", self.recover_sandbox)
        r.add_get("/api/snapshots/{name}", self.get_snapshot)
        r.add_post("/api/sandbox/{sid}/autopause/{interval}", self.set_auto_pause_interval)
        r.add_post("/api/sandbox/{sid}/autostop/{interval}", self.set_auto_stop_interval)
        r.add_put("/api/sandbox/{sid}/labels", self.set_labels)
        r.add_get("/api/sandbox/{sid}/toolbox-proxy-url", self.toolbox_proxy_url)
        r.add_post("/api/volumes", self.create_volume)
        r.add_get("/api/volumes", self.list_volumes)
        r.add_get("/api/volumes/by-name/{name}", self.get_volume_by_name)
        r.add_get("/api/volumes/{vid}", self.get_volume)
        r.add_delete("/api/volumes/{vid}", self.delete_volume)
        t = "/toolbox/{sid}"
        r.add_post(t + "/process/interpreter/context", self.create_context)
        r.add_get(t + "/process/interpreter/context", self.list_contexts)
        r.add_delete(t + "/process/interpreter/context/{cid}", self.delete_context)
        r.add_get(t + "/process/interpreter/execute", self.execute)
        r.add_post(t + "/process/execute", self.process_execute)
        r.add_post(t + "/files/bulk-upload", self.bulk_upload)
        r.add_post(t + "/git/clone", self.git_clone)
        r.add_post(t + "/files/bulk-download", self.bulk_download)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def close(self) -> None:
        if self._loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(120)  # aiohttp waits up to 60 s for open handlers
        self._loop.call_soon_threadsafe(self._loop.stop)
        assert self._thread is not None
        self._thread.join(10)

    async def _shutdown(self) -> None:
        for sandbox in list(self.sandboxes.values()):
            await self._kill_contexts(sandbox)
        await asyncio.gather(*(self._unmount(sandbox) for sandbox in list(self.sandboxes.values())))
        if self._sio is not None:
            await self._sio.shutdown()
        if self._pump is not None:
            self._pump.cancel()
        if self._runner is not None:
            await self._runner.cleanup()

    def call(self, coro: Any, timeout: float = 30) -> Any:
        """Run a coroutine on the emulator's loop from a test thread."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    # -- test controls -------------------------------------------------------

    def reset_counts(self) -> None:
        with self._lock:
            self.counts.clear()
            self.sequence.clear()

    def count(self, route_part: str) -> int:
        with self._lock:
            return sum(n for route, n in self.counts.items() if route_part in route)

    def fail_next(self, route_part: str, status: int, times: int = 1) -> None:
        """The next ``times`` requests whose ``METHOD /route`` contains route_part get ``status``."""
        with self._lock:
            self._faults.append([route_part, status, times])

    def clear_faults(self) -> None:
        """Forget the faults of ``fail_next`` that no request has used up."""
        with self._lock:
            self._faults.clear()

    def before_next(self, route_part: str, action: str) -> None:
        """Just before the next request whose ``METHOD /route`` contains route_part, its sandbox is paused
        (``action="pause"``) or starts stopping (``"stop"``): who wins a race with auto-pause or the dashboard."""
        with self._lock:
            self._before.append((route_part, action))

    def drop_next_websocket(self, after_frames: int = 1) -> None:
        """Cut the next interpreter websocket abruptly after it sent ``after_frames`` frames."""
        with self._lock:
            self._drop_ws_after = after_frames

    def cut_websockets(self, sandbox_id: str) -> int:
        """Cut every open interpreter websocket of a sandbox (a dropped VPN, a sleeping laptop) and
        leave the cells running: the daemon keeps draining the workers' output and drops it
        (docs/reattach.md). Returns how many were cut."""

        async def cut() -> int:
            sockets = list(self.sandboxes[sandbox_id].sockets)
            for transport in sockets:
                transport.abort()
            return len(sockets)

        return int(self.call(cut()))

    def stop_sandbox(self, sandbox_id: str, state: str = "stopped") -> None:
        """What auto-stop (or auto-archive) does: the sandbox stops and loses every process.

        ``state="archived"`` goes on through ``archiving``. An ephemeral sandbox is destroyed instead.
        """
        self.call(self._stop(self.sandboxes[sandbox_id], archive=state == "archived"))

    def delete_sandbox_now(self, sandbox_id: str) -> None:
        """What a delete in the dashboard does: the sandbox goes through destroying to destroyed (404)."""

        async def delete() -> None:
            sandbox = self.sandboxes[sandbox_id]
            await self._kill_processes(sandbox)
            self._transition(sandbox, "destroying", "destroyed")

        self.call(delete())

    def run_auto_stop(self) -> list[str]:
        """Daytona's auto-stop: every started sandbox idle longer than its autoStopInterval stops.

        Tests make a sandbox idle by moving its ``last_activity`` back. Returns the ids stopped.
        """

        async def sweep() -> list[str]:
            stopped = []
            for sandbox in list(self.sandboxes.values()):
                interval_min = sandbox.auto_stop_min
                idle_s = time.time() - sandbox.last_activity
                if sandbox.state == "started" and interval_min and idle_s > interval_min * 60:
                    await self._stop(sandbox)
                    stopped.append(sandbox.id)
            return stopped

        return self.call(sweep())

    def run_auto_pause(self) -> list[str]:
        """Daytona's auto-pause: every started sandbox idle longer than its autoPauseInterval pauses.

        Like ``run_auto_stop``, tests make a sandbox idle by moving its ``last_activity`` back.
        Returns the ids paused.
        """

        async def sweep() -> list[str]:
            paused = []
            for sandbox in list(self.sandboxes.values()):
                idle_s = time.time() - sandbox.last_activity
                if sandbox.state == "started" and sandbox.auto_pause_min and idle_s > sandbox.auto_pause_min * 60:
                    self._pause(sandbox)
                    paused.append(sandbox.id)
            return paused

        return self.call(sweep())

    def pause_sandbox(self, sandbox_id: str) -> None:
        """What a pause from the dashboard (or auto-pause) does: every process freezes, through ``pausing``."""

        async def pause() -> None:
            self._pause(self.sandboxes[sandbox_id])

        self.call(pause())

    def fail_next_pause(self, reason: str = "failed to pause the sandbox", recoverable: bool = True) -> None:
        """The next pause job fails: the sandbox goes from ``pausing`` to ``error`` with this reason and
        ``recoverable`` flag (what the runner reports), and its processes are gone."""
        with self._lock:
            self._failing_pauses.append((reason, recoverable))

    def fail_after_create(self, status: int = 500, times: int = 1) -> None:
        """The next ``times`` creates make their sandbox, then answer ``status`` (create is not idempotent)."""
        with self._lock:
            self._fail_after_create.extend([status] * times)

    def wait_for_state(self, sandbox_id: str, state: str, timeout: float = 10.0) -> None:
        """Block until a sandbox reaches ``state`` (for tests that race a transition)."""
        deadline = time.monotonic() + timeout
        while self.sandboxes[sandbox_id].state != state:
            if time.monotonic() > deadline:
                raise TimeoutError(f"sandbox {sandbox_id} is {self.sandboxes[sandbox_id].state}, not {state}")
            time.sleep(0.01)

    def add_volume(self, name: str, state: str = "ready", error_reason: str | None = None) -> None:
        with self._lock:
            volume = EmuVolume(str(uuid.uuid4()), name, state=state, error_reason=error_reason)
            self.volumes[volume.id] = volume

    def live_sandboxes(self) -> list[EmuSandbox]:
        return [s for s in self.sandboxes.values() if s.state not in ("destroying", "destroyed")]

    # -- plumbing ------------------------------------------------------------

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path.startswith(SOCKETIO_PATH):  # Socket.IO authenticates in its own handshake
            return await handler(request)
        route = request.match_info.route.resource
        key = f"{request.method} {route.canonical if route is not None else request.path}"
        with self._lock:
            self.counts[key] += 1
            self.sequence.append(key)
            fault = next((f for f in self._faults if f[0] in key and f[2] > 0), None)
            if fault is not None:
                fault[2] -= 1
            before = next((b for b in self._before if b[0] in key), None)
            if before is not None:
                self._before.remove(before)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return self._failed_auth(request.remote or "")
        if fault is not None:
            return self._error(fault[1], f"injected fault {fault[1]}")
        if before is not None:
            sandbox = self._sandbox(request)
            if before[1] == "pause":
                self._pause(sandbox)
                while sandbox.state == "pausing":
                    await asyncio.sleep(0.01)
            else:
                await self._stop(sandbox)
        if request.path.startswith("/toolbox/"):
            self._touch(request.match_info.get("sid", ""))
        try:
            return await handler(request)
        except BadRequest as exc:
            return self._error(400, str(exc))
        except KeyError as exc:
            return self._error(404, f"not found: {exc}")

    def _failed_auth(self, client: str) -> web.Response:
        """A 401, counted by the failed-auth throttler when it is configured (``failed_auth = (limit, ttl_s)``; off by
        default, as in Daytona): auth/failed-auth-tracker.service.ts incrementFailedAuth(), per client address. The
        ``limit``-th failure within ``ttl_s`` blocks the address for ``ttl_s``: that failure and every one after it is
        a 429 "ThrottlerException: Too Many Requests" (filters/all-exceptions.filter.ts) with
        ``X-RateLimit-Remaining-failed-auth: 0`` and a ``Retry-After`` of what is left of the block (the whole ttl
        when it begins); headers from common/utils/rate-limit-headers.util.ts."""
        if self.failed_auth is None:
            return self._error(401, "Invalid credentials")
        limit, ttl_s = self.failed_auth
        now = time.monotonic()
        with self._lock:
            blocked_until = self._auth_blocked.get(client, 0.0)
            if blocked_until > now:
                retry_after = max(1, math.ceil(blocked_until - now))
                return self._rate_limited_auth(limit, retry_after)
            started, hits = self._auth_hits.get(client, (now, 0))
            if now - started >= ttl_s:
                started, hits = now, 0
            hits += 1
            self._auth_hits[client] = (started, hits)
            if hits >= limit:
                self._auth_blocked[client] = now + ttl_s
                return self._rate_limited_auth(limit, math.ceil(ttl_s))
        response = self._error(401, "Invalid credentials")
        response.headers.update(
            {
                "X-RateLimit-Limit-failed-auth": str(limit),
                "X-RateLimit-Remaining-failed-auth": str(max(0, limit - hits)),
                "X-RateLimit-Reset-failed-auth": str(math.ceil(started + ttl_s - now)),
            }
        )
        return response

    def _rate_limited_auth(self, limit: int, retry_after: int) -> web.Response:
        response = self._error(429, "ThrottlerException: Too Many Requests")
        response.headers.update(
            {
                "X-RateLimit-Limit-failed-auth": str(limit),
                "X-RateLimit-Remaining-failed-auth": "0",
                "X-RateLimit-Reset-failed-auth": str(retry_after),
                "Retry-After": str(retry_after),
            }
        )
        return response

    async def _socket_connect(self, sid: str, environ: dict[str, Any], auth: Any = None) -> None:
        """notification.gateway.ts afterInit(): the token is the API key (or a JWT); the client joins its
        organization's room, where every event of the organization's sandboxes goes."""
        token = auth.get("token") if isinstance(auth, dict) else None
        if token != self.api_key:
            raise socketio.exceptions.ConnectionRefusedError("Unauthorized")
        assert self._sio is not None
        await self._sio.enter_room(sid, ORG_ID)

    @staticmethod
    async def _pump_events(sio: socketio.AsyncServer, events: asyncio.Queue[tuple[str, dict[str, Any]]]) -> None:
        """Send the events in the order they happened."""
        while True:
            name, data = await events.get()
            with contextlib.suppress(Exception):  # a client that went away
                await sio.emit(name, data, room=ORG_ID)

    def _emit(self, name: str, data: dict[str, Any]) -> None:
        if self._events is not None:
            self._events.put_nowait((name, data))

    def _set_state(self, sandbox: EmuSandbox, state: str, desired: str) -> None:
        """Change the state (and desired state), with the events notification.service.ts sends for it."""
        old_state, old_desired = sandbox.state, sandbox.desired
        sandbox.state, sandbox.desired = state, desired
        if state != old_state:
            self._emit("sandbox.state.updated", {"sandbox": self._dto(sandbox), "oldState": old_state, "newState": state})
        if desired != old_desired:
            self._emit(
                "sandbox.desired-state.updated",
                {"sandbox": self._dto(sandbox), "oldDesiredState": old_desired, "newDesiredState": desired},
            )

    @staticmethod
    def _error(status: int, message: str) -> web.Response:
        return web.json_response({"statusCode": status, "message": message, "error": message}, status=status)

    def _touch(self, sid: str) -> None:
        """Every toolbox request counts as activity and postpones auto-stop (the proxy calls
        sandbox-activity.service.ts). Only a started sandbox has a toolbox to reach."""
        sandbox = self.sandboxes.get(sid)
        if sandbox is not None and sandbox.state == "started":
            sandbox.last_activity = time.time()

    def _sandbox(self, request: web.Request) -> EmuSandbox:
        sid = request.match_info["sid"]
        for sandbox in self.sandboxes.values():
            if sid in (sandbox.id, sandbox.spec.get("name")) and sandbox.state != "destroyed":
                return sandbox
        raise KeyError(f"sandbox {sid}")

    def _started(self, request: web.Request) -> EmuSandbox:
        sandbox = self._sandbox(request)
        if sandbox.state != "started":
            raise BadRequest(f"Sandbox {sandbox.id} is not started (state {sandbox.state})")
        return sandbox

    def host_path(self, sandbox: EmuSandbox, path: str) -> Path:
        """Where a sandbox path lives on this machine."""
        for mount_path, folder in sandbox.mounts:
            if _under(path, mount_path):
                return folder / os.path.relpath(path, mount_path)
        if _under(path, SANDBOX_HOME):
            return sandbox.home / os.path.relpath(path, SANDBOX_HOME)
        return Path(path) if os.path.isabs(path) else sandbox.home / path

    def bucket_path(self, volume_name: str, *parts: str) -> Path:
        """Where a volume keeps a file (what S3 holds), for tests: ``bucket_path("daytona-kernel", key, "a.txt")``."""
        volume = next(v for v in self.volumes.values() if v.name == volume_name)
        return self.root / "volumes" / volume.id / Path(*parts)

    async def _mount(self, sandbox: EmuSandbox, index: int, mount_path: str, bucket: Path) -> Path:
        """Mount a volume's sub-folder at mount_path inside the sandbox, as the runner does with mount-s3."""
        if _under(mount_path, SANDBOX_HOME):
            where = sandbox.home / os.path.relpath(mount_path, SANDBOX_HOME)
        else:
            where = self.root / "mounts" / sandbox.id / str(index)
        if self.volume_semantics == "mount-s3":
            mount = MountS3(bucket, where)
            await asyncio.to_thread(mount.start)
            sandbox.fuse_mounts.append(mount)
        else:
            where.parent.mkdir(parents=True, exist_ok=True)
            where.symlink_to(bucket, target_is_directory=True)
        return where

    async def _unmount(self, sandbox: EmuSandbox) -> None:
        mounts, sandbox.fuse_mounts = sandbox.fuse_mounts, []
        for mount in mounts:
            await asyncio.to_thread(mount.stop)

    def _dto(self, sandbox: EmuSandbox) -> dict[str, Any]:
        spec = sandbox.spec
        data = {
            "id": sandbox.id,
            "organizationId": ORG_ID,
            "name": spec.get("name") or sandbox.id,
            "snapshot": spec.get("snapshot") or "daytonaio/sandbox:emulated",
            "user": spec.get("user") or "daytona",
            "env": spec.get("env") or {},
            "labels": sandbox.labels,
            "public": bool(spec.get("public")),
            "networkBlockAll": bool(spec.get("networkBlockAll")),
            "kvm": False,
            "target": spec.get("target") or "us",
            "cpu": spec.get("cpu") or 1,
            "gpu": spec.get("gpu") or 0,
            "memory": spec.get("memory") or 1,
            "disk": spec.get("disk") or 3,
            "state": sandbox.state,
            "desiredState": sandbox.desired,
            "errorReason": sandbox.error_reason,
            "recoverable": sandbox.recoverable,
            "autoStopInterval": sandbox.auto_stop_min,
            "autoPauseInterval": sandbox.auto_pause_min,
            "sandboxClass": sandbox.sandbox_class,
            "autoArchiveInterval": spec.get("autoArchiveInterval") or 10080,
            "autoDeleteInterval": spec.get("autoDeleteInterval", -1),
            "volumes": spec.get("volumes") or [],
            "createdAt": sandbox.created_at,
            "updatedAt": _now(),
            "lastActivityAt": datetime.fromtimestamp(sandbox.last_activity, timezone.utc).isoformat(),
            "toolboxProxyUrl": self.toolbox_url,
            "daemonVersion": "emulator",
        }
        return checked(SandboxModel, data)

    async def _kill_contexts(self, sandbox: EmuSandbox) -> None:
        """Every process of the sandbox gets SIGKILL at once: each context's worker with its process group
        (its children too), and each ``process/execute`` command's group. The daemon is the container's
        entrypoint (apps/runner/pkg/docker/container_configs.go); its SIGTERM path only drains HTTP
        (apps/daemon/cmd/daemon/main.go), and when PID 1 exits the kernel kills the rest: no grace, no
        atexit, no signal handler runs in the sandbox at a stop, an auto-stop or a delete."""
        for pgid in list(sandbox.process_groups):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        sandbox.process_groups.clear()
        await asyncio.gather(*(ctx.worker.kill() for ctx in list(sandbox.contexts.values())))
        sandbox.frozen = False
        sandbox.contexts.clear()

    @staticmethod
    def _signal_workers(sandbox: EmuSandbox, signum: int) -> None:
        """Signal every process of the sandbox: each worker leads its own process group (its session)."""
        sandbox.frozen = signum == signal.SIGSTOP
        for ctx in sandbox.contexts.values():
            pid = ctx.worker.pid
            if pid is not None and ctx.worker.alive:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signum)

    def _pause(self, sandbox: EmuSandbox) -> None:
        """Freeze every process now; the state follows through ``pausing`` to ``paused``, or to ``error`` when
        the pause job fails (job-state-handler.service.ts handlePauseSandboxJobCompletion())."""
        with self._lock:
            failure = self._failing_pauses.pop(0) if self._failing_pauses else None
        self._signal_workers(sandbox, signal.SIGSTOP)
        if failure is None:
            self._transition(sandbox, "pausing", "paused")
            return
        reason, recoverable = failure

        async def fail() -> None:
            if sandbox.state != "pausing":  # overtaken (deleted)
                return
            sandbox.error_reason, sandbox.recoverable = reason, recoverable
            await self._kill_processes(sandbox)
            self._set_state(sandbox, "error", "paused")

        def failed() -> None:
            task = asyncio.ensure_future(fail())
            self._background.add(task)
            task.add_done_callback(self._background.discard)

        self._set_state(sandbox, "pausing", "paused")
        asyncio.get_running_loop().call_later(self.transition_s.get("pausing", 0.0), failed)

    @staticmethod
    def _not_errored(sandbox: EmuSandbox) -> None:
        """sandbox.service.ts assertSandboxNotErrored()."""
        if sandbox.state in ("error", "build_failed"):
            raise BadRequest("Sandbox is in an errored state")

    def _transition(self, sandbox: EmuSandbox, via: str, desired: str, on_arrival: Any = None) -> None:
        """Enter the transitional state ``via`` now and reach ``desired`` after ``transition_s[via]``
        (then call ``on_arrival``, if given)."""
        self._set_state(sandbox, via, desired)

        def arrive() -> None:
            if sandbox.state == via and sandbox.desired == desired:  # not overtaken by another change
                self._set_state(sandbox, desired, desired)
                if on_arrival is not None:
                    on_arrival()
                if desired == "destroyed":
                    task = asyncio.ensure_future(self._release(sandbox))
                    self._background.add(task)
                    task.add_done_callback(self._background.discard)

        delay = self.transition_s.get(via, 0.0)
        if delay > 0:
            asyncio.get_running_loop().call_later(delay, arrive)
        else:
            arrive()

    async def _release(self, sandbox: EmuSandbox) -> None:
        """A destroyed sandbox's disk goes; its volumes stay."""
        await self._unmount(sandbox)  # first: the volume must not be emptied with the sandbox's disk
        for _, where in sandbox.mounts:
            if where.is_symlink():
                where.unlink()
        shutil.rmtree(sandbox.home, ignore_errors=True)

    async def _kill_processes(self, sandbox: EmuSandbox) -> None:
        """The daemon dies with the sandbox: its sockets drop (1006) and every context is gone."""
        for transport in list(sandbox.sockets):
            transport.abort()
        await self._kill_contexts(sandbox)

    async def _stop(self, sandbox: EmuSandbox, archive: bool = False) -> None:
        """Stop (auto-stop or the API): every process dies at once, the state follows after ``stopping``.

        sandbox.service.ts stop(): autoDeleteInterval 0 sets the desired state to destroyed.
        """
        await self._kill_processes(sandbox)
        if sandbox.ephemeral:
            self._transition(sandbox, "destroying", "destroyed")
        else:
            self._transition(sandbox, "stopping", "stopped")
            if archive:
                self._archive_after_stop(sandbox)

    def _archive_after_stop(self, sandbox: EmuSandbox) -> None:
        async def archive() -> None:
            while sandbox.state == "stopping":
                await asyncio.sleep(0.01)
            if sandbox.state == "stopped":
                self._transition(sandbox, "archiving", "archived")

        task = asyncio.ensure_future(archive())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    @staticmethod
    def _in_transition(sandbox: EmuSandbox) -> bool:
        return sandbox.state != sandbox.desired

    @staticmethod
    def _change_pending(sandbox: EmuSandbox) -> bool:
        """The entity's ``pending`` (sandbox.entity.ts getInvariantChanges()): state != desiredState, except on the
        way to archived and in error or build_failed."""
        return (
            sandbox.state != sandbox.desired and sandbox.desired != "archived" and sandbox.state not in ("error", "build_failed")
        )

    # -- sandboxes -----------------------------------------------------------

    async def create_sandbox(self, request: web.Request) -> web.Response:
        throttled = self._throttle_create()
        if throttled is not None:
            return throttled
        body = await request.json()
        spec = parse(CreateSandbox, body)
        buckets = []
        for vol in spec.volumes or []:
            volume = next((v for v in self.volumes.values() if v.id == vol.volume_id), None)
            if volume is None:
                raise BadRequest(f"volume {vol.volume_id} does not exist")
            volume.dto()
            if volume.state != "ready":
                raise BadRequest(f"volume {volume.name} is not ready (state {volume.state})")
            subpath = vol.subpath or ""
            if subpath.startswith("/") or ".." in subpath.split("/"):
                raise BadRequest(f"invalid subpath {subpath!r}: resolves outside volume mount")
            buckets.append((vol.mount_path, self.root / "volumes" / volume.id / subpath))
        if spec.snapshot and spec.snapshot.startswith("missing"):
            raise BadRequest(f"Snapshot {spec.snapshot} not found. Did you add it through the Daytona Dashboard?")
        if spec.build_info is None:
            # createFromSnapshot(): cpu, mem, disk and gpu come from the snapshot, whatever the request says
            snapshot = self.snapshots.get(spec.snapshot or "", {})
            for key, field_name in (("cpu", "cpu"), ("mem", "memory"), ("disk", "disk"), ("gpu", "gpu")):
                body.pop(field_name, None)
                if key in snapshot:
                    body[field_name] = snapshot[key]
        if (body.get("gpu") or 0) > 0 and spec.auto_delete_interval != 0:
            # createFromSnapshot() and createFromBuildInfo(): a GPU sandbox must be ephemeral
            raise BadRequest(GPU_MUST_BE_EPHEMERAL)
        if spec.name and any(s.spec.get("name") == spec.name and s.state != "destroyed" for s in self.sandboxes.values()):
            return self._error(409, f"Sandbox with name {spec.name} already exists")  # sandbox.service.ts about 712
        pausable = self.sandbox_class in self.pausable_classes
        self._idle_intervals(body, spec, pausable)
        pending = self._check_quota(body)  # counted until the sandbox itself counts
        sid = str(uuid.uuid4())
        home = self.root / "sandboxes" / sid
        home.mkdir(parents=True)
        sandbox = EmuSandbox(
            sid, body, dict(spec.labels or {}), home, [], state="creating", sandbox_class=self.sandbox_class, pausable=pausable
        )
        for index, (mount_path, bucket) in enumerate(buckets):
            bucket.mkdir(parents=True, exist_ok=True)  # the runner creates a missing subpath
            sandbox.mounts.append((mount_path, await self._mount(sandbox, index, mount_path, bucket)))
        sandbox.listed_from = time.monotonic() + self.list_lag_s
        self.sandboxes[sid] = sandbox
        if pending is not None:
            self._pending.remove(pending)
        self._emit("sandbox.created", self._dto(sandbox))
        self._transition(sandbox, "creating", "started")  # the SDK's create() waits for started
        with self._lock:
            fail_status = self._fail_after_create.pop(0) if self._fail_after_create else None
        if fail_status is not None:  # create is not idempotent: the sandbox exists all the same
            return self._error(fail_status, f"injected fault {fail_status} after creating {sid}")
        return web.json_response(self._dto(sandbox))

    def _throttle_create(self) -> web.Response | None:
        """The sandbox-create throttler: over ``create_rate``'s limit within its window, a 429 that says
        when to come back (whole seconds, rounded up, as @nestjs/throttler does)."""
        return self._throttle("sandbox-create", self.create_rate)

    def _throttle_lifecycle(self) -> web.Response | None:
        """The sandbox-lifecycle throttler (``lifecycle_rate``): sandbox.controller.ts puts delete, recover, start,
        stop, pause, resize and archive under ``@ThrottlerScope('sandbox-lifecycle')``."""
        return self._throttle("sandbox-lifecycle", self.lifecycle_rate)

    def _throttle(self, name: str, rate: tuple[int, float] | None) -> web.Response | None:
        """@nestjs/throttler: over ``rate``'s limit within its window, 429 with ``Retry-After-<name>``."""
        if rate is None:
            return None
        limit, window_s = rate
        now = time.monotonic()
        with self._lock:
            hits = self._throttle_hits[name] = [t for t in self._throttle_hits.get(name, []) if now - t < window_s]
            if len(hits) < limit:
                hits.append(now)
                return None
            self.throttled += 1
            wait_s = max(1, math.ceil(hits[0] + window_s - now))
        response = self._error(429, "ThrottlerException: Too Many Requests")
        response.headers[f"Retry-After-{name}"] = str(wait_s)
        return response

    @staticmethod
    def _size(spec: dict[str, Any]) -> dict[str, int]:
        return {
            "cpu": spec.get("cpu") or 1,
            "memory": spec.get("memory") or 1,
            "disk": spec.get("disk") or 3,
            "gpu": spec.get("gpu") or 0,
        }

    def _check_quota(self, body: dict[str, Any]) -> dict[str, int] | None:
        """sandbox.service.ts validateOrganizationQuotas: the organisation's totals with this sandbox and
        the creates under way added (no await here: concurrent creates are counted one after the other).
        Returns this create's pending usage, to drop once the sandbox counts."""
        if not self.quota:
            return None
        wanted = self._size(body)
        for key, total in self.quota.items():
            counted = CONSUMING_DISK if key == "disk" else CONSUMING_COMPUTE
            used = sum(self._size(s.spec)[key] for s in self.sandboxes.values() if s.state in counted)
            used += sum(p[key] for p in self._pending)
            if used + wanted[key] > total:
                extra = "\nConsider archiving your unused Sandboxes to free up available storage." if key == "disk" else ""
                raise BadRequest(
                    f"Total {QUOTA_NAMES[key]} limit exceeded. Maximum allowed: {total}{QUOTA_UNITS[key]}.{extra}\n{UPGRADE_TIER}"
                )
        self._pending.append(wanted)
        return wanted

    def _idle_intervals(self, body: dict[str, Any], spec: Any, pausable: bool) -> None:
        """CreateSandbox's idle rules (its field docs): refuse what the API refuses, fill in its defaults."""
        stop, pause = spec.auto_stop_interval, spec.auto_pause_interval
        if pause and stop:
            raise BadRequest("At most one of autoStopInterval and autoPauseInterval may be non-zero")
        if pause and spec.auto_delete_interval == 0:
            raise BadRequest("Ephemeral sandboxes cannot have auto-pause enabled")
        if pause and not pausable:
            raise BadRequest(f"Sandbox class {self.sandbox_class} does not support pausing")
        if pausable and spec.auto_delete_interval != 0 and stop is None and pause is None:
            body["autoPauseInterval"], body["autoStopInterval"] = DEFAULT_AUTO_PAUSE_MIN, 0

    async def list_sandboxes(self, request: web.Request) -> web.Response:
        wanted = json.loads(request.query.get("labels") or "{}")
        now = time.monotonic()
        items = [
            self._dto(s)
            for s in self.sandboxes.values()
            if s.state != "destroyed" and s.listed_from <= now and all(s.labels.get(k) == v for k, v in wanted.items())
        ]
        return web.json_response(checked(ListSandboxesResponse, {"items": items, "nextCursor": None}))

    async def get_sandbox(self, request: web.Request) -> web.Response:
        return web.json_response(self._dto(self._sandbox(request)))

    async def start_sandbox(self, request: web.Request) -> web.Response:
        """sandbox.service.ts start(): started is a no-op; errored is a 400; during a transition only archiving may start."""
        throttled = self._throttle_lifecycle()
        if throttled is not None:
            return throttled
        sandbox = self._sandbox(request)
        if sandbox.state == "started" and sandbox.desired == "started":
            return web.json_response(self._dto(sandbox))
        self._not_errored(sandbox)
        if self._in_transition(sandbox) and not (sandbox.desired == "archived" and sandbox.state in STARTABLE):
            return self._error(409, STATE_CHANGE_IN_PROGRESS)
        if sandbox.state not in STARTABLE:
            raise BadRequest("Sandbox is not in valid state")
        if sandbox.state == "paused":  # resume: the frozen processes continue once it is started
            sandbox.last_activity = time.time()
            self._transition(sandbox, "resuming", "started", lambda: self._signal_workers(sandbox, signal.SIGCONT))
        else:
            self._transition(sandbox, "starting", "started")
        return web.json_response(self._dto(sandbox))

    async def pause_sandbox_request(self, request: web.Request) -> web.Response:
        """sandbox.service.ts pause(), in its order: 400 unless the API's state is started (paused included:
        a started sandbox with a change pending is reported as ``stopping``/``destroying``), 409 for that
        pending change, 422 for a class that cannot pause."""
        throttled = self._throttle_lifecycle()
        if throttled is not None:
            return throttled
        sandbox = self._sandbox(request)
        if sandbox.state not in ("started", *PENDING_FROM_STARTED):
            raise BadRequest("Sandbox must be in started state to pause")
        if self._in_transition(sandbox):
            return self._error(409, STATE_CHANGE_IN_PROGRESS)
        if not sandbox.pausable:
            return self._error(422, "Pausing is not supported for this sandbox")
        self._pause(sandbox)
        return web.json_response(self._dto(sandbox))

    @staticmethod
    def _interval(request: web.Request) -> int:
        try:
            interval = int(request.match_info["interval"])
        except ValueError:
            raise BadRequest("interval must be an integer") from None
        if interval < 0:
            raise BadRequest("Interval must be a non-negative integer")
        return interval

    async def set_auto_stop_interval(self, request: web.Request) -> web.Response:
        """set_autostop_interval(): it turns auto-pause off (at most one of the two may be non-zero)."""
        sandbox = self._sandbox(request)
        interval = self._interval(request)
        sandbox.spec["autoStopInterval"] = interval
        if interval:
            sandbox.spec["autoPauseInterval"] = 0
        return web.json_response(self._dto(sandbox))

    async def set_auto_pause_interval(self, request: web.Request) -> web.Response:
        """set_auto_pause_interval(): a pausable, non-ephemeral class only; it turns auto-stop off."""
        sandbox = self._sandbox(request)
        interval = self._interval(request)
        if interval and not sandbox.pausable:
            raise BadRequest(f"Sandbox class {sandbox.sandbox_class} does not support pausing")
        if interval and sandbox.ephemeral:
            raise BadRequest("Ephemeral sandboxes cannot have auto-pause enabled")
        sandbox.spec["autoPauseInterval"] = interval
        if interval:
            sandbox.spec["autoStopInterval"] = 0  # at most one of the two may be non-zero
        return web.json_response(self._dto(sandbox))

    async def stop_sandbox_request(self, request: web.Request) -> web.Response:
        """sandbox.service.ts stop(): 400 when errored, 409 during a transition, 400 unless started or paused."""
        throttled = self._throttle_lifecycle()
        if throttled is not None:
            return throttled
        sandbox = self._sandbox(request)
        self._not_errored(sandbox)
        if self._in_transition(sandbox):
            return self._error(409, STATE_CHANGE_IN_PROGRESS)
        if sandbox.state not in ("started", "paused"):
            raise BadRequest("Sandbox is not in a stoppable state")
        await self._stop(sandbox)
        return web.json_response(self._dto(sandbox))

    async def recover_sandbox(self, request: web.Request) -> web.Response:
        """sandbox.service.ts recover() (in place): 400 unless recoverable and in error; then started again
        (a new container: its processes are new), and the controller answers once it is started."""
        throttled = self._throttle_lifecycle()
        if throttled is not None:
            return throttled
        sandbox = self._sandbox(request)
        if not sandbox.recoverable:
            raise BadRequest("Sandbox is not in a recoverable state")
        if sandbox.state != "error":
            raise BadRequest("Sandbox must be in error state to recover")
        sandbox.error_reason, sandbox.recoverable = None, False
        await self._kill_processes(sandbox)
        self._transition(sandbox, "starting", "started")
        deadline = time.monotonic() + 30  # recoverSandbox(): waitForSandboxStarted(sandboxDto, 30)
        while sandbox.state != "started" and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return web.json_response(self._dto(sandbox))

    async def get_snapshot(self, request: web.Request) -> web.Response:
        """snapshot.controller.ts getSnapshot(): a snapshot by name (``snapshots``), else 404."""
        name = request.match_info["name"]
        found = self.snapshots.get(name)
        if found is None:
            return self._error(404, f"Snapshot {name} not found")
        data = {
            "id": name,
            "organizationId": ORG_ID,
            "general": False,
            "name": name,
            "imageName": name,
            "state": "active",
            "size": 1,
            "entrypoint": None,
            "cpu": found.get("cpu", 1),
            "gpu": found.get("gpu", 0),
            "mem": found.get("mem", 1),
            "disk": found.get("disk", 3),
            "errorReason": None,
            "createdAt": _now(),
            "updatedAt": _now(),
            "lastUsedAt": None,
            "sourceSandboxId": None,
        }
        return web.json_response(checked(SnapshotDto, data))

    async def delete_sandbox(self, request: web.Request) -> web.Response:
        """sandbox.service.ts destroy() (about line 2014): 409 while a change is pending (creating, starting,
        stopping, pausing, resuming, destroying: a second delete too), else the desired state becomes destroyed,
        via destroying."""
        throttled = self._throttle_lifecycle()
        if throttled is not None:
            return throttled
        sandbox = self._sandbox(request)
        if self._change_pending(sandbox):
            return self._error(409, STATE_CHANGE_IN_PROGRESS)
        await self._kill_processes(sandbox)
        self._transition(sandbox, "destroying", "destroyed")
        return web.json_response(self._dto(sandbox))

    async def set_labels(self, request: web.Request) -> web.Response:
        sandbox = self._sandbox(request)
        sandbox.labels = dict(parse(SandboxLabels, await request.json()).labels)
        return web.json_response(checked(SandboxLabels, {"labels": sandbox.labels}))

    async def toolbox_proxy_url(self, request: web.Request) -> web.Response:
        self._sandbox(request)
        return web.json_response({"url": self.toolbox_url})

    # -- volumes -------------------------------------------------------------

    async def create_volume(self, request: web.Request) -> web.Response:
        spec = parse(CreateVolume, await request.json())
        if any(v.name == spec.name for v in self.volumes.values()):
            return self._error(409, f"volume {spec.name} already exists")
        volume = EmuVolume(str(uuid.uuid4()), spec.name)
        self.volumes[volume.id] = volume
        return web.json_response(volume.dto())

    async def list_volumes(self, request: web.Request) -> web.Response:
        return web.json_response([v.dto() for v in self.volumes.values()])

    async def get_volume_by_name(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        volume = next((v for v in self.volumes.values() if v.name == name), None)
        if volume is None:
            return self._error(404, f"Volume with name {name} not found")
        return web.json_response(volume.dto())

    async def get_volume(self, request: web.Request) -> web.Response:
        return web.json_response(self.volumes[request.match_info["vid"]].dto())

    async def delete_volume(self, request: web.Request) -> web.Response:
        del self.volumes[request.match_info["vid"]]
        return web.Response(status=200)

    # -- interpreter ---------------------------------------------------------

    def _context_dto(self, ctx: EmuContext) -> dict[str, Any]:
        return checked(
            InterpreterContext,
            {"id": ctx.id, "cwd": ctx.cwd, "language": "python", "active": ctx.worker.alive, "createdAt": ctx.created_at},
        )

    async def create_context(self, request: web.Request) -> web.Response:
        sandbox = self._started(request)
        spec = parse(CreateContextRequest, await request.json())
        cwd = spec.cwd or str(sandbox.home)
        folder = self.host_path(sandbox, cwd)
        if not folder.is_dir():  # the daemon cannot start a worker there (manager.go)
            return self._error(500, f"failed to start context: chdir {cwd}: no such file or directory")
        async with sandbox.context_lock:  # manager.go CreateContext(): the lock is held while the worker starts
            ctx = await self._new_context(sandbox, str(uuid.uuid4()), cwd)
        return web.json_response(self._context_dto(ctx))

    async def _new_context(self, sandbox: EmuSandbox, cid: str, cwd: str) -> EmuContext:
        folder = self.host_path(sandbox, cwd)
        env = self._sandbox_env(sandbox)
        worker = InterpreterWorker(self.python, str(folder), env, pipe_bytes=None)  # Go's pipe: Linux's 64 KiB
        await worker.start()
        ctx = EmuContext(cid, cwd, worker)
        sandbox.contexts[ctx.id] = ctx
        return ctx

    @staticmethod
    def _sandbox_env(sandbox: EmuSandbox) -> dict[str, str]:
        """The environment of the sandbox's processes: the container's (the create's ``env`` over the image's),
        never this machine's Daytona settings. The daemon starts workers and commands with its own environment
        (interpreter/manager.go, process/execute.go), which is the container's: the API key is not in it."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("DAYTONA_")}
        env.update(sandbox.spec.get("env") or {})
        return env

    async def list_contexts(self, request: web.Request) -> web.Response:
        sandbox = self._started(request)
        async with sandbox.context_lock:  # manager.go ListContexts(): behind a create or delete under way
            contexts = [self._context_dto(c) for c in sandbox.contexts.values() if c.id != "default"]
        return web.json_response(checked(ListContextsResponse, {"contexts": contexts}))

    async def delete_context(self, request: web.Request) -> web.Response:
        sandbox = self._started(request)
        cid = request.match_info["cid"]
        if cid == "default":
            raise BadRequest("cannot delete default context")
        async with sandbox.context_lock:  # manager.go DeleteContext(): held while the worker exits (SIGTERM, 2 s, kill)
            ctx = sandbox.contexts.pop(cid)
            await ctx.worker.shutdown()
        return web.json_response({"message": "Context deleted successfully"})  # controller.go DeleteContext

    async def execute(self, request: web.Request) -> web.StreamResponse:
        """The interpreter websocket, as controller.go, repl_client.go and websocket.go run it."""
        sandbox = self._sandbox(request)
        if sandbox.state != "started":
            return web.Response(status=400, text="sandbox is not started")  # fails the handshake
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        transport = request.transport
        assert transport is not None
        sandbox.sockets.add(transport)
        try:
            await self._serve_execute(sandbox, ws, transport)
        finally:
            sandbox.sockets.discard(transport)
        return ws

    async def _serve_execute(self, sandbox: EmuSandbox, ws: web.WebSocketResponse, transport: asyncio.BaseTransport) -> None:
        first = await ws.receive()
        try:
            req = json.loads(first.data) if first.type == WSMsgType.TEXT else None
            if not isinstance(req, dict):
                raise ValueError("not an object")
            timeout, envs = req.get("timeout", DEFAULT_EXEC_TIMEOUT_S), req.get("envs") or {}
            # Go unmarshals "timeout" into an int64 and "envs" into map[string]string
            if isinstance(timeout, bool) or not isinstance(timeout, (int, type(None))):
                raise ValueError("timeout is not an integer")
            if not isinstance(envs, dict) or not all(isinstance(v, str) for v in envs.values()):
                raise ValueError("envs is not a map of strings")
        except ValueError:
            await ws.close(code=WS_PROTOCOL_ERROR, message=b"invalid JSON payload")
            return
        if not req.get("code"):
            await ws.close(code=WS_POLICY, message=b"code is required")
            return
        if timeout is not None and timeout < 0:
            await ws.close(code=WS_POLICY, message=b"timeout must be greater than or equal to 0")
            return
        cid = req.get("contextId")
        async with sandbox.context_lock:  # manager.go GetContext() / GetOrCreateDefaultContext(): the manager's lock
            if cid is None:  # the default context, created on first use
                ctx = sandbox.contexts.get("default") or await self._new_context(sandbox, "default", str(sandbox.home))
            else:
                ctx = sandbox.contexts.get(cid)
        if ctx is None:
            await ws.close(code=WS_POLICY, message=f"context not found: {cid}".encode())
            return
        with self._lock:
            drop_after, self._drop_ws_after = self._drop_ws_after, None
        frames: asyncio.Queue[dict[str, str] | int] = asyncio.Queue(WS_CLIENT_FRAMES)
        attached = True

        def emit(chunk: Chunk) -> None:
            nonlocal attached
            if not attached:
                return
            try:
                frames.put_nowait(chunk)
            except asyncio.QueueFull:  # "slow consumer": no room for its 1008 close frame either
                attached = False
                transport.abort()

        async def send() -> None:
            sent = 0
            while True:
                frame = await frames.get()
                if isinstance(frame, int):
                    await ws.close(code=frame, message=b"worker process ended" if frame == WS_WORKER_EXITED else b"")
                    return
                await ws.send_str(json.dumps(frame))
                sent += 1
                if drop_after is not None and sent >= drop_after:
                    transport.abort()
                    return

        sending = asyncio.ensure_future(send())
        reading: list[asyncio.Future[None]] = []

        async def discard() -> None:
            with contextlib.suppress(Exception):
                async for _ in ws:  # aiohttp answers pings and a client's close, as gorilla does
                    pass

        def on_attach() -> None:
            """websocket.go attachWebSocket(): once the job leaves the queue, a reader discards every later
            client frame (v0.190.0), so a close is answered; before that nothing reads the socket."""
            reading.append(asyncio.ensure_future(discard()))

        # controller.go runs the job in its own goroutine (``go iCtx.enqueueAndExecute``): nothing the
        # client does (closing, vanishing) stops it or the reading of the worker's output.
        job = asyncio.ensure_future(ctx.worker.execute(req["code"], emit, timeout or None, envs, on_attach))
        self._background.add(job)
        job.add_done_callback(self._background.discard)
        ending = await asyncio.shield(job)
        if attached:
            try:
                frames.put_nowait(WS_CLOSE_CODES[ending])
            except asyncio.QueueFull:
                transport.abort()
                sending.cancel()
        else:
            sending.cancel()
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            await sending
        for reader in reading:
            reader.cancel()

    async def process_execute(self, request: web.Request) -> web.Response:
        """execute.go ExecuteCommand(): the shell reads the command on its stdin, in a process group of its
        own; a timeout SIGKILLs the group (408); a cwd that does not exist is exit code -1."""
        sandbox = self._started(request)
        spec = parse(ExecuteRequest, await request.json())
        if not spec.command.strip():
            raise BadRequest("command cannot be empty or whitespace-only")
        cwd = self.host_path(sandbox, spec.cwd) if spec.cwd else sandbox.home
        if not cwd.is_dir():  # cmd.Start() fails: exit code -1, the error as the result
            return web.json_response(
                checked(ExecuteResponse, {"exitCode": -1, "result": f"chdir {spec.cwd}: no such file or directory"})
            )
        # The sandbox's /home/daytona is its folder here (and its volumes are mounted inside it), so a
        # command naming it (`mkdir -p /home/daytona/workspace`) acts on this sandbox, not on this machine.
        command = spec.command.replace(SANDBOX_HOME, str(sandbox.home))
        env = {**self._sandbox_env(sandbox), **(spec.envs or {})}
        proc = await asyncio.create_subprocess_exec(
            daemon_shell(),
            cwd=str(cwd),
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            process_group=0,
        )
        sandbox.process_groups.add(proc.pid)
        try:
            out, _ = await asyncio.wait_for(proc.communicate(command.encode()), spec.timeout or None)
        except asyncio.TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the whole group: its children too
            await proc.wait()
            return self._error(408, "command execution timeout")
        finally:
            sandbox.process_groups.discard(proc.pid)
        data = {"exitCode": proc.returncode, "result": out.decode("utf-8", "replace")}
        return web.json_response(checked(ExecuteResponse, data))

    async def git_clone(self, request: web.Request) -> web.Response:
        """go-git's clone (apps/daemon/pkg/git/clone.go, toolbox git/clone_repository.go), imitated with git:
        single branch; ``branch`` is read as refs/heads/<branch> (a tag is not found); ``commit_id``
        is checked out after the clone as a full hash; credentials count only when both are given."""
        sandbox = self._started(request)
        spec = parse(GitCloneRequest, await request.json())
        auth = (spec.username, spec.password) if spec.username is not None and spec.password is not None else None
        self.git_auth_seen.append((spec.username, spec.password))
        wanted = self.git_credentials.get(spec.url)
        if wanted is not None and (auth is None or auth[1] != wanted[1] or not auth[0]):
            return self._error(400, "authentication required")
        if spec.branch:
            found = await self._git("ls-remote", "--exit-code", spec.url, f"refs/heads/{spec.branch}")
            if found[0]:
                return self._error(400, "reference not found")
        dest = str(self.host_path(sandbox, spec.path))
        argv = ["clone", "--quiet", "--single-branch"] + (["--branch", spec.branch] if spec.branch else [])
        code, out = await self._git(*argv, spec.url, dest)
        if code:
            return self._error(400, f"git clone failed: {out}")
        if spec.commit_id:
            if len(spec.commit_id) != 40:  # plumbing.NewHash of anything else is a hash that does not exist
                return self._error(400, "object not found")
            code, out = await self._git("-C", dest, "checkout", "--quiet", spec.commit_id)
            if code:
                return self._error(400, "object not found")
        return web.Response(status=200)

    @staticmethod
    async def _git(*args: str) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec("git", *args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        out, _ = await proc.communicate()
        return proc.returncode or 0, out.decode(errors="replace")

    # -- files ---------------------------------------------------------------

    async def bulk_upload(self, request: web.Request) -> web.Response:
        """fs/upload_files.go: each file written in place (os.Create, then io.Copy: no temp file and rename);
        a file that fails is reported and left as far as it was written; any failure makes the answer a 400
        listing them. ``upload_space`` (bytes, None = unlimited) is what the sandbox's disk still takes."""
        sandbox = self._started(request)
        reader = await request.multipart()
        paths: dict[str, str] = {}
        files: list[dict[str, Any]] = []
        errors: list[str] = []
        async for part in reader:
            name = part.name or ""
            if name.endswith(".path"):
                paths[name[: -len(".path")]] = (await part.read()).decode()
            elif name.endswith(".file"):
                key = name[: -len(".file")]
                dest = paths.get(key) or part.filename
                if not dest:
                    raise BadRequest(f"part {name} has no destination path")
                target = self.host_path(sandbox, dest)
                target.parent.mkdir(parents=True, exist_ok=True)
                data = await part.read(decode=False)
                room = len(data) if self.upload_space is None else max(self.upload_space, 0)
                target.write_bytes(data[:room])
                if self.upload_space is not None:
                    self.upload_space -= min(room, len(data))
                if room < len(data):
                    errors.append(f"{dest}: write: write {dest}: no space left on device")
                    continue
                files.append({"path": dest, "bytes": len(data)})
            else:
                raise BadRequest(f"unexpected multipart field {name!r}")
        if errors:
            return web.json_response({"errors": errors, "files": files}, status=400)
        return web.json_response({"files": files})

    async def bulk_download(self, request: web.Request) -> web.StreamResponse:
        """fs/download_files.go DownloadFiles(): the parts stream as they are read. Each path is opened first
        (openDownloadFile: a FIFO blocks the handler until a writer comes) and then stat-ed on the open file (only a
        directory is refused, 400 INVALID_FILE_PATH); the part's Content-Length is that size, but the body is copied to
        EOF (a device streams for as long as the client reads). Names are written as the daemon writes them
        (multipartContentDisposition: a latin-1 ``filename`` and ``filename*=utf-8''...``, RFC 5987)."""
        sandbox = self._started(request)
        spec = parse(FilesDownloadRequest, await request.json())
        if not spec.paths:
            return web.json_response({"error": 'request body must be {"paths": [ ... ]} and non-empty'}, status=400)
        response = web.StreamResponse(headers={"Content-Type": f"multipart/form-data; boundary={DOWNLOAD_BOUNDARY}"})
        await response.prepare(request)
        try:
            for path in spec.paths:
                opened = await _in_own_thread(functools.partial(_open_download, self.host_path(sandbox, path), path))
                if isinstance(opened, dict):
                    opened.update(timestamp=_now(), path=path, method="POST")
                    await response.write(
                        _part_header("error", path, "application/json; charset=utf-8") + json.dumps(opened).encode() + b"\r\n"
                    )
                    continue
                f, size = opened
                try:
                    await response.write(_part_header("file", path, "application/octet-stream", size))
                    while True:
                        chunk = await _in_own_thread(functools.partial(f.read, 64 * 1024))
                        if not chunk:
                            break
                        await response.write(chunk)
                    await response.write(b"\r\n")
                finally:
                    f.close()
            await response.write(f"--{DOWNLOAD_BOUNDARY}--\r\n".encode())
            await response.write_eof()
        except ConnectionError:  # the client went away: the daemon's ctxWriter stops the copy, and so does this
            return response
        return response


DOWNLOAD_BOUNDARY = "DAYTONA-FILE-BOUNDARY"  # download_files.go


def _open_download(target: Path, path: str) -> tuple[Any, int] | dict[str, Any]:
    """openDownloadFile(): open (a FIFO blocks here), then stat the open file; a directory is refused."""
    try:
        f = open(target, "rb")  # closed by the caller once streamed
    except FileNotFoundError:
        return {"statusCode": 404, "code": "FILE_NOT_FOUND", "message": f"file not found: {path}"}
    except PermissionError:
        return {"statusCode": 403, "code": "FILE_ACCESS_DENIED", "message": f"permission denied: {path}"}
    except IsADirectoryError:  # Python refuses to open a directory; Go opens it, and the stat refuses it
        return {
            "statusCode": 400,
            "code": "INVALID_FILE_PATH",
            "message": f"invalid file path: path points to a directory: {path}",
        }
    except OSError as exc:
        return {"statusCode": 500, "code": "FILE_READ_FAILED", "message": f"failed to open file: {exc}"}
    return f, os.fstat(f.fileno()).st_size


def _part_header(name: str, path: str, content_type: str, size: int | None = None) -> bytes:
    """One part's headers as mime/multipart writes them, with multipartContentDisposition()'s names."""
    latin1 = "".join(
        "_" if ord(c) > 0xFF or ord(c) < 0x20 or c == "\x7f" else c
        for c in path.replace("\\", "\\\\").replace('"', '\\"').replace("\r", "").replace("\n", "").replace("\x00", "")
    )
    rfc5987 = urllib.parse.quote(path.encode(), safe="!#$&+-.^_`|~")
    lines = [
        f"--{DOWNLOAD_BOUNDARY}",
        f'Content-Disposition: form-data; name="{name}"; filename="{latin1}"; filename*=utf-8\'\'{rfc5987}',
        f"Content-Type: {content_type}",
    ] + ([f"Content-Length: {size}"] if size is not None else [])
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _in_own_thread(fn: Any) -> Any:
    """Run a blocking call in a thread of its own (a FIFO's open may never return: it must not hold a pooled thread)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, failure: BaseException | None) -> None:
        if done.cancelled():
            return
        if failure is not None:
            done.set_exception(failure)
        else:
            done.set_result(result)

    def run() -> None:
        try:
            result, failure = fn(), None
        except BaseException as exc:  # handed to the awaiting task
            result, failure = None, exc
        with contextlib.suppress(RuntimeError):  # the loop is gone (the emulator closed)
            loop.call_soon_threadsafe(settle, result, failure)

    threading.Thread(target=run, name="emulator-download", daemon=True).start()
    return await done
