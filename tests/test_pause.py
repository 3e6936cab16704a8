"""Sessions that survive idleness (issue 17, items 1 and 4): a sandbox whose class can pause is paused
instead of stopped, when idle (Daytona's auto-pause) and at shutdown under 'reuse', and the next cell
resumes it with its variables; where Daytona refuses pausing the kernel stops the sandbox as before
and says so in ``%daytona status``.

The emulator's pausing freezes the sandbox's processes (SIGSTOP) and resuming continues them
(SIGCONT), through ``pausing``, ``paused`` and ``resuming``; only the classes in
``pausable_classes`` pause (linux-vm and windows, as sandbox.service.ts pause() allows).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from conftest import sandboxes_of
from kernels import Kernel, result_text

CREATE = "POST /api/sandbox"
STOP = "POST /api/sandbox/{sid}/stop"
PAUSE = "POST /api/sandbox/{sid}/pause"
RESUMED = "resumed the paused sandbox in "


@pytest.fixture
def pausing(daytona_env: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The session's emulator, with sandboxes of a class that can pause."""
    monkeypatch.setattr(daytona_env, "sandbox_class", "linux-vm")
    return daytona_env


def only_sandbox(emu: Any, folder: Path) -> Any:
    live = [s for s in sandboxes_of(emu, folder) if s.state not in ("destroying", "destroyed")]
    assert len(live) == 1, [(s.id, s.state) for s in sandboxes_of(emu, folder)]
    return live[0]


