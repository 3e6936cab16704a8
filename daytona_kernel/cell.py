"""What the session needs from a request and from whoever shows its output.

``Cell`` is one execute request as a value. ``Frontend`` is the session's view
of the Jupyter client: it shows output (``emit``), a notice that stays with the
cell's output (``notice``), a transient status line (``progress``) and asks for
input (``ask``). The kernel implements it on top of iopub and stdin (docs/status.md
says how each client sees the status line); tests and ``daytona-kernel doctor``
use ``Recorder``.

Output is named by its iopub message type throughout: ``stream``, ``display_data``,
``update_display_data``, ``clear_output``, ``execute_result``, ``error`` (the kernel
publishes each as it is).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from .backends.base import ProgressCallback

__all__ = [
    "NOTICE_METADATA",
    "Cell",
    "CellOutcome",
    "Frontend",
    "Notice",
    "ProgressCallback",
    "Recorder",
    "error_content",
    "stderr",
    "stdout",
]

# The message metadata of a kernel notice, so a client (the agent API) can tell the kernel's own words from the cell's stderr.
NOTICE_METADATA = {"daytona_kernel_notice": True}


@dataclass(frozen=True)
class Cell:
    """One cell to run, as the execute_request asked for it (code already transformed)."""

    code: str
    count: int
    silent: bool = False
    store_history: bool = True
    allow_stdin: bool = False
    user_expressions: dict[str, str] = field(default_factory=dict)


class Frontend(Protocol):
    """Where a cell's output goes."""

    def emit(self, msg_type: str, content: dict[str, Any]) -> None:
        """Show one output: its iopub message type (stream, display_data, update_display_data,
        clear_output, execute_result or error) and content."""

    def notice(self, text: str) -> None:
        """State something the user must know (a file skipped or refused, variables reset, a conflict
        copy): once per request, on stderr, kept in the saved notebook like ipykernel's own warnings.
        An empty text says nothing."""

    def progress(self, text: str) -> None:
        """Show a transient status line while the cell waits; an empty text ends it. It never
        outlives the request, and it is not shown once the cell has shown an output."""

    async def ask(self, prompt: str, password: bool) -> str:
        """input(): ask the user and return the answer."""


@dataclass
class CellOutcome:
    """How a cell ended. ``error`` is the content of its one error output, if any."""

    error: dict[str, Any] | None = None
    user_expressions: dict[str, Any] = field(default_factory=dict)
    payload: list[dict[str, Any]] = field(default_factory=list)


def error_content(ename: str, message: str) -> dict[str, Any]:
    """An error for the user that comes from the kernel, not from their code."""
    return {"ename": ename, "evalue": message, "traceback": [f"\x1b[0;31m{ename}\x1b[0m: {message}"]}


class Notice(dict[str, Any]):
    """The content of a stderr stream output that the kernel wrote (not the cell): the kernel
    publishes it with ``NOTICE_METADATA``. The cell's own stderr is a plain dict."""


def stderr(text: str) -> dict[str, Any]:
    """The content of a stderr stream output with a notice of the kernel's (``Notice``)."""
    return Notice(name="stderr", text=text)


def stdout(text: str) -> dict[str, Any]:
    """The content of a stdout stream output."""
    return {"name": "stdout", "text": text}


class Recorder:
    """A Frontend that keeps what it is given: for ``doctor``, tests and output outside a cell."""

    def __init__(self, answers: list[str] | None = None) -> None:
        self.outputs: list[tuple[str, dict[str, Any]]] = []
        self.statuses: list[str] = []
        self.prompts: list[tuple[str, bool]] = []
        self._noticed: set[str] = set()
        self._answers = list(answers or [])

    def emit(self, msg_type: str, content: dict[str, Any]) -> None:
        self.outputs.append((msg_type, content))

    def notice(self, text: str) -> None:
        if text and text not in self._noticed:
            self._noticed.add(text)
            self.emit("stream", stderr(text))

    def progress(self, text: str) -> None:
        self.statuses.append(text)

    async def ask(self, prompt: str, password: bool) -> str:
        self.prompts.append((prompt, password))
        return self._answers.pop(0) if self._answers else ""

    def text(self, name: str = "stdout") -> str:
        """All stream text of one stream."""
        return "".join(c["text"] for msg_type, c in self.outputs if msg_type == "stream" and c["name"] == name)

    def of_type(self, msg_type: str) -> list[dict[str, Any]]:
        return [c for t, c in self.outputs if t == msg_type]
