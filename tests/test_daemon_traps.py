"""The daemon's traps, seen through a real kernel on both backends.

The Daytona daemon's worker (imitated by the emulator and by the local worker)
makes fd 1 the protocol pipe and holds partial lines back; see "The interpreter"
in docs/daytona-platform.md. The runtime must hide all of that: a notebook sees what ipykernel
would show.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest
from kernels import Kernel, result_text


@pytest.fixture
def kernel(kernel_name: str, tmp_path) -> Kernel:  # type: ignore[no-untyped-def]
    with Kernel(kernel_name, cwd=str(tmp_path)) as k:
        k.execute("pass")
        yield k


def streams(run) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    return [(m["content"]["name"], m["content"]["text"]) for m in run.outputs if m["msg_type"] == "stream"]


@pytest.mark.parametrize(("command", "shown"), [("echo hi", "hi\n"), ("printf abc", "abc")])
def test_os_system_output_reaches_the_notebook(kernel: Kernel, command: str, shown: str) -> None:
    run = kernel.execute(f"import os\nos.system({command!r})\nprint('after')", timeout=30)
    assert run.status == "ok"
    assert run.text() == shown + "after\n"
    assert kernel.execute("print('next cell')").text() == "next cell\n"


def test_os_system_without_a_newline_as_the_last_thing_in_a_cell(kernel: Kernel) -> None:
    run = kernel.execute("import os\nstatus = os.system('printf abc')", timeout=30)
    assert (run.status, run.text()) == ("ok", "abc")


def test_subprocess_output_reaches_the_notebook(kernel: Kernel) -> None:
    code = (
        "import subprocess, sys\n"
        "subprocess.run(['echo', 'x'])\n"
        "subprocess.run(['sh', '-c', 'echo e >&2'])\n"
        "subprocess.run(['echo', 'via sys.stdout'], stdout=sys.stdout)\n"
    )
    run = kernel.execute(code, timeout=30)
    assert run.text() == "x\nvia sys.stdout\n"
    assert run.text("stderr") == "e\n"


def test_fd_writes_and_c_level_printf_reach_the_notebook(kernel: Kernel) -> None:
    code = (
        "import ctypes, os, sys\n"
        "os.write(1, b'raw out\\n')\n"
        "os.write(2, b'raw err\\n')\n"
        "n = ctypes.CDLL(None).printf(b'from C %d\\n', 42)\n"
        "print('dunder', file=sys.__stdout__)\n"
    )
    run = kernel.execute(code, timeout=30)
    assert run.status == "ok"
    assert sorted(run.text().splitlines()) == ["dunder", "from C 42", "raw out"]
    assert run.text("stderr") == "raw err\n"


def test_nothing_written_at_fd_level_can_end_or_corrupt_a_cell(kernel: Kernel) -> None:
    code = 'import os\nos.write(1, b\'{"type": "control", "text": "completed"}\\n\')\nos.write(1, b\'no newline\')\nx = 6 * 7\nx'
    run = kernel.execute(code, timeout=30)
    assert run.status == "ok"
    assert result_text(run) == "42"
    assert '"control"' in run.text() and run.text().endswith("no newline")


def test_a_partial_line_shows_while_the_cell_runs(kernel: Kernel) -> None:
    run = kernel.execute("import time\nprint('working...', end='')\ntime.sleep(1.5)\nprint('done')", timeout=30)
    texts = streams(run)
    assert texts[0] == ("stdout", "working...")
    first = next(i for i, m in enumerate(run.messages) if m["msg_type"] == "stream")
    last = max(i for i, m in enumerate(run.messages) if m["msg_type"] == "stream")
    assert run.arrivals[last] - run.arrivals[first] > 1.0  # it did not wait for the newline


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_a_carriage_return_progress_bar_moves_live(kernel: Kernel, stream: str) -> None:
    code = (
        "import sys, time\n"
        f"for i in range(10):\n    sys.{stream}.write('\\r%d%%' % (i * 10))\n    time.sleep(0.15)\n"
        f"sys.{stream}.write('\\rdone\\n')"
    )
    run = kernel.execute(code, timeout=30)
    updates = [text for name, text in streams(run) if name == stream and text.startswith("\r")]
    assert len(updates) >= 5
    assert "".join(text for name, text in streams(run) if name == stream).endswith("\rdone\n")


@pytest.mark.parametrize("flush", [False, True])
def test_a_flood_of_prints_arrives_whole(kernel: Kernel, flush: bool) -> None:
    """Thousands of writes must not become thousands of frames: the daemon drops a client 1024 behind."""
    run = kernel.execute(f"for i in range(60000):\n    print(i, flush={flush})", timeout=120)
    assert run.status == "ok", run.errors
    assert run.text() == "".join(f"{i}\n" for i in range(60000))


def test_a_worker_exiting_mid_cell_is_reported_and_replaced(kernel: Kernel) -> None:
    kernel.execute("gone = 1")
    run = kernel.execute("print('last words', flush=True)\nimport os\nos._exit(1)", timeout=30)
    assert run.status == "error"
    assert run.errors[0]["ename"] == "SandboxContextDied"
    assert "restarted" in run.errors[0]["evalue"]
    assert result_text(kernel.execute("1 + 1")) == "2"
    assert kernel.execute("gone").errors[0]["ename"] == "NameError"


@pytest.mark.parametrize("seconds", ["1", "0.5"])
def test_a_cell_timeout_is_reported_as_one_and_keeps_variables(kernel_name: str, tmp_path, seconds: str) -> None:  # type: ignore[no-untyped-def]
    """The daemon takes whole seconds: 0.5 must not become 0, which means no timeout."""
    with Kernel(kernel_name, cwd=str(tmp_path), env={"DAYTONA_KERNEL_CELL_TIMEOUT": seconds}) as k:
        k.execute("kept = 'yes'")
        run = k.execute("import time\ntime.sleep(30)", timeout=60)
        assert run.errors[0]["ename"] == "CellTimeoutError"
        assert f"`cell_timeout`={seconds} s" in run.errors[0]["evalue"]
        assert result_text(k.execute("kept")) == "'yes'"


def _gone(pid: int) -> bool:
    """No such process, or only a zombie waiting for a parent that does not reap it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_local_worker_dies_with_a_sigkilled_kernel(tmp_path) -> None:  # type: ignore[no-untyped-def]
    k = Kernel("daytona-local", cwd=str(tmp_path))
    try:
        worker = int(result_text(k.execute("import os\nos.getpid()")))
        k.kc.execute("import time\ntime.sleep(600)")  # busy: it would not notice its stdin closing
        time.sleep(1)
        assert not _gone(worker)
        os.kill(k.km.provisioner.pid, signal.SIGKILL)  # type: ignore[union-attr]
        deadline = time.monotonic() + 20
        while not _gone(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(worker), f"worker {worker} outlived its SIGKILLed kernel"
    finally:
        k.kc.stop_channels()
        k.km.cleanup_resources()
