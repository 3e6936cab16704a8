"""A scripted sandbox for the fast tier: the backend interface, with no process and no network.

A test writes down what each run prints and how it ends; the session under
test cannot tell it from a real backend. ``FakeSandbox`` answers the bootstrap
by itself (a ``hello`` frame with the token it reads from the bootstrap code),
then plays one ``Run`` per ``run_code`` call, in order::

    sandbox = FakeSandbox([Run(["hi\\n", frame("result", {...})]), Run(raises=ContextDied("gone"))])

A run's output items are plain text (stdout), ``frame(kind, payload)`` (encoded
with the context's token) or ``raw(fn)`` (``fn(token)`` returns any text, for
hostile frames). ``Run(raises=...)`` raises after its output: ContextDied,
ContextTimeout, SandboxNotRunning ... on cue.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from daytona_kernel.backends.base import (
    Context,
    ExecResult,
    FileError,
    OutputCallback,
    ProgressCallback,
    RunError,
    Sandbox,
    Toolbox,
)
from daytona_kernel.runtime import HANDLE
from daytona_kernel.runtime.framing import PIECE_CHARS, Kind, encode_frame

TOKEN_IN_BOOTSTRAP = re.compile(r"Runtime\('([0-9a-f]+)'")
Item = Any  # str | _Frame | _Raw


@dataclass(frozen=True)
class _Frame:
    kind: str
    payload: Any
    piece_chars: int | None = None


@dataclass(frozen=True)
class _Raw:
    render: Callable[[str], str]


def frame(kind: str, payload: Any, piece_chars: int | None = None) -> _Frame:
    """An output item: a well-formed frame with the context's token."""
    return _Frame(kind, payload, piece_chars)


def raw(render: Callable[[str], str]) -> _Raw:
    """An output item: whatever ``render(token)`` returns, as it is."""
    return _Raw(render)


@dataclass
class Run:
    """One scripted ``run_code``: output chunks, then an error result or an exception.

    ``wait`` (an asyncio.Event) holds the run after its output until it is set,
    like a cell that is still running; ``on_start`` is called when the run begins.
    """

    stdout: list[Item] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    error: RunError | None = None
    raises: BaseException | None = None
    wait: asyncio.Event | None = None


class FakeContext(Context):
    """A context that plays the sandbox's script."""

    def __init__(self, sandbox: FakeSandbox, number: int) -> None:
        self._sandbox = sandbox
        self.id = f"fake-ctx-{number}"
        self.token = ""
        self.closed = False
        self._waiting: list[asyncio.Event] = []

    async def run_code(
        self, code: str, on_stdout: OutputCallback, on_stderr: OutputCallback, timeout: float | None = None
    ) -> RunError | None:
        self._sandbox.codes.append(code)
        if self.closed:
            raise self._sandbox.closed_error()
        boot = TOKEN_IN_BOOTSTRAP.search(code)
        if boot is not None and f"{HANDLE} = " in code:
            self.token = boot.group(1)
            run = self._sandbox.bootstrap_run or Run([frame(Kind.HELLO, {"pid": 4242, "python": "3.12.1"})])
        else:
            run = self._sandbox.next_run()
        for item in run.stdout:
            on_stdout(self._render(item))
        for text in run.stderr:
            on_stderr(text)
        if run.wait is not None:
            self._waiting.append(run.wait)
            await run.wait.wait()
            if self.closed:
                raise self._sandbox.closed_error()
        if run.raises is not None:
            raise run.raises
        return run.error

    def _render(self, item: Item) -> str:
        if isinstance(item, _Frame):
            pieces = encode_frame(self.token, item.kind, item.payload, item.piece_chars or PIECE_CHARS)
            return "".join(pieces)
        if isinstance(item, _Raw):
            return item.render(self.token)
        return str(item)

    async def close(self) -> None:
        self.closed = True
        self._sandbox.closed_contexts.append(self.id)
        for event in self._waiting:  # a run in progress ends with the context
            event.set()


class FakeSandbox(Sandbox, Toolbox):
    """See the module docstring. Everything the session asks of it is recorded. It is its own toolbox,
    so a test overrides a lifecycle or a toolbox method in one subclass."""

    def __init__(self, runs: list[Run] | None = None, workdir: str = "/home/daytona/workspace") -> None:
        self.id = "fake-sandbox"
        self.toolbox = self
        self.workdir = workdir
        self.runs: list[Run] = list(runs or [])
        self.bootstrap_run: Run | None = None
        self.start_errors: list[BaseException] = []  # raised by start(), one per call, before it succeeds
        self.start_wait: asyncio.Event | None = None  # start() holds here until it is set (a slow provisioning)
        self.progress_lines: list[str] = ["creating sandbox…"]
        self.codes: list[str] = []
        self.contexts: list[FakeContext] = []
        self.closed_contexts: list[str] = []
        self.commands: list[str] = []
        self.exec_results: dict[str, ExecResult] = {}
        self.uploads: list[tuple[bytes, str]] = []
        self.files: dict[str, bytes] = {}
        self.download_limits: list[dict[str, int] | None] = []  # the ``limits`` of each download
        self.starts = 0
        self.shut_down = False

    def next_run(self) -> Run:
        if not self.runs:
            raise AssertionError("the session ran more code than the test scripted")
        return self.runs.pop(0)

    @staticmethod
    def closed_error() -> BaseException:
        from daytona_kernel.errors import ContextDied

        return ContextDied("the context was deleted")

    @property
    def description(self) -> str:
        return "fake sandbox"

    async def info(self) -> dict[str, str]:
        return {"sandbox": self.id, "state": "started"}

    async def start(self, progress: ProgressCallback) -> None:
        self.starts += 1
        for line in self.progress_lines:
            progress(line)
        if self.start_wait is not None:
            await self.start_wait.wait()
        if self.start_errors:
            raise self.start_errors.pop(0)

    async def create_context(self) -> FakeContext:
        context = FakeContext(self, len(self.contexts) + 1)
        self.contexts.append(context)
        return context

    async def exec(self, command: str, timeout: float | None = None) -> ExecResult:
        self.commands.append(command)
        return self.exec_results.get(command, ExecResult(0, ""))

    async def upload(self, files: list[tuple[bytes, str]]) -> None:
        self.uploads.extend(files)
        for content, path in files:
            self.files[path] = content

    async def download(self, paths: list[str], limits: dict[str, int] | None = None) -> dict[str, bytes | FileError]:
        self.download_limits.append(limits)
        limits = limits or {}
        out: dict[str, bytes | FileError] = {}
        for p in paths:
            content = self.files.get(p)
            if content is None:
                out[p] = FileError("no such file in the fake sandbox", retry=False)
            elif len(content) > limits.get(p, len(content)):
                out[p] = FileError(f"it is more than {limits[p]} bytes", retry=False, over_limit=True)
            else:
                out[p] = content
        return out

    async def clone(self, url: str, ref: str | None, dest: str, username: str | None, password: str | None) -> None:
        self.commands.append(f"clone {url} {ref} {dest}")

    async def remove(self, paths: list[str]) -> None:
        for path in paths:
            self.files.pop(path, None)

    async def shutdown(self) -> None:
        self.shut_down = True
