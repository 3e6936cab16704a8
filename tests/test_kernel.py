"""The kernel core on the local backend, driven through jupyter_client."""

from __future__ import annotations

import base64
import hashlib
import re
import threading
import time
from pathlib import Path

import pytest
from kernels import Kernel


@pytest.fixture(scope="module")
def kernel() -> Kernel:
    with Kernel("daytona-local") as k:
        k.execute("pass")
        yield k


def test_kernel_info_describes_python_and_the_backend(kernel: Kernel) -> None:
    info = kernel.request("kernel_info")
    lang = info["language_info"]
    assert lang["name"] == "python"
    assert lang["mimetype"] == "text/x-python"
    assert lang["file_extension"] == ".py"
    assert lang["pygments_lexer"] == "ipython3"
    assert lang["codemirror_mode"] == {"name": "ipython", "version": 3}
    assert lang["nbconvert_exporter"] == "python"
    assert lang["version"].count(".") == 2
    assert "local backend" in info["banner"]
    assert info["implementation"] == "daytona-kernel"
    assert "debugger" in info.get("supported_features", [])
    assert "kernel subshells" not in info.get("supported_features", [])


def test_output_streams_while_the_cell_runs(kernel: Kernel) -> None:
    run = kernel.execute("import time\nprint('first', flush=True)\ntime.sleep(3)\nprint('second')")
    streams = [(t, m) for t, m in zip(run.arrivals, run.messages) if m["msg_type"] == "stream"]
    idle_at = run.arrivals[-1]
    assert streams[0][1]["content"]["text"] == "first\n"
    assert idle_at - streams[0][0] > 2.0, "the first chunk should arrive long before the cell ends"
    assert run.text() == "first\nsecond\n"


def test_ten_megabytes_of_prints_arrive_intact(kernel: Kernel) -> None:
    code = (
        "import hashlib\nh = hashlib.sha256()\n"
        "for i in range(100000):\n    line = f'{i:08d} ' + 'x' * 90 + '\\n'\n    h.update(line.encode())\n    print(line, end='')\n"
        "digest = h.hexdigest()"
    )
    run = kernel.execute(code, timeout=300)
    text = run.text()
    assert len(text) == 100000 * 100
    digest = kernel.execute("digest").of_type("execute_result")[0]["data"]["text/plain"].strip("'")
    assert hashlib.sha256(text.encode()).hexdigest() == digest


def test_a_five_megabyte_image_arrives_intact(kernel: Kernel) -> None:
    code = (
        "import os, base64\nblob = os.urandom(5 * 1024 * 1024)\n"
        "display({'image/png': base64.b64encode(blob).decode()}, raw=True)\n"
        "import hashlib\nhashlib.sha256(blob).hexdigest()"
    )
    run = kernel.execute(code, timeout=300)
    png = run.of_type("display_data")[0]["data"]["image/png"]
    digest = run.of_type("execute_result")[0]["data"]["text/plain"].strip("'")
    assert hashlib.sha256(base64.b64decode(png)).hexdigest() == digest


