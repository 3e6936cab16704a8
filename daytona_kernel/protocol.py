"""The wire protocol, typed: every frame the runtime sends becomes one small event.

Frames come out of the sandbox, which may be hostile (see the security model),
so each one is checked here against its schema before the kernel uses it. A
frame that does not fit raises ``ProtocolError``; the session turns that into
the cell's error, so a bad frame never crashes the kernel or loses a reply.

To add a frame kind: name it in ``runtime.framing.Kind``, send it from the
runtime, add an event class and its parser here, and handle the event in
``daytona_kernel.request.Request``.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from .errors import ProtocolError
from .runtime.framing import Frame, Kind

# The iopub message type each output frame kind becomes: from here on, output is named as Jupyter names it
# (the session's Frontend.emit, the output policy, the kernel's iopub), plus "stream" and "error".
IOPUB_TYPES = {
    Kind.DISPLAY: "display_data",
    Kind.UPDATE: "update_display_data",
    Kind.CLEAR: "clear_output",
    Kind.RESULT: "execute_result",
}
MAX_DEPTH = 100  # nesting of lists and dicts in one payload
MAX_COMM_BUFFER_BYTES = 16 * 1024 * 1024  # a comm message's binary buffers, together
COMM_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
MAX_NAME_CHARS = 200  # a comm target's name, a message id
MAX_COUNT = 10**9  # an execution count or a number of variables from the journal, which a cell can write


@dataclass(frozen=True)
class Hello:
    """The runtime is installed in a fresh context."""

    pid: int
    python: str
    ipython: str = ""  # the IPython version the cells run on; "" for the basic shell
    ipython_cache: str = ""  # where the kernel may put its own IPython for this Python; "" if it should not
    journal: dict[str, Any] = field(default_factory=dict)  # the other sessions in the sandbox (attach.Detached.parse)


@dataclass(frozen=True)
class Output:
    """Something to show: ``msg_type`` is its iopub message type (display_data, update_display_data,
    clear_output or execute_result; ``IOPUB_TYPES`` of its frame kind); ``content`` is the iopub content."""

    msg_type: str
    content: dict[str, Any]


@dataclass(frozen=True)
class CellError:
    """The cell raised: ``content`` has ename, evalue, traceback. ``reply_only``: the sandbox already
    showed it on stderr (a UsageError, as ipykernel shows one); it goes into the reply, not the outputs."""

    content: dict[str, Any]
    reply_only: bool = False


@dataclass(frozen=True)
class UserExpressions:
    values: dict[str, Any]


@dataclass(frozen=True)
class Payload:
    """One execute_reply payload item (page, set_next_input, ask_exit)."""

    item: dict[str, Any]


@dataclass(frozen=True)
class InputRequest:
    """input() waits for an answer, which the kernel writes to ``path`` in the sandbox."""

    prompt: str
    password: bool
    path: str


@dataclass(frozen=True)
class FileChanges:
    """Files the cell changed in the working directory: path -> (size, mtime_ns, permission bits)."""

    changed: dict[str, tuple[int, ...]] = field(default_factory=dict)
    deleted: list[str] = field(default_factory=list)
    truncated: bool = False
    partial: bool = False  # sent while the cell runs (new and changed files so far); the one at its end is complete


@dataclass(frozen=True)
class Reply:
    """The answer to a runtime call, as it came: ``ContextSupervisor.call`` hands it to the call's reply
    parser below (``checkpointed``, ``completion``, ``adopted`` ...), so no caller reads it as a dict."""

    value: dict[str, Any]


@dataclass(frozen=True)
class CommMessage:
    """A comm message from the sandbox: ``msg_type`` is comm_open, comm_msg or comm_close; ``content``
    has comm_id and data (and target_name for an open), as the iopub message will."""

    msg_type: str
    content: dict[str, Any]
    metadata: dict[str, Any] = field(default_factory=dict)
    buffers: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class ParentSwitch:
    """The output that follows belongs to the frontend message ``msg_id`` ("": to the request itself)."""

    msg_id: str


@dataclass(frozen=True)
class CommAck:
    """The runtime took the frontend's messages up to inbox batch ``seq``; ``more``: a background
    thread may still publish, so the kernel keeps draining."""

    seq: int
    more: bool = False


@dataclass(frozen=True)
class DebugMessage:
    """A DAP message from the sandbox's debugger (docs/debugger.md): a ``response`` to the kernel's request
    ``answers`` (the kernel's own number for it), or an ``event`` (``answers`` None). Checked here; never acted on."""

    message: dict[str, Any]
    answers: int | None = None


Event = (
    Hello
    | Output
    | CellError
    | UserExpressions
    | Payload
    | InputRequest
    | FileChanges
    | Reply
    | CommMessage
    | ParentSwitch
    | CommAck
    | DebugMessage
)


def decode_event(frame: Frame) -> Event:
    """The typed event for one decoded frame. Raises ProtocolError when it does not fit its schema."""
    parse = _PARSERS.get(frame.kind) if isinstance(frame.kind, str) else None
    if parse is None:
        raise ProtocolError(f"a frame of unknown kind {str(frame.kind)[:40]!r}")
    _check_depth(frame.payload, frame.kind)
    return parse(_dict(frame.payload, frame.kind))


def file_changes(payload: Any) -> FileChanges:
    """The file changes in a runtime reply (``file_changes``), checked like a ``files`` frame."""
    _check_depth(payload, Kind.FILES)
    return _files(_dict(payload, "the file_changes reply"))


# -- typed replies to calls (runtime.calls) ---------------------------------------


@dataclass(frozen=True)
class Checkpointed:
    """The reply to ``Checkpoint``: the variables saved and skipped, the pickler, the file's size in bytes."""

    saved: list[str]
    skipped: list[str]
    pickler: str
    size: int


@dataclass(frozen=True)
class Restored:
    """The reply to ``Restore``: the variables that came back and those that did not."""

    restored: list[str]
    failed: list[str]


@dataclass(frozen=True)
class VolumeSynced:
    """The reply to ``SyncVolume``: whether the volume's copy was complete in time."""

    done: bool


@dataclass(frozen=True)
class FanoutDone:
    """The reply to ``Scatter``, ``Dump`` and ``Gather``: what went wrong ("" when nothing did)."""

    error: str


def checkpointed(value: Any) -> Checkpointed:
    p = _dict(value, "the checkpoint reply")
    return Checkpointed(
        _names(p.get("saved", []), "saved"),
        _names(p.get("skipped", []), "skipped"),
        _str(p.get("pickler", ""), "checkpoint.pickler"),
        _int(p.get("bytes", 0), "checkpoint.bytes"),
    )


def restored(value: Any) -> Restored:
    p = _dict(value, "the restore reply")
    return Restored(_names(p.get("restored", []), "restored"), _names(p.get("failed", []), "failed"))


def volume_synced(value: Any) -> VolumeSynced:
    return VolumeSynced(_bool(_dict(value, "the sync_volume reply").get("done", False), "sync_volume.done"))


def fanout_done(value: Any) -> FanoutDone:
    error = _dict(value, "the fanout reply").get("error") or ""
    return FanoutDone(_str(error, "fanout.error"))


@dataclass(frozen=True)
class Completion:
    """The reply to ``Complete``: the fields of a complete_reply the runtime filled in (the rest are the kernel's defaults)."""

    matches: list[str]
    cursor_start: int | None = None
    cursor_end: int | None = None
    metadata: dict[str, Any] | None = None


@dataclass(frozen=True)
class Inspection:
    """The reply to ``Inspect``: an inspect_reply's fields (``data`` still to be cleaned by the output policy)."""

    found: bool
    data: dict[str, Any]
    metadata: dict[str, Any]


@dataclass(frozen=True)
class Adopted:
    """The reply to ``Adopt``: what the kernel takes over from an attached session (its execution count,
    inputs and how many variables it has). The journal is the cell's to write: bad entries are left out."""

    count: int
    inputs: list[tuple[int, str]]
    variables: int


@dataclass(frozen=True)
class SessionComm:
    """One comm open in an attached session (``Runtime.comm_table``)."""

    target_name: str
    state: dict[str, Any]


@dataclass(frozen=True)
class OpenComms:
    """The reply to ``CommTable``: the comms open in the runtime, by comm id (malformed entries left out)."""

    comms: dict[str, SessionComm]


def completion(value: Any) -> Completion:
    """Lenient, as ipykernel's own reply would be read: a field of the wrong type is left to the kernel's default."""
    p = _dict(value, "the complete reply")
    matches = p.get("matches")
    start, end, metadata = p.get("cursor_start"), p.get("cursor_end"), p.get("metadata")
    return Completion(
        [m for m in matches if isinstance(m, str)] if isinstance(matches, list) else [],
        start if _is_int(start) else None,
        end if _is_int(end) else None,
        metadata if isinstance(metadata, dict) else None,
    )


def inspection(value: Any) -> Inspection:
    p = _dict(value, "the inspect reply")
    data, metadata = p.get("data"), p.get("metadata")
    return Inspection(
        p.get("found") is True, data if isinstance(data, dict) else {}, metadata if isinstance(metadata, dict) else {}
    )


def adopted(value: Any) -> Adopted:
    p = _dict(value, "the adopt reply")
    items = p.get("inputs")
    inputs = [
        (item[0], item[1])
        for item in (items if isinstance(items, list) else [])
        if isinstance(item, list) and len(item) == 2 and _count(item[0]) is not None and isinstance(item[1], str)
    ]
    return Adopted(_count(p.get("count")) or 0, inputs, _count(p.get("variables")) or 0)


def open_comms(value: Any) -> OpenComms:
    entries = _dict(value, "the comm_table reply").get("comms")
    comms = {}
    for comm_id, entry in (entries if isinstance(entries, dict) else {}).items():
        if isinstance(comm_id, str) and isinstance(entry, dict) and isinstance(entry.get("target_name"), str):
            state = entry.get("state")
            comms[comm_id] = SessionComm(entry["target_name"], state if isinstance(state, dict) else {})
    return OpenComms(comms)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(value: Any) -> int | None:
    return value if _is_int(value) and 0 <= value <= MAX_COUNT else None


def _names(value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ProtocolError(f"the runtime's reply has a malformed {what!r} (not a list of names)")
    return value


# -- checks --------------------------------------------------------------------


def _check_depth(value: Any, kind: str) -> None:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ProtocolError(f"a {kind} frame is nested more than {MAX_DEPTH} levels deep")
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)


def _dict(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProtocolError(f"{what} is {_type(value)}, not an object")
    return value


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ProtocolError(f"{what} is {_type(value)}, not a string")
    return value


def _bool(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise ProtocolError(f"{what} is {_type(value)}, not true or false")
    return value


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ProtocolError(f"{what} is {value!r:.40}, not a whole number >= 0")
    return value


def _path(value: Any, what: str) -> str:
    path = _str(value, what)
    if not path or "\x00" in path:
        raise ProtocolError(f"{what} {path!r:.80} is not a valid path")
    return path


def _type(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


def _mimebundle(payload: dict[str, Any], kind: str) -> dict[str, Any]:
    return _dict(payload.get("data"), f"{kind}.data")


# -- one parser per kind -----------------------------------------------------------


def _hello(p: dict[str, Any]) -> Hello:
    return Hello(
        _int(p.get("pid"), "hello.pid"),
        _str(p.get("python"), "hello.python"),
        _str(p.get("ipython") or "", "hello.ipython"),
        _str(p.get("ipython_cache") or "", "hello.ipython_cache"),
        _dict(p.get("journal") or {}, "hello.journal"),
    )


def _display(kind: str) -> Callable[[dict[str, Any]], Output]:
    def parse(p: dict[str, Any]) -> Output:
        content = {
            "data": _mimebundle(p, kind),
            "metadata": _dict(p.get("metadata", {}), f"{kind}.metadata"),
            "transient": _dict(p.get("transient", {}), f"{kind}.transient"),
        }
        return Output(IOPUB_TYPES[kind], content)

    return parse


def _clear(p: dict[str, Any]) -> Output:
    return Output(IOPUB_TYPES[Kind.CLEAR], {"wait": _bool(p.get("wait", False), "clear.wait")})


def _result(p: dict[str, Any]) -> Output:
    content = {
        "data": _mimebundle(p, Kind.RESULT),
        "metadata": _dict(p.get("metadata", {}), "result.metadata"),
        "execution_count": _int(p.get("execution_count"), "result.execution_count"),
    }
    return Output(IOPUB_TYPES[Kind.RESULT], content)


def _error(p: dict[str, Any]) -> CellError:
    traceback = p.get("traceback", [])
    if not isinstance(traceback, list) or not all(isinstance(line, str) for line in traceback):
        raise ProtocolError("error.traceback is not a list of strings")
    content = {"ename": _str(p.get("ename"), "error.ename"), "evalue": _str(p.get("evalue"), "error.evalue")}
    return CellError(dict(content, traceback=traceback), _bool(p.get("reply_only", False), "error.reply_only"))


def _user_expressions(p: dict[str, Any]) -> UserExpressions:
    for name, value in p.items():
        _dict(value, f"user_expressions[{name!r:.40}]")
    return UserExpressions(p)


def _payload(p: dict[str, Any]) -> Payload:
    _str(p.get("source"), "payload.source")
    return Payload(p)


def _input(p: dict[str, Any]) -> InputRequest:
    return InputRequest(
        _str(p.get("prompt", ""), "input.prompt"),
        _bool(p.get("password", False), "input.password"),
        _path(p.get("path"), "input.path"),
    )


def _files(p: dict[str, Any]) -> FileChanges:
    changed: dict[str, tuple[int, ...]] = {}
    for rel, stat in _dict(p.get("changed", {}), "files.changed").items():
        _path(rel, "files.changed path")
        if not isinstance(stat, list) or len(stat) not in (2, 3):
            raise ProtocolError(f"files.changed[{rel!r:.80}] is not a [size, mtime, mode] list")
        changed[rel] = tuple(_int(value, "a changed file's size, mtime or mode") for value in stat)
    deleted = p.get("deleted", [])
    if not isinstance(deleted, list):
        raise ProtocolError(f"files.deleted is {_type(deleted)}, not a list")
    deleted = [_path(rel, "files.deleted path") for rel in deleted]
    return FileChanges(
        changed, deleted, _bool(p.get("truncated", False), "files.truncated"), _bool(p.get("partial", False), "files.partial")
    )


def _reply(p: dict[str, Any]) -> Reply:
    return Reply(p)


def _comm(kind: str) -> Callable[[dict[str, Any]], CommMessage]:
    def parse(p: dict[str, Any]) -> CommMessage:
        content = _dict(p.get("content"), f"{kind}.content")
        comm_id = _str(content.get("comm_id"), f"{kind}.comm_id")
        if not COMM_ID.fullmatch(comm_id):
            raise ProtocolError(f"{kind}.comm_id {comm_id!r:.80} is not a comm id")
        checked: dict[str, Any] = {"comm_id": comm_id, "data": _dict(content.get("data", {}), f"{kind}.data")}
        if kind == Kind.COMM_OPEN:
            checked["target_name"] = _name(content.get("target_name"), "comm_open.target_name")
            module = content.get("target_module")
            checked["target_module"] = None if module is None else _name(module, "comm_open.target_module")
        metadata = _dict(p.get("metadata", {}), f"{kind}.metadata")
        return CommMessage(kind, checked, metadata, _buffers(p.get("buffers", []), kind))

    return parse


def _name(value: Any, what: str) -> str:
    name = _str(value, what)
    if not name or len(name) > MAX_NAME_CHARS:
        raise ProtocolError(f"{what} {name!r:.80} is empty or over {MAX_NAME_CHARS} characters")
    return name


def _buffers(value: Any, kind: str) -> tuple[bytes, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ProtocolError(f"{kind}.buffers is not a list of base64 strings")
    if sum(len(item) for item in value) * 3 // 4 > MAX_COMM_BUFFER_BYTES:
        raise ProtocolError(f"{kind}.buffers are over {MAX_COMM_BUFFER_BYTES // (1024 * 1024)} MB together")
    try:
        return tuple(base64.b64decode(item, validate=True) for item in value)
    except (binascii.Error, ValueError) as exc:
        raise ProtocolError(f"{kind}.buffers are not valid base64 ({exc})") from None


def _parent(p: dict[str, Any]) -> ParentSwitch:
    msg_id = _str(p.get("msg_id"), "parent.msg_id")
    if len(msg_id) > MAX_NAME_CHARS:
        raise ProtocolError(f"parent.msg_id is over {MAX_NAME_CHARS} characters")
    return ParentSwitch(msg_id)


def _comm_ack(p: dict[str, Any]) -> CommAck:
    return CommAck(_int(p.get("seq"), "comm_ack.seq"), _bool(p.get("more", False), "comm_ack.more"))


MAX_DAP_CHARS = 32 * 1024 * 1024  # the strings of one DAP message from the sandbox, together
DAP_FIELDS: dict[str, Callable[[Any, str], Any]] = {  # DAP's base fields, where a message has them
    "seq": _int,
    "request_seq": _int,
    "command": _str,
    "event": _str,
    "success": _bool,
    "message": _str,
    "body": _dict,
}


def _debug(p: dict[str, Any]) -> DebugMessage:
    """A DAP event, or the reply to the kernel's request ``answers``: a DAP response, or what ipykernel's
    Debugger replies instead (``{}`` before ``initialize``, a bare body for ``modules``). Typed, bounded."""
    message = _dict(p.get("message"), "debug.message")
    answers = p.get("answers")
    kind = message.get("type")
    if answers is not None:
        _int(answers, "debug.answers")
        if kind not in (None, "response"):
            raise ProtocolError(f"debug.message.type is {str(kind)[:40]!r}, not 'response', in a reply")
    elif kind == "event":
        _str(message.get("event"), "debug.message.event")
    else:
        raise ProtocolError(f"debug.message.type is {str(kind)[:40]!r}, not 'event', outside a reply")
    for name, check in DAP_FIELDS.items():
        if name in message:
            check(message[name], f"debug.message.{name}")
    if size_of(message) > MAX_DAP_CHARS:
        raise ProtocolError(f"a debug message is over {MAX_DAP_CHARS // (1024 * 1024)} MB")
    return DebugMessage(message, answers)


def size_of(value: Any) -> int:
    """About how many characters ``value`` takes as JSON: its strings, keys and scalars (8 each). The output
    budget charges by it, and a debug message's cap is checked with it."""
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, dict):
            total += sum(len(k) for k in item if isinstance(k, str))
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        else:
            total += 8
    return total


_PARSERS: dict[str, Callable[[dict[str, Any]], Event]] = {
    Kind.HELLO: _hello,
    Kind.DISPLAY: _display(Kind.DISPLAY),
    Kind.UPDATE: _display(Kind.UPDATE),
    Kind.CLEAR: _clear,
    Kind.RESULT: _result,
    Kind.ERROR: _error,
    Kind.USER_EXPRESSIONS: _user_expressions,
    Kind.PAYLOAD: _payload,
    Kind.INPUT: _input,
    Kind.FILES: _files,
    Kind.REPLY: _reply,
    Kind.COMM_OPEN: _comm(Kind.COMM_OPEN),
    Kind.COMM_MSG: _comm(Kind.COMM_MSG),
    Kind.COMM_CLOSE: _comm(Kind.COMM_CLOSE),
    Kind.PARENT: _parent,
    Kind.COMM_ACK: _comm_ack,
    Kind.DEBUG: _debug,
}
assert set(_PARSERS) == set(Kind.ALL), "every frame kind needs a parser"
