"""The emulator's control plane, driven through the unmodified SDK: what it must imitate.

Each test pins one behaviour of the real API or daemon (v0.190.0: apps/api/src/sandbox/services/
sandbox.service.ts, apps/api/src/notification/, apps/daemon/pkg/git/clone.go), so the kernel's
lifecycle tests run against the platform's traps, not against an instant, forgiving fake.
"""

from __future__ import annotations

import asyncio
import os
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Awaitable, Callable

import pytest
from daytona import AsyncDaytona, CreateSandboxFromImageParams, CreateSandboxFromSnapshotParams, DaytonaConfig, Resources
from daytona.common.errors import DaytonaConflictError, DaytonaError, DaytonaNotFoundError
from daytona_api_client_async.exceptions import ConflictException
from daytona_emulator import DaytonaEmulator

pytestmark = pytest.mark.slow  # the emulator, git and kernels run as subprocesses
TRANSITION_S = 0.6  # long enough to act inside a transition, short enough for a fast test


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Any:
    emulator = DaytonaEmulator(tmp_path_factory.mktemp("control-plane")).start()
    emulator.transition_s = dict.fromkeys(emulator.transition_s, TRANSITION_S)
    yield emulator
    emulator.close()


def run(emu: DaytonaEmulator, body: Callable[[AsyncDaytona], Awaitable[Any]]) -> Any:
    async def go() -> Any:
        client = AsyncDaytona(DaytonaConfig(api_key=emu.api_key, api_url=emu.api_url, target="us"))
        try:
            return await body(client)
        finally:
            await client.close()

    return asyncio.run(go())


def params(**kw: Any) -> CreateSandboxFromSnapshotParams:
    return CreateSandboxFromSnapshotParams(labels={"test": "control-plane"}, **kw)


async def state_of(client: AsyncDaytona, sandbox_id: str) -> str:
    sandbox = await client.get(sandbox_id)
    return str(getattr(sandbox.state, "value", sandbox.state))


def test_start_during_stopping_is_a_409_and_works_once_stopped(emu: DaytonaEmulator, monkeypatch: pytest.MonkeyPatch) -> None:
    # Three requests must land inside the stopping state: on a loaded machine they took longer than 0.6 s.
    monkeypatch.setitem(emu.transition_s, "stopping", 4.0)

    async def body(client: AsyncDaytona) -> None:
        sandbox = await client.create(params())
        emu.stop_sandbox(sandbox.id)  # auto-stop: the state goes through stopping
        assert await state_of(client, sandbox.id) == "stopping"
        with pytest.raises(DaytonaConflictError, match="Sandbox state change in progress"):
            await sandbox.start()
        with pytest.raises(DaytonaConflictError):
            await sandbox.stop()
        await sandbox.wait_for_sandbox_stop()
        await sandbox.start()
        assert await state_of(client, sandbox.id) == "started"

    run(emu, body)


def test_start_during_starting_is_a_409(emu: DaytonaEmulator) -> None:
    async def body(client: AsyncDaytona) -> None:
        sandbox = await client.create(params())
        await sandbox.stop()
        await client._sandbox_api.start_sandbox(sandbox.id)  # the request alone: no waiting
        assert await state_of(client, sandbox.id) == "starting"
        with pytest.raises(ConflictException):
            await client._sandbox_api.start_sandbox(sandbox.id)

    run(emu, body)


def test_start_during_archiving_is_accepted(emu: DaytonaEmulator) -> None:
    async def body(client: AsyncDaytona) -> None:
        sandbox = await client.create(params())
        emu.stop_sandbox(sandbox.id, state="archived")
        deadline = time.monotonic() + 5
        while await state_of(client, sandbox.id) != "archiving":
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        await sandbox.start()
        assert await state_of(client, sandbox.id) == "started"

    run(emu, body)


def test_an_ephemeral_stop_deletes_the_sandbox(emu: DaytonaEmulator) -> None:
    async def body(client: AsyncDaytona) -> None:
        sandbox = await client.create(params(auto_delete_interval=0))
        await sandbox.stop()  # the SDK treats destroyed as stopped
        with pytest.raises(DaytonaNotFoundError):
            await client.get(sandbox.id)

    run(emu, body)


def test_a_gpu_sandbox_must_be_ephemeral(emu: DaytonaEmulator) -> None:
    async def body(client: AsyncDaytona) -> None:
        gpu = Resources(gpu=1)
        with pytest.raises(DaytonaError, match="GPU sandboxes must be ephemeral") as refused:
            await client.create(CreateSandboxFromImageParams(image="python:3.12", resources=gpu))
        assert getattr(refused.value, "status_code", None) == 400
        sandbox = await client.create(CreateSandboxFromImageParams(image="python:3.12", resources=gpu, auto_delete_interval=0))
        assert sandbox.gpu == 1

    run(emu, body)


