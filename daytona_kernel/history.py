"""Input history, kept per kernel session in the kernel process.

Reply shapes match ipykernel's ``history_reply``: ``(session, line, input)``
tuples, or ``(session, line, (input, output))`` when output is asked for. The
output is the start of the result's text/plain (``OUTPUT_CHARS``), so a kernel
that shows large results does not keep them all.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any

CURRENT_SESSION = 1
OUTPUT_CHARS = 10_000  # the most of a result's text/plain that history keeps; results can be many MB


@dataclass(frozen=True)
class HistoryEntry:
    line: int
    source: str
    output: str | None


class History:
    """Cells of this kernel session, in order."""

    def __init__(self) -> None:
        self._entries: list[HistoryEntry] = []

    def store(self, line: int, source: str, output: str | None) -> None:
        self._entries.append(HistoryEntry(line, source.rstrip("\n"), bounded(output)))

    def prepend(self, inputs: list[tuple[int, str]]) -> None:
        """The inputs of a session this kernel attached to: they came before this kernel's own cells."""
        self._entries[:0] = [HistoryEntry(line, source.rstrip("\n"), None) for line, source in inputs]

    def query(
        self,
        access: str,
        *,
        output: bool = False,
        session: int | None = None,
        start: int | None = None,
        stop: int | None = None,
        n: int | None = None,
        pattern: str | None = None,
        unique: bool = False,
    ) -> list[tuple[int, int, Any]]:
        """Entries for a ``tail``, ``range`` or ``search`` request; [] for others."""
        entries = self._entries
        if access == "tail":
            entries = entries[-n:] if n else entries[-10:]
        elif access == "range":
            if session not in (None, 0, CURRENT_SESSION):
                return []
            first = start or 0
            entries = [e for e in entries if e.line >= first and (stop is None or e.line < stop)]
        elif access == "search":
            entries = [e for e in entries if fnmatch.fnmatchcase(e.source, pattern or "*")]
            if unique:
                seen: set[str] = set()
                kept = []
                for entry in reversed(entries):
                    if entry.source not in seen:
                        seen.add(entry.source)
                        kept.append(entry)
                entries = kept[::-1]
            if n:
                entries = entries[-n:]
        else:
            return []
        if output:
            return [(CURRENT_SESSION, e.line, (e.source, e.output)) for e in entries]
        return [(CURRENT_SESSION, e.line, e.source) for e in entries]


def bounded(output: str | None, limit: int = OUTPUT_CHARS) -> str | None:
    """At most ``limit`` characters of ``output``, saying how many more there were."""
    if output is None or len(output) <= limit:
        return output
    return f"{output[:limit]}… [{len(output) - limit} more characters not kept in history]"
