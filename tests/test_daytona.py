"""The Daytona backend: the unmodified SDK against the loopback emulator, through real kernels."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import papermill
import pytest
from conftest import REAL_DAYTONA_ENV, sandboxes_of
from kernels import Kernel, result_text
from test_conformance import DaytonaLocalConformance

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
WS = "GET /toolbox/{sid}/process/interpreter/execute"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A notebook folder of its own, so each test has its own workspace (and sandbox)."""
    return tmp_path


class DaytonaConformance(DaytonaLocalConformance):
    """The same conformance suite, on the `daytona` kernelspec against the emulator."""

    kernel_name = "daytona"

    @classmethod
    def setUpClass(cls) -> None:
        import tempfile

        from daytona_emulator import DaytonaEmulator

        cls.emu = DaytonaEmulator(Path(tempfile.mkdtemp(prefix="emu-conformance-"))).start()
        cls.saved_env = {k: os.environ.get(k) for k in cls.emu.env()}
        os.environ.update(cls.emu.env())
        super().setUpClass()

    @classmethod
    def tearDownClass(cls) -> None:
        super().tearDownClass()
        for key, value in cls.saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        cls.emu.close()


def test_quickstart_notebook_on_daytona(daytona_env, folder: Path) -> None:  # type: ignore[no-untyped-def]
    out = papermill.execute_notebook(
        str(EXAMPLES / "quickstart.ipynb"), str(folder / "out.ipynb"), kernel_name="daytona", cwd=str(folder)
    )
    outputs = [o for c in out.cells if c.cell_type == "code" for o in c.outputs]
    assert any(o.output_type == "display_data" and "image/png" in o.data for o in outputs)
    assert any(o.output_type == "execute_result" and "text/html" in o.data for o in outputs)
    assert not [o for o in outputs if o.output_type == "error"]


def test_a_plain_cell_costs_one_websocket_and_nothing_else(daytona_env, folder: Path) -> None:  # type: ignore[no-untyped-def]
    with Kernel("daytona", cwd=str(folder)) as k:
        k.execute("warm = 1")
        daytona_env.reset_counts()
        for code in ("x = 1", "print(x)", "x + 1", "import math\nmath.pi"):
            k.execute(code)
        assert dict(daytona_env.counts) == {WS: 4}
        daytona_env.reset_counts()
        k.request("complete", "mat", 3)
        k.request("is_complete", "for x in y:")
        assert dict(daytona_env.counts) == {WS: 1}


def test_interrupt_keeps_state_through_kill_int(daytona_env, folder: Path) -> None:  # type: ignore[no-untyped-def]
    with Kernel("daytona", cwd=str(folder)) as k:
        k.execute("kept = 'here'")
        daytona_env.reset_counts()
        timer = threading.Timer(1.0, k.interrupt)
        timer.start()
        run = k.execute("import time\ntime.sleep(60)")
        timer.join()
        assert run.reply["content"]["ename"] == "KeyboardInterrupt"
        assert daytona_env.count("POST /toolbox/{sid}/process/execute") == 1  # the kill -INT
        assert result_text(k.execute("kept")) == "'here'"


def test_a_stopped_sandbox_is_started_again_for_the_next_cell(daytona_env, folder: Path) -> None:  # type: ignore[no-untyped-def]
    with Kernel("daytona", cwd=str(folder)) as k:
        k.execute("lost = 1\nopen('kept.txt', 'w').write('on the volume')")
        (sandbox,) = sandboxes_of(daytona_env, folder)
        daytona_env.stop_sandbox(sandbox.id)
        run = k.execute("print(open('kept.txt').read())")
        assert run.status == "ok"
        assert run.text() == "on the volume\n"
        assert "variables were reset" in run.text("stderr") and "files in the working directory are intact" in run.text("stderr")
        assert k.execute("lost").errors[0]["ename"] == "NameError"
        assert sandbox.state == "started"


def test_a_dropped_websocket_gives_a_clear_error_and_the_next_cell_works(daytona_env, folder: Path) -> None:  # type: ignore[no-untyped-def]
    with Kernel("daytona", cwd=str(folder)) as k:
        k.execute("state = 'kept'")
        daytona_env.drop_next_websocket(after_frames=1)
        run = k.execute("print('partial', flush=True)\nimport time\ntime.sleep(1)\nprint('never seen')")
        assert run.status == "error"
        err = run.errors[0]
        assert err["ename"] == "SandboxConnectionLost"
        assert "connection" in err["evalue"] and "variables are kept" in err["evalue"]
        after = k.execute("state")  # at once: it waits in the worker's queue while the cut cell finishes
        assert result_text(after) == "'kept'" and "never seen" not in after.text(), after.outputs


CUT_CELL = "import signal, time\n{ignore}print('cut', flush=True)\ntime.sleep({seconds})\n"


