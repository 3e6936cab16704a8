"""A workspace's sandbox on Daytona: found by the labels this kernel puts on it, or created with the
configuration, with its volume ready first.

Settings are fixed when a sandbox is created (``apps/api/src/sandbox/services/sandbox.service.ts``),
so a sandbox that is found again is compared with the configuration (``drift_notice``), and the idle
interval is chosen at creation (``create``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import posixpath
import secrets
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Iterator, Protocol, TypeVar

from daytona.common.errors import DaytonaConflictError, DaytonaError, DaytonaNotFoundError

from ...config import DEFAULT_MOUNT_PATH, SANDBOX_WORKDIR, DaytonaSettings
from ...errors import BackendError
from ...identity import owner_id
from ..base import IdleMode, ProgressCallback, SandboxPolicy
from .api import (
    GONE_STATES,
    LABEL_APP,
    LABEL_KERNEL,
    LABEL_OWNER,
    LABEL_POLICY,
    LABEL_WORKER,
    LABEL_WORKSPACE,
    RETRY_BUDGET_S,
    SANDBOX_START_TIMEOUT_S,
    call_api,
    client_config,
    is_refused,
    state_name,
    translate_error,
)

if TYPE_CHECKING:
    from daytona import AsyncDaytona

log = logging.getLogger("daytona_kernel.daytona")
T = TypeVar("T")


GPU_MUST_BE_EPHEMERAL = "GPU sandboxes must be ephemeral"  # sandbox.service.ts about 525 and 867: a create's 400
VOLUME_READY_TIMEOUT_S = 120.0
VOLUME_POLL_S = 0.5
LOADING_SWITCH_INTERVAL_S = 0.0005  # sys.setswitchinterval while the SDK loads in a thread (Python's default: 5 ms)
_loads = 0  # SDK loads under way in this process: they share the short switch interval
_interval_before = 0.0  # the switch interval to restore after them


class ApiCall(Protocol):
    async def __call__(self, what: str, fn: Callable[[], Awaitable[T]], *, retry: bool = True) -> T: ...


def overlaps(a: str, b: str) -> bool:
    """Is one of two sandbox folders the other, or inside it?"""
    a, b = posixpath.normpath(a), posixpath.normpath(b)
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


def volume_mount_path(configured: str) -> tuple[str, str]:
    """Where to mount the volume, and a notice when the configured mount_path cannot be used.

    The working directory is on the sandbox's disk; a volume mounted at it (or
    above it) would put it back on mount-s3, so such a mount_path (what it
    meant in earlier versions) is replaced by the default.
    """
    if not overlaps(configured, SANDBOX_WORKDIR):
        return configured, ""
    return DEFAULT_MOUNT_PATH, (
        f"mount_path={configured} would put the working directory on the volume, where renames, appends and "
        f"seeks fail. The working directory is now {SANDBOX_WORKDIR} on the sandbox's disk and the volume, which "
        f"keeps a volume copy of it, is mounted at {DEFAULT_MOUNT_PATH}. Remove mount_path from your configuration.\n"
    )


def defer_model_builds() -> None:
    """Have pydantic build a model's validators when it is first used, not when its class is defined.

    The daytona SDK defines about 300 models at import (its API clients'), and a kernel uses a few of
    them: building them all was about a tenth of the SDK's import, paid by every start and restart. Set
    before the Daytona backend first imports the SDK's models, with its client (``WorkspaceSandboxes``); in a
    kernel process only the SDK uses pydantic (cells run in the sandbox), and the local backend never imports it."""
    import pydantic

    pydantic.BaseModel.model_config["defer_build"] = True


class WorkspaceSandboxes:
    """Finds the workspace's sandbox, or creates it; owns the SDK client. ``worker`` (its number) makes
    it a ``%%daytona map`` engine of this kernel: ephemeral, without the volume, labelled ``daytona-kernel-worker``
    under a workspace label of its own (so neither is ever found as the other), and it uses the SDK client
    of ``lender`` (the main sandbox's): opening one costs about 80 ms of blocking TLS setup, per engine."""

    def __init__(
        self,
        config: DaytonaSettings,
        workspace_key: str,
        kernel_id: str,
        api: ApiCall,
        api_url: str,
        worker: int | None = None,
        lender: WorkspaceSandboxes | None = None,
    ) -> None:
        self._config = config
        self._key = workspace_key
        self._worker = worker
        self._lender = lender
        self._owner_id = owner_id()
        self._kernel_id = kernel_id
        self._api = api
        self._api_url = api_url
        self._client: AsyncDaytona | None = None
        self._opening: asyncio.Future[None] | None = None  # done when open_client's load of the SDK ends
        self.notices: list[str] = []  # about the configuration, for the user's first cell
        self.policy = SandboxPolicy(config.sandbox_policy if worker is None else SandboxPolicy.EPHEMERAL.value)
        if config.gpu > 0 and self.policy is not SandboxPolicy.EPHEMERAL:
            # sandbox.service.ts createFromBuildInfo() (about line 867): a GPU sandbox needs autoDeleteInterval=0.
            self.policy = SandboxPolicy.EPHEMERAL
            self.notices.append(
                "GPU sandboxes must be ephemeral on Daytona: this kernel gets a sandbox of its own, kept across "
                "restarts and deleted at shutdown (sandbox_policy 'reuse' does not apply). Files on the volume stay.\n"
            )
        self.mount_path, notice = volume_mount_path(config.mount_path) if worker is None else ("", "")
        if notice:
            self.notices.append(notice)
        self.idle_why = ""  # why the sandbox this kernel created stops rather than pauses
        self.unsettled: list[str] = []  # the names of creates sent whose answer has not come
        self.retry_name = ""  # the early path's create failed: the SDK's create goes under the same name
        self.created_early = ""  # the id of the sandbox the early path created (``early``)

    async def check_gpu(self) -> str:
        """Where a snapshot's GPU decides (``createFromSnapshot()`` in sandbox.service.ts takes cpu, memory, disk
        and gpu from the snapshot, about lines 516-526; the SDK sends ``resources`` only with an image): a GPU
        snapshot makes the sandbox ephemeral, as Daytona requires (returns the one line saying so); ``gpu``
        without an image is refused unless the snapshot has that many GPUs."""
        cfg = self._config
        if cfg.image:
            return ""  # the image's resources carry the gpu count; __init__ made the sandbox ephemeral
        if not cfg.snapshot:
            if cfg.gpu > 0:
                raise BackendError(
                    f"gpu = {cfg.gpu} needs an image (DaytonaKernel.image), or a snapshot that has GPUs "
                    "(DaytonaKernel.snapshot): Daytona takes a snapshot's resources from the snapshot, and the "
                    "default snapshot has none. Set one of them, or remove gpu, then restart the kernel."
                )
            return ""
        client = self._client_or_open()
        try:
            snapshot = await self._api(f"look up the snapshot {cfg.snapshot!r}", lambda: client.snapshot.get(cfg.snapshot))
        except BackendError as exc:
            if isinstance(exc.__cause__, DaytonaNotFoundError):
                return ""  # the create says so, with the fix
            raise
        gpus = int(snapshot.gpu or 0)
        if cfg.gpu > gpus:
            raise BackendError(
                f"gpu = {cfg.gpu}, but the snapshot {cfg.snapshot} has {gpus} GPU(s), and Daytona takes a snapshot's "
                "GPU count from the snapshot. Use a snapshot with GPUs, or an image (DaytonaKernel.image) with gpu, "
                "then restart the kernel."
            )
        if not gpus or self.policy is SandboxPolicy.EPHEMERAL:
            return ""
        self.policy = SandboxPolicy.EPHEMERAL
        return (
            f"The snapshot {cfg.snapshot} has {gpus} GPU(s), and Daytona makes GPU sandboxes ephemeral: this "
            "kernel gets a sandbox of its own, kept across restarts and deleted at shutdown (sandbox_policy "
            "'reuse' does not apply). Files on the volume stay.\n"
        )

    @property
    def subpath(self) -> str:
        """This workspace's sub-folder of the volume, inside this installation's own folder."""
        return f"{self._owner_id}/{self._key}"

    async def open_client(self) -> None:
        """Import the SDK's client and make it in a thread, so the kernel's event loop answers Jupyter
        (kernel_info) meanwhile: the import is about 1 s (most of it pydantic models and the API clients),
        and making it loads the system's certificates into each API client's TLS context. The SDK makes
        the client without an event loop (its HTTP session is made at the first request). A daemon thread:
        a kernel process that ends (a restart right after the last one) does not wait for the import.
        A ``%%daytona map`` engine waits for its lender's load (after a restart's quick start, the first cell
        can come while the main sandbox's client still loads)."""
        if self._lender is not None:
            await self._lender.open_client()
            return
        while self._client is None and self._opening is not None:  # one load at a time
            await asyncio.wait({self._opening})  # if it failed, this caller tries again
        if self._client is None:
            self._opening = asyncio.get_running_loop().create_future()
            try:
                with short_switch_interval():
                    client = await in_daemon_thread(self._new_client)
                self._client = self._client or client  # (made meanwhile by a call that could not wait)
            finally:
                self._opening.set_result(None)
                self._opening = None

    def _client_or_open(self) -> AsyncDaytona:
        if self._lender is not None:
            return self._lender._client_or_open()
        if self._client is None:
            self._client = self._new_client()
        return self._client

    def _new_client(self) -> AsyncDaytona:
        try:
            defer_model_builds()
            from daytona import AsyncDaytona
        except Exception as exc:  # a broken or incompatible install: said once per start, with the fix
            raise BackendError(
                f"Could not load the daytona SDK ({type(exc).__name__}: {exc}). Reinstall it in the kernel's "
                "environment (pip install --force-reinstall 'daytona>=0.207.1,<1'), then restart the kernel."
            ) from exc
        try:
            return AsyncDaytona(client_config(self._config))
        except DaytonaError as exc:
            raise translate_error(exc, "connect to Daytona") from exc

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    def labels(self) -> dict[str, str]:
        labels = dict(self._config.labels)
        labels.update(
            {
                LABEL_APP: "true",
                LABEL_WORKSPACE: self._key,
                LABEL_OWNER: self._owner_id,
                LABEL_KERNEL: self._kernel_id,
                LABEL_POLICY: self.policy.value,
            }
        )
        if self._worker is not None:
            labels[LABEL_WORKSPACE] = f"{self._key}-worker-{self._worker}"
            labels[LABEL_WORKER] = str(self._worker)
        return labels

    @property
    def volume_name(self) -> str:
        return self._config.volume_name

    @staticmethod
    def new_name() -> str:
        return sandbox_name()

    def identity(self) -> dict[str, str]:
        """The labels ``find`` looks for."""
        return self._identity(mine=self.policy is SandboxPolicy.EPHEMERAL)

    def _identity(self, mine: bool) -> dict[str, str]:
        """The labels that find this folder's sandbox, or (``mine``) the one this kernel created."""
        labels = self.labels()
        keys = (LABEL_APP, LABEL_OWNER, LABEL_WORKSPACE) + ((LABEL_KERNEL,) if mine else ())
        return {key: labels[key] for key in keys}

    async def ready_volume(self, progress: ProgressCallback) -> Any:
        """The volume, once ready; None for an engine, which mounts none."""
        if self._worker is not None:
            return None
        client = self._client_or_open()
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
                raise BackendError(
                    f"The volume {name!r} did not become ready within {VOLUME_READY_TIMEOUT_S:g} s (state {state})."
                )
            progress(f"waiting for volume {name}… ({state})")
            await asyncio.sleep(VOLUME_POLL_S)
            volume = await self._api(f"check the volume {name!r}", lambda: client.volume.get(name))
        return volume

    async def find(self, sandbox_id: str = "") -> Any:
        """'reuse': the folder's sandbox. 'ephemeral': the one this kernel made before a restart (the
        Jupyter kernel id, in a label, is the same across a restart). ``sandbox_id``: that one, looked up by
        its id (a restart's handoff named it), if it still exists."""
        self.idle_why = ""  # set by create, when this kernel makes the sandbox
        found = await self.by_id(sandbox_id) if sandbox_id else None
        if found is not None:
            return found
        return await self._find_by(self.identity())

    async def by_id(self, sandbox_id: str) -> Any:
        """The sandbox with this id, None when it no longer exists."""
        client = self._client_or_open()
        try:
            found = await self._api("look up the sandbox", lambda: client.get(sandbox_id))
        except BackendError as exc:
            if not isinstance(exc.__cause__, DaytonaNotFoundError):
                raise
            return None
        return found if state_name(found) not in GONE_STATES else None

    async def _find_by(self, labels: dict[str, str]) -> Any:
        from daytona import ListSandboxesQuery

        client = self._client_or_open()
        query = ListSandboxesQuery(labels=labels)

        async def first() -> Any:
            async for sandbox in client.list(query):
                if state_name(sandbox) not in GONE_STATES:
                    return sandbox
            return None

        return await self._api("look for this notebook's sandbox", first)

    def why_not_pause(self) -> str:
        """Why this kernel does not ask Daytona to pause its sandbox when idle ("" when it does)."""
        if self._config.idle_action != IdleMode.PAUSE.value:
            return "idle_action is 'stop'"
        if self.policy is SandboxPolicy.EPHEMERAL:
            return "ephemeral sandboxes cannot pause"
        if not self._config.auto_pause_interval:
            return "auto_pause_interval is 0"
        return ""

    async def create(self, volume: Any, progress: ProgressCallback) -> Any:
        """Create the sandbox. To pause when idle it is created with neither idle interval: Daytona then
        gives a class that can pause auto-pause (with auto-stop off) and any other class auto-stop
        (CreateSandbox.autoPauseInterval), so nothing is refused; the configured minutes are set after."""
        self.idle_why = self.why_not_pause()
        try:
            sandbox = await self._create_with(volume, progress, self._config.auto_stop_interval if self.idle_why else None)
        except BackendError as exc:
            if self.policy is SandboxPolicy.EPHEMERAL or not (is_refused(exc) and GPU_MUST_BE_EPHEMERAL in str(exc)):
                raise
            # The snapshot's GPU count was not known here (its lookup failed, check_gpu), and Daytona takes it from
            # the snapshot (sandbox.service.ts about 520-526): it refused a GPU sandbox that is not ephemeral.
            self.policy = SandboxPolicy.EPHEMERAL
            self.notices.append(
                f"Daytona says the snapshot {self._config.snapshot} has GPUs, and GPU sandboxes must be ephemeral: this "
                "kernel gets a sandbox of its own, kept across restarts and deleted at shutdown (sandbox_policy 'reuse' "
                "does not apply). Files on the volume stay.\n"
            )
            return await self.create(volume, progress)
        await self.created(sandbox)
        return sandbox

    async def created(self, sandbox: Any) -> None:
        """After a create (the SDK's, or the early one, ``early``): the configured idle interval."""
        self.idle_why = self.why_not_pause()
        if not self.idle_why:
            await self._set_idle_interval(sandbox)

    def early_create_body(self, volume_id: str, name: str) -> dict[str, Any] | None:
        """The create's body for the early path (``early.create_body``), as ``_create_with`` would send it
        through the SDK; None where only the SDK's path applies: an image or a snapshot of one's own (a GPU
        snapshot decides the policy first), a GPU, or a ``%%daytona map`` engine."""
        from .early import create_body

        cfg = self._config
        if self._worker is not None or cfg.image or cfg.snapshot or cfg.gpu:
            return None
        idle_why = self.why_not_pause()
        return create_body(
            name=name,
            labels=self.labels(),
            env=cfg.env,
            target=cfg.target or os.environ.get("DAYTONA_TARGET", ""),
            auto_stop_interval=cfg.auto_stop_interval if idle_why else None,
            auto_archive_interval=cfg.auto_archive_interval,
            auto_delete_interval=0 if self.policy is SandboxPolicy.EPHEMERAL else cfg.auto_delete_interval,
            volume=(volume_id, self.mount_path, self.subpath),
            network_block_all=cfg.network_block_all,
        )

    async def _set_idle_interval(self, sandbox: Any) -> None:
        """Set the configured auto-pause minutes, or, on a sandbox Daytona gave auto-stop, the auto-stop minutes."""
        cfg = self._config
        if sandbox.auto_pause_interval:
            if sandbox.auto_pause_interval != cfg.auto_pause_interval:
                try:
                    await self._api(
                        "set the auto-pause interval", lambda: sandbox.set_auto_pause_interval(cfg.auto_pause_interval)
                    )
                except BackendError as exc:
                    if not is_refused(exc):
                        raise
                    log.warning(
                        "Daytona refused auto_pause_interval=%s (%s); it stays %s min",
                        cfg.auto_pause_interval,
                        exc,
                        sandbox.auto_pause_interval,
                    )
            return
        self.idle_why = f"Daytona does not pause sandboxes of class {sandbox.sandbox_class or '(unknown)'}"
        if (sandbox.auto_stop_interval or 0) != cfg.auto_stop_interval:
            await self._api("set the auto-stop interval", lambda: sandbox.set_autostop_interval(cfg.auto_stop_interval))

    async def _create_with(self, volume: Any, progress: ProgressCallback, auto_stop_interval: int | None) -> Any:
        from daytona import CreateSandboxFromImageParams, CreateSandboxFromSnapshotParams, Resources, VolumeMount

        client = self._client_or_open()
        cfg = self._config
        name, self.retry_name = self.retry_name or sandbox_name(), ""
        if name in self.unsettled:  # the early path sent it and its answer never came: made all the same?
            made = await self.named(name)
            if made is not None:
                self.unsettled.remove(name)
                log.warning("the early create of %s was made although its answer was lost", name)
                return made
        common: dict[str, Any] = dict(  # noqa: C408 - the SDK's parameter names, as keywords
            name=name,
            labels=self.labels(),
            env_vars=dict(cfg.env),
            auto_stop_interval=auto_stop_interval,  # None: Daytona's default for the sandbox's class
            auto_archive_interval=cfg.auto_archive_interval,  # 0 = the API's maximum, as the help text says
            auto_delete_interval=0 if self.policy is SandboxPolicy.EPHEMERAL else cfg.auto_delete_interval,
            volumes=[VolumeMount(volume_id=volume.id, mount_path=self.mount_path, subpath=self.subpath)]
            if volume is not None
            else [],
            network_block_all=cfg.network_block_all or None,
        )
        if cfg.image:
            resources = Resources(cpu=cfg.cpu or None, memory=cfg.memory or None, disk=cfg.disk or None, gpu=cfg.gpu or None)
            params: Any = CreateSandboxFromImageParams(image=cfg.image, resources=resources, **common)
            progress(f"creating sandbox… (image {cfg.image}; building it can take minutes)")
        else:
            params = CreateSandboxFromSnapshotParams(snapshot=cfg.snapshot or None, **common)
            progress(f"creating sandbox… (snapshot {cfg.snapshot or 'default'})")
        # Create has no idempotency key, and the list is eventually consistent (sandbox.controller.ts): a create
        # whose answer was lost is found by its name (a read by name is not the list), and a retry that comes
        # while it is still being made is a 409 "already exists", never a second sandbox.
        if name not in self.unsettled:
            self.unsettled.append(name)  # until its answer comes: a shutdown looks it up (``made_anyway``)
        try:
            sandbox = await call_api(
                "create a sandbox",
                lambda: client.create(params, timeout=SANDBOX_START_TIMEOUT_S),
                api_url=self._api_url,
                progress=progress,
                budget_s=RETRY_BUDGET_S,
                done_anyway=lambda: self.named(name),
            )
        except BackendError as exc:
            sandbox = await self.named(name) if isinstance(exc.__cause__, DaytonaConflictError) else None
            if sandbox is None:
                raise
            log.warning("create of %s answered %s: it was made by an attempt whose answer was lost", name, exc)
        self.unsettled.remove(name)
        log.info("created sandbox %s (%s) for workspace %s", sandbox.id, name, self._key)
        return sandbox

    async def named(self, name: str) -> Any:
        """The sandbox with this name (what a create was sent with), None if there is none or it is being destroyed."""
        client = self._client_or_open()
        try:
            found = await self._api(f"look up the sandbox {name}", lambda: client.get(name))
        except BackendError as exc:
            if not isinstance(exc.__cause__, DaytonaNotFoundError):
                raise
            return None
        return found if state_name(found) not in GONE_STATES else None

    async def made_anyway(self) -> Any:
        """A sandbox that a create whose answer never came (cut short by an interrupt or a shutdown, or its
        connection lost) made all the same, or None."""
        for name in list(self.unsettled):
            found = await self.named(name)
            self.unsettled.remove(name)
            if found is not None:
                return found
        return None

    def volume_dir_in(self, sb: Any, workdir: str) -> tuple[str, str]:
        """Where the volume is mounted in this sandbox ("" for nowhere usable), and a notice when the
        working directory cannot be on the sandbox's disk.

        A sandbox made before the working directory moved to the disk has the volume mounted at it;
        it keeps working there, without a separate copy (mounts are fixed at creation).
        """
        mounts = [v.mount_path for v in (sb.volumes or [])]
        if any(overlaps(m, workdir) for m in mounts):
            return "", (
                f"This sandbox was made with the volume mounted at the working directory {workdir}, where "
                "renames, appends, zip files and sqlite fail. Delete the sandbox (or `%daytona recreate`) to get the "
                "working directory on the sandbox's disk.\n"
            )
        return (self.mount_path if self.mount_path in mounts else ""), ""


@contextlib.contextmanager
def short_switch_interval() -> Iterator[None]:
    """While the SDK's import (about 1 s of CPU, holding the GIL) runs in its thread, the event loop that answers
    Jupyter and runs a restart's first cell (``DaytonaSandbox._quick_start``) would wait up to the switch
    interval for the GIL at every wake-up: a shorter one while it loads (back-to-back restarts on the emulator,
    1.25 -> 1.15 s median, measured in turns)."""
    global _loads, _interval_before
    if _loads == 0:
        _interval_before = sys.getswitchinterval()
        sys.setswitchinterval(LOADING_SWITCH_INTERVAL_S)
    _loads += 1
    try:
        yield
    finally:
        _loads -= 1
        if _loads == 0:
            sys.setswitchinterval(_interval_before)


async def in_daemon_thread(fn: Callable[[], T]) -> T:
    """``fn()`` in a thread of its own that the process's exit does not join (``asyncio.to_thread``'s are)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, failure: BaseException | None) -> None:
        if done.done():
            return  # the waiter was cancelled
        if failure is not None:
            done.set_exception(failure)
        else:
            done.set_result(result)  # type: ignore[arg-type]

    def run() -> None:
        try:
            result, failure = fn(), None
        except BaseException as exc:  # handed to the waiter, which raises it
            result, failure = None, exc
        try:
            loop.call_soon_threadsafe(settle, result, failure)
        except RuntimeError:
            pass  # the loop has closed: the kernel ended meanwhile

    threading.Thread(target=run, name="daytona-sdk-load", daemon=True).start()
    return await done


def sandbox_name() -> str:
    """A new sandbox's name: unique in the organisation (names are, ``sandbox.service.ts`` about line 712), chosen
    once per create so that its retries carry the same one."""
    return f"daytona-kernel-{secrets.token_hex(8)}"


def drift_notice(cfg: DaytonaSettings, mount_path: str, sb: Any, volume: Any) -> str:
    """Settings are fixed at creation (sandbox.service.ts): name what a reused sandbox no
    longer matches, once, with the way out ("" when it matches). A volume mounted elsewhere moves
    the working directory there, so the kernel keeps working."""
    drift = []
    if cfg.snapshot and not cfg.image and sb.snapshot != cfg.snapshot:
        drift.append(f"snapshot {sb.snapshot} (configured: {cfg.snapshot})")
    for name, want, have in (
        ("cpu", cfg.cpu, sb.cpu),
        ("memory", cfg.memory, sb.memory),
        ("disk", cfg.disk, sb.disk),
        ("gpu", cfg.gpu, sb.gpu),
    ):
        if cfg.image and want and want != have:
            drift.append(f"{name} {have} (configured: {want})")
    env = sb.env or {}
    changed = sorted(k for k, v in cfg.env.items() if env.get(k) != v)
    if changed:
        drift.append(f"environment variables {', '.join(changed)}")
    if volume is not None:  # an engine mounts none
        mounts = [v for v in (sb.volumes or []) if v.volume_id == volume.id]
        if not mounts:
            drift.append(f"no volume {cfg.volume_name}")
        elif all(v.mount_path != mount_path for v in mounts):
            drift.append(f"the volume mounted at {mounts[0].mount_path} (configured: {mount_path})")
    if not drift:
        return ""
    return (
        f"The sandbox {sb.id} was created with other settings: {'; '.join(drift)}. It keeps its old "
        "settings; run `%daytona recreate` to rebuild it with the current configuration (variables and "
        "the sandbox's own disk are lost; the volume is kept).\n"
    )