def process_state(pid: int) -> str:
    """The kernel's one-letter state of a process: T when it is stopped (SIGSTOP)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


# -- the emulator, through the unmodified SDK ----------------------------------------------


def sdk_client(emu: Any) -> Any:
    from daytona import AsyncDaytona, DaytonaConfig

    return AsyncDaytona(DaytonaConfig(api_key=emu.api_key, api_url=emu.api_url, target="us"))


def test_emulator_pause_freezes_every_process_and_start_resumes_them(pausing: Any) -> None:
    from daytona import CreateSandboxFromSnapshotParams

    async def go() -> None:
        client = sdk_client(pausing)
        sandbox = await client.create(CreateSandboxFromSnapshotParams(labels={"test": "pause"}))
        assert (sandbox.auto_pause_interval, sandbox.auto_stop_interval) == (60, 0)  # a pausable class's default
        ctx = await sandbox.code_interpreter.create_context()
        run = await sandbox.code_interpreter.run_code(
            "import os, subprocess\nx = 41\nchild = subprocess.Popen(['sleep', '60'])\nprint(os.getpid(), child.pid)", context=ctx
        )
        pids = [int(p) for p in run.stdout.split()]
        await sandbox.pause()
        assert sandbox.state == "paused"
        assert [process_state(p) for p in pids] == ["T", "T"]  # the worker and its child are frozen
        with pytest.raises(Exception, match="not started"):
            await sandbox.process.exec("true")  # the toolbox answers as for a stopped sandbox
        await sandbox.start()
        assert sandbox.state == "started"
        assert all(process_state(p) != "T" for p in pids)
        again = await sandbox.code_interpreter.run_code("child.kill()\nprint(x + 1)", context=ctx)
        assert again.stdout == "42\n"
        await sandbox.delete()
        await client.close()

    asyncio.run(go())


def test_emulator_refuses_pausing_where_the_class_cannot(daytona_env: Any) -> None:
    from daytona import CreateSandboxFromSnapshotParams
    from daytona.common.errors import DaytonaBadRequestError, DaytonaError, DaytonaValidationError

    async def go() -> None:
        client = sdk_client(daytona_env)
        sandbox = await client.create(CreateSandboxFromSnapshotParams(labels={"test": "no-pause"}))
        assert (sandbox.auto_pause_interval, sandbox.auto_stop_interval) == (0, 15)
        with pytest.raises(DaytonaError, match="Pausing is not supported for this sandbox"):
            await sandbox.pause()  # 422 (sandbox.service.ts pause())
        with pytest.raises(DaytonaBadRequestError, match="does not support pausing"):
            await sandbox.set_auto_pause_interval(5)
        with pytest.raises(DaytonaBadRequestError, match="does not support pausing"):
            await client.create(CreateSandboxFromSnapshotParams(auto_pause_interval=5, auto_stop_interval=0))
        with pytest.raises(DaytonaValidationError, match="mutually exclusive"):  # the SDK's own check
            await client.create(CreateSandboxFromSnapshotParams(auto_pause_interval=5, auto_stop_interval=5))
        assert sandbox.state == "started"
        await sandbox.delete()
        await client.close()

    asyncio.run(go())


def test_emulator_auto_pause_is_postponed_by_activity_and_a_pausing_sandbox_refuses_a_start(
    pausing: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from daytona import CreateSandboxFromSnapshotParams
    from daytona.common.errors import DaytonaConflictError

    monkeypatch.setitem(pausing.transition_s, "pausing", 2.0)

    async def go() -> None:
        client = sdk_client(pausing)
        sandbox = await client.create(CreateSandboxFromSnapshotParams(auto_pause_interval=5, auto_stop_interval=0))
        emulated = pausing.sandboxes[sandbox.id]
        emulated.last_activity -= 600  # idle for 10 minutes ...
        await sandbox.process.exec("true")  # ... until now: a toolbox request is activity
        assert sandbox.id not in pausing.run_auto_pause()
        emulated.last_activity -= 600
        assert pausing.run_auto_pause() == [sandbox.id]
        await sandbox.refresh_data()
        assert sandbox.state == "pausing"
        with pytest.raises(DaytonaConflictError):
            await sandbox.start()  # 409 "Sandbox state change in progress", as during stopping
        pausing.wait_for_state(sandbox.id, "paused")
        await sandbox.delete()
        await client.close()

    asyncio.run(go())


# -- the kernel ------------------------------------------------------------------------------


def test_idle_sandbox_is_paused_and_the_next_cell_resumes_it_with_its_variables(pausing: Any, tmp_path: Path) -> None:
    with Kernel("daytona", cwd=str(tmp_path)) as k:
        k.execute("x = 41")
        sandbox = only_sandbox(pausing, tmp_path)
        assert (sandbox.auto_pause_min, sandbox.auto_stop_min) == (15, 0)  # set at creation: works with no kernel
        assert pausing.counts[CREATE] == 1
        sandbox.last_activity -= 3600
        assert pausing.run_auto_pause() == [sandbox.id]
        pausing.wait_for_state(sandbox.id, "paused")
        run = k.execute("x + 1", timeout=30)
        assert result_text(run) == "42", run.errors
        assert RESUMED in run.text("stderr") and "your variables are intact" in run.text("stderr")
        assert "variables were reset" not in run.text("stderr")
        assert sandbox.state == "started"
        assert k.execute("x").text("stderr") == ""  # one line, once


def test_a_cell_after_the_auto_pause_interval_resumes_before_its_files_go_up(pausing: Any, tmp_path: Path) -> None:
    env = {"DAYTONA_KERNEL_AUTO_PAUSE_INTERVAL": "1"}  # 1 minute: the kernel checks before every cell
    with Kernel("daytona", cwd=str(tmp_path), env=env) as k:
        k.execute("x = 'kept'")
        sandbox = only_sandbox(pausing, tmp_path)
        sandbox.last_activity -= 120
        assert pausing.run_auto_pause() == [sandbox.id]
        pausing.wait_for_state(sandbox.id, "paused")
        (tmp_path / "new.txt").write_text("written while paused")
        run = k.execute("print(x, open('new.txt').read())", timeout=30)
        assert run.text() == "kept written while paused\n", (run.errors, run.text("stderr"))
        assert RESUMED in run.text("stderr") and "Could not sync" not in run.text("stderr")


def test_a_pause_from_the_dashboard_right_after_a_cell_still_uploads_the_files_edited_meanwhile(
    pausing: Any, tmp_path: Path
) -> None:
    """Daytona pauses by its own clock, or from the dashboard: the kernel cannot know it in advance."""
    with Kernel("daytona", cwd=str(tmp_path)) as k:
        k.execute("x = 'kept'")
        sandbox = only_sandbox(pausing, tmp_path)
        pausing.pause_sandbox(sandbox.id)
        pausing.wait_for_state(sandbox.id, "paused")
        (tmp_path / "edited.txt").write_text("edited while paused")
        run = k.execute("print(x, open('edited.txt').read())", timeout=30)
        assert run.text() == "kept edited while paused\n", (run.errors, run.text("stderr"))
        assert RESUMED in run.text("stderr") and "Could not sync" not in run.text("stderr")


def test_a_cell_arriving_while_pausing_waits_for_paused_then_resumes(
    pausing: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(pausing.transition_s, "pausing", 2.0)
    with Kernel("daytona", cwd=str(tmp_path)) as k:
        k.execute("x = 6")
        sandbox = only_sandbox(pausing, tmp_path)
        pausing.pause_sandbox(sandbox.id)  # the dashboard, or auto-pause, just began
        assert sandbox.state == "pausing"
        run = k.execute("x * 7", timeout=30)
        assert result_text(run) == "42", run.errors
        assert RESUMED in run.text("stderr")
        status = run.status_lines
        assert any("pausing" in line for line in status), status  # the status line said what it waited for


def test_shutdown_under_reuse_pauses_and_the_next_kernel_resumes(pausing: Any, tmp_path: Path) -> None:
    with Kernel("daytona", cwd=str(tmp_path)) as k:
        k.execute("1")
        sandbox = only_sandbox(pausing, tmp_path)
    assert sandbox.state in ("pausing", "paused")
    assert pausing.count(PAUSE) == 1 and pausing.count(STOP) == 0
    pausing.wait_for_state(sandbox.id, "paused")
    with Kernel("daytona", cwd=str(tmp_path)) as k:
        assert result_text(k.execute("6 * 7", timeout=30)) == "42"
        assert only_sandbox(pausing, tmp_path) is sandbox and sandbox.state == "started"


def test_a_pause_daytona_refuses_at_shutdown_becomes_a_stop(pausing: Any, tmp_path: Path) -> None:
    with Kernel("daytona", cwd=str(tmp_path)) as k:
        k.execute("1")
        sandbox = only_sandbox(pausing, tmp_path)
        sandbox.pausable = False  # Daytona no longer pauses it (422)
    assert pausing.count(PAUSE) == 1 and pausing.count(STOP) == 1
    assert sandbox.state in ("stopping", "stopped")


def test_a_shutdown_that_lost_the_race_with_a_pause_leaves_the_sandbox_paused(pausing: Any, tmp_path: Path) -> None:
    """Auto-pause, or a pause from the dashboard, came first: pause() answers 400 (not started), which is
    not "this class cannot pause"; stopping now would throw the memory away."""
    with Kernel("daytona", cwd=str(tmp_path)) as k:
        k.execute("x = 1")
        sandbox = only_sandbox(pausing, tmp_path)
        pausing.before_next("/pause", "pause")  # auto-pause gets there just before the kernel's own pause
    assert pausing.count(PAUSE) == 1 and pausing.count(STOP) == 0
    assert sandbox.state == "paused"


def test_a_shutdown_during_a_pending_stop_does_not_stop_it_again(
    pausing: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(pausing.transition_s, "stopping", 3.0)
    with Kernel("daytona", cwd=str(tmp_path)) as k:
        k.execute("1")
        sandbox = only_sandbox(pausing, tmp_path)
        pausing.before_next("/pause", "stop")  # a stop from the dashboard is pending: pause() is a 409
    assert pausing.count(PAUSE) == 1 and pausing.count(STOP) == 0
    assert sandbox.state in ("stopping", "stopped")


def test_a_failed_pause_is_recovered_by_the_next_cell_not_deleted(pausing: Any, tmp_path: Path) -> None:
    with Kernel("daytona", cwd=str(tmp_path)) as k:
        k.execute("x = 1")
        sandbox = only_sandbox(pausing, tmp_path)
        pausing.fail_next_pause("pause timed out on the runner", recoverable=True)
        pausing.pause_sandbox(sandbox.id)  # auto-pause, whose job fails
        pausing.wait_for_state(sandbox.id, "error")
        (tmp_path / "data.txt").write_text("still synced")
        run = k.execute("print(open('data.txt').read()); x", timeout=60)
        stderr = run.text("stderr")
        assert "delete the sandbox" not in stderr and "delete the sandbox" not in str(run.errors), (stderr, run.errors)
        assert "error state (pause timed out on the runner); Daytona recovered it" in stderr, stderr
        assert "fresh interpreter: variables were reset" in stderr, stderr
        assert run.text() == "still synced\n", (run.errors, stderr)
        assert [e["ename"] for e in run.errors] == ["NameError"]  # a fresh interpreter: said, not hidden
        assert sandbox.state == "started"
        assert result_text(k.execute("6 * 7")) == "42"


def test_a_failed_pause_at_shutdown_is_left_for_the_next_kernel_to_recover(pausing: Any, tmp_path: Path) -> None:
    with Kernel("daytona", cwd=str(tmp_path)) as k:
        k.execute("1")
        sandbox = only_sandbox(pausing, tmp_path)
        pausing.fail_next_pause("pause timed out on the runner", recoverable=True)
    assert sandbox.state == "error" and pausing.count(STOP) == 0
    with Kernel("daytona", cwd=str(tmp_path)) as k:
        run = k.execute("6 * 7", timeout=60)
        assert result_text(run) == "42", (run.errors, run.text("stderr"))
        assert "Daytona recovered it" in run.text("stderr")
        assert only_sandbox(pausing, tmp_path) is sandbox and sandbox.state == "started"


def test_an_error_that_cannot_be_recovered_still_says_what_to_do(pausing: Any, tmp_path: Path) -> None:
    with Kernel("daytona", cwd=str(tmp_path)) as k:
        k.execute("1")
        sandbox = only_sandbox(pausing, tmp_path)
        pausing.fail_next_pause("the runner lost the sandbox", recoverable=False)
        pausing.pause_sandbox(sandbox.id)
        pausing.wait_for_state(sandbox.id, "error")
        run = k.execute("1", timeout=60)
        text = str(run.errors)
        assert "error state (the runner lost the sandbox)" in text and "delete the sandbox" in text, text
    sandbox.state = "destroyed"  # out of the way of the other tests


def test_status_shows_the_pause_mode_activity_and_resources(pausing: Any, tmp_path: Path) -> None:
    with Kernel("daytona", cwd=str(tmp_path)) as k:
        k.execute("1")
        text = k.execute("%daytona status").text()
    assert "idle mode:" in text and "pause after 15 min idle" in text, text
    assert "auto-pause in about 14m" in text or "auto-pause in about 15m" in text, text
    assert "1 CPU, 1 GiB RAM, 3 GiB disk (held now: all of it)" in text, text


def test_status_leaves_a_paused_sandbox_paused_and_sync_resumes_it(pausing: Any, tmp_path: Path) -> None:
    with Kernel("daytona", cwd=str(tmp_path)) as k:
        k.execute("x = 1")
        sandbox = only_sandbox(pausing, tmp_path)
        pausing.pause_sandbox(sandbox.id)
        pausing.wait_for_state(sandbox.id, "paused")
        text = k.execute("%daytona status").text()
        assert (
            "paused now; the next cell resumes it" in text
            and "(held now: disk only; its memory and processes are kept, not billed)" in text
        ), text
        assert sandbox.state == "paused"
        (tmp_path / "data.txt").write_text("up")
        run = k.execute("%sync")
        assert run.status == "ok" and RESUMED in run.text("stderr"), (run.errors, run.text("stderr"))
        assert result_text(k.execute("open('data.txt').read(), x")) == "('up', 1)"


def test_where_pausing_is_refused_the_sandbox_stops_and_status_says_why(daytona_env: Any, tmp_path: Path) -> None:
    with Kernel("daytona", cwd=str(tmp_path), env={"DAYTONA_KERNEL_CHECKPOINT_ON_IDLE": "true"}) as k:
        k.execute("1")
        assert daytona_env.counts[CREATE] == 1  # Daytona's default for its class: auto-stop, nothing refused
        sandbox = only_sandbox(daytona_env, tmp_path)
        assert (sandbox.auto_pause_min, sandbox.auto_stop_min) == (0, 15)
        text = k.execute("%daytona status").text()
        assert "stop after 15 min idle" in text and "checkpoint_on_idle saves them first" in text, text
        assert "not paused because Daytona does not pause sandboxes of class container" in text, text
        assert "auto-stop in about" in text, text
    assert daytona_env.count(PAUSE) == 0 and sandbox.state in ("stopping", "stopped")


def test_ephemeral_sandboxes_stop_without_asking_to_pause(pausing: Any, tmp_path: Path) -> None:
    with Kernel("daytona", cwd=str(tmp_path), env={"DAYTONA_KERNEL_SANDBOX_POLICY": "ephemeral"}) as k:
        text = k.execute("%daytona status").text()
        assert pausing.counts[CREATE] == 1
    assert "not paused because ephemeral sandboxes cannot pause" in text, text


def test_idle_action_stop_keeps_stopping_a_sandbox_that_could_pause(pausing: Any, tmp_path: Path) -> None:
    with Kernel("daytona", cwd=str(tmp_path), env={"DAYTONA_KERNEL_IDLE_ACTION": "stop"}) as k:
        k.execute("1")
        sandbox = only_sandbox(pausing, tmp_path)
        assert (sandbox.auto_pause_min, sandbox.auto_stop_min) == (0, 15)
        assert "not paused because idle_action is 'stop'" in k.execute("%daytona status").text()
    assert sandbox.state in ("stopping", "stopped") and pausing.count(PAUSE) == 0


# -- in process ------------------------------------------------------------------------------


async def test_the_idle_checkpoint_is_armed_only_for_a_sandbox_that_stops() -> None:
    import logging

    from fakes import FakeSandbox

    from daytona_kernel.backends.base import IdleMode
    from daytona_kernel.config import SessionSettings
    from daytona_kernel.idle import IdleCheckpoint
    from daytona_kernel.runtime.calls import RuntimeOptions
    from daytona_kernel.supervisor import ContextSupervisor

    sandbox = FakeSandbox()
    settings = SessionSettings(checkpoint_on_idle=True, auto_stop_interval=15)
    log = logging.getLogger("test-pause")
    timer = IdleCheckpoint(ContextSupervisor(sandbox, settings, log, RuntimeOptions()), settings, log)
    sandbox.idle_mode = IdleMode.PAUSE  # a paused sandbox keeps its variables: nothing to save
    timer.arm()
    assert timer._timer is None
    sandbox.idle_mode = IdleMode.STOP
    timer.arm()
    assert timer._timer is not None
    timer.disarm()


async def test_idle_time_is_counted_by_the_wall_clock_which_moves_on_while_a_laptop_sleeps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A monotonic clock stands still during a suspend; Daytona's auto-pause does not."""
    import logging
    import time

    from fakes import FakeSandbox, Run, frame

    from daytona_kernel.cell import Cell, Recorder
    from daytona_kernel.config import SessionSettings
    from daytona_kernel.session import SandboxSession

    done = frame("result", {"data": {"text/plain": "1"}, "metadata": {}, "execution_count": 1})
    sandbox = FakeSandbox([Run([done]), Run([done])])
    sandbox.auto_pause_s = 15 * 60.0
    asked: list[bool] = []

    async def resume_if_paused(progress: Any) -> bool:
        asked.append(True)
        return False

    sandbox.resume_if_paused = resume_if_paused  # type: ignore[method-assign]
    session = SandboxSession(sandbox, SessionSettings(), logging.getLogger("test-pause"))
    await session.execute(Cell("1", 1), Recorder())
    assert asked == []
    slept_until = time.time() + 3600  # the lid was closed for an hour: only the wall clock moved
    monkeypatch.setattr(time, "time", lambda: slept_until)
    await session.execute(Cell("1", 2), Recorder())
    assert asked == [True]  # checked (and resumed if paused) before the cell's files go up