def cut_cell(daytona_env, k: Kernel, seconds: int, ignore_sigint: bool):  # type: ignore[no-untyped-def]
    """A cell whose websocket is cut while it runs on in the sandbox; the next cell queues behind it (FIFO)."""
    daytona_env.drop_next_websocket(after_frames=1)
    ignore = "signal.signal(signal.SIGINT, signal.SIG_IGN)\n" if ignore_sigint else ""
    run = k.execute(CUT_CELL.format(ignore=ignore, seconds=seconds))
    assert run.errors[0]["ename"] == "SandboxConnectionLost", run.errors
    return run


def test_an_interrupt_behind_a_cut_cell_ends_the_cut_cell_and_the_queued_one_runs(daytona_env, folder: Path) -> None:  # type: ignore[no-untyped-def]
    """The interrupt reaches whichever job runs: the cut cell, which yields; the cell behind it then runs."""
    with Kernel("daytona", cwd=str(folder)) as k:
        k.execute("kept = 'here'")
        cut_cell(daytona_env, k, 60, ignore_sigint=False)
        timer = threading.Timer(1.0, k.interrupt)
        timer.start()
        run = k.execute("queued = 'ran'\nkept")
        timer.join()
        assert run.status == "ok" and result_text(run) == "'here'", (run.errors, run.text("stderr"))
        assert result_text(k.execute("queued, kept")) == "('ran', 'here')"


def test_an_interrupt_behind_a_cut_cell_that_ignores_it_keeps_the_variables(daytona_env, folder: Path) -> None:  # type: ignore[no-untyped-def]
    """The cut cell ignores SIGINT past the grace: the cell the user interrupted had not started, so it ends
    without running, and the context (every variable) is kept instead of restarted."""
    with Kernel("daytona", cwd=str(folder)) as k:
        k.execute("kept = 'here'")
        cut_cell(daytona_env, k, 12, ignore_sigint=True)
        timer = threading.Timer(1.0, k.interrupt)
        timer.start()
        run = k.execute("queued = 'ran'")
        timer.join()
        assert run.reply["content"]["ename"] == "KeyboardInterrupt", run.reply["content"]
        stderr = run.text("stderr")
        assert "restarted" not in stderr and "had not started" in stderr, stderr
        after = k.execute("kept, 'queued' in globals()", timeout=60)  # runs once the cut cell has ended
        assert result_text(after) == "('here', False)", (after.errors, after.text("stderr"))
        pid = result_text(k.execute("import os; os.getpid()"))
    assert not list(Path("/tmp").glob(f"daytona-kernel-cancelled-{pid}-*"))  # the note does not outlive its job


def test_kernel_info_answers_while_daytona_is_slow(daytona_env, folder: Path) -> None:  # type: ignore[no-untyped-def]
    daytona_env.delay_s = 1.5
    try:
        with Kernel("daytona", cwd=str(folder)) as k:  # ready = kernel_info answered
            assert k.request("kernel_info")["status"] == "ok"
            assert daytona_env.counts["POST /api/sandbox"] == 0  # provisioning was still under way
            run = k.execute("3 * 3")
            assert result_text(run) == "9"
            daytona_env.delay_s = 0.0  # the shutdown need not be slow too
        # the first cell had to wait: one status line, updated in place, then cleared away
        status = [m for m in run.outputs if m["msg_type"] in ("display_data", "update_display_data")]
        assert status and status[0]["msg_type"] == "display_data"
        assert status[0]["content"]["data"]["text/plain"].startswith("⏳ ")
        assert len({m["content"]["transient"]["display_id"] for m in status}) == 1
        kinds = [m["msg_type"] for m in run.outputs]
        assert kinds.index("clear_output") > kinds.index("display_data") and kinds[-1] == "execute_result"
    finally:
        daytona_env.delay_s = 0.0


def test_an_interrupt_while_the_first_cell_waits_for_the_sandbox_ends_that_cell(daytona_env, folder: Path) -> None:  # type: ignore[no-untyped-def]
    """Ctrl-C during provisioning: the cell ends with KeyboardInterrupt at once, the sandbox keeps starting."""
    daytona_env.delay_s = 1.0  # every API request: provisioning takes several seconds
    try:
        with Kernel("daytona", cwd=str(folder)) as k:
            interrupted: list[float] = []

            def interrupt_at_the_status_line(msg: dict) -> None:  # type: ignore[type-arg]
                if msg["msg_type"] == "display_data" and not interrupted:
                    interrupted.append(time.monotonic())
                    k.interrupt()

            run = k.execute("print('never run')", timeout=30, on_message=interrupt_at_the_status_line)
            assert interrupted, run.outputs
            assert run.reply["content"]["ename"] == "KeyboardInterrupt"
            assert run.text() == "" and "still starting" in run.text("stderr")
            daytona_env.delay_s = 0.0
            assert result_text(k.execute("6 * 7")) == "42"
            assert daytona_env.counts["POST /api/sandbox"] == 1  # the provisioning that was under way
    finally:
        daytona_env.delay_s = 0.0


