"""Frames: how the in-sandbox runtime reports structured events through stdout.

This module is pure and standard-library only (Python 3.9+). The kernel imports
it, and the same source is sent into the sandbox, so both sides share one
implementation of the wire format and one list of frame kinds (``Kind``).

A frame is one line::

    MARK <token> <flag> <json>\\n

``MARK`` starts with the ASCII record separator, which ordinary output almost
never contains. ``token`` is a random per-context string, so a frame printed by
user code (which does not know the token) is shown as plain text. ``flag`` is
``.`` for the last piece of a frame and ``+`` when more pieces follow: large
payloads are split so that no line comes near the Daytona daemon's 1 MiB line
limit. The JSON is ASCII-only, so a piece's length is its size in bytes, and a
frame line never contains a raw record separator or newline.

Large strings (a 2 MB image's base64) can leave the line protocol: the runtime
writes their UTF-8 bytes, one after another, to a file in the sandbox (an ASCII string
a piece at a time, ``blob_pieces``) and the
frame's JSON becomes ``[kind, payload, {"path": ..., "sizes": [[keys, nbytes], ...]}]``
with ``""`` where each string was (``split_blobs``). The kernel downloads the
file in one request and puts the strings back (``join_blobs``): no JSON
encoding, decoding or daemon line for those bytes.

The decoder finds a frame header wherever it sits in the stream (a lone
record separator in user output does not hide the frame after it), never
re-scans text it has already seen, and caps the size of every piece and every
reassembled payload. A line that carries the right token but cannot be decoded
becomes a ``BadFrame`` (never text: that would show the token).

Examples:
    >>> lines = encode_frame("t0k", Kind.DISPLAY, {"data": {"text/plain": "1"}})
    >>> dec = FrameDecoder("t0k")
    >>> [type(e).__name__ for e in dec.feed("hi " + "".join(lines))]
    ['Text', 'Frame']
"""

from __future__ import annotations

import json
from typing import Any, Iterator, List, Optional, Tuple, Union

VERSION = 1
MARK = "\x1eDKF%d " % VERSION
PIECE_CHARS = 384 * 1024  # at most twice this once the worker JSON-encodes a line again: under its 1 MiB cap
MAX_PAYLOAD_CHARS = 64 * 1024 * 1024  # one reassembled frame; larger ones are dropped as a BadFrame
BLOB_MAX_DEPTH = 8  # how deep in a payload split_blobs looks for large strings
BLOB_PIECE_CHARS = 64 * 1024  # an ASCII large string is encoded this much at a time: no whole copy of it in memory
RECORD_SEPARATOR = "\x1e"
KERNEL_MAGICS = ("sync", "upload", "download", "daytona")  # run in the kernel, never in the sandbox


class Kind(object):
    """Every frame kind, sandbox to kernel. Add a kind here, then handle it in ``daytona_kernel.protocol``."""

    HELLO = "hello"  # the runtime is installed: pid, Python version
    DISPLAY = "display"  # display_data
    UPDATE = "update"  # update_display_data
    CLEAR = "clear"  # clear_output
    RESULT = "result"  # execute_result
    ERROR = "error"  # the cell's exception
    USER_EXPRESSIONS = "user_expressions"  # execute_reply's user_expressions
    PAYLOAD = "payload"  # execute_reply payloads (page, set_next_input, ask_exit)
    INPUT = "input"  # input() is waiting for the user's answer
    FILES = "files"  # what the cell changed in the working directory
    REPLY = "reply"  # the answer to a runtime call (complete, inspect, checkpoint ...)
    COMM_OPEN = "comm_open"  # a comm opened in the sandbox (ipywidgets ...): content, metadata, base64 buffers
    COMM_MSG = "comm_msg"  # a message on a comm
    COMM_CLOSE = "comm_close"  # a comm closed in the sandbox
    PARENT = "parent"  # the output that follows belongs to this frontend message ("": to the request)
    COMM_ACK = "comm_ack"  # the frontend messages were taken up to this inbox batch
    DEBUG = "debug"  # a DAP message from the debugger (debug.py): a response to the kernel's request, or an event

    ALL = (
        HELLO,
        DISPLAY,
        UPDATE,
        CLEAR,
        RESULT,
        ERROR,
        USER_EXPRESSIONS,
        PAYLOAD,
        INPUT,
        FILES,
        REPLY,
        COMM_OPEN,
        COMM_MSG,
        COMM_CLOSE,
        PARENT,
        COMM_ACK,
        DEBUG,
    )


