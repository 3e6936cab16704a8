"""DaytonaKernel: the Jupyter protocol adapter, and nothing else.

Requests go to the SandboxSession; its events come back here and become iopub
messages. Interrupt and shutdown arrive on the control thread and are handed
to the shell loop, where the session and its backend live.
"""

from __future__ import annotations

import asyncio
import os
import platform
import signal
import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import zmq
from ipykernel._version import kernel_protocol_version
from jupyter_client.session import Session

from . import __version__
from .cell import NOTICE_METADATA, Cell, CellOutcome, Notice, error_content, stderr
from .comms import CommBridge
from .compose import build_session, kernel_id_of
from .config import DaytonaKernelConfig
from .debugger import DebugRequests
from .dispatch import ShellDispatch
from .errors import ConfigError, DaytonaKernelError
from .history import History
from .interactive import check_complete, daytona_cell, kernel_magic_lines
from .runtime.calls import Complete, Inspect
from .session import SandboxSession

SHUTDOWN_TIMEOUT_S = 60.0
STATUS_ID_PREFIX = "daytona-kernel-status-"  # the display id of a status line (docs/status.md)
STDIN_POLL_S = 0.01


class DaytonaKernel(DaytonaKernelConfig, ShellDispatch):
    """A Python kernel whose cells run in a Daytona sandbox (or the local backend)."""

    implementation = "daytona-kernel"
    implementation_version = __version__
    language = "python"
    help_links = [
        {"text": "Python Reference", "url": "https://docs.python.org/3/"},
        {"text": "Daytona documentation", "url": "https://www.daytona.io/docs/"},
    ]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.config_problems.update(getattr(self.parent, "config_problems", {}))
        self._problems = self.validate()
        self._next_count = 1
        self._history = History()
        self._shell_loop: asyncio.AbstractEventLoop | None = None
        self._session: SandboxSession | None = None
        self._terminating: asyncio.Future[None] | None = None
        self._comms: CommBridge | None = None
        self._publisher = IopubPublisher(self)
        self.shell_handlers.update(comm_open=self._comm, comm_msg=self._comm, comm_close=self._comm)
        if not self._problems:
            try:
                self._session = build_session(self, os.getcwd(), self._kernel_id(), self.log, publisher=self._publisher)
            except DaytonaKernelError as exc:
                self._problems.append(str(exc))
        if self._session is not None:
            self._comms = self._session.comms
            self._session.debugger.publish = lambda event: self._messages.send(
                self.iopub_socket, "debug_event", event, self.get_parent(), ident=self._topic("debug_event")
            )
        self._debugging = DebugRequests(
            self._session.debugger if self._session is not None else None,
            "; ".join(self._problems),
            self._on_shell_loop,
            lambda stream, ident, parent, reply: self._messages.send(stream, "debug_reply", reply, parent, ident),
            self.log,
        )

    def _kernel_id(self) -> str:
        """The id Jupyter gave this kernel (from ``kernel-<id>.json``), for sandbox labels."""
        return kernel_id_of(getattr(self.parent, "connection_file", "") or "") or f"pid-{os.getpid()}"

    @property
    def _messages(self) -> Session:
        """The Jupyter message session (jupyter_client's ``Session``), set up by the kernel app."""
        assert self.session is not None
        return self.session

    # -- kernel_info -----------------------------------------------------

    @property
    def language_info(self) -> dict[str, Any]:  # type: ignore[override]
        version = (self._session and self._session.python_version) or platform.python_version()
        return {
            "name": "python",
            "version": version,
            "mimetype": "text/x-python",
            "codemirror_mode": {"name": "ipython", "version": 3},
            "pygments_lexer": "ipython3",
            "nbconvert_exporter": "python",
            "file_extension": ".py",
        }

    @property
    def banner(self) -> str:  # type: ignore[override]
        where = self._session.sandbox.description if self._session else "not configured"
        return f"Python (daytona-kernel {__version__}) on the {self.backend} backend: {where}\n"

    @property
    def kernel_info(self) -> dict[str, Any]:
        """The base class's reply with the debugger (in the sandbox: docs/debugger.md) and without kernel
        subshells. Built here: the base property imports debugpy to ask whether it is there, 70 ms before the first reply."""
        return {
            "protocol_version": kernel_protocol_version,
            "implementation": self.implementation,
            "implementation_version": self.implementation_version,
            "language_info": self.language_info,
            "banner": self.banner,
            "help_links": self.help_links,
            "supported_features": ["debugger"] if self._session is not None else [],
        }

    # -- comms: the bridge to the sandbox's comms (comms.py) -------------------

    async def _comm(self, stream: Any, ident: Any, parent: Any) -> None:
        """comm_open, comm_msg, comm_close from the frontend, in their turn: the idle follows the output of
        the sandbox's handler, as with ipykernel (JupyterLab's Output widget captures until then)."""
        handled = self._to_sandbox(parent)
        if handled is not None:
            await handled

    def _to_sandbox(self, parent: dict[str, Any]) -> asyncio.Future[None] | None:
        """A frontend comm message to the bridge; what resolves once the sandbox handled it."""
        if self._comms is not None:
            return self._comms.from_frontend(parent)
        if parent["header"]["msg_type"] == "comm_open":  # no sandbox: close it, as for an unknown target
            self._publisher.publish_comm("comm_close", {"comm_id": parent["content"].get("comm_id"), "data": {}}, {}, [], parent)
        return None

    async def comm_info_request(self, stream: Any, ident: Any, parent: Any) -> None:
        target_name = parent["content"].get("target_name")
        comms = self._comms.info(target_name) if self._comms is not None else {}
        self._messages.send(stream, "comm_info_reply", {"status": "ok", "comms": comms}, parent, ident)

    async def debug_request(self, stream: Any, ident: Any, parent: Any) -> None:
        self._debugging.handle(stream, ident, parent)  # replied to from a task: the control channel goes on

    # -- execution count: ipykernel's rules ------------------------------

    @property
    def execution_count(self) -> int:
        """The count the next stored cell gets; the base class's bumps are ignored."""
        return self._next_count

    @execution_count.setter
    def execution_count(self, value: int) -> None:
        pass  # like ipykernel, only do_execute moves the count, and only for stored cells

    # -- lifecycle -------------------------------------------------------

    def start(self) -> None:
        super().start()
        self._shell_loop = self.io_loop.asyncio_loop  # type: ignore[attr-defined]
        if self._session is not None:
            self._shell_loop.call_soon(self._session.start)
        for signum in (signal.SIGTERM, signal.SIGHUP):
            self._shell_loop.add_signal_handler(signum, self._on_terminate_signal, signum)

    def _on_terminate_signal(self, signum: int) -> None:
        self.log.warning("received %s: releasing the sandbox before exiting", signal.Signals(signum).name)
        if self._terminating is None:
            self._terminating = asyncio.ensure_future(self._terminate())

    async def _terminate(self) -> None:
        try:
            if self._session is not None:
                await asyncio.wait_for(self._session.shutdown(), SHUTDOWN_TIMEOUT_S)
        except (DaytonaKernelError, asyncio.TimeoutError) as exc:
            self.log.error("could not release the sandbox: %s; its auto-stop interval bounds the cost", exc)
        finally:
            self.io_loop.stop()

    async def _on_shell_loop(self, coro: Any, timeout: float | None = None) -> Any:
        """Run a coroutine on the shell loop from the control thread, and wait for it."""
        assert self._shell_loop is not None
        future = asyncio.run_coroutine_threadsafe(coro, self._shell_loop)
        return await asyncio.wait_for(asyncio.wrap_future(future), timeout)

    async def interrupt_request(self, stream: Any, ident: Any, parent: Any) -> None:
        content: dict[str, Any] = {"status": "ok"}
        if self._session is not None:
            try:
                await self._on_shell_loop(self._session.interrupt(), SHUTDOWN_TIMEOUT_S)
            except (DaytonaKernelError, asyncio.TimeoutError) as exc:
                self.log.error("interrupt failed: %s", exc)
                content = {"status": "error", "ename": type(exc).__name__, "evalue": str(exc), "traceback": []}
        self._messages.send(stream, "interrupt_reply", content, parent, ident=ident)

    async def do_shutdown(self, restart: bool) -> dict[str, Any]:
        """A restart keeps the sandbox running for the next kernel process (same kernel id, so it finds
        it again); a real shutdown releases it by policy."""
        if self._session is not None:
            try:
                await self._on_shell_loop(self._session.shutdown(restart=restart), SHUTDOWN_TIMEOUT_S)
            except (DaytonaKernelError, asyncio.TimeoutError) as exc:
                self.log.error(
                    "could not release the sandbox %s at shutdown: %s; its auto-stop interval bounds the cost",
                    self._session.sandbox.id,
                    exc,
                )
        return {"status": "ok", "restart": restart}

    # -- requests --------------------------------------------------------

    def _emit(self, msg_type: str, content: dict, parent: dict | None = None) -> None:
        """Publish on iopub. Callers in background tasks pass the request's parent, captured up front.
        A kernel notice (``cell.Notice``) carries ``NOTICE_METADATA``."""
        metadata = NOTICE_METADATA if isinstance(content, Notice) else None
        self._messages.send(
            self.iopub_socket, msg_type, content, parent or self.get_parent(), ident=self._topic(msg_type), metadata=metadata
        )

    async def do_execute(
        self,
        code: str,
        silent: bool,
        store_history: bool = True,
        user_expressions: dict[str, str] | None = None,
        allow_stdin: bool = False,
        *,
        cell_meta: dict | None = None,
        cell_id: str | None = None,
    ) -> dict[str, Any]:
        store_history = store_history and not silent  # IPython: silent forces store_history off
        if not code.strip():
            return {"status": "ok", "execution_count": self._next_count - 1, "payload": [], "user_expressions": {}}
        parent = self.get_parent()  # session callbacks may run in other tasks (provisioning, input)
        frontend = KernelFrontend(self, parent, live_status=allow_stdin and not silent)
        if self._comms is not None:
            self._comms.note_request(parent)
        try:
            if self._session is not None and not self._problems:
                await self._session.attacher.auto_attach(frontend)  # attach='auto': continue the previous session first
                self._adopt()
            count = self._next_count
            cell = Cell(code, count, silent, store_history, allow_stdin, dict(user_expressions or {}))
            outcome = await self._outcome(cell, frontend)
        except Exception as exc:  # the last resort: a bug below must still end in a reply, with the error shown
            self.log.exception("daytona-kernel failed while running a cell")
            count = self._next_count
            content = error_content(
                type(exc).__name__,
                f"{exc} (an unexpected error in daytona-kernel; the kernel log has the traceback, and the kernel "
                "keeps running: run the cell again, or restart the kernel if it happens again)",
            )
            frontend.emit("error", content)
            outcome = CellOutcome(error=content)
        frontend.end_status()  # a status line never outlives its request
        if store_history:
            self._next_count += 1
            self._history.store(count, code, frontend.last_result)
        reply: dict[str, Any] = {"execution_count": self._next_count - 1, "payload": outcome.payload}
        if outcome.error is not None:
            reply.update(status="error", **outcome.error)
        else:
            reply.update(status="ok", user_expressions=outcome.user_expressions)
        self._adopt()  # after %daytona attach: the next cell goes on from the session's count
        return reply

    async def _outcome(self, cell: Cell, frontend: KernelFrontend) -> CellOutcome:
        """Run one cell where it belongs: a configuration problem, the kernel's magics, a map cell, or the sandbox."""
        if self._problems:
            content = error_content(ConfigError.ename, "\n".join(self._problems))
            frontend.emit("error", content)
            return CellOutcome(error=content)
        assert self._session is not None
        magics = kernel_magic_lines(cell.code)
        if magics:
            return CellOutcome(error=await self._session.kernel_magics(magics, frontend))
        mapped = daytona_cell(cell.code)
        if mapped is not None:
            return await self._session.fan_out(
                mapped[0], mapped[1], replace(cell, code=mapped[1], allow_stdin=False, user_expressions={}), frontend
            )
        return await self._session.execute(cell, frontend)

    def _adopt(self) -> None:
        """After an attach: go on from the attached session's execution count, with its inputs in the history."""
        adopted = self._session.attacher.take_adopted() if self._session is not None else None
        if adopted is None:
            return
        self._history.prepend(adopted.inputs)
        self._next_count = max(self._next_count, adopted.count + 1)

    async def do_complete(self, code: str, cursor_pos: int | None) -> dict[str, Any]:
        cursor_pos = len(code) if cursor_pos is None else cursor_pos
        reply = None
        if self._session is not None:
            reply = await self._session.query(Complete(code=code, cursor=cursor_pos))
        return {
            "status": "ok",
            "matches": [],
            "cursor_start": cursor_pos,
            "cursor_end": cursor_pos,
            "metadata": {},
            **(reply or {}),
        }

    async def do_inspect(
        self, code: str, cursor_pos: int | None, detail_level: int = 0, omit_sections: Any = ()
    ) -> dict[str, Any]:
        cursor_pos = len(code) if cursor_pos is None else cursor_pos
        reply = None
        if self._session is not None:
            reply = await self._session.query(Inspect(code=code, cursor=cursor_pos, detail_level=detail_level))
        return {"status": "ok", "found": False, "data": {}, "metadata": {}, **(reply or {})}

    async def do_is_complete(self, code: str) -> dict[str, Any]:
        return check_complete(code)

    async def do_history(
        self,
        hist_access_type: str,
        output: bool,
        raw: bool,
        session: int | None = None,
        start: int | None = None,
        stop: int | None = None,
        n: int | None = None,
        pattern: str | None = None,
        unique: bool = False,
        **kwargs: Any,
    ) -> dict[str, Any]:
        entries = self._history.query(
            hist_access_type, output=output, session=session, start=start, stop=stop, n=n, pattern=pattern, unique=unique
        )
        return {"status": "ok", "history": entries}