def test_transient_errors_are_retried(daytona_env, folder: Path) -> None:  # type: ignore[no-untyped-def]
    daytona_env.fail_next("POST /api/sandbox", 503, times=2)
    daytona_env.fail_next("POST /toolbox/{sid}/process/interpreter/context", 429, times=1)
    with Kernel("daytona", cwd=str(folder)) as k:
        assert result_text(k.execute("21 * 2")) == "42"
    assert daytona_env.counts["POST /api/sandbox"] >= 3
    assert daytona_env.count("POST /toolbox/{sid}/process/interpreter/context") == 2


def test_503s_on_the_interpreter_handshake_are_retried_and_the_variables_kept(daytona_env, folder: Path) -> None:  # type: ignore[no-untyped-def]
    """Nothing runs before the handshake succeeds, so it is safe to try again (issue 23 item 8)."""
    with Kernel("daytona", cwd=str(folder)) as k:
        k.execute("x = 41")
        daytona_env.fail_next(WS, 503, times=2)
        run = k.execute("x + 1")
        assert result_text(run) == "42", (run.errors, run.text("stderr"))
        assert "variables were reset" not in run.text("stderr")
    assert daytona_env.count("POST /toolbox/{sid}/process/interpreter/context") == 1  # the same context throughout


def test_a_rejected_key_fails_fast_with_the_fix_and_without_the_key(daytona_env, folder: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("DAYTONA_API_KEY", "dtn_wrong_key_0123456789abcdef")
    with Kernel("daytona", cwd=str(folder)) as k:
        started = time.monotonic()
        run = k.execute("1")
        assert time.monotonic() - started < 15
        err = run.errors[0]
        assert err["ename"] == "DaytonaAuthError"
        assert "DAYTONA_API_KEY" in err["evalue"]
        assert "dtn_wrong_key" not in str(run.messages) and "dtn_wrong_key" not in str(run.reply)
        assert k.request("kernel_info")["status"] == "ok"
    assert daytona_env.count("GET /api/volumes/by-name/{name}") == 2  # the early start's lookup, then the SDK's, which reports


def test_reuse_finds_the_same_sandbox_across_kernels(daytona_env, folder: Path) -> None:  # type: ignore[no-untyped-def]
    with Kernel("daytona", cwd=str(folder)) as k:
        first = result_text(k.execute("import os\nos.getcwd()"))
    with Kernel("daytona", cwd=str(folder)) as k:
        second = result_text(k.execute("import os\nos.getcwd()"))
    mine = sandboxes_of(daytona_env, folder)
    assert first == second
    assert daytona_env.counts["POST /api/sandbox"] == 1
    assert [s.state for s in mine] == ["stopped"]


def test_ephemeral_leaves_no_sandbox_and_files_outlive_it(daytona_env, folder: Path) -> None:  # type: ignore[no-untyped-def]
    env = {"DAYTONA_KERNEL_SANDBOX_POLICY": "ephemeral"}
    before = {s.id for s in daytona_env.live_sandboxes()}
    with Kernel("daytona", cwd=str(folder), env=env) as k:
        k.execute("open('result.txt', 'w').write('durable')")
    assert {s.id for s in daytona_env.live_sandboxes()} == before
    with Kernel("daytona", cwd=str(folder), env=env) as k:
        assert result_text(k.execute("open('result.txt').read()")) == "'durable'"
    assert {s.id for s in daytona_env.live_sandboxes()} == before
    assert daytona_env.counts["POST /api/sandbox"] == 2


def test_an_unknown_snapshot_is_a_clear_error(daytona_env, folder: Path) -> None:  # type: ignore[no-untyped-def]
    with Kernel("daytona", cwd=str(folder), env={"DAYTONA_KERNEL_SNAPSHOT": "missing-snapshot"}) as k:
        err = k.execute("1").errors[0]
        assert err["ename"] == "SandboxError"
        assert "missing-snapshot" in err["evalue"] and "create a sandbox" in err["evalue"]


@pytest.mark.daytona_e2e
@pytest.mark.skipif(
    not REAL_DAYTONA_ENV.get("DAYTONA_API_KEY"), reason="DAYTONA_API_KEY is not set: no real Daytona cloud to test against"
)
def test_real_cloud_round_trip(folder: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    for key, value in REAL_DAYTONA_ENV.items():
        monkeypatch.setenv(key, value)
    with Kernel("daytona", cwd=str(folder), env={"DAYTONA_KERNEL_SANDBOX_POLICY": "ephemeral"}) as k:
        assert result_text(k.execute("6 * 7", timeout=300)) == "42"
        assert k.execute("print('streamed')").text() == "streamed\n"
