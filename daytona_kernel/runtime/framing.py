"""Frames: how the in-sandbox runtime reports structured events through stdout.

This module is pure and standard-library only. The kernel imports it, and the
same source is sent into the sandbox, so both sides share one implementation.

A frame is one line::

    MARK <token> <flag> <json>\\n

``MARK`` starts with the ASCII record separator, which ordinary output almost
never contains. ``token`` is a random per-context string, so a frame printed by
user code (which does not know the token) is shown as plain text. ``flag`` is
``.`` for the last piece of a frame and ``+`` when more pieces follow: large
payloads are split so that no line comes near the Daytona daemon's 1 MiB line
limit. The JSON is ASCII-only, so a piece's length is its size in bytes.

Examples:
    >>> lines = encode_frame("t0k", "display", {"data": {"text/plain": "1"}})
    >>> dec = FrameDecoder("t0k")
    >>> [type(e).__name__ for e in dec.feed("hi " + "".join(lines))]
    ['Text', 'Frame']
"""

import json

VERSION = 1
MARK = "\x1eDKF%d " % VERSION
PIECE_CHARS = 128 * 1024


class Text(object):
    """Plain output text that was not a frame."""

    __slots__ = ("text",)

    def __init__(self, text):
        self.text = text

    def __eq__(self, other):
        return isinstance(other, Text) and other.text == self.text

    def __repr__(self):
        return "Text(%r)" % (self.text,)


class Frame(object):
    """One decoded event: a kind (``display``, ``error`` ...) and its payload."""

    __slots__ = ("kind", "payload")

    def __init__(self, kind, payload):
        self.kind = kind
        self.payload = payload

    def __eq__(self, other):
        return isinstance(other, Frame) and (other.kind, other.payload) == (self.kind, self.payload)

    def __repr__(self):
        return "Frame(%r, %r)" % (self.kind, self.payload)


def encode_frame(token, kind, payload, piece_chars=PIECE_CHARS):
    """Return the lines (each ending in a newline) that carry one frame."""
    body = json.dumps([kind, payload], ensure_ascii=True, separators=(",", ":"), default=repr)
    head = MARK + token + " "
    if len(body) <= piece_chars:
        return [head + ". " + body + "\n"]
    pieces = [body[i : i + piece_chars] for i in range(0, len(body), piece_chars)]
    lines = [head + "+ " + p + "\n" for p in pieces[:-1]]
    lines.append(head + ". " + pieces[-1] + "\n")
    return lines


class FrameDecoder(object):
    """Split a stream of output text into ``Text`` and ``Frame`` events.

    Feed it text in chunks of any size; a frame or marker cut across chunks is
    held until the rest arrives. Anything that looks like a frame but does not
    carry the right token, or does not parse, is returned as ``Text``.
    """

    def __init__(self, token):
        self._head = MARK + token + " "
        self._pending = ""
        self._pieces = []

    def feed(self, text):
        buf = self._pending + text if self._pending else text
        self._pending = ""
        events = []
        pos = 0
        while True:
            i = buf.find("\x1e", pos)
            if i < 0:
                self._text(events, buf[pos:])
                return events
            self._text(events, buf[pos:i])
            nl = buf.find("\n", i)
            if nl < 0:
                rest = buf[i:]
                if MARK.startswith(rest) or rest.startswith(MARK):
                    self._pending = rest
                else:
                    self._text(events, rest)
                return events
            self._line(events, buf[i : nl + 1])
            pos = nl + 1

    def flush(self):
        """End of output: whatever is held back is plain text after all."""
        events = []
        self._text(events, self._pending)
        self._pending = ""
        if self._pieces:
            self._text(events, "".join(self._pieces))
            self._pieces = []
        return events

    def _line(self, events, line):
        head = self._head
        if not line.startswith(head) or len(line) < len(head) + 3 or line[len(head) + 1] != " ":
            self._text(events, line)
            return
        flag = line[len(head)]
        body = line[len(head) + 2 : -1]
        if flag == "+":
            self._pieces.append(body)
            return
        if flag != ".":
            self._text(events, line)
            return
        if self._pieces:
            body = "".join(self._pieces) + body
            self._pieces = []
        try:
            kind, payload = json.loads(body)
        except ValueError:
            self._text(events, line)
            return
        events.append(Frame(kind, payload))

    @staticmethod
    def _text(events, text):
        if not text:
            return
        if events and isinstance(events[-1], Text):
            events[-1] = Text(events[-1].text + text)
        else:
            events.append(Text(text))
