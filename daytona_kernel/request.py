"""One request in flight: decodes its output stream and collects what it reports.

Text becomes stream output; frames become typed events (``protocol``); a frame
that does not fit becomes the request's error. A frame whose large strings wait
in a file in the sandbox (framing's ``split_blobs``) is fetched with one download
while later output waits behind it, so everything is shown in the order it was made. Everything shown passes the
output policy and the cell's output budget (``outputs``). Nothing the sandbox prints can
raise out of here, so a hostile frame never cuts a run short (which would leave
the rest of its output to show up in the next cell).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from .backends.base import Context, OutputCallback, RunError, Sandbox
from .cell import Frontend, error_content, stderr, stdout
from .comms import WIDGET_VIEW
from .errors import BackendError, DaytonaKernelError, ProtocolError
from .outputs import OutputBudget, OutputPolicy
from .protocol import (
    CellError,
    CommAck,
    CommMessage,
    DebugMessage,
    FileChanges,
    Hello,
    InputRequest,
    Output,
    ParentSwitch,
    Payload,
    Reply,
    UserExpressions,
    decode_event,
)
from .runtime.framing import BadFrame, Frame, FrameDecoder, Text, join_blobs

if TYPE_CHECKING:
    from .comms import CommBridge

RUNTIME_CALL_TIMEOUT_S = 30.0  # a bootstrap or a runtime call (complete, inspect ...); user code runs for run_timeout
EmitCallback = Callable[[str, dict[str, Any]], None]
Fetch = Callable[[str, int], Awaitable[bytes]]  # a sandbox file, and the most bytes to take of it
log = logging.getLogger("daytona_kernel.request")


class Request:
    """See the module docstring. ``emit`` shows output; ``on_input`` handles input() requests.
    ``policy`` cleans what is shown (default: the safe policy); ``budget`` caps its size; ``comms``
    publishes comm messages and the output of frontend messages the sandbox handled (none: comm
    frames are dropped, and widgets show their text); ``fetch`` downloads a file from the sandbox (without
    it, a frame whose large strings wait in one is an error); ``debug`` takes the debugger's messages (debugger.py)."""

    def __init__(
        self,
        token: str,
        emit: EmitCallback,
        on_input: Callable[[InputRequest], None] | None = None,
        policy: OutputPolicy | None = None,
        budget: OutputBudget | None = None,
        comms: CommBridge | None = None,
        fetch: Fetch | None = None,
        debug: Callable[[DebugMessage], None] | None = None,
    ) -> None:
        self._decoder = FrameDecoder(token)
        self._debug = debug
        self._comms = comms
        self._under: dict[str, Any] | None = None  # the frontend message whose handling produces the output
        self._clearing: bool | None = None  # the last output was a clear (its wait), so a run of clears merges
        self._emit_now = emit
        self._on_input = on_input
        self._policy = policy or OutputPolicy(trusted=False)
        self._budget = budget or OutputBudget(0)
        self._fetch = fetch
        self._held: list[tuple[Callable[[Any], None], Any]] | None = None  # output waiting behind a fetch
        self._fetching: asyncio.Future[None] | None = None
        self.error: dict[str, Any] | None = None
        self.error_shown = False  # the error output was already emitted, in its place among the outputs
        self._error_pending = False  # the error is emitted before the next output, if one follows
        self.hello: Hello | None = None
        self.reply: dict[str, Any] | None = None
        self.files: FileChanges | None = None
        self.on_partial_files: Callable[[FileChanges], None] | None = None  # a running cell's files so far
        self.user_expressions: dict[str, Any] = {}
        self.payload: list[dict[str, Any]] = []
        self.done = asyncio.Event()
        self.interrupted = False
        self.restarted_by_watchdog = False

    def on_stdout(self, text: str) -> None:
        for event in self._decoder.feed(text):
            self._in_order(self._handle, event)

    def on_stderr(self, text: str) -> None:
        self._in_order(self._stream, {"name": "stderr", "text": text})  # the cell's own stderr, not a notice

    async def settle(self) -> None:
        """Wait until the large strings of every frame so far are fetched and shown."""
        while self._fetching is not None:
            await self._fetching

    def finish(self) -> None:
        """The run is over: release what the decoder held back, then say what was removed
        or dropped (each notice once). Safe to call twice. Output still waiting for a
        fetch (``settle`` was not awaited: the run failed) is shown without it."""
        if self._fetching is not None:
            self._fetching.cancel()
            self._release(BadFrame("the run ended before the file of its large strings was fetched from the sandbox"))
        for event in self._decoder.flush():
            self._in_order(self._handle, event)
        for notice in (self._policy.take_notice(), self._budget.take_notice()):
            if notice:
                self._emit("stream", stderr(notice))
        self.done.set()

    def _stream(self, content: dict[str, Any]) -> None:
        text = self._budget.text(content["text"])
        if text:
            self._emit("stream", dict(content, text=text))

    def _emit(self, msg_type: str, content: dict[str, Any]) -> None:
        """Emit an output; the sandbox's error, if one is pending, goes first, in its place.
        While the sandbox handles a frontend message, its output goes under that message."""
        self._clearing = content.get("wait") is True if msg_type == "clear_output" else None
        if self._under is not None and self._comms is not None:
            self._comms.output(msg_type, content, self._under)
            return
        if self._error_pending:
            self._error_pending = False
            self.error_shown = True
            if self.error is not None:
                self._emit_now("error", self.error)
        self._emit_now(msg_type, content)

    def fail(self, content: dict[str, Any], overrides: bool = False, in_place: bool = False) -> None:
        """Record the request's error. A cell shows one error output, at the end, or
        (``in_place``: the sandbox's own error) just before any output that follows it,
        such as the cell's figures, as with ipykernel. A later error is shown as text
        unless it ``overrides``."""
        if self.error is None or overrides:
            self.error = content
            self._error_pending = in_place
        else:
            self._emit("stream", stderr(f"{content['ename']}: {content['evalue']}\n"))

    def _in_order(self, handle: Callable[[Any], None], item: Any) -> None:
        if self._held is not None:
            self._held.append((handle, item))
        else:
            handle(item)

    def _handle(self, event: Text | Frame | BadFrame) -> None:
        if isinstance(event, Text):
            self._stream(stdout(event.text))
            return
        if isinstance(event, Frame) and event.blobs is not None and self._fetch is not None:
            self._held = []
            self._fetching = asyncio.ensure_future(self._fetch_blobs(event))
            return
        try:
            if isinstance(event, BadFrame):
                raise ProtocolError(event.reason)
            if isinstance(event, Frame) and event.blobs is not None:
                raise ProtocolError("a frame's large strings wait in a file, and this request cannot fetch files")
            self._apply(decode_event(event))
        except ProtocolError as exc:
            self.fail(
                error_content(
                    exc.ename,
                    f"The sandbox sent output the kernel could not use: {exc}. It was dropped; the cell's other output is shown.",
                )
            )

    async def _fetch_blobs(self, frame: Frame) -> None:
        """Download the file of ``frame``'s large strings, show the frame, then the output that waited for it."""
        assert frame.blobs is not None and self._fetch is not None
        event: Frame | BadFrame
        try:
            data = await self._fetch(frame.blobs.path, sum(size for _, size in frame.blobs.sizes))
            event = Frame(frame.kind, join_blobs(frame.payload, frame.blobs, data))
        except Exception as exc:  # whatever went wrong, the cell's other output is still shown
            log.warning("could not fetch %s from the sandbox: %r", frame.blobs.path, exc)
            event = BadFrame(f"the file of its large strings could not be fetched from the sandbox ({exc})")
        self._release(event)

    def _release(self, event: Frame | BadFrame) -> None:
        """The fetch is over: show its frame, then the output that waited (which may wait for the next fetch)."""
        held, self._held, self._fetching = self._held or [], None, None
        self._handle(event)
        for handle, item in held:
            self._in_order(handle, item)

    def _apply(self, event: Any) -> None:
        if isinstance(event, Output):
            if self._merged(event) or not self._policy.displays.shown(event.msg_type, event.content):
                return
            if self._budget.fits(event.content):  # before cleaning: what is dropped costs no cleaning
                self._emit(event.msg_type, self._shown(event.msg_type, event.content))
        elif isinstance(event, CellError) and event.reply_only:
            if self.error is None:  # already on stderr: the reply says error, no error output
                self.error, self.error_shown = event.content, True
        elif isinstance(event, CellError):
            if self._under is not None:  # a widget callback's error is not the cell's
                self._emit("error", event.content)
            else:
                self.fail(event.content, in_place=True)
        elif isinstance(event, (CommMessage, ParentSwitch, CommAck)):
            self._comm(event)
        elif isinstance(event, Payload):
            item = self._policy.payload(event.item)
            if item is not None:
                self.payload.append(item)
        elif isinstance(event, InputRequest):
            if self._on_input is None:
                raise ProtocolError("an input request arrived, but this request does not take input")
            self._on_input(event)
        elif isinstance(event, FileChanges):
            if not event.partial:
                self.files = event
            elif self.on_partial_files is not None:  # a running cell's files so far: copied while it runs
                self.on_partial_files(event)
        elif isinstance(event, UserExpressions):
            self.user_expressions = self._policy.user_expressions(event.values)
        elif isinstance(event, Reply):
            self.reply = event.value
        elif isinstance(event, Hello):
            self.hello = event
        elif isinstance(event, DebugMessage):
            if self._debug is None:
                raise ProtocolError("a debugger message arrived, but this request does not take them")
            self._debug(event)

    def _merged(self, event: Output) -> bool:
        """Is this clear_output part of a run of clears that already did what it would do? After a clear
        that cleared at once, or a waiting clear followed by another waiting one, it changes nothing."""
        if event.msg_type != "clear_output":
            return False
        return self._clearing is not None and (self._clearing is False or event.content["wait"] is True)

    def _shown(self, msg_type: str, content: dict[str, Any]) -> dict[str, Any]:
        """An output cleaned by the policy. A widget view stays only for a widget the frontend has
        (the comm bridge opened it, the widget policy let it through); otherwise its text shows."""
        data = content.get("data")
        if not isinstance(data, dict) or WIDGET_VIEW not in data:
            return self._policy.content(msg_type, content)
        data = dict(data)
        view = data.pop(WIDGET_VIEW)
        cleaned = self._policy.content(msg_type, dict(content, data=data))
        if self._comms is not None and self._comms.shows(view):
            cleaned["data"] = dict(cleaned["data"], **{WIDGET_VIEW: view})
        return cleaned

    def _comm(self, event: CommMessage | ParentSwitch | CommAck) -> None:
        if self._comms is None:  # a session without the bridge (doctor): widgets show their text
            return
        if isinstance(event, ParentSwitch):
            if self._under is not None:  # the sandbox is done with that message
                self._comms.handled([str(self._under.get("header", {}).get("msg_id", ""))])
            self._under = self._comms.parent_for(event.msg_id) if event.msg_id else None
            self._clearing = None  # another output area
        elif isinstance(event, CommMessage):
            self._comms.from_sandbox(event, self._under, self._budget)
        else:
            self._comms.ack(event)