def test_create_is_not_idempotent(emu: DaytonaEmulator) -> None:
    from daytona import ListSandboxesQuery

    async def body(client: AsyncDaytona) -> None:
        labels = {"test": "not-idempotent"}
        emu.fail_after_create(503)
        with pytest.raises(DaytonaError) as failed:
            await client.create(CreateSandboxFromSnapshotParams(labels=labels))
        assert getattr(failed.value, "status_code", None) == 503
        found = [s async for s in client.list(ListSandboxesQuery(labels=labels))]
        assert len(found) == 1  # the failed create made one all the same

    run(emu, body)


def test_toolbox_requests_are_activity_and_auto_stop_stops_the_idle(emu: DaytonaEmulator) -> None:
    async def body(client: AsyncDaytona) -> None:
        idle = await client.create(params(auto_stop_interval=15))
        busy = await client.create(params(auto_stop_interval=15))
        for sandbox in (idle, busy):
            emu.sandboxes[sandbox.id].last_activity -= 3600
        await busy.process.exec("true")  # a toolbox request
        await busy.refresh_data()
        assert time.time() - datetime.fromisoformat(str(busy.last_activity_at)).timestamp() < 60
        assert emu.run_auto_stop() == [idle.id]
        assert emu.sandboxes[busy.id].state == "started"
        assert await state_of(client, idle.id) in ("stopping", "stopped")

    run(emu, body)


def test_a_context_in_a_missing_folder_is_a_500(emu: DaytonaEmulator) -> None:
    async def body(client: AsyncDaytona) -> None:
        sandbox = await client.create(params())
        with pytest.raises(DaytonaError) as failed:
            await sandbox.code_interpreter.create_context(cwd="/no/such/folder/anywhere")
        assert getattr(failed.value, "status_code", None) == 500

    run(emu, body)


def clone_into(emu: DaytonaEmulator, dest: str, **kw: Any) -> Path:
    async def body(client: AsyncDaytona) -> Path:
        sandbox = await client.create(params())
        await sandbox.git.clone(path=dest, **kw)
        return emu.host_path(emu.sandboxes[sandbox.id], dest)

    return run(emu, body)


def test_git_clone_reads_a_branch_as_refs_heads(emu: DaytonaEmulator, repo: dict[str, str]) -> None:
    assert (clone_into(emu, "on-main", url=repo["url"], branch="main") / "version.txt").read_text() == "2"
    with pytest.raises(DaytonaError, match="reference not found"):
        clone_into(emu, "on-tag", url=repo["url"], branch="v1")  # go-git: refs/heads/v1 does not exist


def test_git_clone_checks_out_a_full_commit_id_only(emu: DaytonaEmulator, repo: dict[str, str]) -> None:
    assert (clone_into(emu, "at-first", url=repo["url"], commit_id=repo["first"]) / "version.txt").read_text() == "1"
    with pytest.raises(DaytonaError, match="object not found"):
        clone_into(emu, "at-short", url=repo["url"], commit_id=repo["first"][:8])


def test_git_credentials_count_only_when_both_are_given(emu: DaytonaEmulator, repo: dict[str, str]) -> None:
    emu.git_credentials[repo["url"]] = ("anyone", "s3cret")
    try:
        with pytest.raises(DaytonaError, match="authentication required"):
            clone_into(emu, "token-only", url=repo["url"], password="s3cret")
        assert (clone_into(emu, "both", url=repo["url"], username="x", password="s3cret") / "version.txt").exists()
    finally:
        del emu.git_credentials[repo["url"]]


# -- pausing, stopping from paused, recoverable errors (sandbox.service.ts pause/stop/start/recover) -------


@pytest.fixture
def vm_class(emu: DaytonaEmulator, monkeypatch: pytest.MonkeyPatch) -> str:
    """New sandboxes are of the class linux-vm, one of the two that pause."""
    monkeypatch.setattr(emu, "sandbox_class", "linux-vm")
    return "linux-vm"


def test_pause_is_400_unless_started_409_while_a_change_is_pending_422_for_the_class(emu: DaytonaEmulator, vm_class: str) -> None:
    from daytona.common.errors import DaytonaBadRequestError

    async def body(client: AsyncDaytona) -> None:
        sandbox = await client.create(params())
        await sandbox.pause()
        assert await state_of(client, sandbox.id) == "paused"
        with pytest.raises(DaytonaBadRequestError, match="must be in started state to pause"):
            await sandbox.pause()  # a paused sandbox is not started: 400, not "this class cannot pause"
        await sandbox.stop()  # accepted from paused
        assert await state_of(client, sandbox.id) == "stopped"
        with pytest.raises(DaytonaBadRequestError, match="must be in started state to pause"):
            await sandbox.pause()
        await sandbox.start()
        emu.stop_sandbox(sandbox.id)  # a stop is pending: the API still has it started
        with pytest.raises(DaytonaConflictError):
            await sandbox.pause()

    run(emu, body)
    emu.sandbox_class = "container"

    async def container(client: AsyncDaytona) -> None:
        sandbox = await client.create(params())
        with pytest.raises(DaytonaError, match="Pausing is not supported for this sandbox") as refused:
            await sandbox.pause()
        assert getattr(refused.value, "status_code", None) == 422
        assert await state_of(client, sandbox.id) == "started"

    run(emu, container)


