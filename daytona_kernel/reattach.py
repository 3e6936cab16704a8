"""``%daytona attach``: take over a session that another kernel process of this notebook left running in
the sandbox (its journal is read by ``attach.SessionJournal``; docs/reattach.md)."""

from __future__ import annotations

import asyncio

from .backends.base import LOCAL_ATTACH, Sandbox
from .cell import Frontend, stderr
from .comms import CommBridge
from .errors import BackendError, DaytonaKernelError, Interrupted, UsageError
from .journal import SessionJournal
from .protocol import Adopted, adopted, open_comms
from .runtime.calls import Adopt, CommTable
from .supervisor import ContextSupervisor, Live


class Attacher:
    """Attaches this kernel to a detached session: replays and follows its last cell, then makes its
    context, execution count, inputs and widgets this kernel's. ``journal`` is None where the backend
    cannot keep sessions (the local backend); ``attach_mode`` is the ``attach`` setting."""

    def __init__(
        self,
        sandbox: Sandbox,
        supervisor: ContextSupervisor,
        journal: SessionJournal | None,
        comms: CommBridge | None,
        attach_mode: str,
    ) -> None:
        self._sandbox = sandbox
        self._supervisor = supervisor
        self._journal = journal
        self._comms = comms
        self._attach_mode = attach_mode
        self.adopted: Adopted | None = None  # set by an attach, taken by the kernel (execution count, history)
        self._stop_following: asyncio.Event | None = None  # set by an interrupt while an attach follows a cell

    def stop_following(self) -> bool:
        """An interrupt: stop following the session's cell, if an attach does (the cell goes on)."""
        if self._stop_following is None:
            return False
        self._stop_following.set()
        return True

    async def attach(self, frontend: Frontend, args: list[str]) -> str:
        """``%daytona attach``: replay the detached session's last cell, follow it to its end, then make
        its context this kernel's (namespace, execution count, inputs). See docs/reattach.md."""
        journal = self._journal
        if journal is None:
            raise UsageError(LOCAL_ATTACH)
        live = await self._supervisor.ready(frontend.progress)
        session = await journal.pick(args, live.context.id)
        await journal.claim(session)
        frontend.emit(
            "stream",
            stderr(
                f"daytona-kernel: attaching to {session.name or 'this folder'}'s session ({session.describe()}); its last cell's output follows.\n"
            ),
        )
        self._stop_following = asyncio.Event()
        try:
            followed = await journal.follow(session, frontend, self._stop_following)
        except Interrupted:
            await journal.release(session)
            raise Interrupted(
                "Interrupted by user: stopped following the session's cell, which goes on in the sandbox. "
                "`%daytona attach` follows it again; this kernel keeps its fresh namespace."
            ) from None
        finally:
            self._stop_following = None
        if not followed:
            await journal.end(session, "its interpreter died")
            raise BackendError(
                "The session's interpreter ended while it ran detached (out of memory, or killed); its variables are gone. "
                "This kernel keeps its fresh namespace."
            )
        context = await self._sandbox.toolbox.adopt_context(session.context_id)
        old = await self._supervisor.adopt(Live(context, session.token, session.pid, session.python))
        if old is not None:
            await journal.forget(old.id)
        self.adopted = await self._supervisor.call(Adopt(instance=journal.identity.instance), adopted)
        return (
            f"attached: {self.adopted.variables} variable(s), execution count {self.adopted.count}{await self._adopt_comms()}; "
            "your next cells run in this session.\n"
        )

    async def _adopt_comms(self) -> str:
        """The attached session's widgets become this kernel's (reload the page to see them again)."""
        if self._comms is None:
            return ""
        self._comms.closed_all()
        count = self._comms.adopt(await self._supervisor.query(CommTable(), open_comms))
        if self._supervisor.live is not None:
            self._comms.runtime_is(self._supervisor.live.token)
        return f", {count} widget(s) (reload the page to see them)" if count else ""

    async def auto_attach(self, frontend: Frontend) -> None:
        """With attach='auto', attach before the first cell when a session of this notebook was found."""
        if self._journal is None or self._attach_mode != "auto":
            return
        try:
            await self._supervisor.ready(frontend.progress)
        except DaytonaKernelError:
            return  # the cell itself reports it
        if not self._journal.take_auto():
            return
        try:
            frontend.emit("stream", stderr(await self.attach(frontend, [])))
        except DaytonaKernelError as exc:
            frontend.emit("stream", stderr(f"daytona-kernel: could not attach to the previous session: {exc}\n"))

    def take_adopted(self) -> Adopted | None:
        taken, self.adopted = self.adopted, None
        return taken
