"""``daytona-kernel mcp``: a Model Context Protocol server over stdio for coding agents.

A thin layer over the agent API (``agent.AsyncAgentKernel``): it starts one daytona-kernel in the
folder it is given when the client connects, and shuts it down when the client disconnects. Each
tool is one API call; its result is MCP content: text in the order the cell produced it, images as
image content, an error as an error result with its traceback, the kernel's notices in a block of
their own. Needs the official ``mcp`` SDK: ``pip install 'daytona-kernel[mcp]'``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Callable, TypeVar

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import CallToolResult, ContentBlock, ImageContent, TextContent, ToolAnnotations

from . import __version__
from .agent import LOCAL_WARNING, AsyncAgentKernel
from .agent_results import RunResult, redact

__all__ = ["DEFAULT_TIMEOUT_S", "build_server", "main", "result_content"]

log = logging.getLogger("daytona_kernel.mcp")
F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_TIMEOUT_S = 600.0
PROGRESS_CHARS = 2000  # of each piece of output, in a progress notification
INSTRUCTIONS = """\
Runs Python in a persistent IPython session inside a Daytona sandbox, isolated from this machine
(unless the server says it uses the daytona-local kernel). Variables persist between run_python
calls, like notebook cells. The project folder is mirrored into the sandbox's working directory
before each run, and the files the code writes there come back. Use interrupt to stop a long run
(variables are kept) and restart for a clean interpreter (variables are lost). input() is not
available: pass values in the code."""


class _RedactingFilter(logging.Filter):
    """No log line carries a credential from the environment (DAYTONA_API_KEY ...)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = redact(record.getMessage()), None
        return True


def result_content(result: RunResult) -> CallToolResult:
    """A run's result as an MCP tool result: text, images, notices; ``is_error`` when the cell raised."""
    content: list[ContentBlock] = []
    header = f"[execution count {result.execution_count}]" if result.execution_count is not None else ""
    text = result.text or ("" if result.images else "(no output)")
    content.append(TextContent(type="text", text=f"{header}\n{text}" if header else text))
    for image in result.images:
        content.append(ImageContent(type="image", data=image.data, mime_type=image.mime))
    if result.notices:
        content.append(TextContent(type="text", text="daytona-kernel notices:\n" + "".join(result.notices)))
    return CallToolResult(content=content, is_error=not result.ok)


class Progress:
    """A run's output as MCP progress notifications, so the client can show it while the call runs (a client
    that asked for no progress gets none: the SDK drops them)."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self._count = 0
        self._sending: set[asyncio.Future[None]] = set()

    def output(self, text: str) -> None:
        self._count += 1
        sending = asyncio.ensure_future(self._ctx.report_progress(self._count, None, text[-PROGRESS_CHARS:]))
        self._sending.add(sending)
        sending.add_done_callback(self._sending.discard)

    async def sent(self) -> None:
        """Wait until every notification is out: none may follow the call's result."""
        for outcome in await asyncio.gather(*self._sending, return_exceptions=True):
            if isinstance(outcome, Exception):
                log.info("a progress notification was not sent: %s", outcome)


def build_server(kernel: AsyncAgentKernel) -> MCPServer:
    """The MCP server whose tools drive ``kernel``; it starts the kernel when a client connects."""

    @asynccontextmanager
    async def lifespan(_server: Any) -> AsyncIterator[None]:
        log.info("starting kernel %s in %s", kernel.kernel_name, kernel.folder)
        await kernel.start()
        try:
            yield
        finally:
            log.info("the client disconnected: shutting the kernel down")
            await kernel.shutdown()

    instructions = INSTRUCTIONS + ("\n\nWARNING: " + LOCAL_WARNING if kernel.is_local else "")
    server = MCPServer("daytona-kernel", instructions=instructions, version=__version__, lifespan=lifespan)

    _add_run_tools(server, kernel)
    _add_session_tools(server, kernel)
    return server


def _tool(server: MCPServer, annotations: ToolAnnotations) -> Callable[[F], F]:
    """``server.tool`` with the function's docstring as its description, without the source's indentation."""

    def register(fn: F) -> F:
        return server.tool(description=inspect.cleandoc(fn.__doc__ or ""), annotations=annotations)(fn)

    return register