def test_stopping_a_paused_sandbox_ends_its_processes(emu: DaytonaEmulator, vm_class: str) -> None:
    async def body(client: AsyncDaytona) -> None:
        sandbox = await client.create(params())
        ctx = await sandbox.code_interpreter.create_context()
        pid = int((await sandbox.code_interpreter.run_code("import os\nprint(os.getpid())", context=ctx)).stdout)
        await sandbox.pause()
        await sandbox.stop()
        await sandbox.start()
        assert await sandbox.code_interpreter.list_contexts() == []  # the daemon's memory went with the stop
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)

    run(emu, body)


def test_a_failed_pause_is_a_recoverable_error_and_recover_starts_the_sandbox(emu: DaytonaEmulator, vm_class: str) -> None:
    from daytona.common.errors import DaytonaBadRequestError

    async def body(client: AsyncDaytona) -> None:
        sandbox = await client.create(params())
        emu.fail_next_pause("pause timed out on the runner", recoverable=True)
        with pytest.raises(DaytonaError, match="entered error state"):
            await sandbox.pause()
        await sandbox.refresh_data()
        assert (sandbox.state, sandbox.recoverable, sandbox.error_reason) == ("error", True, "pause timed out on the runner")
        with pytest.raises(DaytonaBadRequestError, match="errored state"):
            await sandbox.start()
        with pytest.raises(DaytonaBadRequestError, match="errored state"):
            await sandbox.stop()
        await sandbox.recover()
        assert await state_of(client, sandbox.id) == "started"
        assert (await sandbox.process.exec("echo back")).result == "back\n"
        with pytest.raises(DaytonaBadRequestError, match="not in a recoverable state"):
            await sandbox.recover()

    run(emu, body)


# -- GPU from the snapshot (sandbox.service.ts createFromSnapshot about 520-526) ----------------------------


def test_a_snapshot_create_takes_its_gpu_from_the_snapshot(emu: DaytonaEmulator, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(emu.snapshots, "cuda-snapshot", {"cpu": 4, "mem": 16, "disk": 20, "gpu": 1})

    async def body(client: AsyncDaytona) -> None:
        with pytest.raises(DaytonaError, match="GPU sandboxes must be ephemeral - set autoDeleteInterval to 0") as refused:
            await client.create(params(snapshot="cuda-snapshot"))  # the default policy is not ephemeral
        assert getattr(refused.value, "status_code", None) == 400
        sandbox = await client.create(params(snapshot="cuda-snapshot", auto_delete_interval=0))
        assert (sandbox.gpu, sandbox.cpu, sandbox.memory) == (1, 4, 16)
        assert (await client.snapshot.get("cuda-snapshot")).gpu == 1
        plain = await client.create(params())
        assert plain.gpu == 0

    run(emu, body)


# -- state events (apps/api/src/notification/gateways/notification.gateway.ts) ---------------------------


def test_state_changes_are_sent_as_socketio_events_to_the_sdk(emu: DaytonaEmulator) -> None:
    async def body(client: AsyncDaytona) -> list[tuple[str, Any]]:
        sandbox = await client.create(params())
        dispatcher = client._event_dispatcher
        assert dispatcher is not None
        await dispatcher.connect()  # what the SDK does in the background at once
        assert dispatcher.is_connected, dispatcher.fail_error
        seen: list[tuple[str, Any]] = []
        dispatcher.subscribe(sandbox.id, lambda name, data: seen.append((name, data)), ["sandbox.state.updated"])
        await sandbox.stop()
        for _ in range(100):  # the last event may still be on its way when stop() has seen the state
            if [d["newState"] for _, d in seen] == ["stopping", "stopped"]:
                break
            await asyncio.sleep(0.02)
        return seen

    seen = run(emu, body)
    assert [(name, d["oldState"], d["newState"]) for name, d in seen] == [
        ("sandbox.state.updated", "started", "stopping"),
        ("sandbox.state.updated", "stopping", "stopped"),
    ]
    assert seen[-1][1]["sandbox"]["state"] == "stopped"  # the SDK reads the state from the sandbox DTO


def test_the_event_gateway_refuses_a_wrong_token(emu: DaytonaEmulator) -> None:
    from daytona.internal.event_dispatcher import AsyncEventDispatcher

    async def body() -> None:
        dispatcher = AsyncEventDispatcher(emu.api_url, "dtn_wrong")
        with pytest.raises(ConnectionError):
            await dispatcher.connect()
        await dispatcher.disconnect()

    asyncio.run(body())