class Text(object):
    """Plain output text that was not a frame."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Text) and other.text == self.text

    def __repr__(self) -> str:
        return "Text(%r)" % (self.text,)


class Blobs(object):
    """Where a frame's large strings wait in the sandbox: a file, and each string's place and size in bytes."""

    __slots__ = ("path", "sizes")

    def __init__(self, path: str, sizes: List[Tuple[List[Union[str, int]], int]]) -> None:
        self.path = path
        self.sizes = sizes

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Blobs) and (other.path, other.sizes) == (self.path, self.sizes)

    def __repr__(self) -> str:
        return "Blobs(%r, %r)" % (self.path, self.sizes)


class Frame(object):
    """One decoded frame: a kind (``display``, ``error`` ...) and its payload (still unvalidated).
    ``blobs``: the payload's large strings are in a file, still to be fetched (``join_blobs``)."""

    __slots__ = ("kind", "payload", "blobs")

    def __init__(self, kind: str, payload: Any, blobs: Optional[Blobs] = None) -> None:
        self.kind = kind
        self.payload = payload
        self.blobs = blobs

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Frame) and (other.kind, other.payload, other.blobs) == (self.kind, self.payload, self.blobs)

    def __repr__(self) -> str:
        return "Frame(%r, %r%s)" % (self.kind, self.payload, ", %r" % (self.blobs,) if self.blobs else "")


class BadFrame(object):
    """A line with the right token that could not be decoded; ``reason`` says why."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BadFrame) and other.reason == self.reason

    def __repr__(self) -> str:
        return "BadFrame(%r)" % (self.reason,)


Event = Union[Text, Frame, BadFrame]


def encode_frame(token: str, kind: str, payload: Any, piece_chars: int = PIECE_CHARS, blobs: Optional[dict] = None) -> list[str]:
    """Return the lines (each ending in a newline) that carry one frame; ``blobs`` as ``split_blobs`` made them."""
    body = json.dumps(
        [kind, payload] if blobs is None else [kind, payload, blobs], ensure_ascii=True, separators=(",", ":"), default=repr
    )
    head = MARK + token + " "
    if len(body) <= piece_chars:
        return [head + ". " + body + "\n"]
    pieces = [body[i : i + piece_chars] for i in range(0, len(body), piece_chars)]
    lines = [head + "+ " + p + "\n" for p in pieces[:-1]]
    lines.append(head + ". " + pieces[-1] + "\n")
    return lines


Blob = Union[str, bytes]  # a large string: itself when ASCII (each character one byte), else its UTF-8 bytes


def split_blobs(payload: Any, min_chars: int) -> Tuple[Any, List[Tuple[List[Union[str, int]], Blob]]]:
    """Take the strings of at least ``min_chars`` out of a payload's dicts and lists.

    Returns a copy of the payload with ``""`` in their places (the original is
    left alone), and each string's keys and ``Blob``: an ASCII string (a base64
    image) as it is, so that it is encoded a piece at a time as it is written
    (``blob_pieces``), any other as its UTF-8 bytes; either way its length is
    its size in the file. A string that cannot be encoded (a lone surrogate)
    stays in place, for the JSON to escape.
    """
    found: List[Tuple[List[Union[str, int]], Blob]] = []

    def walk(node: Any, keys: List[Union[str, int]]) -> Any:
        if isinstance(node, str):
            if len(node) >= min_chars:
                try:
                    found.append((keys, node if node.isascii() else node.encode("utf-8")))
                    return ""
                except UnicodeEncodeError:
                    pass  # a lone surrogate: the string stays inline, where JSON escapes it
            return node
        if len(keys) >= BLOB_MAX_DEPTH:
            return node
        if isinstance(node, dict):
            return {k: walk(v, keys + [k]) if isinstance(k, str) else v for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v, keys + [i]) for i, v in enumerate(node)]
        return node

    thin = walk(payload, [])
    return (thin, found) if found else (payload, [])


def blob_pieces(blob: Blob) -> Iterator[bytes]:
    """A ``Blob``'s bytes for the file. An ASCII string is encoded ``BLOB_PIECE_CHARS`` at a time:
    one 2.7 MB copy of it would be fresh memory at each display (the allocator gives a block that
    large back to the system when it is freed), a page fault every 4 KiB, costing the sandbox more
    than the copying itself."""
    if isinstance(blob, bytes):
        yield blob
        return
    for start in range(0, len(blob), BLOB_PIECE_CHARS):
        yield blob[start : start + BLOB_PIECE_CHARS].encode("ascii")


def join_blobs(payload: Any, blobs: Blobs, data: bytes) -> Any:
    """Put a frame's large strings back from the bytes of its file; ValueError if they do not fit."""
    if sum(size for _, size in blobs.sizes) != len(data):
        raise ValueError("the file holds %d bytes, the frame announced %d" % (len(data), sum(s for _, s in blobs.sizes)))
    start, view = 0, memoryview(data)
    for keys, size in blobs.sizes:
        node = payload
        for key in keys[:-1]:
            node = _child(node, key)
        if _child(node, keys[-1]) != "":
            raise ValueError("a large string's place in the frame is not empty")
        node[keys[-1]] = str(view[start : start + size], "utf-8")  # no copy of the bytes first
        start += size
    return payload