def _add_run_tools(server: MCPServer, kernel: AsyncAgentKernel) -> None:
    """run_python, interrupt, restart."""

    @_tool(server, ToolAnnotations(destructive_hint=False, idempotent_hint=False, open_world_hint=True))
    async def run_python(code: str, ctx: Context, timeout: float = DEFAULT_TIMEOUT_S) -> CallToolResult:
        """Run Python code in the sandboxed IPython session and return what it printed and displayed.

        State persists between calls (variables, imports), like notebook cells; IPython syntax works
        (`!pip install x`, `%timeit`). Output comes back in order: stdout, stderr, the last expression's
        value, and an exception's traceback (then the result is an error). Figures come back as images.
        Past `timeout` seconds the code is interrupted and the variables are kept."""
        progress = Progress(ctx)
        result = await kernel.run(code, timeout=timeout, on_output=progress.output)
        await progress.sent()
        return result_content(result)

    @_tool(server, ToolAnnotations(destructive_hint=False))
    async def interrupt() -> str:
        """Interrupt the code that run_python is running now (a KeyboardInterrupt) and wait until that call
        has returned; variables are kept."""
        if await kernel.interrupt():
            return "Interrupted: the running run_python call ended (KeyboardInterrupt); the variables are kept."
        if kernel.busy:
            return "The running code did not stop within 2 minutes of interrupts; restart ends it (variables are lost)."
        return "Nothing was running."

    @_tool(server, ToolAnnotations(destructive_hint=True))
    async def restart() -> str:
        """Restart the Python interpreter: every variable and import is lost; files stay."""
        return await kernel.restart()


def _add_session_tools(server: MCPServer, kernel: AsyncAgentKernel) -> None:
    """status, list_variables, upload_file, download_file."""

    @_tool(server, ToolAnnotations(read_only_hint=True))
    async def status() -> str:
        """Where the code runs: backend, sandbox id and state, resources, and how long the kernel has run."""
        return (await kernel.status()).text()

    @_tool(server, ToolAnnotations(read_only_hint=True))
    async def list_variables() -> str:
        """The variables defined in the session: name, type, size and a short repr."""
        found = await kernel.variables()
        if not found:
            return "No variables are defined."
        return "\n".join(f"{v.name}: {v.type}{f' (size {v.size})' if v.size else ''} = {v.repr}" for v in found)

    @_tool(server, ToolAnnotations(destructive_hint=False))
    async def upload_file(path: str, dest: str | None = None) -> str:
        """Copy a file or folder from the project folder into the sandbox's working directory (the
        project is also mirrored before every run_python; use this for files the mirror leaves out)."""
        return await kernel.upload(path, dest)

    @_tool(server, ToolAnnotations(destructive_hint=False))
    async def download_file(path: str, dest: str | None = None) -> str:
        """Copy a file the code wrote in the sandbox into the project folder. Files this machine could
        run by themselves (hidden names such as .vscode/, a .pth, AGENTS.md) are refused."""
        return await kernel.download(path, dest)


def folder_problem(folder: str) -> str | None:
    """Why ``folder`` cannot be the agent's project (clients may start servers in / or in your home)."""
    path = Path(folder).expanduser().resolve()
    if not path.is_dir():
        return f"the folder {path} does not exist; give the project with --folder PATH"
    if path == Path(path.anchor) or path == Path.home().resolve():
        return f"{path} is not a project folder (the kernel would mirror all of it); give the project with --folder PATH"
    return None


def main(kernel_name: str, folder: str, notebook: str | None) -> int:
    """``daytona-kernel mcp``: serve until the client disconnects."""
    handler = logging.StreamHandler(sys.stderr)  # stdout is the protocol's
    handler.addFilter(_RedactingFilter())
    handler.setFormatter(logging.Formatter("daytona-kernel mcp: %(levelname)s %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    problem = folder_problem(folder)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    from .transcript import TranscriptError

    try:
        kernel = AsyncAgentKernel(kernel_name, folder, notebook=notebook)
    except TranscriptError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    build_server(kernel).run("stdio")
    return 0
