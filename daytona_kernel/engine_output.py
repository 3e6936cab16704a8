"""A map cell's output as ipyparallel's ``%%px`` shows it (docs/fanout.md, "Output").

``CellLines`` is the cell's one output area: every engine's stream text goes out at once, each
line prefixed ``[stdout:R] `` or ``[stderr:R] ``, a line still without its newline included (a
progress bar shows live). At most one such open line exists; anything else shown first ends it
with a newline, and the engine's next text starts a new prefixed line, so a client that merges
consecutive stream outputs never shows one engine's text after another's prefix.

An engine cannot pass for another: a carriage return in its text (which a client honours by
writing the rest of the line over its start) is followed by its own prefix again; a backspace
(which JupyterLab honours by deleting the character before it) and an escape sequence other than
a colour (which a terminal running ``jupyter console`` honours by moving its cursor, to another
engine's line, say) are shown escaped, as text.
"""

from __future__ import annotations

import re
from typing import Any

from .cell import Frontend, stdout

# Control characters shown as text: they could erase a line's prefix or move to another line. An
# escape that starts a colour (SGR, ESC [ digits/semicolons m) stays: tracebacks and loggers use it.
ESCAPED = re.compile(r"\x08|\x1b(?!\[[0-9;]*m)")


class CellLines:
    """See the module docstring. Everything a map cell shows goes through one of these."""

    def __init__(self, frontend: Frontend) -> None:
        self._frontend = frontend
        self._open: tuple[str, int] | None = None  # (stream, rank) of the line shown without its newline

    def stream(self, name: str, rank: int, text: str) -> None:
        """Engine ``rank``'s stream text, shown now."""
        text = ESCAPED.sub(lambda m: f"\\x{ord(m.group()):02x}", text.replace("\r\n", "\n"))
        if not text:
            return
        prefix = f"[{name}:{rank}] "
        shown = ""
        if self._open != (name, rank):
            self.end_line()
            shown = prefix
        head, *rest = text.split("\n")
        shown += head.replace("\r", "\r" + prefix)
        for i, line in enumerate(rest):
            shown += "\n"
            if line or i < len(rest) - 1:  # an empty line keeps its prefix; the end of the text starts none
                shown += prefix + line.replace("\r", "\r" + prefix)
        self._open = None if text.endswith("\n") else (name, rank)
        self._frontend.emit("stream", {"name": name, "text": shown})

    def end_line(self, rank: int | None = None) -> None:
        """End the open line (only engine ``rank``'s, if given) with a newline."""
        if self._open is not None and rank in (None, self._open[1]):
            name = self._open[0]
            self._open = None
            self._frontend.emit("stream", {"name": name, "text": "\n"})

    def emit(self, msg_type: str, content: dict[str, Any]) -> None:
        """Any other output of the cell (an update adds none, so it leaves the open line as it is)."""
        if msg_type != "update_display_data":
            self.end_line()
        self._frontend.emit(msg_type, content)

    def notice(self, text: str) -> None:
        self.end_line()
        self._frontend.notice(text)


class EngineOutput:
    """One engine's outputs as the cell shows them: stream text through the cell's ``CellLines``,
    rich outputs after a header line with ``worker: R`` in their metadata, results shown as
    displays (one cell has one result), the engine's error kept for the cell's combined error."""

    def __init__(self, rank: int, lines: CellLines) -> None:
        self.rank = rank
        self._lines = lines

    def emit(self, msg_type: str, content: dict[str, Any]) -> None:
        if msg_type == "stream":
            name = content["name"] if content["name"] in ("stdout", "stderr") else "stdout"
            self._lines.stream(name, self.rank, content["text"])
        elif msg_type in ("display_data", "execute_result"):
            header = (
                f"Out[{self.rank}:{content.get('execution_count')}]:" if msg_type == "execute_result" else f"[output:{self.rank}]"
            )
            self._lines.emit("stream", stdout(header + "\n"))
            shown = {
                "data": content.get("data", {}),
                "metadata": self._tagged(content),
                "transient": content.get("transient", {}),
            }
            self._lines.emit("display_data", shown)
        elif msg_type == "update_display_data":
            self._lines.emit("update_display_data", dict(content, metadata=self._tagged(content)))
        # "error" is the engine's error: the cell shows one combined error instead. "clear_output" would
        # clear every engine's output, so an engine may not clear the cell.

    def _tagged(self, content: dict[str, Any]) -> dict[str, Any]:
        return {**content.get("metadata", {}), "worker": self.rank}

    def flush(self) -> None:
        """The engine is done: end its line if it has one open."""
        self._lines.end_line(self.rank)

    def notice(self, text: str) -> None:
        """A line about this engine (on stderr, with its rank)."""
        self._lines.stream("stderr", self.rank, text if text.endswith("\n") else text + "\n")
