"""The agent API (daytona_kernel.agent) on both backends: one kernel per backend for the class.

Each test sets up the state it reads, so the tests hold in any order and on any xdist worker.
"""

from __future__ import annotations

import asyncio
import base64
import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest

from daytona_kernel.agent import LOCAL_WARNING, RESTARTED, AgentKernel, AsyncAgentKernel
from daytona_kernel.agent_calls import NO_INPUT

pytestmark = pytest.mark.timeout(300)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def backend_env(name: str, emulator: Any) -> dict[str, str]:
    env = dict(os.environ)
    if name == "daytona":
        env.update(emulator.env())
    return env


@pytest.fixture(scope="class", params=["daytona-local", "daytona"])
def agent(request: pytest.FixtureRequest, emulator: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentKernel]:
    root = tmp_path_factory.mktemp("agent")
    (root / "project").mkdir()
    with AgentKernel(
        request.param, root / "project", notebook=root / "transcript.ipynb", env=backend_env(request.param, emulator)
    ) as kernel:
        yield kernel


def start_sleeping(kernel: AgentKernel, results: list[Any]) -> threading.Thread:
    """A 60 s run in another thread, once it is in flight."""
    thread = threading.Thread(target=lambda: results.append(kernel.run("import time\ntime.sleep(60)")))
    thread.start()
    while not kernel.kernel.busy:
        time.sleep(0.05)
    return thread