def _child(node: Any, key: Union[str, int]) -> Any:
    if isinstance(node, dict) and isinstance(key, str) and key in node:
        return node[key]
    if isinstance(node, list) and isinstance(key, int) and not isinstance(key, bool) and 0 <= key < len(node):
        return node[key]
    raise ValueError("a large string's place is not in the frame")


class FrameDecoder(object):
    """Split a stream of output text into ``Text``, ``Frame`` and ``BadFrame`` events.

    Feed it text in chunks of any size; a frame or header cut across chunks is
    held until the rest arrives. Work per chunk is proportional to the chunk.
    """

    def __init__(self, token: str, max_piece_chars: int = PIECE_CHARS, max_payload_chars: Optional[int] = None) -> None:
        self._head = MARK + token + " "
        self._max_line = max_piece_chars + 2  # flag, space, piece
        self._max_payload = MAX_PAYLOAD_CHARS if max_payload_chars is None else max_payload_chars
        self._partial = ""  # a possible start of a header at the end of the last chunk
        self._line: Optional[List[str]] = None  # the pieces of a frame line in progress (after its header)
        self._line_chars = 0
        self._skipping = False  # the line in progress was too long: drop it up to its newline
        self._pieces: List[str] = []  # bodies of "+" pieces waiting for their final "." piece
        self._pieces_chars = 0
        self._overflowed = False  # the multi-piece payload was too large: drop it up to its last piece

    def feed(self, text: str) -> list[Event]:
        buf = self._partial + text if self._partial else text
        self._partial = ""
        events: list[Event] = []
        pos = 0
        end = len(buf)
        head = self._head
        while pos < end:
            if self._line is not None:
                pos = self._continue_line(events, buf, pos)
                continue
            i = buf.find(RECORD_SEPARATOR, pos)
            if i < 0:
                self._text(events, buf[pos:])
                break
            self._text(events, buf[pos:i])
            if buf.startswith(head, i):
                self._line = []
                self._line_chars = 0
                pos = i + len(head)
            elif end - i < len(head) and head.startswith(buf[i:]):
                self._partial = buf[i:]
                break
            else:  # a record separator that does not start our header: ordinary text
                self._text(events, RECORD_SEPARATOR)
                pos = i + 1
        return events

    def flush(self) -> list[Event]:
        """End of output: a held-back header start is text; a frame cut short is a BadFrame."""
        events: list[Event] = []
        self._text(events, self._partial)
        self._partial = ""
        if self._line is not None:
            self._line = None
            if not self._skipping:
                events.append(BadFrame("a frame was cut off before its end"))
            self._skipping = False
        if self._pieces or self._overflowed:
            if not self._overflowed:
                events.append(BadFrame("a frame in several pieces ended without its last piece"))
            self._drop_pieces()
        return events

    def _continue_line(self, events: list[Event], buf: str, pos: int) -> int:
        """Add ``buf[pos:]`` to the frame line in progress, up to its newline; return the new position."""
        assert self._line is not None
        nl = buf.find("\n", pos)
        stop = len(buf) if nl < 0 else nl
        if not self._skipping:
            self._line.append(buf[pos:stop])
            self._line_chars += stop - pos
            if self._line_chars > self._max_line:
                self._skipping = True
                self._line = []
                events.append(BadFrame("a frame line is over %d characters" % self._max_line))
        if nl < 0:
            return len(buf)
        line = "".join(self._line)
        skipped = self._skipping
        self._line = None
        self._skipping = False
        if skipped:
            self._drop_pieces()
        else:
            self._piece(events, line)
        return nl + 1

    def _piece(self, events: list[Event], line: str) -> None:
        if len(line) < 2 or line[1] != " " or line[0] not in "+.":
            self._drop_pieces()
            events.append(BadFrame("a frame line has no valid flag"))
            return
        flag, body = line[0], line[2:]
        if not self._overflowed:
            self._pieces.append(body)
            self._pieces_chars += len(body)
            if self._pieces_chars > self._max_payload:
                self._pieces = []
                self._overflowed = True
                events.append(BadFrame("a frame is over %d characters" % self._max_payload))
        if flag == "+":
            return
        overflowed, body = self._overflowed, "".join(self._pieces)
        self._drop_pieces()
        if not overflowed:
            events.append(_parse(body))

    def _drop_pieces(self) -> None:
        self._pieces = []
        self._pieces_chars = 0
        self._overflowed = False

    @staticmethod
    def _text(events: list[Event], text: str) -> None:
        if not text:
            return
        if events and isinstance(events[-1], Text):
            events[-1] = Text(events[-1].text + text)
        else:
            events.append(Text(text))