def test_a_large_output_travels_as_a_file_in_its_place_that_the_next_cells_write_over_or_remove(
    kernel_name: str, emulator, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """Strings past the backend's blob_chars leave the line protocol (one download), on both backends. The next
    cell writes its own over the file (a shorter one too), and a cell without any removes it when it ends."""
    code = (
        "import os, sys, base64\nrt = sys.stdout._rt\nblob = os.urandom(3 * 1024 * 1024)\nprint('before', flush=True)\n"
        "display({'image/png': base64.b64encode(blob).decode(), 'text/plain': 'img'}, raw=True)\n"
        "print('after', [n for n in os.listdir(rt.private.path()) if n.startswith('out-')], flush=True)\n"
        "display({'text/plain': 'small'}, raw=True)\nimport hashlib\nhashlib.sha256(blob).hexdigest()"
    )
    with Kernel(kernel_name, cwd=str(tmp_path)) as k:
        k.execute("pass")  # the start's status lines
        downloads = emulator.count("bulk-download")
        run = k.execute(code, timeout=120)
        assert run.status == "ok", run.errors
        shown = [(m["msg_type"], m["content"].get("text") or m["content"]["data"].get("text/plain")) for m in run.outputs]
        assert shown == [
            ("stream", "before\n"),
            ("display_data", "img"),
            ("stream", "after ['out-0']\n"),
            ("display_data", "small"),
            ("execute_result", run.of_type("execute_result")[0]["data"]["text/plain"]),
        ]
        png = run.of_type("display_data")[0]["data"]["image/png"]
        digest = run.of_type("execute_result")[0]["data"]["text/plain"].strip("'")
        assert hashlib.sha256(base64.b64decode(png)).hexdigest() == digest
        if kernel_name == "daytona":
            assert emulator.count("bulk-download") == downloads + 1
        again = k.execute(
            "path = os.path.join(rt.private.path(), 'out-0')\nfile = os.stat(path).st_ino\n"
            "display({'image/png': base64.b64encode(blob[:1000000]).decode()}, raw=True)\nos.stat(path).st_ino == file"
        )
        assert again.status == "ok", again.errors
        assert base64.b64decode(again.of_type("display_data")[0]["data"]["image/png"]) == base64.b64decode(png)[:1000000]
        assert again.of_type("execute_result")[0]["data"]["text/plain"] == "True"  # the same file, written over
        k.execute("x = 1")  # no large output: the last cell's file goes when this cell ends
        left = k.execute("[n for n in os.listdir(rt.private.path()) if n.startswith('out-')]")
        assert left.of_type("execute_result")[0]["data"]["text/plain"] == "[]"
        k.execute("display({'image/png': base64.b64encode(blob).decode()}, raw=True)")  # its file stays with the runtime
        folder = k.execute("rt.private.path()").of_type("execute_result")[0]["data"]["text/plain"]
        k.restart()  # the sandbox stays; the new runtime removes what the ended one left
        gone = k.execute(f"import os\nos.path.exists({folder})")
        assert gone.of_type("execute_result")[0]["data"]["text/plain"] == "False", gone.outputs


def test_error_cell_has_one_error_output_showing_the_users_line(kernel: Kernel) -> None:
    run = kernel.execute("a = 1\nb = [a]\nb[5]")
    assert run.status == "error"
    assert [m["msg_type"] for m in run.outputs] == ["error"]
    err = run.errors[0]
    assert (err["ename"], err["evalue"]) == ("IndexError", "list index out of range")
    tb = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(err["traceback"]))  # IPython colours the failing expression
    assert "b[5]" in tb and "line 3" in tb
    assert "daytona-kernel-runtime" not in tb and "local/worker.py" not in tb
    assert run.reply["content"]["ename"] == "IndexError"


def test_syntax_error_points_at_the_problem(kernel: Kernel) -> None:
    run = kernel.execute("x = 1\ny = (x +\n")
    err = run.errors[0]
    assert err["ename"] == "SyntaxError"
    tb = "\n".join(err["traceback"])
    assert "y = (x +" in tb and "^" in tb


def test_code_that_does_not_tokenize_is_a_syntax_error_not_a_hang(kernel: Kernel) -> None:
    run = kernel.execute("def broken():\n        return 1\n    broken()")
    assert [e["ename"] for e in run.errors] == ["IndentationError"]
    assert "broken()" in "\n".join(run.errors[0]["traceback"])


def _interrupt_soon(kernel: Kernel, delay: float = 1.0) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(delay), kernel.interrupt()))
    thread.start()
    return thread


@pytest.mark.parametrize("busy_code", ["while True:\n    pass", "import time\ntime.sleep(100)"])
def test_interrupt_stops_the_cell_and_keeps_variables(kernel: Kernel, busy_code: str) -> None:
    kernel.execute("survivor = 'still here'")
    thread = _interrupt_soon(kernel)
    started = time.monotonic()
    run = kernel.execute(busy_code, timeout=60)
    elapsed = time.monotonic() - started
    thread.join()
    assert run.status == "error"
    assert run.reply["content"]["ename"] == "KeyboardInterrupt"
    assert len(run.errors) == 1
    assert elapsed < 30
    assert kernel.execute("survivor").of_type("execute_result")[0]["data"]["text/plain"] == "'still here'"


def test_a_cell_that_ignores_interrupts_gets_its_context_restarted() -> None:
    with Kernel("daytona-local", env={"DAYTONA_KERNEL_INTERRUPT_GRACE": "1"}) as k:
        k.execute("lost = 1")
        thread = _interrupt_soon(k)
        run = k.execute("import time\nwhile True:\n    try:\n        time.sleep(10)\n    except KeyboardInterrupt:\n        pass")
        thread.join()
        assert run.reply["content"]["ename"] == "KeyboardInterrupt"
        assert "restarted" in run.text("stderr") and "variables were lost" in run.text("stderr")
        after = k.execute("lost")
        assert after.errors[0]["ename"] == "NameError"
        assert k.execute("print('works')").text() == "works\n"


