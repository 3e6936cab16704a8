"""Daytona's harsh paths, as its source (v0.190.0) has them: nothing a finished cell wrote is lost, and nothing
half made is left running (docs/daytona-platform.md, "Stop, delete and the harsh paths").

- a stop SIGKILLs every process of the sandbox (the daemon is PID 1: apps/runner/pkg/docker/container_configs.go);
- a DELETE during a change of state is a 409 "Sandbox state change in progress" (sandbox.service.ts destroy());
- the interpreter's contexts are created and deleted under one lock (interpreter/manager.go);
- the sandbox list is eventually consistent (sandbox.controller.ts), and a name is unique;
- repeated bad keys make 401s into 429s (auth/failed-auth-tracker.service.ts);
- bulk download opens before it stats and names each part as download_files.go does.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import sandboxes_of
from kernels import Kernel, result_text

pytestmark = pytest.mark.slow  # the emulator and kernels run as subprocesses
TRANSITION_S = 1.0


@pytest.fixture(scope="module")
def slow_emulator(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from daytona_emulator import DaytonaEmulator

    emu = DaytonaEmulator(tmp_path_factory.mktemp("harsh")).start()
    emu.transition_s = dict.fromkeys(emu.transition_s, TRANSITION_S)
    yield emu
    emu.close()


@pytest.fixture
def emu(slow_emulator: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    for key, value in slow_emulator.env().items():
        monkeypatch.setenv(key, value)
    slow_emulator.reset_counts()
    return slow_emulator


def live(emulator: Any, folder: Path) -> list[Any]:
    return [s for s in sandboxes_of(emulator, folder) if s.state not in ("destroying", "destroyed")]


def eventually(check: Any, timeout: float = 60.0) -> None:
    """Wait until ``check()`` holds (Daytona's transitions take their time)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"still not true after {timeout} s: {check.__doc__ or check}")
        time.sleep(0.1)


def sdk_call(emulator: Any, action: Any) -> Any:
    """Run ``action(client)`` with the SDK's async client against the emulator; the sandboxes it made are deleted
    after it (the emulator is shared: they would count against another test's quota)."""
    from daytona import AsyncDaytona, DaytonaConfig

    async def run() -> Any:
        client = AsyncDaytona(DaytonaConfig(api_key=emulator.api_key, api_url=emulator.api_url, target="us"))
        try:
            return await action(client)
        finally:
            await client.close()

    before = set(emulator.sandboxes)
    try:
        return asyncio.run(run())
    finally:
        for sid in set(emulator.sandboxes) - before:
            if emulator.sandboxes[sid].state not in ("destroying", "destroyed"):
                emulator.delete_sandbox_now(sid)


# -- a stop kills; what a finished cell wrote is on the volume already ---------------------------------------------


def test_a_stop_nobody_announced_loses_nothing_a_finished_cell_wrote(daytona_env: Any, tmp_path: Path) -> None:
    env = {"DAYTONA_KERNEL_SANDBOX_POLICY": "ephemeral", "DAYTONA_KERNEL_SYNC": "off"}
    with Kernel("daytona", cwd=str(tmp_path), env=env) as k:
        assert k.execute("1").status == "ok"
        wrote = k.execute("open('keep.txt', 'w').write('kept')")
        assert wrote.status == "ok", wrote.errors
        (sandbox,) = live(daytona_env, tmp_path)
        daytona_env.stop_sandbox(sandbox.id)  # the dashboard, right after the cell: SIGKILL, and ephemeral: deleted
        back = k.execute("print(open('keep.txt').read())", timeout=120)
        assert back.status == "ok", (back.errors, back.text("stderr"))
        assert back.text() == "kept\n"
        assert "variables were reset" in back.text("stderr")


def test_a_stop_kills_every_process_at_once_without_atexit(daytona_env: Any, tmp_path: Path) -> None:
    async def scenario(client: Any) -> list[str]:
        from daytona import CreateSandboxFromSnapshotParams

        sandbox = await client.create(CreateSandboxFromSnapshotParams(), timeout=60)
        ctx = await sandbox.code_interpreter.create_context()
        code = (
            "import atexit, signal, os\n"
            "atexit.register(lambda: open('atexit.txt', 'w').write('ran'))\n"
            "signal.signal(signal.SIGTERM, lambda *a: open('sigterm.txt', 'w').write('ran'))\n"
        )
        result = await sandbox.code_interpreter.run_code(code, context=ctx)
        assert result.error is None, result.error
        await sandbox.stop()
        home = daytona_env.sandboxes[sandbox.id].home
        return sorted(p.name for p in home.iterdir())

    assert sdk_call(daytona_env, scenario) == []  # neither the atexit handler nor the SIGTERM handler wrote


# -- a delete during a change of state --------------------------------------------------------------------------------


def test_a_delete_during_a_change_of_state_is_a_409_and_so_is_a_second_delete(emu: Any) -> None:
    from daytona.common.errors import DaytonaConflictError

    async def scenario(client: Any) -> None:
        from daytona import CreateSandboxFromSnapshotParams

        sandbox = await client.create(CreateSandboxFromSnapshotParams(), timeout=60)
        emu.stop_sandbox(sandbox.id)  # stopping for a second
        with pytest.raises(DaytonaConflictError, match="Sandbox state change in progress"):
            await sandbox.delete()
        emu.wait_for_state(sandbox.id, "stopped")
        await sandbox.delete()  # settled: accepted
        with pytest.raises(DaytonaConflictError, match="Sandbox state change in progress"):
            await sandbox.delete()  # destroying: pending too

    sdk_call(emu, scenario)


def test_a_shutdown_while_the_sandbox_is_created_leaves_nothing_running(
    emu: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(emu.transition_s, "creating", 4.0)
    with Kernel("daytona", cwd=str(tmp_path), env={"DAYTONA_KERNEL_SANDBOX_POLICY": "ephemeral"}):
        eventually(lambda: any(s.state == "creating" for s in sandboxes_of(emu, tmp_path)))
    eventually(lambda: not live(emu, tmp_path))  # deleted once it started, not left running and billed


def test_recreate_during_an_auto_stop_deletes_the_old_sandbox_once_it_stopped(
    emu: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(emu.transition_s, "stopping", 3.0)
    with Kernel("daytona", cwd=str(tmp_path)) as k:
        assert k.execute("1").status == "ok"
        (old,) = live(emu, tmp_path)
        emu.stop_sandbox(old.id)  # auto-stop just began
        run = k.execute("%daytona recreate", timeout=120)
        assert run.status == "ok", (run.errors, run.text("stderr"))
        assert old.state in ("destroying", "destroyed")
        (new,) = live(emu, tmp_path)
        assert new is not old and result_text(k.execute("6 * 7", timeout=60)) == "42"


def test_a_shutdown_while_map_workers_start_leaves_none_running(
    emu: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from test_fanout_daytona import kernel_id, workers_of

    with Kernel("daytona", cwd=str(tmp_path)) as k:
        assert k.execute("1").status == "ok"
        monkeypatch.setitem(emu.transition_s, "creating", 4.0)
        ident = kernel_id(k)
        k.kc.execute("%%daytona map 3\nprint(rank)")
        eventually(lambda: len([w for w in workers_of(emu, ident) if w.state == "creating"]) == 3)
    eventually(lambda: not workers_of(emu, ident))  # each deleted once Daytona let it go


# -- the context manager's lock ----------------------------------------------------------------------------------------


def test_a_context_is_created_only_after_a_deletion_under_way_has_ended(daytona_env: Any) -> None:
    """manager.go: DeleteContext holds the lock while the old worker exits (SIGTERM, up to 2 s), and CreateContext
    needs it: a create that comes meanwhile is answered only after the deletion."""

    async def scenario(client: Any) -> list[str]:
        from daytona import CreateSandboxFromSnapshotParams

        sandbox = await client.create(CreateSandboxFromSnapshotParams(), timeout=60)
        old = await sandbox.code_interpreter.create_context()
        slow_exit = "import signal, time\nsignal.signal(signal.SIGTERM, lambda *a: (time.sleep(1), exit(0)))"
        assert (await sandbox.code_interpreter.run_code(slow_exit, context=old)).error is None
        order: list[str] = []

        async def delete() -> None:
            await sandbox.code_interpreter.delete_context(old)
            order.append("deleted")

        async def create() -> None:
            await asyncio.sleep(0.2)  # the deletion has begun
            await sandbox.code_interpreter.create_context()
            order.append("created")

        await asyncio.gather(delete(), create())
        return order

    assert sdk_call(daytona_env, scenario) == ["deleted", "created"]


# -- creates: a lost answer, an eventually consistent list -----------------------------------------------------------


def test_a_lost_create_answer_with_a_lagging_list_makes_one_sandbox(
    emu: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(emu, "list_lag_s", 120.0)  # the search index has not seen the new sandbox yet
    emu.fail_after_create(503)
    with Kernel("daytona", cwd=str(tmp_path), env={"DAYTONA_KERNEL_SANDBOX_POLICY": "ephemeral"}) as k:
        assert result_text(k.execute("3 * 3", timeout=60)) == "9"
        assert len(live(emu, tmp_path)) == 1, [(s.id, s.state) for s in sandboxes_of(emu, tmp_path)]


def test_a_name_is_unique_and_a_retried_create_is_a_409(daytona_env: Any) -> None:
    from daytona.common.errors import DaytonaConflictError

    async def scenario(client: Any) -> None:
        from daytona import CreateSandboxFromSnapshotParams

        await client.create(CreateSandboxFromSnapshotParams(name="harsh-once"), timeout=60)
        with pytest.raises(DaytonaConflictError, match="Sandbox with name harsh-once already exists"):
            await client.create(CreateSandboxFromSnapshotParams(name="harsh-once"), timeout=60)

    sdk_call(daytona_env, scenario)


# -- the failed-auth throttler ------------------------------------------------------------------------------------------


def test_a_wrong_key_throttled_to_429_is_reported_as_the_key_at_once(
    emu: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from daytona import AsyncDaytona, DaytonaConfig
    from daytona.common.errors import DaytonaAuthenticationError, DaytonaRateLimitError

    monkeypatch.setattr(emu, "failed_auth", (3, 120.0))

    async def bad_key() -> list[type[BaseException]]:
        client = AsyncDaytona(DaytonaConfig(api_key="dtn_wrong", api_url=emu.api_url, target="us"))
        seen = []
        try:
            for _ in range(3):
                try:
                    await client.get("anything")
                except (DaytonaAuthenticationError, DaytonaRateLimitError) as exc:
                    seen.append(type(exc))
        finally:
            await client.close()
        return seen

    assert asyncio.run(bad_key()) == [DaytonaAuthenticationError, DaytonaAuthenticationError, DaytonaRateLimitError]
    with Kernel("daytona", cwd=str(tmp_path), env={"DAYTONA_API_KEY": "dtn_still_wrong"}) as k:
        run = k.execute("1 + 1", timeout=90)  # the old kernel waited out the 120 s as a rate limit
        assert run.status == "error"
        message = run.errors[0]["evalue"]
        assert "DAYTONA_API_KEY" in message and "failed authentications" in message, run.errors
    assert emu.count("GET /api/sandbox") >= 1


# -- downloads ------------------------------------------------------------------------------------------------------------


def toolbox_of(emulator: Any, client: Any, sandbox: Any) -> Any:
    from daytona_kernel.backends.daytona.toolbox import DaytonaToolbox, FoundSandbox

    return DaytonaToolbox(FoundSandbox(sandbox, emulator.api_url), "/home/daytona")


def test_one_path_that_cannot_come_down_fails_alone(daytona_env: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from daytona_kernel.backends.base import FileError
    from daytona_kernel.backends.daytona import toolbox

    monkeypatch.setattr(toolbox, "DOWNLOAD_STALL_S", 2.0)

    async def scenario(client: Any) -> tuple[dict[str, Any], Any]:
        from daytona import CreateSandboxFromSnapshotParams

        sandbox = await client.create(CreateSandboxFromSnapshotParams(), timeout=60)
        home = daytona_env.sandboxes[sandbox.id].home
        (home / "a.txt").write_text("a")
        (home / "café 東京.txt").write_text("named")
        (home / "folder").mkdir()
        os.mkfifo(home / "pipe")  # the daemon's open blocks until a writer comes
        (home / "z.txt").write_text("z")
        names = ["a.txt", "café 東京.txt", "folder", "pipe", "z.txt"]
        try:
            got = await toolbox_of(daytona_env, client, sandbox).download([f"/home/daytona/{n}" for n in names])
        finally:
            with open(home / "pipe", "wb"):  # release the emulator's blocked open
                pass
        return {n: got[f"/home/daytona/{n}"] for n in names}, FileError

    got, file_error = sdk_call(daytona_env, scenario)
    assert got["a.txt"] == b"a" and got["café 東京.txt"] == b"named" and got["z.txt"] == b"z"
    assert isinstance(got["folder"], file_error) and "directory" in got["folder"].message
    assert isinstance(got["pipe"], file_error) and not got["pipe"].retry, got["pipe"]


def test_a_device_that_streams_forever_stops_at_the_byte_cap(daytona_env: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from daytona_kernel.backends.base import FileError
    from daytona_kernel.backends.daytona import toolbox

    monkeypatch.setattr(toolbox, "DOWNLOAD_MAX_BYTES", 4 * 1024 * 1024)

    async def scenario(client: Any) -> dict[str, Any]:
        from daytona import CreateSandboxFromSnapshotParams

        sandbox = await client.create(CreateSandboxFromSnapshotParams(), timeout=60)
        (daytona_env.sandboxes[sandbox.id].home / "b.txt").write_text("b")
        return await toolbox_of(daytona_env, client, sandbox).download(["/dev/zero", "/home/daytona/b.txt"])

    got = sdk_call(daytona_env, scenario)
    assert isinstance(got["/dev/zero"], FileError) and got["/dev/zero"].over_limit
    assert got["/home/daytona/b.txt"] == b"b"


# -- quota, throttles, the sandbox's environment -------------------------------------------------------------------------


def test_archived_sandboxes_do_not_count_against_the_disk_quota(daytona_env: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario(client: Any) -> None:
        from daytona import CreateSandboxFromSnapshotParams

        first = await client.create(CreateSandboxFromSnapshotParams(), timeout=60)
        daytona_env.stop_sandbox(first.id, state="archived")
        daytona_env.wait_for_state(first.id, "archived")
        used = sum(3 for s in daytona_env.sandboxes.values() if s.state in ("started", "stopped", "paused", "archiving"))
        monkeypatch.setattr(daytona_env, "quota", {"disk": used + 3})  # room for exactly one more
        await client.create(CreateSandboxFromSnapshotParams(), timeout=60)  # the archived one holds no disk

    sdk_call(daytona_env, scenario)


def test_closing_eight_workers_at_once_waits_out_the_lifecycle_throttler(
    daytona_env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from test_fanout_daytona import kernel_id, workers_of

    with Kernel("daytona", cwd=str(tmp_path)) as k:
        assert k.execute("%%daytona map 8\npass", timeout=180).status == "ok"
        ident = kernel_id(k)
        monkeypatch.setattr(daytona_env, "lifecycle_rate", (3, 2.0))
        throttled = daytona_env.throttled
        closed = k.execute("%daytona map --close", timeout=180)
        assert closed.status == "ok" and "closed 8 engines" in closed.text(), (closed.errors, closed.text())
        assert daytona_env.throttled > throttled
        assert not workers_of(daytona_env, ident)


def test_the_sandbox_processes_never_see_the_api_key(daytona_env: Any) -> None:
    async def scenario(client: Any) -> str:
        from daytona import CreateSandboxFromSnapshotParams

        sandbox = await client.create(CreateSandboxFromSnapshotParams(env_vars={"MINE": "yes"}), timeout=60)
        result = await sandbox.process.exec("echo key=${DAYTONA_API_KEY:-none} mine=$MINE")
        return str(result.result)

    assert os.environ.get("DAYTONA_API_KEY")  # the emulator's own process has it
    assert sdk_call(daytona_env, scenario).strip() == "key=none mine=yes"


# -- regressions seen from outside ---------------------------------------------------------------------------------------


def test_a_restart_that_finds_its_sandbox_stopping_waits_and_starts_it(
    emu: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new process runs its first cell in the context the old one left (its handoff) while the SDK loads, and
    the sandbox stops just then (an auto-stop that came with the restart): the handshake is refused (400), the
    load waits for the stop and starts the sandbox, and the cell runs there in a new interpreter."""
    monkeypatch.setitem(emu.transition_s, "stopping", 3.0)
    with Kernel("daytona", cwd=str(tmp_path)) as k:
        assert k.execute("1").status == "ok"
        (sandbox,) = live(emu, tmp_path)
        k.restart()
        emu.before_next("GET /toolbox/{sid}/process/interpreter/execute", "stop")  # as the first cell asks for it
        run = k.execute("21 * 2", timeout=120)
        assert run.status == "ok" and result_text(run) == "42", (run.errors, run.text("stderr"))
        assert "started again" in run.text("stderr") and sandbox.state == "started"


def test_a_gpu_snapshot_whose_lookup_fails_is_made_ephemeral_when_the_create_says_so(
    emu: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(emu.snapshots, "cuda-hidden", {"cpu": 4, "mem": 16, "disk": 20, "gpu": 1})
    emu.fail_next("GET /api/snapshots/", 404)  # the lookup gives no GPU count
    with Kernel("daytona", cwd=str(tmp_path), env={"DAYTONA_KERNEL_SNAPSHOT": "cuda-hidden"}) as k:
        first = k.execute("1 + 1", timeout=60)
        assert first.status == "ok" and result_text(first) == "2", (first.errors, first.text("stderr"))
        assert first.text("stderr").count("GPU sandboxes must be ephemeral") == 1, first.text("stderr")
        (sandbox,) = live(emu, tmp_path)
        assert sandbox.spec["autoDeleteInterval"] == 0 and sandbox.labels["daytona-kernel-policy"] == "ephemeral"
    eventually(lambda: not live(emu, tmp_path))  # ephemeral: deleted at shutdown


def test_a_restart_keeps_the_labels_another_client_wrote_meanwhile(emu: Any, tmp_path: Path) -> None:
    """Labels are replaced all at once (replaceLabels): the restart's label for the next context must be written
    over the labels as they are now, not over the copy this kernel read at its start."""
    with Kernel("daytona", cwd=str(tmp_path)) as k:
        assert k.execute("1").status == "ok"
        (sandbox,) = live(emu, tmp_path)

        async def label(client: Any) -> None:
            found = await client.get(sandbox.id)
            await found.set_labels(dict(found.labels, team="data"))  # another kernel, or the dashboard

        sdk_call(emu, label)
        k.restart()
        assert sandbox.labels.get("team") == "data", sandbox.labels
        assert sandbox.labels.get("daytona-kernel-next-context", "").startswith(sandbox.labels["daytona-kernel-kernel-id"])