async def run_in(
    context: Context,
    code: str,
    request: Request,
    timeout: float | None,
    *,
    heard: Callable[[OutputCallback], OutputCallback] | None = None,
    finish: bool = True,
) -> RunError | None:
    """The one way code runs in a context: its stdout and stderr are read by ``request`` (through ``heard``, which
    tells the interrupt's watchdog that the run is alive), for at most ``timeout`` seconds (``RUNTIME_CALL_TIMEOUT_S``
    for the runtime's own calls, ``SessionSettings.run_timeout`` where user code runs). Then ``request.finish()``,
    whatever happened, unless ``finish`` is False: a cell's run, whose large strings are fetched (``settle``)
    before it finishes. A worker the daemon replaced is run again by ``ContextSupervisor.run_installed``."""
    on_stdout: OutputCallback = request.on_stdout
    on_stderr: OutputCallback = request.on_stderr
    if heard is not None:
        on_stdout, on_stderr = heard(on_stdout), heard(on_stderr)
    try:
        return await context.run_code(code, on_stdout, on_stderr, timeout)
    finally:
        if finish:
            request.finish()


def fetcher(sandbox: Sandbox) -> Fetch:
    """A Request's ``fetch``: one file from ``sandbox`` (a cell's large output strings), or BackendError.
    The download stops at ``limit`` bytes (what the frame announced): the sandbox decides what the file
    holds, so the kernel never takes more of it than the frame said."""

    async def fetch(path: str, limit: int) -> bytes:
        got = (await sandbox.toolbox.download([path], limits={path: limit})).get(path)
        if not isinstance(got, bytes):
            raise BackendError(f"could not download {path}: {got.message if got is not None else 'no answer'}")
        return got

    return fetch


