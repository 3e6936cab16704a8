"""The context supervisor: one live interpreter context in the sandbox, kept alive.

It provisions the sandbox in the background, bootstraps the runtime into a
context, clones ``repo_url`` once, replaces a context that died and brings a
stopped sandbox back. Everyone else asks it for the live context (``ready``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, replace
from typing import Any, Awaitable, Callable, Sequence, TypeVar

from . import ipython_bundle
from .backends.base import Context, RunError, Sandbox
from .cell import Frontend, ProgressCallback
from .config import SessionSettings
from .errors import BackendError, DaytonaKernelError, RuntimeCallError
from .installer import RuntimeInstaller, close_quietly
from .journal import SessionJournal
from .protocol import Hello
from .request import RUNTIME_CALL_TIMEOUT_S, Request, run_in
from .runtime import call_source, warmup_code
from .runtime.calls import RUNTIME_MISSING, Call, RuntimeOptions

# A restart's head start for the next process is worth at most this long: Jupyter kills a kernel process
# that has not ended 5 s after its shutdown request, and the old contexts must still be deleted (detach).
LEAVE_NEXT_CONTEXT_S = 1.5
STARTING_CANCEL_S = 10.0  # a start cancelled at shutdown: how long its end (a create under way) is waited for

T = TypeVar("T")
WORKER_REPLACED = (
    "The sandbox's Python process had ended since the last request and was replaced by a fresh one: "
    "variables were reset; files in the working directory are intact.\n"
)


@dataclass
class Live:
    """A bootstrapped context: where requests go."""

    context: Context
    token: str
    pid: int
    python: str


class ContextSupervisor:
    """See the module docstring. ``runtime_options`` are passed to every new runtime."""

    def __init__(
        self,
        sandbox: Sandbox,
        settings: SessionSettings,
        log: logging.Logger,
        runtime_options: RuntimeOptions,
        journal: SessionJournal | None = None,
        notices: Sequence[str] = (),
    ) -> None:
        """``notices``: for the user, before the first cell's output (the mirror's, say)."""
        self.sandbox = sandbox
        self._settings = settings
        self._log = log
        self._runtime_options = replace(
            runtime_options, output_limit_chars=settings.output_limit_chars, blob_chars=sandbox.blob_chars
        )
        self.notices: list[str] = list(notices)  # for the user, shown before the next cell's output
        self._sandbox_started = False
        self._starting: asyncio.Future[Live] | None = None
        self.live: Live | None = None
        self._repo_staged_in: int | None = None  # the sandbox generation repo_url was staged in
        self._shutting: asyncio.Future[None] | None = None  # the shutdown under way
        self._closing: set[asyncio.Future[None]] = set()  # old contexts being deleted in the background
        self._looking: set[asyncio.Future[None]] = set()  # the journal's look, after a restart's quick start
        self._progress: ProgressCallback | None = None
        self._last_progress = ""
        self.journal = journal  # journals each context's cells, for reattaching
        self._installer = RuntimeInstaller(sandbox, settings, log, journal, self.report, self.notices.append)

    @property
    def python_version(self) -> str | None:
        return self.live.python if self.live else None

    @property
    def sandbox_started(self) -> bool:
        """Whether the sandbox was started (so ``shutdown`` releases it)."""
        return self._sandbox_started

    def start(self) -> None:
        """Begin provisioning in the background, so the first cell rarely waits."""
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._start())

    async def ready(self, progress: ProgressCallback | None = None) -> Live:
        """The live context, once started. Raises DaytonaKernelError if it cannot start.

        While it waits, ``progress`` receives status lines (the latest one at
        once), and an empty line when the wait is over.
        """
        self.start()
        assert self._starting is not None
        waiting = progress if not self._starting.done() else None
        if waiting is not None:
            self._progress = waiting
            if self._last_progress:
                waiting(self._last_progress)
        try:
            return await asyncio.shield(self._starting)
        except DaytonaKernelError:
            self._starting = None  # the next request tries again
            raise
        finally:
            self._progress = None
            if waiting is not None:
                waiting("")  # the wait is over: clear the status line

    def take_notices(self) -> list[str]:
        """The queued notices (what starting, recovering or replacing the context took), once, with the sandbox's
        (after a restart's quick start, what its load found comes after the start). Emptied in place: the
        installer holds this list's ``append``."""
        self.notices += self.sandbox.take_notices()
        notices = list(self.notices)
        self.notices.clear()
        return notices

    def show_notices(self, frontend: Frontend) -> None:
        """The queued notices, on stderr."""
        for notice in self.take_notices():
            frontend.notice(notice)

    def report(self, text: str) -> None:
        """A status line for whoever waits for the context."""
        self._last_progress = text
        self._log.info("%s", text)
        if self._progress is not None:
            self._progress(text)

    async def _start(self) -> Live:
        self._last_progress = ""
        await self.sandbox.start(self.report)
        self._sandbox_started = True
        self.notices += self.sandbox.take_notices()
        left = await self.sandbox.take_next_context()
        installed = await self._install_in_left(left) if left is not None else None
        if left is None or installed is None:
            context = await self.sandbox.toolbox.create_context()
            token, hello = await self._installer.install(context, self._runtime_options)
        else:
            context, (token, hello) = left, installed
        await self.sandbox.first_start_settled()
        if self._installer.wants_ipython(hello) and await self._installer.ship_ipython(context, hello):
            old = context  # a new context finds the shipped IPython; the old one goes meanwhile
            context, _ = await asyncio.gather(self.sandbox.toolbox.create_context(), self.close_quietly(old))
            token, hello = await self._installer.install(context, self._runtime_options)
        self.live = Live(context, token, hello.pid, hello.python)
        if self._settings.repo_url and self._repo_staged_in != self.sandbox.generation:
            self._repo_staged_in = self.sandbox.generation  # once per sandbox: a new one needs it again
            await self._installer.stage_repo()
        self._log.info("runtime ready in %s (pid %s, Python %s)", self.sandbox.description, hello.pid, hello.python)
        if self.journal is not None:
            # Read where the first cell's notice needs it (a session to offer, or attach='auto'); else after it.
            if self.sandbox.loading and self._settings.attach != "auto" and not self.journal.may_offer(context.id, hello.journal):
                looking = asyncio.ensure_future(self._look(self.journal, context.id, hello))
                self._looking.add(looking)
                looking.add_done_callback(self._looked)
            else:
                await self._look(self.journal, context.id, hello)
        return self.live

    async def _install_in_left(self, context: Context) -> tuple[str, Hello] | None:
        """The runtime in the context the previous process left at a restart; None when that context cannot be
        used (gone, its sandbox stopped or deleted, the handed-over websocket refused): the installer has
        deleted it and a new one is made. Nothing of the user's has run in it."""
        try:
            return await self._installer.install(context, self._runtime_options)
        except BackendError as exc:
            self._log.info("the context the restart left cannot be used (%s); making another", exc)
            return None

    def _looked(self, looking: asyncio.Future[None]) -> None:
        """A background look ended: its failure (the SDK's load's, which can be anything) is logged, not lost."""
        self._looking.discard(looking)
        if not looking.cancelled() and looking.exception() is not None:
            self._log.warning("the session journal could not be read after the restart: %s", looking.exception())

    async def _look(self, journal: SessionJournal, context_id: str, hello: Hello) -> None:
        notice = await journal.look(context_id, hello.journal)
        if notice:
            self.notices.append(notice)

    async def run_installed(
        self, live: Live, run: Callable[[Live], Awaitable[RunError | None]], replaced: Callable[[], None]
    ) -> RunError | None:
        """``run(live)``: one run (``request.run_in``), in a new request. A fresh worker without the runtime (the
        daemon replaced a dead one) answers in the same round trip: the runtime is installed again,
        ``replaced()`` ends the first run's request (it read nothing of the cell), and the code runs there. The
        one home of that retry: cells, map cells and the runtime's calls (``call``) run through it."""
        run_error = await run(live)
        if not runtime_missing(run_error):
            return run_error
        live = await self.rebootstrap(live)
        replaced()
        return await run(live)

    async def rebootstrap(self, live: Live) -> Live:
        """The worker behind ``live`` was silently replaced by a fresh one (the daemon does that
        after a worker died between cells): install the runtime again in the same context and
        queue a notice that the variables were reset. If that fails, the next request starts
        a new context."""
        self._log.warning("the interpreter of context %s was replaced by a fresh one; bootstrapping again", live.context.id)
        try:
            live.token, hello = await self._installer.install(live.context, self._runtime_options)
        except DaytonaKernelError:
            if self.live is live:
                self.live, self._starting = None, None
            raise
        live.pid, live.python = hello.pid, hello.python
        self.notices.append(WORKER_REPLACED)
        return live

    def restart_context(self) -> None:
        """Replace the context in the background; the next request waits for it."""
        live, self.live = self.live, None
        if live is not None:
            closing = asyncio.ensure_future(self.close_quietly(live.context))
            self._closing.add(closing)  # keep a reference until it is done
            closing.add_done_callback(self._closing.discard)
        self._starting = asyncio.ensure_future(self._start())

    async def adopt(self, live: Live) -> Context | None:
        """Make ``live`` (a context another kernel process left) this kernel's; returns the context it
        replaces, which is closed."""
        old, self.live = self.live, live
        adopted: asyncio.Future[Live] = asyncio.get_running_loop().create_future()
        adopted.set_result(live)
        self._starting = adopted
        if old is None:
            return None
        await self.close_quietly(old.context)
        return old.context

    async def recover(self, cause: DaytonaKernelError, progress: ProgressCallback | None) -> Live:
        """The sandbox stopped (auto-stop, archive), is gone or could not be reached: start it (or find or
        create another) and a new context."""
        self._log.warning("sandbox not running (%s); starting it again", cause)
        self.live = None
        self._starting = asyncio.ensure_future(self._start())
        return await self.ready(progress)

    async def resume(self, progress: ProgressCallback | None) -> float | None:
        """Resume the sandbox if it is paused: its contexts, and the live one's variables, carry on.
        Returns the seconds it took, or None if it was not paused."""
        began = time.monotonic()
        if not await self.sandbox.resume_if_paused(progress or self.report):
            return None
        took = time.monotonic() - began
        self._log.info("resumed the paused sandbox %s in %.1f s", self.sandbox.id, took)
        return took

    async def recreate(self, progress: ProgressCallback | None) -> Live:
        """``%daytona recreate``: a new sandbox with the current configuration, and a new context in it."""
        self.live = None
        await self._wait_for_closing()
        await self.sandbox.recreate(progress or self.report)
        self._starting = asyncio.ensure_future(self._start())
        return await self.ready(progress)

    async def _wait_for_closing(self) -> None:
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    async def close_quietly(self, context: Context) -> None:
        await close_quietly(context, self._log)

    async def shutdown(self, restart: bool = False, before_ending: Callable[[], Awaitable[None]] | None = None) -> None:
        """Stop provisioning, then release the sandbox: on a restart keep it for the next kernel process
        (``detach``), otherwise stop or delete it by policy. ``before_ending`` runs first in the live context (at a
        restart, while the next context is made). Safe to call twice: a second call (a SIGTERM during a shutdown)
        waits for the first."""
        if self._shutting is None:
            self._shutting = asyncio.ensure_future(self._shutdown(restart, before_ending))
        await asyncio.shield(self._shutting)

    async def _shutdown(self, restart: bool, before_ending: Callable[[], Awaitable[None]] | None) -> None:
        if self._starting is not None and not self._starting.done():
            self._starting.cancel()
            if not restart:  # what its create did must be known to be released (a restart leaves it to the next process)
                await asyncio.wait({self._starting}, timeout=STARTING_CANCEL_S)
        if not self._sandbox_started:
            if not restart:  # a start cut short may have made its sandbox all the same: the backend looks for it
                await self.sandbox.shutdown()
        else:
            await self._wait_for_closing()
            if restart:
                # This process's context goes while the next one is made: the daemon answers a deletion only once
                # the worker has exited. Not under the timeout, which would cancel a deletion half done.
                ending = asyncio.ensure_future(self._end_live(before_ending)) if self.live is not None else None
                try:
                    await asyncio.wait_for(self._leave_next_context(), LEAVE_NEXT_CONTEXT_S)
                except asyncio.TimeoutError:
                    self._log.warning("no time to prepare the next context for the restart: the next process makes its own")
                finally:
                    if ending is not None:
                        await ending
                    await self.sandbox.detach()  # also deletes a next context that was not named in time
            else:
                if before_ending is not None:
                    await before_ending()
                await self.sandbox.shutdown()

    async def _end_live(self, before_ending: Callable[[], Awaitable[None]] | None) -> None:
        live = self.live
        if before_ending is not None:
            await before_ending()
        if live is not None:
            await self.close_quietly(live.context)

    async def _leave_next_context(self) -> None:
        """A restart: the next kernel process's context, with IPython importing there while that process
        starts (about half of its bootstrap, off the restart's path). Only after a normal run: a failure
        just leaves the next process to create its own."""
        if self.live is None:
            return
        options = replace(self._runtime_options, ship_ipython=ipython_bundle.ipython_version())
        if not options.ipython:
            return
        try:
            await self.sandbox.leave_next_context(warmup_code(options), RUNTIME_CALL_TIMEOUT_S)
        except DaytonaKernelError as exc:
            self._log.warning("could not prepare the next context for the restart: %s", exc)

    async def call(self, call: Call, parse: Callable[[Any], T]) -> T:
        """One runtime call answered by a ``reply`` frame, parsed by its reply's parser in ``protocol.py``
        (``checkpointed``, ``completion`` ...). Raises RuntimeCallError saying why it failed (ProtocolError
        when the reply does not fit)."""
        method, code = call.METHOD, call_source(call)
        live = self.live
        if live is None:
            raise RuntimeCallError(f"{method}: the sandbox is not ready.")
        requests: list[Request] = []

        async def run(live: Live) -> RunError | None:
            requests.append(Request(live.token, self._installer.output_outside_a_cell))
            return await run_in(live.context, code, requests[-1], RUNTIME_CALL_TIMEOUT_S)

        error = await self.run_installed(live, run, lambda: None)  # the first request is finished already
        request = requests[-1]
        if error is not None:
            raise RuntimeCallError(f"{method} failed in the sandbox: {error.name}: {error.value}")
        if request.error is not None:
            raise RuntimeCallError(f"{method} failed: {request.error['evalue']}")
        if request.reply is None:
            raise RuntimeCallError(f"{method}: the runtime did not answer.")
        return parse(request.reply)

    async def query(self, call: Call, parse: Callable[[Any], T]) -> T | None:
        """``call`` for requests that must never disturb the user (complete, inspect):
        None when the sandbox is not ready or the call failed; failures are only logged."""
        if self.live is None:
            return None
        try:
            return await self.call(call, parse)
        except DaytonaKernelError as exc:
            self._log.warning("%s", exc)
            return None


def runtime_missing(error: RunError | None) -> bool:
    """The run found a worker without the runtime (see ``call_source``)."""
    return error is not None and error.name == RUNTIME_MISSING