class IopubPublisher:
    """The comm bridge's ``Publisher``: comm messages, and the output of the sandbox's widget callbacks, on iopub."""

    def __init__(self, kernel: DaytonaKernel) -> None:
        self._kernel = kernel

    def publish_comm(
        self, msg_type: str, content: dict[str, Any], metadata: dict[str, Any], buffers: Sequence[bytes], parent: dict[str, Any]
    ) -> None:
        topic = f"comm-{content.get('comm_id')}".encode()
        kernel = self._kernel
        kernel._messages.send(
            kernel.iopub_socket, msg_type, content, parent, ident=topic, metadata=metadata, buffers=list(buffers)
        )

    def publish_output(self, msg_type: str, content: dict[str, Any], parent: dict[str, Any]) -> None:
        self._kernel._emit(msg_type, content, parent)


class KernelFrontend:
    """The session's Frontend for one execute request: iopub output under the request's
    parent, a transient status line while the cell waits, and input() through the stdin channel.

    Every output is published once (docs/status.md has the design and its table of clients):

    - The status line is a ``display_data`` with a ``transient`` display id, updated in place,
      shown only at the top of a cell's output area: before the request's first output, and
      only to a client that can answer input (``allow_stdin``); a headless client (nbclient,
      papermill) asks without and gets none.
    - It goes with a ``clear_output``: ``wait=True`` right before the first output (which takes
      its place in one step), else at once when it ends. Nothing else is ever cleared, so nothing
      is shown again, and a saved notebook keeps no trace of it.
    - A notice (``notice``) is an ordinary stderr output, once per request."""

    def __init__(self, kernel: DaytonaKernel, parent: dict[str, Any], live_status: bool = True) -> None:
        self._kernel = kernel
        self._parent = parent
        self._live_status = live_status
        self._status_id = ""
        self._output_shown = False
        self._noticed: set[str] = set()
        self.last_result: str | None = None  # the text of the last execute_result, for history

    def _publish(self, msg_type: str, content: dict[str, Any]) -> None:
        self._kernel._emit(msg_type, content, self._parent)

    def emit(self, msg_type: str, content: dict[str, Any]) -> None:
        if msg_type == "execute_result":
            self.last_result = content["data"].get("text/plain", "")
        if msg_type != "update_display_data":  # an update changes an output shown before; it adds none here
            if self._status_id:
                self._status_id = ""
                self._publish("clear_output", {"wait": True})  # the status line, replaced by this output
            self._output_shown = True
        self._publish(msg_type, content)

    def notice(self, text: str) -> None:
        if text and text not in self._noticed:
            self._noticed.add(text)
            self.emit("stream", stderr(text))

    def progress(self, text: str) -> None:
        """One output, updated in place, gone when it ends (see the class docstring)."""
        if not text:
            self.end_status()
            return
        if self._output_shown or not self._live_status:
            return  # below an output it could not go again without clearing that output too
        shown = bool(self._status_id)
        if not shown:
            self._status_id = f"{STATUS_ID_PREFIX}{uuid.uuid4().hex}"
        content = {"data": {"text/plain": f"⏳ {text}"}, "metadata": {}, "transient": {"display_id": self._status_id}}
        self._publish("update_display_data" if shown else "display_data", content)

    def end_status(self) -> None:
        """Take the status line away, if it is shown (the request's end calls this too)."""
        if self._status_id:
            self._status_id = ""
            self._publish("clear_output", {"wait": False})

    async def ask(self, prompt: str, password: bool) -> str:
        """input() in the sandbox: an input_request on the stdin channel, answered without blocking the loop."""
        kernel = self._kernel
        parent = kernel.get_parent("shell")
        ident = kernel._get_shell_context_var(kernel._shell_parent_ident)
        while True:  # drop stale replies, as ipykernel does
            try:
                kernel.stdin_socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
        kernel._messages.send(kernel.stdin_socket, "input_request", {"prompt": prompt, "password": password}, parent, ident=ident)
        while True:
            _, reply = kernel._messages.recv(kernel.stdin_socket, zmq.NOBLOCK)
            if reply is not None:
                return str(reply["content"].get("value", ""))
            await asyncio.sleep(STDIN_POLL_S)