class TestAgentApi:
    def test_state_persists_between_runs(self, agent: AgentKernel) -> None:
        first = agent.run("x = 41")
        second = agent.run("print('x is', x)\nx + 1")
        assert first.ok and second.ok, (first, second)
        assert second.text == "x is 41\n42\n"
        assert second.execution_count == (first.execution_count or 0) + 1

    def test_output_is_handed_over_as_it_comes(self, agent: AgentKernel) -> None:
        pieces: list[str] = []
        result = agent.run("import sys\nprint('one', flush=True)\nprint('two', file=sys.stderr)\n3", on_output=pieces.append)
        assert "".join(pieces) == "one\ntwo\n" and result.text == "one\ntwo\n3\n"

    def test_a_figure_comes_back_as_an_image(self, agent: AgentKernel) -> None:
        result = agent.run("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()")
        assert result.ok, result.text
        assert [i.mime for i in result.images] == ["image/png"]
        assert base64.b64decode(result.images[0].data).startswith(PNG_MAGIC)

    def test_an_error_comes_back_with_its_traceback(self, agent: AgentKernel) -> None:
        result = agent.run("print('before')\ndef f():\n    return 1 / 0\nf()")
        assert not result.ok and result.error is not None
        assert (result.error.name, result.error.value) == ("ZeroDivisionError", "division by zero")
        assert any("return 1 / 0" in line for line in result.error.traceback)
        assert "\x1b[" not in result.text  # plain text, no terminal colours
        assert result.text.index("before") < result.text.index("ZeroDivisionError")

    def test_an_interrupt_from_another_thread_keeps_the_variables(self, agent: AgentKernel) -> None:
        agent.run("kept = 'still here'")
        results: list[Any] = []
        thread = start_sleeping(agent, results)
        assert agent.interrupt() is True  # it waits for the run to end
        thread.join()
        assert results[0].interrupted and results[0].error.name == "KeyboardInterrupt", results[0]
        after = agent.run("kept")
        assert after.text == "'still here'\n", after

    def test_a_timeout_interrupts_and_says_the_variables_are_kept(self, agent: AgentKernel) -> None:
        agent.run("y = 5")
        result = agent.run("import time\ntime.sleep(60)", timeout=3)
        assert result.timed_out and result.interrupted
        assert any("timeout of 3 s and was interrupted; the variables are kept" in n for n in result.notices)
        assert agent.run("y * 2").text == "10\n"

    def test_long_output_is_cut_with_a_note_naming_the_whole_text(
        self, agent: AgentKernel, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(agent.kernel, "output_chars", 3000)
        result = agent.run("for i in range(2000):\n    print(f'line {i}')\nraise ValueError('at the end')")
        assert result.truncated and len(result.text) < 3500
        assert result.text.startswith("line 0\n") and "ValueError: at the end" in result.text  # the head and the tail
        path = re.search(r"the full text is in (\S+)\]", result.text)
        assert path is not None
        whole = Path(path.group(1)).read_text()
        assert "line 1000\nline 1001\n" in whole and "line 1000\n" not in result.text

    def test_restart_loses_the_variables_and_says_so(self, agent: AgentKernel) -> None:
        agent.run("gone = 1")
        assert agent.restart() == RESTARTED
        result = agent.run("gone")
        assert result.error is not None and result.error.name == "NameError"

    def test_variables_lists_names_types_and_reprs(self, agent: AgentKernel) -> None:
        agent.run("import os\nalpha = [1, 2, 3]\ndef helper(): pass\n_private = 1")
        found = {v.name: v for v in agent.variables()}
        assert (found["alpha"].type, found["alpha"].repr, found["alpha"].size) == ("list", "[1, 2, 3]", "3")
        assert not {"os", "helper", "_private", "In", "Out"} & set(found)
        assert agent.run("alpha").execution_count is not None  # the listing left the session as it was

    def test_input_fails_at_once_with_a_clear_error(self, agent: AgentKernel) -> None:
        result = agent.run("answer = input('name? ')", timeout=60)
        assert result.error is not None and result.error.name == "StdinNotImplementedError"
        assert not result.timed_out
        assert NO_INPUT + "\n" in result.notices

    def test_kernel_notices_are_kept_apart_from_the_cells_stderr(self, agent: AgentKernel) -> None:
        (agent.kernel.folder / ".env").write_text("TOKEN=not-for-the-sandbox\n")  # the mirror keeps it here, with a notice
        result = agent.run("import sys\nprint('mine', file=sys.stderr)")
        assert result.text == "mine\n"
        assert any("look like secrets: .env" in n for n in result.notices), result.notices

    def test_html_comes_back_as_text_without_its_scripts(self, agent: AgentKernel) -> None:
        result = agent.run("from IPython.display import HTML, display\ndisplay(HTML('<b>bold</b><script>alert(1)</script>'))")
        assert result.text == "bold\n"
        assert "script" not in str(result.outputs)  # the transcript too: even a kernel that trusts its sandbox

    def test_upload_and_download_go_through_the_mirror(self, agent: AgentKernel) -> None:
        (agent.kernel.folder / "data.txt").write_text("from the laptop")
        assert "uploaded 1 file(s)" in agent.upload("data.txt")
        agent.run("open('made.txt', 'w').write(open('data.txt').read().upper())")
        (agent.kernel.folder / "made.txt").unlink(missing_ok=True)  # the mirror brought it back; take it again by hand
        assert "downloaded 1 file(s)" in agent.download("made.txt")
        assert (agent.kernel.folder / "made.txt").read_text() == "FROM THE LAPTOP"

    @pytest.mark.parametrize("name", [".vscode/tasks.json", "evil.pth", "AGENTS.md"])
    def test_download_refuses_what_this_machine_could_run(self, agent: AgentKernel, name: str) -> None:
        agent.run(f"import os\nos.makedirs(os.path.dirname({name!r}) or '.', exist_ok=True)\nopen({name!r}, 'w').write('x')")
        with pytest.raises(PermissionError, match="is not written here"):
            agent.download(name)
        assert not (agent.kernel.folder / name).exists()

    def test_status_names_the_backend_and_the_uptime(self, agent: AgentKernel) -> None:
        info = agent.status()
        assert info["backend"] == ("local" if agent.kernel.is_local else "daytona")
        assert info["sandbox"] and info["kernel uptime"].endswith(" s (since this client started it)")
        assert ("isolation" in info) == agent.kernel.is_local

    def test_a_second_client_attaches_by_connection_file(self, agent: AgentKernel) -> None:
        agent.run("shared = 'seen by both'")
        assert agent.kernel.connection_file is not None and agent.kernel.folder not in agent.kernel.connection_file.parents
        with AgentKernel(agent.kernel.kernel_name, agent.kernel.folder, connection_file=agent.kernel.connection_file) as other:
            assert other.run("shared").text == "'seen by both'\n"
            with pytest.raises(RuntimeError, match="restart needs the kernel's manager"):
                other.restart()
        assert agent.run("shared").text == "'seen by both'\n"  # leaving did not shut the kernel down

    def test_every_run_is_in_the_transcript(self, agent: AgentKernel) -> None:
        codes = ["marker_a = 'transcript-a'", "print(marker_a)"]
        for code in codes:
            agent.run(code)
        assert agent.kernel.transcript is not None
        nb = nbformat.read(agent.kernel.transcript.path, as_version=4)
        nbformat.validate(nb)
        assert nb.metadata.kernelspec.display_name == ("Python (Daytona local)" if agent.kernel.is_local else "Python (Daytona)")
        cells = nb.cells[-2:]
        assert [c.source for c in cells] == codes
        assert cells[1].outputs[0]["text"] == "transcript-a\n"


@pytest.mark.slow
async def test_async_api_and_a_concurrent_interrupt(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The async core: a context manager, and an interrupt from another task while run() waits."""
    async with AsyncAgentKernel("daytona-local", tmp_path) as kernel:
        assert LOCAL_WARNING in caplog.text
        await kernel.run("n = 3")
        running = asyncio.ensure_future(kernel.run("import time\ntime.sleep(60)"))
        while not kernel.busy:
            await asyncio.sleep(0.05)
        assert await kernel.interrupt() is True
        assert running.done() and running.result().interrupted
        assert (await kernel.run("n")).text == "3\n"
    assert not list(tmp_path.glob("kernel*.json"))  # the connection file never was in the project


@pytest.mark.slow
def test_a_refused_key_never_appears_in_results_or_the_transcript(
    emulator: Any, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    key = "dtn_refused0123456789abcdefXYZ"
    env = dict(backend_env("daytona", emulator), DAYTONA_API_KEY=key)
    (tmp_path / "project").mkdir()
    with AgentKernel("daytona", tmp_path / "project", notebook=tmp_path / "t.ipynb", env=env) as kernel:
        result = kernel.run("1 + 1", timeout=120)
        status = kernel.status()
    assert not result.ok, result.text
    seen = result.text + "".join(result.notices) + str(result.outputs) + status.text() + (tmp_path / "t.ipynb").read_text()
    captured = capfd.readouterr()
    assert key not in seen and key not in captured.err and key not in captured.out


@pytest.mark.slow
def test_a_kernel_that_dies_ends_the_run_and_restart_brings_it_back(tmp_path: Path) -> None:
    with AgentKernel("daytona-local", tmp_path) as kernel:
        kernel.run("before = 1")
        results: list[Any] = []
        thread = threading.Thread(target=lambda: results.append(kernel.run("import time\ntime.sleep(60)")))
        thread.start()
        assert kernel.kernel._km is not None
        while not results:  # kill the kernel process itself (not the sandbox's worker) while the run waits
            kernel.kernel._km.provisioner.process.kill()
            thread.join(1.0)
        assert results[0].error is not None and results[0].error.name == "KernelDied"
        assert "restart" in results[0].error.value
        assert kernel.restart() == RESTARTED
        assert kernel.run("before").error.name == "NameError"
