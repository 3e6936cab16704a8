"""What a run returns to an agent: typed values built from the kernel's iopub messages.

``Outputs`` follows one execute request's iopub messages the way a notebook does (``clear_output``,
``update_display_data`` by display id, the kernel's transient status line left out) and turns them
into ``RunResult``: the text in the order it came (stdout, stderr, results, the error's traceback),
the images, the error, and the kernel's own notices kept apart from the cell's stderr. Every bundle
passes through the kernel's output policy again (``outputs.OutputPolicy``, never trusted here), so
no script reaches the agent or the transcript even from a kernel configured to trust its sandbox.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import nh3

from .config import SECRET_ENV_VARS
from .outputs import OutputPolicy

__all__ = ["NOTICE_METADATA_KEY", "CellError", "Image", "Outputs", "RunResult", "Variable", "redact", "strip_ansi"]

log = logging.getLogger(__name__)
NOTICE_METADATA_KEY = "daytona_kernel_notice"  # in a stream message's metadata: the kernel's words, not the cell's
STATUS_DISPLAY_PREFIX = "daytona-kernel-status-"  # the kernel's transient status line (kernel.KernelFrontend)
IMAGE_TYPES = ("image/png", "image/jpeg")
TEXT_TYPES = ("text/plain", "text/markdown", "text/latex")
DEFAULT_REPR = re.compile(r"(<[\w.]+ object( at 0x[0-9a-fA-F]+)?>)?")  # object.__repr__, or no text at all
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
MIN_SECRET_CHARS = 8  # shorter values would mask ordinary words


def strip_ansi(text: str) -> str:
    """Text without terminal colour codes (tracebacks carry them)."""
    return ANSI.sub("", text)


def redact(text: str, environ: dict[str, str] | None = None) -> str:
    """``text`` with the values of the credentials in the environment (DAYTONA_API_KEY ...) replaced by ***."""
    env = os.environ if environ is None else environ
    for name in SECRET_ENV_VARS:
        value = env.get(name, "")
        if len(value) >= MIN_SECRET_CHARS and value in text:
            text = text.replace(value, "***")
    return text


@dataclass(frozen=True)
class Image:
    """An image the cell displayed: its MIME type and its base64 data, as the kernel sent it."""

    mime: str
    data: str


@dataclass(frozen=True)
class CellError:
    """The exception that ended the cell, its traceback as plain text lines."""

    name: str
    value: str
    traceback: list[str]

    @property
    def text(self) -> str:
        return "\n".join(self.traceback) if self.traceback else f"{self.name}: {self.value}"


@dataclass(frozen=True)
class Variable:
    """One name in the interpreter, as VS Code's Variables view shows it."""

    name: str
    type: str
    repr: str
    size: str = ""


@dataclass
class RunResult:
    """How one ``run`` ended.

    ``text`` is what the cell printed and showed, in order (stdout, stderr, results, the error's
    traceback), cut at the client's cap with a note saying where the rest is; ``outputs`` are the
    notebook outputs (nbformat), as the transcript keeps them; ``notices`` are the kernel's own
    messages (a resumed sandbox, a sync problem), never mixed into ``text``."""

    execution_count: int | None
    text: str
    images: list[Image] = field(default_factory=list)
    error: CellError | None = None
    notices: list[str] = field(default_factory=list)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    interrupted: bool = False
    timed_out: bool = False
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None


