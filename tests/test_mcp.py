"""``daytona-kernel mcp`` driven by the mcp SDK's own stdio client, on both backends.

One server per backend for the class. Each test sets up the state it reads, so the tests hold in any
order and on any xdist worker; the transcript test checks every run this server was sent.
"""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import nbformat
import pytest

pytest.importorskip("mcp", reason="needs the mcp SDK from the test extra: pip install -e '.[test]'")
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client

from daytona_kernel.agent import LOCAL_WARNING, RESTARTED

pytestmark = pytest.mark.timeout(300)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TOOLS = {"run_python", "interrupt", "restart", "status", "list_variables", "upload_file", "download_file"}
SERVER = [sys.executable, "-c", "import sys; from daytona_kernel.cli import main; sys.exit(main())", "mcp"]


class McpServer:
    """A stdio MCP client session on a loop thread of its own, so the tests can call tools concurrently."""

    def __init__(self, kernel: str, folder: Path, notebook: Path, errlog: Path, env: dict[str, str]) -> None:
        self.notebook, self.errlog = notebook, errlog
        self.codes: list[str] = []  # every run_python call, for the transcript test
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._ready: Future[Client] = Future()
        args = [*SERVER[1:], "--kernel", kernel, "--folder", str(folder), "--notebook", str(notebook)]
        self._params = StdioServerParameters(command=SERVER[0], args=args, env=env, cwd=str(folder))
        self._session = asyncio.run_coroutine_threadsafe(self._serve(), self._loop)
        self.client = self._ready.result(timeout=180)

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        try:
            with self.errlog.open("w") as err:
                async with Client(stdio_client(self._params, errlog=err)) as client:
                    self._ready.set_result(client)
                    await self._stop.wait()
        except BaseException as exc:
            if not self._ready.done():
                self._ready.set_exception(exc)
            raise

    def call(self, tool: str, **arguments: Any) -> Any:
        return self.submit(tool, **arguments).result(timeout=240)

    def submit(self, tool: str, progress: Any = None, **arguments: Any) -> Future[Any]:
        if tool == "run_python":
            self.codes.append(arguments["code"])
        return asyncio.run_coroutine_threadsafe(self.client.call_tool(tool, arguments, progress_callback=progress), self._loop)

    def tools(self) -> Any:
        return asyncio.run_coroutine_threadsafe(self.client.list_tools(), self._loop).result(timeout=60)

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._session.result(timeout=120)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def text(result: Any) -> str:
    return "\n".join(c.text for c in result.content if c.type == "text")


def server_env(kernel: str, emulator: Any) -> dict[str, str]:
    env = dict(os.environ)
    if kernel == "daytona":
        env.update(emulator.env())
    return env