def test_a_dead_worker_is_reported_and_replaced() -> None:
    with Kernel("daytona-local") as k:
        k.execute("gone = 1")
        run = k.execute("import os\nos._exit(1)")
        assert run.status == "error"
        err = run.errors[0]
        assert err["ename"] == "SandboxContextDied"
        assert "restarted" in err["evalue"] and "variables were lost" in err["evalue"]
        assert k.execute("1 + 1").of_type("execute_result")[0]["data"]["text/plain"] == "2"
        assert k.execute("gone").errors[0]["ename"] == "NameError"


def test_restart_gives_a_fresh_namespace() -> None:
    with Kernel("daytona-local") as k:
        k.execute("before_restart = 1")
        k.restart()
        run = k.execute("before_restart")
        assert run.errors[0]["ename"] == "NameError"


def test_execution_count_follows_ipykernel() -> None:
    with Kernel("daytona-local") as k:
        first = k.execute("1")
        assert first.reply["content"]["execution_count"] == 1
        k.execute("print('quiet')", silent=True)
        k.execute("2", store_history=False)
        third = k.execute("3")
        assert third.reply["content"]["execution_count"] == 2
        assert third.of_type("execute_result")[0]["execution_count"] == 2
        inputs = [m["content"]["execution_count"] for m in third.messages if m["msg_type"] == "execute_input"]
        assert inputs == [2]


def test_invalid_config_fails_the_first_cell_clearly_and_the_kernel_lives() -> None:
    with Kernel("daytona-local", env={"DAYTONA_KERNEL_CELL_TIMEOUT": "soon"}) as k:
        run = k.execute("print('hi')")
        assert run.status == "error"
        err = run.errors[0]
        assert err["ename"] == "DaytonaKernelConfigError"
        assert "cell_timeout" in err["evalue"] and "DAYTONA_KERNEL_CELL_TIMEOUT" in err["evalue"]
        assert k.request("kernel_info")["status"] == "ok"
        assert k.execute("1").errors[0]["ename"] == "DaytonaKernelConfigError"


def test_daytona_backend_without_a_key_says_what_to_set() -> None:
    with Kernel("daytona") as k:
        err = k.execute("1").errors[0]
        assert err["ename"] == "DaytonaKernelConfigError"
        assert "DAYTONA_API_KEY" in err["evalue"]


def test_command_line_beats_environment_beats_config_file(tmp_path: Path) -> None:
    config_dir = tmp_path / "cfg"
    config_dir.mkdir()
    (config_dir / "daytona_kernel_config.py").write_text("c.DaytonaKernel.cell_timeout = 'from-file'\n")
    with Kernel("daytona-local", env={"JUPYTER_CONFIG_DIR": str(config_dir)}) as k:
        assert "'from-file'" in k.execute("1").errors[0]["evalue"]
    with Kernel("daytona-local", env={"JUPYTER_CONFIG_DIR": str(config_dir), "DAYTONA_KERNEL_CELL_TIMEOUT": "7"}) as k:
        assert k.execute("1").status == "ok"


def test_cell_timeout_stops_a_long_cell_with_a_clear_error() -> None:
    with Kernel("daytona-local", env={"DAYTONA_KERNEL_CELL_TIMEOUT": "1"}) as k:
        run = k.execute("import time\ntime.sleep(30)")
        err = run.errors[0]
        assert err["ename"] == "CellTimeoutError"
        assert "`cell_timeout`=1 s" in err["evalue"]
        assert k.execute("print('next')").text() == "next\n"


def test_spoofed_frame_in_user_output_is_plain_text(kernel: Kernel) -> None:
    run = kernel.execute('print(\'\\x1eDKF1 ffffffffffffffff . ["error", {"ename": "Fake"}]\')')
    assert run.status == "ok"
    assert not run.errors
    assert "Fake" in run.text()


def test_no_write_to_the_daemon_comes_near_its_line_limit(kernel: Kernel) -> None:
    """Every chunk the runtime hands the interpreter stays far below 1 MiB once JSON-encoded."""
    code = (
        "import sys, json\nsizes = []\ntarget = sys.stdout.target\n"
        "class Spy:\n    def write(self, s):\n        sizes.append(len(json.dumps({'type': 'stdout', 'text': s})))\n"
        "        return target.write(s)\n"
        "sys.stdout.target = Spy()\n"
        "print('a' * 3_000_000)\nprint('\\x01' * 1_000_000)\nprint('é' * 1_000_000)\nprint('\\x1b[31mred\\x1b[0m' * 200_000)\n"
        "sys.stdout.flush()\nsys.stdout.target = target\n"
    )
    run = kernel.execute(code, timeout=120)
    assert run.status == "ok", run.errors
    biggest = kernel.execute("max(sizes)").of_type("execute_result")[0]["data"]["text/plain"]
    assert int(biggest) < 1024 * 1024 * 0.9
