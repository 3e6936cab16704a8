"""The debugger's kernel side: Jupyter's debug protocol across the sandbox boundary (docs/debugger.md).

A ``debug_request`` (control channel) carries one DAP request. It goes into the sandbox the way
frontend comm messages go (``delivery.py``): while a cell runs (stopped at a breakpoint, most often) as a
file uploaded to the cell's inbox, else in a short ``Debug`` call of its own. The sandbox's debugger
(``runtime/debug.py``, ipykernel's ``Debugger`` on debugpy) answers with ``debug`` frames, checked by
``protocol.py`` like every frame: a response names the kernel's number for the request it answers, and
becomes the ``debug_reply``; an event becomes a ``debug_event`` on iopub. The kernel opens no file and no
socket for any of it: a ``source`` request is answered from the sandbox's files, and what the frontend
renders (``richInspectVariables``' MIME bundle) passes the output policy.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import logging
from typing import Any, Awaitable, Callable, Coroutine

from . import ipython_bundle
from .context_client import ContextClient
from .errors import DaytonaKernelError
from .protocol import DebugMessage
from .request import Request, fetcher
from .runtime import call_source
from .runtime.calls import Debug
from .supervisor import Live

REPLY_TIMEOUT_S = 60.0  # a request the sandbox does not answer in this time gets a failed reply
FETCH_EVERY_S = 0.05  # after a cell ended, how often the kernel fetches replies the sandbox held
MAX_COMMAND_CHARS = 100
SHIP_TIMEOUT_S = 60.0  # unpacking debugpy (about 1 MB, 250 files) in the sandbox

EventSink = Callable[[dict[str, Any]], Any]
OnShellLoop = Callable[[Coroutine[Any, Any, Any]], Awaitable[Any]]
SendReply = Callable[[Any, Any, dict[str, Any], dict[str, Any]], Any]  # stream, ident, parent, reply content


def failed(request: dict[str, Any], message: str) -> dict[str, Any]:
    """A DAP response that says ``message``, as debugpy words a failure."""
    seq = request.get("seq", 0)
    return {
        "type": "response",
        "seq": seq,
        "request_seq": seq,
        "success": False,
        "command": request.get("command", ""),
        "message": message,
    }


class DebugRelay:
    """See the module docstring. ``publish`` sends a ``debug_event`` (the kernel sets it)."""

    def __init__(self, client: ContextClient) -> None:
        """``client``: the calls into the context, shared with the comm bridge's delivery."""
        self._client = client
        self._log = client.log
        self._pending: dict[int, tuple[asyncio.Future[dict[str, Any]], str]] = {}  # the kernel's number -> reply, command
        self._next_id = 0
        self._upload_seq = 0
        self._started_on = ""  # the runtime (its token) whose debugger answered initialize
        self._debugpy: str | None = None  # the kernel's debugpy version, to ship to a sandbox without one ("": none)
        self.publish: EventSink | None = None

    def started_on(self, live: Live) -> bool:
        """Whether the debugger traces ``live``'s interpreter (it answered initialize, and no disconnect since)."""
        return bool(self._started_on) and self._started_on == live.token

    # -- from the sandbox ------------------------------------------------------

    def receive(self, event: DebugMessage) -> None:
        """A checked DAP message from the sandbox (``Request``): a reply to one of ours, or an event."""
        if event.answers is None:
            if self.publish is not None:
                self.publish(event.message)
            return
        pending = self._pending.get(event.answers)
        if pending is None or pending[0].done():
            self._log.warning("the sandbox's debugger answered request %d, which is not waiting; dropped", event.answers)
            return
        self._pending.pop(event.answers)
        pending[0].set_result(self._cleaned(pending[1], event.message))

    def _cleaned(self, command: str, reply: dict[str, Any]) -> dict[str, Any]:
        """What the frontend renders as HTML passes the output policy: richInspectVariables' bundle."""
        body = reply.get("body")
        if command != "richInspectVariables" or not isinstance(body, dict):
            return reply
        shown = self._client.outputs.content("display_data", {"data": body.get("data", {}), "metadata": body.get("metadata", {})})
        return dict(reply, body={"data": shown.get("data", {}), "metadata": shown.get("metadata", {})})

    # -- from the frontend -----------------------------------------------------

    async def request(self, message: Any) -> dict[str, Any]:
        """One debug_request's content (a DAP request) to its debug_reply's content."""
        if (
            not isinstance(message, dict)
            or not isinstance(message.get("command"), str)
            or len(message["command"]) > MAX_COMMAND_CHARS
        ):
            return failed(message if isinstance(message, dict) else {}, "a debug request needs a DAP command")
        try:
            live = await self._client.supervisor.ready()
        except DaytonaKernelError as exc:
            return failed(message, f"the sandbox is not available: {exc}")
        reply = await self._relay(live, message)
        folder = (reply.get("body") or {}).get("shipDebugpy") if message["command"] == "initialize" else None
        if not isinstance(folder, str) or reply.get("success") is not False:
            return reply
        problem = await self._ship(live, folder)  # a sandbox without debugpy (Daytona's default image): then ask again
        return (
            await self._relay(live, message)
            if not problem
            else failed(message, f"debugpy could not be installed in the sandbox: {problem}")
        )

    async def _relay(self, live: Live, message: dict[str, Any]) -> dict[str, Any]:
        self._next_id += 1
        ident = self._next_id
        reply: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[ident] = (reply, message["command"])
        try:
            item = {"id": ident, "message": message, "debugpy": self._shippable()}
            return await asyncio.wait_for(self._exchange(live, item, reply), REPLY_TIMEOUT_S)
        except asyncio.TimeoutError:
            return failed(message, f"the sandbox's debugger did not answer in {REPLY_TIMEOUT_S:g} s")
        except DaytonaKernelError as exc:
            return failed(message, f"the request could not reach the sandbox: {exc}")
        finally:
            self._pending.pop(ident, None)

    def _shippable(self) -> str:
        if self._debugpy is None:
            try:
                self._debugpy = importlib.metadata.version("debugpy")
            except importlib.metadata.PackageNotFoundError:
                self._debugpy = ""
        return self._debugpy

    async def _ship(self, live: Live, folder: str) -> str:
        """The kernel's pure-Python debugpy into the sandbox's ``folder`` (the one its debugger named): "" or why not."""
        if not ipython_bundle.supports(live.python, ipython_bundle.DEBUGPY):
            return f"the kernel's debugpy does not run on the sandbox's Python {live.python}"
        async with self._client.inflight.lock:
            reason, size = await ipython_bundle.ship(
                self._client.sandbox, live.context, live.python, folder, SHIP_TIMEOUT_S, ipython_bundle.DEBUGPY
            )
        if not reason:
            self._log.info("debugpy %s shipped to the sandbox: %.1f MB", self._shippable(), size / 1e6)
        return reason

    async def _exchange(self, live: Live, item: dict[str, Any], reply: asyncio.Future[dict[str, Any]]) -> dict[str, Any]:
        uploaded = await self._send(live, item)
        if not uploaded and not reply.done():  # the call answers what it carries: a reply that did not come never will
            return failed(item["message"], "the sandbox's debugger sent no usable reply (the kernel log says why)")
        while not reply.done():
            await asyncio.wait({reply}, timeout=FETCH_EVERY_S)
            if reply.done() or not uploaded or not self._client.idle:
                continue
            await self._call(live, [])  # the cell ended first: its reply waits in the sandbox
        answer = reply.result()
        if item["message"]["command"] == "initialize" and answer.get("success"):
            self._started_on = live.token
        elif item["message"]["command"] == "disconnect":
            self._started_on = ""
        return answer

    async def _send(self, live: Live, item: dict[str, Any]) -> bool:
        """Into the sandbox: True when uploaded to a running cell's inbox, False when sent in a call."""
        inbox = await self._client.cell_inbox(lambda: self._started_on == live.token)
        if inbox is not None:
            self._upload_seq += 1
            await self._client.upload(inbox, f"debug-{self._upload_seq}.json", json.dumps([item]).encode())
            return True
        await self._call(live, [item])
        return False

    async def _call(self, live: Live, items: list[dict[str, Any]]) -> None:
        """One ``Debug`` call while no cell runs: its frames (replies, held events) come to ``receive``."""
        client = self._client
        async with client.inflight.lock:
            request = Request(live.token, self._output, None, client.outputs, None, None, fetcher(client.sandbox), self.receive)
            error = await client.call(live, call_source(Debug(requests=items)), request)
        if error is not None:
            self._log.warning("the debug call failed in the sandbox: %s: %s", error.name, error.value)

    def _output(self, msg_type: str, content: dict[str, Any]) -> None:
        """Output of a ``Debug`` call (a protocol error, a stray print): logged, bounded."""
        self._log.warning("output of a debug call: %s %.200r", msg_type, content)


