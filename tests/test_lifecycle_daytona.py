"""The sandbox lifecycle as Daytona really runs it: real kernels, the unmodified SDK, and an emulator
whose transitions take time (stopping, starting, archiving, destroying), so each trap of the
control plane (apps/api/src/sandbox/services/sandbox.service.ts, apps/daemon/pkg/git/clone.go) shows here the way a user would meet it."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import sandboxes_of
from kernels import Kernel, result_text
from test_storage import wait_for

pytestmark = pytest.mark.slow  # the emulator, git and kernels run as subprocesses
TRANSITION_S = 1.0  # each transitional state lasts this long: realistic order, fast tests
STOP = "POST /api/sandbox/{sid}/stop"
CREATE = "POST /api/sandbox"


@pytest.fixture(scope="module")
def slow_emulator(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from daytona_emulator import DaytonaEmulator

    emu = DaytonaEmulator(tmp_path_factory.mktemp("lifecycle")).start()
    emu.transition_s = dict.fromkeys(emu.transition_s, TRANSITION_S)
    yield emu
    emu.close()


@pytest.fixture
def emu(slow_emulator: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    for key, value in slow_emulator.env().items():
        monkeypatch.setenv(key, value)
    slow_emulator.reset_counts()
    return slow_emulator


def only_sandbox(emu: Any, folder: Path) -> Any:
    live = [s for s in sandboxes_of(emu, folder) if s.state not in ("destroying", "destroyed")]
    assert len(live) == 1, [(s.id, s.state) for s in sandboxes_of(emu, folder)]
    return live[0]


def test_a_restart_keeps_the_sandbox_running(emu: Any, tmp_path: Path) -> None:
    with Kernel("daytona", cwd=str(tmp_path)) as k:
        k.execute("x = 1")
        sandbox = only_sandbox(emu, tmp_path)
        k.restart()
        assert sandbox.state == "started"  # not stopped for the next process
        first = k.execute("import os\nos.getpid() > 0")
        assert result_text(first) == "True" and first.text("stderr") == ""
        assert k.execute("x").errors[0]["ename"] == "NameError"  # a new interpreter, like ipykernel
        assert only_sandbox(emu, tmp_path) is sandbox
        assert emu.count(STOP) == 0
    emu.wait_for_state(sandbox.id, "stopped", timeout=30)  # a real shutdown still releases it (right after a restart
    # it first waits for the SDK's load: under load Jupyter's 5 s may pass, and the stop ends after the process)


async def end_context(sandbox: Any, context_id: str) -> None:
    await sandbox.contexts.pop(context_id).worker.shutdown()


def test_a_restart_starts_the_next_interpreter_before_the_new_kernel_process(emu: Any, tmp_path: Path) -> None:
    """The old kernel process, as it shuts down for a restart, creates the next context and starts importing
    IPython there; the new process takes that context over instead of creating one (its bootstrap then
    finds IPython imported: most of a bootstrap's time)."""
    with Kernel("daytona", cwd=str(tmp_path)) as k:
        k.execute("x = 1")
        sandbox = only_sandbox(emu, tmp_path)
        k.km.shutdown_kernel(now=False, restart=True)  # what restart_kernel does, in two steps
        left = set(sandbox.contexts)
        assert len(left) == 1  # the old kernel's context is gone; the next one is there
        k.km.start_kernel(**k.km._launch_args)
        k.kc.wait_for_ready(timeout=60)
        first = k.execute("import os\nos.getpid() > 0")
        assert result_text(first) == "True" and first.text("stderr") == ""
        assert k.execute("x").errors[0]["ename"] == "NameError"  # a new interpreter, like ipykernel
        assert set(sandbox.contexts) == left  # taken over, none created
        k.km.shutdown_kernel(now=False, restart=True)
        (gone,) = set(sandbox.contexts)
        emu.call(end_context(sandbox, gone))  # ended before the next process looks (the sandbox restarted ...)
        k.km.start_kernel(**k.km._launch_args)
        k.kc.wait_for_ready(timeout=60)
        assert result_text(k.execute("1 + 1")) == "2"  # it made its own
        assert len(sandbox.contexts) == 1 and gone not in sandbox.contexts
    assert sandbox.state == "stopped"


def test_a_restarts_head_start_for_the_next_process_is_bounded(emu: Any, tmp_path: Path) -> None:
    """Naming the next context is only a speed-up: when Daytona keeps answering 503, its retries (up to 30 s)
    must not outlast Jupyter's 5 s wait for the old process, which would be killed before deleting its contexts."""
    with Kernel("daytona", cwd=str(tmp_path)) as k:
        k.execute("x = 1")
        sandbox = only_sandbox(emu, tmp_path)
        emu.fail_next("/labels", 503, times=1000)
        try:
            k.km.shutdown_kernel(now=False, restart=True)
        finally:
            emu.clear_faults()
        assert sandbox.contexts == {}  # the old context and the unnamed next one are both deleted
        k.km.start_kernel(**k.km._launch_args)
        k.kc.wait_for_ready(timeout=60)
        assert result_text(k.execute("1 + 1")) == "2"


def test_a_next_context_this_kernel_left_and_never_took_does_not_keep_the_sandbox_up(emu: Any, tmp_path: Path) -> None:
    """A restart's next context that no process of the kernel took (its new process never started, or made
    its own) is nobody's: the kernel's shutdown does not count it as another kernel's and keep the sandbox up."""
    import asyncio

    from daytona import AsyncDaytona, DaytonaConfig

    from daytona_kernel.backends.daytona.api import LABEL_NEXT
    from daytona_kernel.compose import kernel_id_of

    async def leave_a_context(sandbox_id: str, label: str) -> None:
        client = AsyncDaytona(DaytonaConfig(api_key=emu.api_key, api_url=emu.api_url, target="us"))
        try:
            found = await client.get(sandbox_id)
            context = await found.code_interpreter.create_context()
            await found.set_labels({**found.labels, LABEL_NEXT: f"{label}.{context.id}"})
        finally:
            await client.close()

    with Kernel("daytona", cwd=str(tmp_path)) as k:
        k.execute("x = 1")
        sandbox = only_sandbox(emu, tmp_path)
        asyncio.run(leave_a_context(sandbox.id, kernel_id_of(k.km.connection_file)))
    assert sandbox.state == "stopped"
    with Kernel("daytona", cwd=str(tmp_path)) as k:
        k.execute("x = 1")
        sandbox = only_sandbox(emu, tmp_path)
        asyncio.run(leave_a_context(sandbox.id, "another-kernel"))  # another kernel's, about to start: kept
    assert sandbox.state == "started"


def test_a_next_context_that_could_not_be_named_is_deleted_with_the_old_one(emu: Any, tmp_path: Path) -> None:
    with Kernel("daytona", cwd=str(tmp_path)) as k:
        k.execute("x = 1")
        sandbox = only_sandbox(emu, tmp_path)
        emu.fail_next("/labels", 400)  # the next context cannot be named in the sandbox's labels
        k.km.shutdown_kernel(now=False, restart=True)
        assert sandbox.contexts == {}  # nothing left behind
        k.km.start_kernel(**k.km._launch_args)
        k.kc.wait_for_ready(timeout=60)
        assert result_text(k.execute("1 + 1")) == "2"


def test_a_restart_while_the_sandbox_is_stopping(emu: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(emu.transition_s, "stopping", 60.0)  # still stopping when the new process looks
    with Kernel("daytona", cwd=str(tmp_path)) as k:
        k.execute("1")
        sandbox = only_sandbox(emu, tmp_path)
        emu.stop_sandbox(sandbox.id)  # auto-stop just began
        assert sandbox.state == "stopping"
        k.restart()
        seen: list[str] = []

        def stop_once_it_waits(msg: dict[str, Any]) -> None:
            if msg["msg_type"] in ("display_data", "update_display_data") and not seen:
                line = msg["content"]["data"]["text/plain"]
                if ": stopping (" in line:  # the new process waits for the stop, as it must
                    seen.append(line)
                    finish_transition(emu, sandbox)

        run = k.execute("21 * 2", timeout=30, on_message=stop_once_it_waits)
        assert result_text(run) == "42" and seen, run.outputs
        assert sandbox.state == "started"


def finish_transition(emu: Any, sandbox: Any) -> None:
    """End a sandbox's transition now, as its timer would later (the test has seen the kernel wait for it)."""

    async def arrive() -> None:
        sandbox.state = sandbox.desired

    emu.call(arrive())


def test_a_sandbox_found_stopping_is_waited_for_then_started(emu: Any, tmp_path: Path) -> None:
    with Kernel("daytona", cwd=str(tmp_path)) as k:
        k.execute("1")
        sandbox = only_sandbox(emu, tmp_path)
        emu.stop_sandbox(sandbox.id)
        run = k.execute("print('back')", timeout=30)
        assert run.text() == "back\n" and "variables were reset" in run.text("stderr")
        status = run.status_lines
        assert any("stopping" in line for line in status), status  # the status line said what it waited for


def test_an_archiving_sandbox_is_started(emu: Any, tmp_path: Path) -> None:
    with Kernel("daytona", cwd=str(tmp_path)) as k:
        k.execute("1")
        sandbox = only_sandbox(emu, tmp_path)
        emu.stop_sandbox(sandbox.id, state="archived")
        emu.wait_for_state(sandbox.id, "archiving")
        assert result_text(k.execute("6 * 7", timeout=30)) == "42"
        assert sandbox.state == "started"


def test_an_ephemeral_sandbox_auto_stopped_then_two_cells(emu: Any, tmp_path: Path) -> None:
    with Kernel("daytona", cwd=str(tmp_path), env={"DAYTONA_KERNEL_SANDBOX_POLICY": "ephemeral"}) as k:
        k.execute("x = 1\nopen('kept.txt', 'w').write('on the volume')")
        first = only_sandbox(emu, tmp_path)
        wait_for(emu.bucket_path("daytona-kernel", first.spec["volumes"][0]["subpath"], "kept.txt"))  # the volume's copy
        first.last_activity -= 3600  # idle for an hour
        assert emu.run_auto_stop() == [first.id]  # ephemeral: stopping deletes it
        one = k.execute("print(open('kept.txt').read())", timeout=30)
        assert one.status == "ok", one.errors
        assert one.text() == "on the volume\n"
        assert "variables were reset" in one.text("stderr")
        two = k.execute("y = 2\ny", timeout=30)
        assert result_text(two) == "2" and two.text("stderr") == ""
        assert only_sandbox(emu, tmp_path) is not first


def test_a_reused_sandbox_deleted_in_the_dashboard_is_replaced(emu: Any, tmp_path: Path) -> None:
    with Kernel("daytona", cwd=str(tmp_path)) as k:
        k.execute("1")
        first = only_sandbox(emu, tmp_path)
        emu.delete_sandbox_now(first.id)  # someone deleted it in the dashboard
        run = k.execute("'again'", timeout=30)
        assert result_text(run) == "'again'" and "variables were reset" in run.text("stderr")


def test_two_notebooks_in_one_folder_one_closed(emu: Any, tmp_path: Path) -> None:
    one = Kernel("daytona", cwd=str(tmp_path))
    with Kernel("daytona", cwd=str(tmp_path)) as two:
        one.execute("a = 1")
        two.execute("b = 2")
        shared = only_sandbox(emu, tmp_path)
        one.close()
        assert shared.state == "started"
        assert result_text(two.execute("b")) == "2"
    assert shared.state == "stopped"  # the last one out stops it


def test_a_gpu_snapshot_makes_the_sandbox_ephemeral_and_says_so_once(
    emu: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """For a snapshot create Daytona takes the GPU count from the snapshot (sandbox.service.ts about 520-526),
    and refuses a GPU sandbox that is not ephemeral: with the default 'reuse' every create was a 400."""
    monkeypatch.setitem(emu.snapshots, "cuda-snapshot", {"cpu": 4, "mem": 16, "disk": 20, "gpu": 1})
    with Kernel("daytona", cwd=str(tmp_path), env={"DAYTONA_KERNEL_SNAPSHOT": "cuda-snapshot"}) as k:
        first = k.execute("1 + 1", timeout=60)
        assert result_text(first) == "2", (first.errors, first.text("stderr"))
        assert first.text("stderr").count("has 1 GPU") == 1 and "ephemeral" in first.text("stderr"), first.text("stderr")
        assert k.execute("2 + 2").text("stderr") == ""
        sandbox = only_sandbox(emu, tmp_path)
        assert sandbox.spec["autoDeleteInterval"] == 0 and sandbox.spec["gpu"] == 1
    assert not [s for s in sandboxes_of(emu, tmp_path) if s.state not in ("destroying", "destroyed")]


def test_gpu_without_an_image_or_a_gpu_snapshot_is_refused_with_the_fix(emu: Any, tmp_path: Path) -> None:
    """The SDK sends resources only with an image: gpu=1 on the default snapshot gave a sandbox with no GPU."""
    with Kernel("daytona", cwd=str(tmp_path), env={"DAYTONA_KERNEL_GPU": "1"}) as k:
        run = k.execute("1 + 1", timeout=60)
        message = str(run.errors)
        assert "gpu = 1 needs" in message and "DaytonaKernel.image" in message, (run.errors, run.text("stderr"))
    assert not [s for s in sandboxes_of(emu, tmp_path) if s.state not in ("destroying", "destroyed")]


def test_a_gpu_sandbox_is_ephemeral_and_says_so_once(emu: Any, tmp_path: Path) -> None:
    env = {"DAYTONA_KERNEL_GPU": "1", "DAYTONA_KERNEL_IMAGE": "python:3.12"}
    with Kernel("daytona", cwd=str(tmp_path), env=env) as k:
        first = k.execute("1 + 1", timeout=30)
        assert result_text(first) == "2", first.errors
        assert first.text("stderr").count("GPU sandboxes must be ephemeral") == 1
        assert k.execute("2 + 2").text("stderr") == ""
        sandbox = only_sandbox(emu, tmp_path)
        assert sandbox.spec["autoDeleteInterval"] == 0 and sandbox.spec["gpu"] == 1
    assert not [s for s in sandboxes_of(emu, tmp_path) if s.state not in ("destroying", "destroyed")]


def test_a_create_that_fails_after_it_succeeded_leaves_one_sandbox(emu: Any, tmp_path: Path) -> None:
    emu.fail_after_create(503)
    with Kernel("daytona", cwd=str(tmp_path)) as k:
        assert result_text(k.execute("3 * 3", timeout=30)) == "9"
        assert len(sandboxes_of(emu, tmp_path)) == 1
        assert emu.counts[CREATE] == 1  # found by its labels, not created again


@pytest.mark.parametrize(("ref", "version"), [("v1", "1"), ("main", "2"), ("first", "1")])
def test_repo_ref_may_be_a_branch_a_tag_or_a_commit(
    emu: Any, tmp_path: Path, repo: dict[str, str], ref: str, version: str
) -> None:
    env = {"DAYTONA_KERNEL_REPO_URL": repo["url"], "DAYTONA_KERNEL_REPO_REF": repo.get(ref, ref)}
    with Kernel("daytona", cwd=str(tmp_path), env=env) as k:
        run = k.execute("open('project/version.txt').read()", timeout=30)
        assert result_text(run) == repr(version), run.errors


def test_git_token_alone_authenticates(emu: Any, tmp_path: Path, repo: dict[str, str]) -> None:
    emu.git_credentials[repo["url"]] = ("anyone", "t0ken")
    try:
        env = {"DAYTONA_KERNEL_REPO_URL": repo["url"], "GIT_TOKEN": "t0ken"}
        with Kernel("daytona", cwd=str(tmp_path), env=env) as k:
            run = k.execute("open('project/version.txt').read()", timeout=30)
            assert result_text(run) == "'2'", run.errors
            assert "t0ken" not in str(run.messages)
    finally:
        del emu.git_credentials[repo["url"]]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("where", ["a closed port", "an unknown host"])  # ids alike in every xdist worker
def test_an_unreachable_api_fails_fast_with_the_url(emu: Any, tmp_path: Path, where: str) -> None:
    url = f"http://127.0.0.1:{_closed_port()}/api" if where == "a closed port" else "http://no-such-host.invalid/api"
    with Kernel("daytona", cwd=str(tmp_path), env={"DAYTONA_API_URL": url}) as k:
        for _ in range(2):  # and the next cell does not wait again
            started = time.monotonic()
            run = k.execute("1", timeout=60)
            assert time.monotonic() - started < 10
            err = run.errors[0]
            assert url in err["evalue"] and "DAYTONA_API_URL" in err["evalue"]
            assert "status.daytona.io" not in err["evalue"]  # not Daytona's own service
        assert k.request("kernel_info")["status"] == "ok"


def test_transient_errors_retry_with_progress_in_the_status_line(emu: Any, tmp_path: Path) -> None:
    emu.fail_next("GET /api/volumes/by-name/{name}", 503, times=2)
    with Kernel("daytona", cwd=str(tmp_path)) as k:
        run = k.execute("'through'", timeout=60)
        assert result_text(run) == "'through'"
        status = run.status_lines
        assert any("Daytona answered 503, retrying" in line and "/30 s" in line for line in status), status


def test_gc_delete_stopped_frees_the_disk_quota(daytona_env: Any) -> None:
    from test_gc import make_sandbox

    from daytona_kernel import admin
    from daytona_kernel.identity import owner_id

    old, recent = make_sandbox(daytona_env, owner_id()), make_sandbox(daytona_env, owner_id())
    for sandbox_id in (old, recent):
        daytona_env.stop_sandbox(sandbox_id)
        daytona_env.wait_for_state(sandbox_id, "stopped")
    daytona_env.sandboxes[old].last_activity -= 8 * 86400
    lines: list[str] = []
    assert admin.run(admin.gc(7 * 86400.0, False, lines.append)) == 0  # without the option: stopped ones stay
    assert daytona_env.sandboxes[old].state == "stopped", lines
    assert admin.run(admin.gc(7 * 86400.0, False, lines.append, delete_stopped=True)) == 0
    assert any(line.startswith(f"deleted {old}: stopped for 8.0 d") for line in lines), lines
    daytona_env.wait_for_state(old, "destroyed")
    assert daytona_env.sandboxes[recent].state == "stopped"


def test_config_drift_is_named_once_and_recreate_rebuilds(emu: Any, tmp_path: Path) -> None:
    with Kernel("daytona", cwd=str(tmp_path)) as k:
        k.execute("open('kept.txt', 'w').write('durable')")
        first = only_sandbox(emu, tmp_path)
    moved = {"DAYTONA_KERNEL_MOUNT_PATH": "/home/daytona/elsewhere"}
    with Kernel("daytona", cwd=str(tmp_path), env=moved) as k:
        run = k.execute("print(open('kept.txt').read())", timeout=30)
        assert run.text() == "durable\n", run.errors  # a changed mount_path never breaks the kernel
        notice = run.text("stderr")
        assert "/home/daytona/elsewhere" in notice and "%daytona recreate" in notice
        assert k.execute("1").text("stderr") == ""  # once
        recreated = k.execute("%daytona recreate", timeout=60)
        assert recreated.status == "ok", recreated.errors
        assert "recreated" in recreated.text() and first.id in recreated.text()
        after = k.execute("print(open('kept.txt').read())", timeout=30)
        assert after.text() == "durable\n", after.errors
        second = only_sandbox(emu, tmp_path)
        assert second is not first and second.spec["volumes"][0]["mountPath"] == "/home/daytona/elsewhere"