class Outputs:
    """The outputs of one execute request, as a notebook would keep them (see the module docstring)."""

    def __init__(self, on_output: Callable[[str], None] | None = None) -> None:
        self.items: list[dict[str, Any]] = []
        self.notices: list[str] = []
        self.error: CellError | None = None
        self._policy = OutputPolicy(trusted=False)
        self._clear_pending = False
        self._on_output = on_output  # the cell's stream text as it comes (``run(on_output=...)``)

    def add(self, msg: dict[str, Any]) -> None:
        """One iopub message of this request (status and execute_input are ignored)."""
        msg_type, content = msg["msg_type"], msg["content"]
        if msg_type == "clear_output":
            if content.get("wait"):
                self._clear_pending = True
            else:
                self.items.clear()
            return
        if msg_type == "stream" and msg.get("metadata", {}).get(NOTICE_METADATA_KEY):
            self.notices.append(redact(str(content.get("text", ""))))
            return
        if msg_type not in ("stream", "display_data", "update_display_data", "execute_result", "error"):
            return
        display_id = str(content.get("transient", {}).get("display_id", ""))
        if display_id.startswith(STATUS_DISPLAY_PREFIX):
            return  # the kernel's "⏳ starting the sandbox" line: transient, never part of the result
        if msg_type != "error":
            content = self._policy.content(msg_type, content)
        if self._clear_pending:
            self.items.clear()
            self._clear_pending = False
        if msg_type == "update_display_data":
            for item in self.items:
                if display_id and item.get("_display_id") == display_id:
                    item["data"], item["metadata"] = content.get("data", {}), content.get("metadata", {})
            return
        item = self._output(msg_type, content, display_id)
        self.items.append(item)
        if msg_type == "stream" and self._on_output is not None:
            self._tell(item["text"])

    def _tell(self, text: str) -> None:
        assert self._on_output is not None
        try:
            self._on_output(text)
        except Exception:  # the caller's callback: its failure must not end the run; it is not called again
            log.exception("the on_output callback failed; the run goes on without it")
            self._on_output = None

    def _output(self, msg_type: str, content: dict[str, Any], display_id: str) -> dict[str, Any]:
        if msg_type == "stream":
            return {"output_type": "stream", "name": content.get("name", "stdout"), "text": redact(str(content.get("text", "")))}
        if msg_type == "error":
            tb = [redact(strip_ansi(str(line))) for line in content.get("traceback", [])]
            self.error = CellError(str(content.get("ename", "")), redact(str(content.get("evalue", ""))), tb)
            return {"output_type": "error", "ename": self.error.name, "evalue": self.error.value, "traceback": tb}
        out: dict[str, Any] = {
            "output_type": msg_type,
            "data": _redacted(content.get("data", {})),
            "metadata": content.get("metadata", {}),
        }
        if msg_type == "execute_result":
            out["execution_count"] = content.get("execution_count")
        if display_id:
            out["_display_id"] = display_id
        return out

    def notebook_outputs(self) -> list[dict[str, Any]]:
        """The outputs for an .ipynb (without the display ids kept for updates)."""
        return [{k: v for k, v in item.items() if k != "_display_id"} for item in self.items]

    def text(self) -> str:
        """Everything as text, in order."""
        parts: list[str] = []
        for item in self.items:
            kind = item["output_type"]
            if kind == "stream":
                parts.append(item["text"])
            elif kind == "error":
                parts.append(CellError(item["ename"], item["evalue"], item["traceback"]).text + "\n")
            else:
                text = bundle_text(item["data"])
                if text:
                    parts.append(text if text.endswith("\n") else text + "\n")
        return "".join(parts)

    def images(self) -> list[Image]:
        found = []
        for item in self.items:
            for mime in IMAGE_TYPES:
                data = item.get("data", {}).get(mime)
                if isinstance(data, str):
                    found.append(Image(mime, data.replace("\n", "")))
        return found


def bundle_text(data: dict[str, Any]) -> str:
    """A display's text: its plain text, markdown or LaTeX, or its HTML as text (tags removed) where the
    plain text is only an object's default repr (``<IPython.core.display.HTML object>``)."""
    html = data.get("text/html")
    if isinstance(html, str) and DEFAULT_REPR.fullmatch(str(data.get("text/plain", ""))):
        return nh3.clean(html, tags=set()).strip()
    for mime in TEXT_TYPES:
        value = data.get(mime)
        if isinstance(value, str) and value:
            return value
        if isinstance(value, list):
            return "".join(str(v) for v in value)
    if isinstance(html, str):
        return nh3.clean(html, tags=set()).strip()
    return ""


def _redacted(data: dict[str, Any]) -> dict[str, Any]:
    return {
        mime: redact(value) if isinstance(value, str) and not mime.startswith("image/") else value for mime, value in data.items()
    }