class DebugRequests:
    """The kernel's ``debug_request`` handler (on the control thread): the reply is sent from a task of the
    control loop once the sandbox has answered, so an interrupt or a shutdown never queues behind a request
    to a debugger stopped in a cell. The relay runs on the shell loop, where the session lives."""

    def __init__(
        self, relay: DebugRelay | None, unavailable: str, on_shell_loop: OnShellLoop, send: SendReply, log: logging.Logger
    ) -> None:
        self._relay = relay
        self._unavailable = unavailable  # why there is no session (the kernel's configuration problems)
        self._on_shell_loop = on_shell_loop
        self._send = send
        self._log = log
        self._replies: set[asyncio.Future[None]] = set()

    def handle(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        task = asyncio.ensure_future(self._reply(stream, ident, parent))
        self._replies.add(task)
        task.add_done_callback(self._replies.discard)

    async def _reply(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        content = parent.get("content")
        request = content if isinstance(content, dict) else {}
        if self._relay is None:
            reply = failed(request, f"the kernel is not configured: {self._unavailable}")
        else:
            try:
                reply = await self._on_shell_loop(self._relay.request(content))
            except Exception as exc:  # the last resort: the frontend still gets its reply, and the kernel log the cause
                self._log.exception("daytona-kernel failed while relaying a debug request")
                reply = failed(request, f"daytona-kernel failed: {exc!r}")
        self._send(stream, ident, parent, reply)
