"""The Daytona backend's lifecycle: cells run in a Daytona sandbox through the async SDK.

``DaytonaSandbox`` takes a sandbox from whatever state Daytona reports to ``started`` and lets it
go at the end; the SDK calls go through ``api.call_api`` (retries, error translation),
finding and creating through ``workspace``, and files, processes and interpreter contexts
through the ``DaytonaToolbox`` it holds.

The lifecycle follows the control plane (``apps/api/src/sandbox/services/
sandbox.service.ts``, ``dto/sandbox.dto.ts`` getSandboxState()): a sandbox that is ``stopping``
is waited for and then started, one that is ``archiving`` is started, a 409
"state change in progress" is waited out within a bounded time, and a 404,
``destroying`` or ``destroyed`` means the sandbox is gone (``SandboxGone``): it
is found or created again. A kernel restart keeps the sandbox (``detach``); a
shutdown stops it only when no other kernel has a context in it.

Idle mode (``IdleMode``, docs/idle.md): with ``idle_action='pause'`` a reused
sandbox whose class can pause gets an auto-pause interval (and auto-stop off)
at creation, so Daytona pauses it when idle even after this process is gone,
and a shutdown pauses it. Any other sandbox (a class that cannot pause,
ephemeral sandboxes, ``idle_action='stop'``) stops, as before. Of the pause's
refusals (``pause()`` in sandbox.service.ts) only a 422 (the class cannot
pause) becomes a stop; after a 400 (not started: auto-pause or the dashboard
paused it first) or a 409 (a change is pending) the state is read again and a
sandbox that is no longer started is left as it is, never stopped: that would
throw away the memory the user was promised. A paused sandbox
(``pausing``/``paused``/``resuming``) is ``SandboxPaused``: it is resumed with
``start()`` and its contexts carry on with their variables. A sandbox in
``error`` that Daytona marks ``recoverable`` (a pause job that failed) is
brought back with ``recover()``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shlex
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable, TypeVar

from daytona.common.errors import DaytonaNotFoundError

from ...config import SANDBOX_WORKDIR, DaytonaSettings
from ...errors import BackendError, ContextDied, SandboxGone, SandboxNotRunning
from ..base import Context, IdleMode, ProgressCallback, Sandbox, SandboxPolicy
from .api import (
    API_REQUEST_TIMEOUT_S,
    LABEL_KERNEL,
    LABEL_NEXT,
    PAUSED_STATES,
    RETRY_BUDGET_S,
    RetriesExhausted,
    api_url_of,
    call_api,
    quiet,
    status_of,
)
from .restart_handoff import (
    Handoff,
    acceptable_url,
    interpreter_headers,
    proxied,
    settings_fingerprint,
    take_handoff,
    write_handoff,
)
from .states import StateLadder, StillChanging, hand_over_deletion
from .status import disk_use, status_lines
from .toolbox import DaytonaContext, DaytonaToolbox, FoundSandbox
from .workspace import WorkspaceSandboxes, drift_notice

if TYPE_CHECKING:
    from .restart_socket import HandedOverToolbox

log = logging.getLogger("daytona_kernel.daytona")
T = TypeVar("T")
SHUTDOWN_PATIENCE_S = 1.5  # how long a shutdown waits for a sandbox's change of state before it hands the sandbox over


class DaytonaSandbox(Sandbox):
    """A Daytona sandbox found by its workspace labels (``reuse``) or made for this kernel."""

    toolbox: DaytonaToolbox

    def __init__(
        self,
        config: DaytonaSettings,
        workspace_key: str,
        kernel_id: str,
        worker: int | None = None,
        main: DaytonaSandbox | None = None,
    ) -> None:
        """``worker``: the number of a ``%%daytona map`` engine of this kernel, whose ``main`` sandbox lends it its SDK
        client (see ``WorkspaceSandboxes``)."""
        self._config = config
        self._kernel_id = kernel_id
        self._sandbox: Any = None
        self._progress: ProgressCallback = quiet
        self._degraded = False  # the last call exhausted its retries: fail fast until Daytona answers
        self.api_url = api_url_of(config)
        lender = main._workspace if main is not None else None
        self._workspace: WorkspaceSandboxes = WorkspaceSandboxes(
            config, workspace_key, kernel_id, self.api, self.api_url, worker, lender
        )
        self._policy = self._workspace.policy
        self._notices = list(self._workspace.notices)
        self.toolbox = DaytonaToolbox(self, SANDBOX_WORKDIR)
        self._states = StateLadder(self.api, self._notices.append)
        self.id = "(not created yet)"
        self.workdir = SANDBOX_WORKDIR
        self.volume_dir = self._workspace.mount_path
        self.generation = 0  # +1 for every sandbox found or created: a new one has lost the old one's state
        self._gpu_checked = False
        self._next_looked_for = False  # the context a restart left (take_next_context)
        # A restart's quick start (docs/reattach.md): the first cell runs in the context the old process left,
        # through ``_handed_over``, while ``_loading`` loads the SDK and fetches the sandbox.
        self._handoff: Handoff | None = None
        self._handed_over: HandedOverToolbox | None = None
        self._toolbox_url = ""  # the handed-over sandbox's toolbox URL, for a restart before the SDK has loaded
        self._unclaimed: Handoff | None = None  # a handoff of this kernel refused: its context is deleted at the start
        self._loading: asyncio.Future[None] | None = None
        self._load_failure: BaseException | None = None  # what the last load failed with, until a start tries again
        self._early = False  # an early first start whose SDK load the first cell has not waited for yet
        self._fingerprint = (
            settings_fingerprint(config, workspace_key, self.api_url, config.target or os.environ.get("DAYTONA_TARGET", ""))
            if worker is None
            else ""  # a map engine neither leaves nor takes a handoff
        )

    @property
    def description(self) -> str:
        source = self._config.image or self._config.snapshot or "default snapshot"
        return f"Daytona sandbox {self.id} ({source}, {self._policy.value})"

    @property
    def size_text(self) -> str:
        """Its size as created (else as configured) and what it is made from."""
        sb, cfg = self._sandbox, self._config
        cpu, memory, disk, gpu = (
            (sb.cpu, sb.memory, sb.disk, sb.gpu) if sb is not None else (cfg.cpu, cfg.memory, cfg.disk, cfg.gpu)
        )
        parts = [f"{cpu} CPU" if cpu else "", f"{memory} GiB memory" if memory else "", f"{disk} GiB disk" if disk else ""]
        parts.append(f"{gpu} GPU" if gpu else "")
        size = ", ".join(p for p in parts if p) or "Daytona's default size"
        source = (
            f"image {cfg.image}"
            if cfg.image
            else f"snapshot {cfg.snapshot or (sb.snapshot if sb is not None else '') or 'default'}"
        )
        return f"a Daytona sandbox of {size} ({source})"

    async def sdk_sandbox(self) -> Any:
        """The SDK's sandbox. The one seam where every SDK call waits, after a restart's quick start, for the
        SDK's load and the sandbox's fetch (and gets their failure, if they failed)."""
        failure = await self._settled()
        if failure is not None:
            raise failure
        if self._sandbox is None:  # the load's failure again (for every caller, not only the first), or no start yet
            raise self._load_failure or SandboxNotRunning("The sandbox is not ready yet.")
        return self._sandbox

    @property
    def loading(self) -> bool:  # type: ignore[override]
        return self._loading is not None and not self._loading.done()

    async def _settled(self) -> BaseException | None:
        """Wait for a quick start's load, if one runs; what it failed with, if it did."""
        loading = self._loading
        if loading is None:
            return None
        await asyncio.wait({loading})  # never cancels it: another caller may wait too
        if self._loading is loading:
            self._loading = None
            if not loading.cancelled() and loading.exception() is not None:
                self._load_failure = loading.exception()
        return None if loading.cancelled() else loading.exception()

    async def first_start_settled(self) -> None:
        """An early first start (``_early_start``): the runtime installed without the SDK; the first cell then waits for
        the SDK's load and fetch (about as long as the raw SDK's import), so the sandbox's idle mode, its notices and
        its intervals are known before any cell runs, as after a normal start. A restart's quick start does not wait."""
        if not self._early:
            return
        self._early = False
        failure = await self._settled()
        if failure is not None:
            raise failure

    def without_sdk(self) -> HandedOverToolbox | None:
        """After a restart's quick start, while the SDK loads: the toolbox without it (tornado's client)."""
        return self._handed_over if self.loading else None

    def take_notices(self) -> list[str]:
        notices = list(self._notices)
        self._notices.clear()  # the same list: the state ladder adds to it
        return notices

    async def api(self, what: str, fn: Callable[[], Awaitable[T]], *, retry: bool = True) -> T:
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

    async def start(self, progress: ProgressCallback) -> None:
        self._progress = progress
        try:
            await self._start(progress)
        finally:
            self._progress = quiet

    async def _start(self, progress: ProgressCallback) -> None:
        await self._settled()  # a quick start's load (its failure: found or created again below)
        if self._sandbox is not None:
            try:
                await self.refresh_state()
                await self._ensure_started(progress)
                return
            except SandboxGone as exc:
                log.warning("%s; finding or creating another", exc)
                progress(f"sandbox {self.id} is gone; finding or creating another…")
                self._sandbox = None
                self.toolbox.contexts.clear()
        elif not self._next_looked_for and (self._quick_start() or await self._early_start(progress)):
            return
        await self._locate(progress, prefer=self._workspace.created_early)

    def _quick_start(self) -> bool:
        """The first start after a restart, when the old process left a handoff that fits: the sandbox is taken
        as started, the first cell runs in the next context through tornado's client (``restart_socket``), and
        the SDK loads meanwhile (``_loading``). False (with a debug line saying why) for the normal start: also
        when the environment names a proxy for the toolbox, which the SDK's sessions honour and tornado's
        client cannot."""
        if not self._fingerprint:
            return False
        refused: list[Handoff] = []
        handoff = take_handoff(self._kernel_id, self._fingerprint, self.api_url, refused=refused)
        headers = interpreter_headers() if handoff is not None else None
        proxy = proxied(handoff.toolbox_url) if handoff is not None else ""
        if handoff is None or headers is None or proxy:
            if handoff is not None:
                log.debug("restart handoff not used: %s", proxy or "the credentials are not in the environment")
            self._unclaimed = refused[0] if refused else handoff  # its context: deleted once the normal start has the sandbox
            return False
        from .restart_socket import HandedOverToolbox

        self._handoff = handoff
        self._handed_over = HandedOverToolbox(handoff.sandbox_url, handoff.interpreter_url, headers)
        self._toolbox_url = handoff.toolbox_url
        self.id = handoff.sandbox_id
        self.volume_dir = handoff.volume_dir  # the sandbox's own (its fetch, which says it, comes later)
        self.generation += 1
        self._loading = asyncio.ensure_future(self._locate(quiet, prefer=handoff.sandbox_id))
        self._loading.add_done_callback(_log_failure)
        log.info("restart: running in context %s of sandbox %s while the daytona SDK loads", handoff.context_id, self.id)
        return True

    async def _early_start(self, progress: ProgressCallback) -> bool:
        """A new kernel's first start, when the workspace has no sandbox yet: created and started without the SDK
        (``early``) while the SDK loads in its thread, then the first context made and left for the
        runtime's install as a restart's is (``take_next_context``), through tornado's client; ``_loading`` then
        fetches the sandbox with the SDK, as after a restart. False (the SDK's start) where that does not apply,
        and after any failure: the SDK's path repeats the request and reports it as always."""
        if not self._fingerprint or self._workspace.early_create_body("", "") is None:
            return False
        headers = interpreter_headers()
        if headers is None or proxied(self.api_url):
            return False
        from .early import EarlyApi, NotEarly, create_early
        from .restart_socket import HandedOverToolbox

        loading = asyncio.ensure_future(self._workspace.open_client())  # the SDK's import, in its thread, meanwhile
        loading.add_done_callback(_log_failure)
        api = EarlyApi(self.api_url, headers)
        try:
            made = await create_early(api, self._workspace, progress)
            toolbox_url = made.toolbox_url.rstrip("/")
            if acceptable_url(toolbox_url, self.api_url) or proxied(toolbox_url):
                raise NotEarly(f"the toolbox URL {toolbox_url} is not one to send the key to here")
            handoff = Handoff(
                self._kernel_id, made.id, toolbox_url, "", self._fingerprint, time.time(), self._workspace.mount_path
            )
            toolbox = HandedOverToolbox(handoff.sandbox_url, handoff.interpreter_url, headers)
            try:
                await toolbox.make_dir(self.workdir)
                handoff = dataclasses.replace(handoff, context_id=await toolbox.create_context(self.workdir))
            except BackendError as exc:
                await toolbox.close()
                raise NotEarly(str(exc)) from exc
        except NotEarly as exc:
            log.info("first start through the SDK: %s", exc)
            return False
        finally:
            api.close()
        self._handoff, self._handed_over, self._toolbox_url = handoff, toolbox, toolbox_url
        self._early = True
        self.id, self.volume_dir = made.id, handoff.volume_dir
        self.generation += 1
        self._loading = asyncio.ensure_future(self._locate(quiet, prefer=made.id))
        self._loading.add_done_callback(_log_failure)
        log.info("first start: sandbox %s created and context %s made while the daytona SDK loads", made.id, handoff.context_id)
        return True

    async def _locate(self, progress: ProgressCallback, prefer: str = "") -> None:
        """Find (``prefer``: by its id, the sandbox a restart handed over) or create the sandbox, and start it."""
        self._load_failure = None
        await self._workspace.open_client()  # in a thread: the kernel answered Jupyter before the SDK was loaded
        if not self._gpu_checked:  # the snapshot's GPU decides the policy, before the sandbox is looked for
            notice = await self._workspace.check_gpu()
            self._gpu_checked = True
            self._policy = self._workspace.policy
            if notice:
                self._notices.append(notice)
        # Independent round trips to Daytona's API: at once. The volume's error, if both fail, is the one shown.
        looked = await asyncio.gather(
            self._workspace.ready_volume(progress), self._workspace.find(prefer), return_exceptions=True
        )
        for failed in looked:
            if isinstance(failed, BaseException):
                raise failed
        volume, self._sandbox = looked
        if self._sandbox is not None:
            # a list item lacks the volumes and env that drift and the volume copy are judged by (one got by its id has them)
            found = self._sandbox
            try:
                if found.id != prefer:
                    await self.api("check the sandbox", lambda: found.refresh_data(request_timeout=API_REQUEST_TIMEOUT_S))
                elif found.id == self._workspace.created_early:  # made without the SDK: its idle interval now
                    await self._workspace.created(found)
                notice = drift_notice(self._config, self._workspace.mount_path, found, volume)
                if notice:
                    self._notices.append(notice)
            except BackendError as exc:
                if not isinstance(exc.__cause__, DaytonaNotFoundError):
                    raise
                self._sandbox = None  # deleted since the list: make another
        if self._sandbox is None:
            said = len(self._workspace.notices)
            self._sandbox = await self._workspace.create(volume, progress)
            self._policy = self._workspace.policy  # a GPU snapshot Daytona named at the create makes it ephemeral
            self._notices += self._workspace.notices[said:]
        if self._sandbox.id != prefer:  # a new sandbox has none of the old one's state
            self.generation += 1
        self.id = self._sandbox.id
        try:
            await self._ensure_started(progress)
        except SandboxGone:  # deleted between the list and the start
            self._sandbox = await self._workspace.create(volume, progress)
            self.generation += 1  # a new one, also when it replaces the sandbox a restart handed over
            self.id = self._sandbox.id
            await self._ensure_started(progress)
        self._note_idle_mode()
        await self._prepare_workdir()
        if self._policy is SandboxPolicy.REUSE and self._sandbox.labels.get(LABEL_KERNEL) != self._kernel_id:
            await self._relabel(self._sandbox, "label the sandbox with this kernel", {LABEL_KERNEL: self._kernel_id})

    async def info(self) -> dict[str, str]:
        await self._settled()
        if self._sandbox is None:
            return {"sandbox": "not created yet", "policy": self._policy.value}
        state = await self.refresh_state()
        why_stops = self._workspace.idle_why or self._workspace.why_not_pause()
        info = status_lines(self._sandbox, state, self._config, self._policy, self.idle_mode, why_stops)
        info["volume"] = (
            f"{self._config.volume_name} at {self.volume_dir or '(not mounted)'} (sub-folder {self._workspace.subpath})"
        )
        info["working directory"] = f"{self.workdir} (on the sandbox's disk; the volume keeps a copy)"
        if state == "started":
            info["disk"] = await disk_use(self.toolbox)
        return info

    async def _prepare_workdir(self) -> None:
        """Make the working directory on the sandbox's disk (a context's cwd must exist), once per sandbox."""
        self.volume_dir, notice = self._workspace.volume_dir_in(self._sandbox, self.workdir)
        if notice:
            self._notices.append(notice)
            return
        sandbox = self._sandbox
        command = f"mkdir -p {shlex.quote(self.workdir)}"
        result = await self.api(
            "make the working directory", lambda: sandbox.process.exec(command, timeout=int(API_REQUEST_TIMEOUT_S))
        )
        if result.exit_code:
            raise BackendError(f"Could not make the working directory {self.workdir} in the sandbox: {result.result}")

    def _note_idle_mode(self) -> None:
        """The idle mode of the sandbox in use: what it was created with (settings are fixed at creation)."""
        minutes = self._sandbox.auto_pause_interval or 0
        self.idle_mode = IdleMode.PAUSE if minutes else IdleMode.STOP
        self.auto_pause_s = minutes * 60.0

    async def recreate(self, progress: ProgressCallback) -> None:
        """Delete this sandbox and make a new one with the current configuration (``%daytona recreate``)."""
        await self._settled()
        if self._sandbox is not None:
            await self.toolbox.close_contexts()
            old = self._sandbox
            progress(f"deleting sandbox {old.id}…")
            await self._states.delete(old, progress)  # during an auto-stop too: once it has stopped
            self._sandbox = None
        await self.start(progress)

    async def _ensure_started(self, progress: ProgressCallback) -> None:
        await self._states.ensure_started(self._sandbox, progress)

    async def refresh_state(self) -> str:
        """The sandbox's state now. Raises SandboxGone if it no longer exists or is being destroyed."""
        return await self._states.refresh(await self.sdk_sandbox())

    async def start_again(self) -> bool:
        """For the toolbox, whose context could not be made: False if the sandbox is started (the failure
        stands); else it stopped since we last looked and is started again, or was deleted and another is
        found or created; True."""
        try:
            if await self.refresh_state() == "started":
                return False
            await self._ensure_started(self._progress)
        except SandboxGone:
            await self.start(self._progress)
        return True

    supports_attach = True  # the daemon keeps a context's worker when its client goes (docs/reattach.md)

    async def detach(self) -> None:
        """A kernel restart: delete this kernel's contexts and keep the sandbox running, so the next
        kernel process (same Jupyter kernel id) finds it started: %pip installs and files survive."""
        if self.without_sdk() is None:  # else its contexts are deleted without the SDK, without waiting for it
            await self._settled()
        try:
            await self.toolbox.close_contexts()
        finally:
            await self._close_client()

    async def leave_next_context(self, code: str, timeout: float) -> None:
        """A restart: the next process's context, created now with ``code`` (importing IPython) left running
        in it, and named in the sandbox's labels for the next process of this kernel (``detach`` keeps it); the
        handoff tells that process where its interpreter is, so its first cell need not wait for the SDK. A
        restart that comes before this process's SDK has loaded does it without the SDK (``restart_socket``),
        without the label."""
        quick = self.without_sdk()
        if quick is not None:
            context = DaytonaContext(self.toolbox, await quick.create_context(self.workdir))
            self.toolbox.contexts.append(context)
            await context.start_code(code, timeout)
            self.toolbox.forget(context)
            write_handoff(
                Handoff(self._kernel_id, self.id, self._toolbox_url, context.id, self._fingerprint, time.time(), self.volume_dir)
            )
            return
        sandbox = await self.sdk_sandbox()
        context = await self.toolbox.new_context()  # one of ours until named: if this fails, detach deletes it
        await context.start_code(code, timeout)
        await self._relabel(
            sandbox, "name the next context in the sandbox's labels", {LABEL_NEXT: f"{self._kernel_id}.{context.id}"}
        )
        self.toolbox.forget(context)
        if self._fingerprint:
            handoff = Handoff(
                self._kernel_id,
                sandbox.id,
                sandbox.toolbox_proxy_url,
                context.id,
                self._fingerprint,
                time.time(),
                self.volume_dir,
            )
            write_handoff(handoff)

    async def _relabel(self, sandbox: Any, what: str, changes: dict[str, str]) -> None:
        """Set some labels. Daytona replaces all of them at once with no precondition (``replaceLabels``,
        sandbox.service.ts), so they are read again just before: a copy cached since the start would undo what
        another kernel sharing the sandbox (or the dashboard) wrote meanwhile."""
        await self.api("read the sandbox's labels", lambda: sandbox.refresh_data(request_timeout=API_REQUEST_TIMEOUT_S))
        labels = dict(sandbox.labels, **changes)
        await self.api(what, lambda: sandbox.set_labels(labels))

    async def take_next_context(self) -> Context | None:
        """Looked for once, at this process's first start: a later start (a context that died, a sandbox
        that stopped) makes its own."""
        if self._next_looked_for:
            return None
        self._next_looked_for = True
        if self._handoff is not None:  # a quick start: the SDK has not loaded
            context = DaytonaContext(self.toolbox, self._handoff.context_id)
            self._handoff = None
            self.toolbox.contexts.append(context)
            return context
        if self._sandbox is None:
            return None
        kernel, _, context_id = (self._sandbox.labels.get(LABEL_NEXT) or "").partition(".")
        await self._delete_unclaimed(context_id if kernel == self._kernel_id else "")
        if kernel != self._kernel_id or not context_id:
            return None
        try:
            return await self.toolbox.adopt_context(context_id)
        except ContextDied:
            return None  # ended since (the sandbox restarted, or the warm-up failed): a new one is made

    async def _delete_unclaimed(self, labelled: str) -> None:
        """The context a refused handoff of this kernel names, unless the label names it too (then it is taken
        as usual): left by a restart that came before the SDK had loaded (no label), no process took it, and it
        would otherwise stay alive and count as another kernel's at shutdown (the sandbox left running)."""
        unclaimed, self._unclaimed = self._unclaimed, None
        if unclaimed is None or (unclaimed.sandbox_id == self.id and unclaimed.context_id == labelled):
            return
        try:
            if unclaimed.sandbox_id == self.id:
                await self.toolbox.end_context(unclaimed.context_id)
                return
            other = await self._workspace.by_id(unclaimed.sandbox_id)  # the sandbox the old settings chose
            if other is not None:
                await DaytonaToolbox(FoundSandbox(other, self.api_url), self.workdir).end_context(unclaimed.context_id)
        except BackendError as exc:
            log.info(
                "could not delete the context %s a restart left (%s); it goes when its sandbox stops", unclaimed.context_id, exc
            )

    async def shutdown(self) -> None:
        """Release by policy: 'ephemeral' deletes; 'reuse' stops, unless another kernel still has a
        context in the sandbox (two notebooks in one folder): then it stays up for that kernel, and
        auto-stop ends it once every kernel has gone quiet. While the SDK still loads after a restart, this kernel's
        contexts are deleted without it first: if Jupyter kills the process before the SDK is there, no
        interpreter with the user's variables is left."""
        if self.without_sdk() is not None:
            await self.toolbox.close_contexts()
        await self._settled()
        try:
            if self._sandbox is None and self._workspace.unsettled:  # a start cut short during its create
                self._sandbox = await self._workspace.made_anyway()
                self.id = self._sandbox.id if self._sandbox is not None else self.id
            if self._sandbox is not None:
                await self.toolbox.close_contexts()
                if self._policy is SandboxPolicy.EPHEMERAL:
                    await self._delete_or_hand_over()
                elif await self._state_settled() == "started":  # Daytona or the dashboard may have paused it meanwhile
                    # a next context our own restart left and no process of this kernel took is not another kernel's
                    kernel, _, left = (self._sandbox.labels.get(LABEL_NEXT) or "").partition(".")
                    others = await self.toolbox.other_kernels(besides=left if kernel == self._kernel_id else "")
                    if others:
                        log.info("sandbox %s left running: %d other kernel context(s) use it", self.id, others)
                    else:
                        await self._pause_or_stop()
        finally:
            await self._close_client()

    async def _pause_or_stop(self) -> None:
        """Pause the sandbox in pause mode, else stop it. Only a 422 (its class cannot pause) makes a pause a
        stop; after any other failure the state is read again, and a sandbox that is no longer started (paused
        by Daytona or the dashboard first, stopping, or in error after a failed pause) is left as it is."""
        sandbox = self._sandbox
        if self.idle_mode is IdleMode.PAUSE:
            try:
                await self.api("pause the sandbox", lambda: sandbox.pause(timeout=API_REQUEST_TIMEOUT_S))
                return
            except BackendError as exc:
                if status_of(exc.__cause__) != 422:
                    state = await self._state_now()
                    if state != "started":
                        log.info("sandbox %s not paused (%s): it is %s now; left as it is", self.id, exc, state)
                        return
                    raise
                log.warning("Daytona cannot pause sandbox %s (%s); stopping it instead", self.id, exc)
        await self.api("stop the sandbox", lambda: sandbox.stop(timeout=API_REQUEST_TIMEOUT_S))

    async def _delete_or_hand_over(self) -> None:
        """Delete the sandbox; while Daytona refuses because its state changes (409: starting, stopping ...), wait
        what a shutdown can (Jupyter kills a kernel 5 s after asking it to end), then hand it to a process of its own."""
        try:
            await self._states.delete(self._sandbox, patience_s=SHUTDOWN_PATIENCE_S)
        except StillChanging as exc:
            log.info("%s", exc)
            hand_over_deletion(self._sandbox.id, self.api_url, self._config.target or os.environ.get("DAYTONA_TARGET", ""))

    async def _state_settled(self) -> str:
        """The state once a change under way (a start cut short by the shutdown) has ended, within what a shutdown
        can wait (else the state then: a reused sandbox still starting is left to its auto-stop), as ``_state_now``."""
        try:
            return await self._states.settled(await self.sdk_sandbox(), SHUTDOWN_PATIENCE_S)
        except BackendError as exc:
            log.warning("the state of sandbox %s could not be read: %s", self.id, exc)
            return "unknown"

    async def _state_now(self) -> str:
        """The state as Daytona reports it now (``destroyed`` if it is gone, ``unknown`` if it cannot be read)."""
        try:
            return await self.refresh_state()
        except SandboxGone:
            return "destroyed"
        except BackendError as exc:
            log.warning("the state of sandbox %s could not be read: %s", self.id, exc)
            return "unknown"

    async def resume_if_paused(self, progress: ProgressCallback) -> bool:
        await self._settled()
        if self._sandbox is None or await self.refresh_state() not in PAUSED_STATES:
            return False
        self._progress = progress
        try:
            await self._ensure_started(progress)
        finally:
            self._progress = quiet
        return True

    async def _close_client(self) -> None:
        if self._loading is not None:  # a restart while the SDK loads: the process exits next
            self._loading.cancel()
        if self._handed_over is not None:
            await self._handed_over.close()
        await self._workspace.close()


def _log_failure(loading: asyncio.Future[None]) -> None:
    """A quick start's load failed: the next SDK call raises it (and a start finds or creates the sandbox)."""
    if not loading.cancelled() and loading.exception() is not None:
        log.warning("after the restart's quick start, the sandbox could not be loaded: %s", loading.exception())