def _parse(body: str) -> Event:
    try:
        decoded = json.loads(body)
    except (ValueError, RecursionError) as exc:
        return BadFrame("a frame is not valid JSON (%s)" % (type(exc).__name__,))
    if not (isinstance(decoded, list) and len(decoded) in (2, 3) and isinstance(decoded[0], str)):
        return BadFrame("a frame is not a [kind, payload] pair")
    if len(decoded) == 2:
        return Frame(decoded[0], decoded[1])
    blobs = _blobs(decoded[2])
    if blobs is None:
        return BadFrame("a frame's file of large strings is not described right")
    return Frame(decoded[0], decoded[1], blobs)


def _blobs(value: Any) -> Optional[Blobs]:
    """The ``{"path", "sizes"}`` of a frame, checked (never more than MAX_PAYLOAD_CHARS bytes in all), or None."""
    if not isinstance(value, dict) or not isinstance(value.get("path"), str) or not isinstance(value.get("sizes"), list):
        return None
    sizes: List[Tuple[List[Union[str, int]], int]] = []
    for item in value["sizes"]:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], list) and item[0]):
            return None
        keys, size = item
        if not (isinstance(size, int) and not isinstance(size, bool) and size >= 0):
            return None
        if not all(isinstance(k, str) or (isinstance(k, int) and not isinstance(k, bool)) for k in keys):
            return None
        sizes.append((keys, size))
    if not value["path"] or sum(size for _, size in sizes) > MAX_PAYLOAD_CHARS:
        return None
    return Blobs(value["path"], sizes)