@pytest.fixture(scope="class", params=["daytona-local", "daytona"])
def server(request: pytest.FixtureRequest, emulator: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[McpServer]:
    root = tmp_path_factory.mktemp("mcp")
    (root / "project").mkdir()
    mcp = McpServer(
        request.param, root / "project", root / "agent.ipynb", root / "server.log", server_env(request.param, emulator)
    )
    yield mcp
    mcp.close()


class TestMcpServer:
    def test_lists_its_tools_with_descriptions(self, server: McpServer) -> None:
        tools = {t.name: t for t in server.tools().tools}
        assert set(tools) == TOOLS
        assert all(t.description for t in tools.values())
        assert "code" in tools["run_python"].input_schema["properties"]
        assert "\n    " not in tools["run_python"].description  # no source indentation
        assert tools["restart"].annotations.destructive_hint and tools["status"].annotations.read_only_hint
        local = "--kernel daytona-local" in " ".join(server._params.args)
        assert (LOCAL_WARNING in server.errlog.read_text()) == local

    def test_state_persists_between_calls(self, server: McpServer) -> None:
        assert not server.call("run_python", code="x = 41").is_error
        result = server.call("run_python", code="x + 1")
        assert not result.is_error and text(result).endswith("\n42\n")

    def test_output_comes_as_progress_while_the_call_runs(self, server: McpServer) -> None:
        messages: list[str] = []

        async def progress(value: float, total: float | None, message: str | None) -> None:
            messages.append(message or "")

        code = "import time\nprint('first', flush=True)\ntime.sleep(1)\nprint('second')"
        result = server.submit("run_python", progress=progress, code=code).result(timeout=240)
        assert "".join(messages) == "first\nsecond\n" and text(result).endswith("first\nsecond\n")

    def test_a_figure_comes_back_as_image_content(self, server: McpServer) -> None:
        result = server.call("run_python", code="import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()")
        images = [c for c in result.content if c.type == "image"]
        assert [i.mime_type for i in images] == ["image/png"]
        assert base64.b64decode(images[0].data).startswith(PNG_MAGIC)

    def test_an_error_comes_back_as_an_error_with_its_traceback(self, server: McpServer) -> None:
        result = server.call("run_python", code="def f():\n    return 1 / 0\nf()")
        assert result.is_error
        assert "return 1 / 0" in text(result) and "ZeroDivisionError: division by zero" in text(result)

    def test_interrupt_from_a_concurrent_call_keeps_the_variables(self, server: McpServer) -> None:
        server.call("run_python", code="kept = 'still here'")
        running = server.submit("run_python", code="import time\ntime.sleep(60)")
        while text(answer := server.call("interrupt")) == "Nothing was running.":  # the run's call is not in yet
            time.sleep(0.2)
        assert text(answer).startswith("Interrupted: the running run_python call ended")
        assert running.result().is_error and "KeyboardInterrupt" in text(running.result())
        assert text(server.call("run_python", code="kept")).endswith("'still here'\n")

    def test_a_timeout_interrupts_and_says_the_variables_are_kept(self, server: McpServer) -> None:
        server.call("run_python", code="y = 5")
        result = server.call("run_python", code="import time\ntime.sleep(60)", timeout=3)
        assert result.is_error and "the variables are kept" in text(result)
        assert text(server.call("run_python", code="y * 2")).endswith("10\n")

    def test_restart_loses_the_variables(self, server: McpServer) -> None:
        server.call("run_python", code="gone = 1")
        assert text(server.call("restart")) == RESTARTED
        result = server.call("run_python", code="gone")
        assert result.is_error and "NameError" in text(result)

    def test_lists_variables(self, server: McpServer) -> None:
        server.call("run_python", code="alpha = [1, 2, 3]")
        listing = text(server.call("list_variables"))
        assert "alpha: list (size 3) = [1, 2, 3]" in listing.splitlines()

    def test_status_says_where_the_code_runs(self, server: McpServer) -> None:
        status = text(server.call("status"))
        backend = "local" if "--kernel daytona-local" in " ".join(server._params.args) else "daytona"
        assert f"backend: {backend}" in [" ".join(line.split()) for line in status.splitlines()]
        assert "kernel uptime:" in status

    def test_files_go_in_and_out_through_the_mirror(self, server: McpServer) -> None:
        folder = Path(server._params.cwd or "")
        (folder / "in.txt").write_text("laptop")
        assert "uploaded 1 file(s)" in text(server.call("upload_file", path="in.txt"))
        server.call("run_python", code="open('out.txt', 'w').write(open('in.txt').read() * 2)")
        (folder / "out.txt").unlink(missing_ok=True)
        assert "downloaded 1 file(s)" in text(server.call("download_file", path="out.txt"))
        assert (folder / "out.txt").read_text() == "laptoplaptop"

    def test_every_call_is_in_the_transcript(self, server: McpServer) -> None:
        server.call("run_python", code="print('for the transcript')")
        nb = nbformat.read(server.notebook, as_version=4)
        nbformat.validate(nb)
        assert [c.source for c in nb.cells] == server.codes
        assert nb.cells[-1].outputs[0]["text"] == "for the transcript\n"


@pytest.mark.slow
def test_the_key_never_appears_even_when_authentication_fails(emulator: Any, tmp_path: Path) -> None:
    key = "dtn_refused0123456789abcdefXYZ"
    (tmp_path / "project").mkdir()
    (tmp_path / "tmp").mkdir()
    env = dict(server_env("daytona", emulator), DAYTONA_API_KEY=key, TMPDIR=str(tmp_path / "tmp"))
    mcp = McpServer("daytona", tmp_path / "project", tmp_path / "agent.ipynb", tmp_path / "server.log", env)
    try:
        run = mcp.call("run_python", code="1 + 1", timeout=120)
        status = mcp.call("status")
    finally:
        mcp.close()
    assert run.is_error, text(run)
    assert not list((tmp_path / "tmp").glob("dk-agent-*"))  # the kernel was shut down and its connection file removed
    seen = [text(run), text(status), (tmp_path / "agent.ipynb").read_text(), (tmp_path / "server.log").read_text()]
    assert "Daytona refused" in seen[0] or "401" in seen[0] or "auth" in seen[0].lower(), seen[0]
    assert not [s for s in seen if key in s]


@pytest.mark.slow
@pytest.mark.parametrize("folder", ["/", "~"])
def test_refuses_the_root_or_home_as_the_project(folder: str) -> None:
    proc = subprocess.run(
        [*SERVER, "--kernel", "daytona-local", "--folder", folder],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 2 and "is not a project folder" in proc.stderr and proc.stdout == ""