@dataclass
class InFlight:
    """What runs in the interpreter context now, shared by the session's parts (the cell's run, the
    interrupt, widget delivery): one call at a time (a cell, or a comm delivery), the request whose output
    is being read, and while a cell runs, the inbox its frontend comm messages go to."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    request: Request | None = None
    in_cell: bool = False  # a cell's request is under way (frontend comm messages then go to its inbox)
    cell_inbox: str | None = None


class InputBridge:
    """input() in the sandbox: ask the frontend, then write the answer where the runtime waits for it."""

    def __init__(self, sandbox: Sandbox, frontend: Frontend, log: logging.Logger) -> None:
        self._sandbox = sandbox
        self._frontend = frontend
        self._log = log
        self._answers: list[asyncio.Future[None]] = []

    def request(self, event: InputRequest) -> None:
        self._answers.append(asyncio.ensure_future(self._answer(event)))

    def cancel(self) -> None:
        """The run is over: stop waiting for answers nobody needs any more."""
        for answer in self._answers:
            answer.cancel()
        self._answers.clear()

    async def _answer(self, event: InputRequest) -> None:
        value = await self._frontend.ask(event.prompt, event.password)
        try:
            await self._sandbox.toolbox.upload([(json.dumps({"value": value}).encode(), event.path)])
        except DaytonaKernelError as exc:
            self._log.warning("could not pass the input to the sandbox: %s", exc)
            self._frontend.emit("stream", stderr(f"Could not pass your input to the sandbox: {exc}. Interrupt the cell.\n"))
