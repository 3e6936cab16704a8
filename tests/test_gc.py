"""Workspace identity and ``daytona-kernel gc`` on the Daytona backend, against the emulator.

Every sandbox carries this installation's random owner id; gc looks only at those, never
touches a sandbox in a transition, goes on after one failure, and talks to the configured API.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import sandboxes_of
from kernels import Kernel

from daytona_kernel import admin
from daytona_kernel.identity import owner_id, owner_id_path

APP, OWNER, KERNEL, POLICY = "daytona-kernel", "daytona-kernel-owner", "daytona-kernel-kernel-id", "daytona-kernel-policy"


def make_sandbox(emulator: Any, owner: str, policy: str = "reuse", kernel: str = "a-kernel-that-is-gone") -> str:
    """A kernel sandbox as a kernel would have left it, made through the SDK."""
    from daytona import AsyncDaytona, CreateSandboxFromSnapshotParams, DaytonaConfig

    async def create() -> str:
        client = AsyncDaytona(DaytonaConfig(api_key=emulator.api_key, api_url=emulator.api_url, target="us"))
        try:
            labels = {APP: "true", OWNER: owner, KERNEL: kernel, POLICY: policy, "daytona-kernel-workspace": "w"}
            sandbox = await client.create(CreateSandboxFromSnapshotParams(labels=labels), timeout=60)
            return str(sandbox.id)
        finally:
            await client.close()

    return asyncio.run(create())


def run_gc(dry_run: bool = False) -> tuple[int, list[str]]:
    lines: list[str] = []
    return admin.run(admin.gc(3600.0, dry_run, lines.append)), lines


def test_the_owner_id_is_random_private_and_stable() -> None:
    first = owner_id()
    assert first == owner_id()
    assert len(first) >= 16 and first not in (os.environ.get("USER", ""), os.uname().nodename)
    assert owner_id_path().stat().st_mode & 0o777 == 0o600


def test_two_installations_with_the_same_notebook_path_get_their_own_sandbox(daytona_env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    folder = tmp_path / "work"  # the same path for both, like /home/jovyan/work on two machines
    folder.mkdir()
    owners = []
    for who in ("alice", "bob"):
        data = tmp_path / who
        env = {"JUPYTER_DATA_DIR": str(data), "DAYTONA_KERNEL_SYNC": "off"}
        with Kernel("daytona", cwd=str(folder), env=env) as k:
            run = k.execute(
                "import os\nprint(sorted(os.listdir('.')))\nopen(f'{who}.txt', 'w').write('mine')".replace("{who}", who)
            )
            assert run.status == "ok", run.errors
            # bob must not see alice's file: the two working directories are different volume sub-folders
            assert run.text() == "[]\n", f"{who} sees another installation's files: {run.text()}"
        owners.append((data / "daytona-kernel" / "owner-id").read_text().strip())
    assert owners[0] != owners[1]
    mine = [s for s in daytona_env.sandboxes.values() if s.labels.get(OWNER) in owners]
    assert sorted(s.labels[OWNER] for s in mine) == sorted(owners)
    assert all(s.spec["volumes"][0]["subpath"].startswith(s.labels[OWNER] + "/") for s in mine)


def test_gc_only_touches_this_installations_sandboxes(daytona_env) -> None:  # type: ignore[no-untyped-def]
    mine = make_sandbox(daytona_env, owner_id())
    other = make_sandbox(daytona_env, "0123456789abcdef0123")
    user_at_host = make_sandbox(daytona_env, f"{os.environ.get('USER', 'root')}@{os.uname().nodename}")
    code, lines = run_gc()
    assert code == 0, lines
    assert f"stopped {mine}: its kernel a-kernel-that-is-gone no longer runs here" in lines
    assert daytona_env.sandboxes[mine].state == "stopped"
    assert daytona_env.sandboxes[other].state == "started"
    assert daytona_env.sandboxes[user_at_host].state == "started"


@pytest.mark.parametrize("state", ["starting", "stopping", "archiving", "creating", "pausing", "resuming", "restoring"])
def test_gc_leaves_a_sandbox_in_transition_alone(daytona_env, state: str) -> None:  # type: ignore[no-untyped-def]
    sandbox = make_sandbox(daytona_env, owner_id(), policy="ephemeral")
    daytona_env.sandboxes[sandbox].state = state
    code, lines = run_gc()
    assert code == 0, lines
    assert f"skipped {sandbox}: it is {state}; run gc again once that has finished" in lines
    assert daytona_env.sandboxes[sandbox].state == state
    # gc reports every stop and delete it tries; the shared emulator may hold other tests' orphans
    assert [line for line in lines if sandbox in line] == [
        f"skipped {sandbox}: it is {state}; run gc again once that has finished"
    ]
    daytona_env.sandboxes[sandbox].state = "destroyed"  # out of the way of the other tests


def test_one_failing_stop_does_not_abort_the_rest(daytona_env) -> None:  # type: ignore[no-untyped-def]
    first, second = make_sandbox(daytona_env, owner_id()), make_sandbox(daytona_env, owner_id())
    daytona_env.fail_next("/stop", 500, times=1)
    code, lines = run_gc()
    assert code == 1, lines
    errors = [line for line in lines if line.startswith("error: could not stop")]
    assert len(errors) == 1 and "restart the kernel" not in errors[0]
    states = sorted(daytona_env.sandboxes[s].state for s in (first, second))
    assert states == ["started", "stopped"]
    code, lines = run_gc()  # the one that failed is cleaned up on the next run
    assert code == 0 and [daytona_env.sandboxes[s].state for s in (first, second)] == ["stopped", "stopped"]


def test_gc_talks_to_the_configured_api_url(daytona_env, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    sandbox = make_sandbox(daytona_env, owner_id())
    monkeypatch.setenv("DAYTONA_API_URL", "http://127.0.0.1:9/api")  # nothing listens there
    monkeypatch.setenv("DAYTONA_KERNEL_API_URL", daytona_env.api_url)
    code, lines = run_gc()
    assert code == 0, lines
    assert daytona_env.sandboxes[sandbox].state == "stopped"


def test_gc_with_a_wrong_key_says_what_to_do_without_restarting_a_kernel(daytona_env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    env = dict(os.environ)
    env.update(daytona_env.env(), DAYTONA_API_KEY="dtn_wrong")
    proc = subprocess.run(
        [sys.executable, "-m", "daytona_kernel.cli", "gc"], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode != 0
    assert "DAYTONA_API_KEY" in proc.stdout and "run `daytona-kernel gc` again" in proc.stdout
    assert "restart the kernel" not in proc.stdout + proc.stderr


def test_gc_leaves_the_sandbox_of_a_running_kernel_alone(daytona_env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with Kernel("daytona", cwd=str(tmp_path)) as k:
        assert k.execute("1").status == "ok"
        (mine,) = sandboxes_of(daytona_env, tmp_path)
        code, lines = run_gc()
        assert code == 0, lines
        assert mine.state == "started", lines
        assert k.execute("2").status == "ok"


def test_gc_stops_a_sandbox_paused_longer_than_the_age_and_keeps_a_recent_one(
    daytona_env, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """Daytona never archives or deletes a paused sandbox (sandbox.manager.ts: only STOPPED ones), and a paused
    sandbox's disk is billed and held against the quota (usage.service.ts): a forgotten one lasts for ever."""
    import time

    monkeypatch.setattr(daytona_env, "sandbox_class", "linux-vm")
    old, recent = make_sandbox(daytona_env, owner_id()), make_sandbox(daytona_env, owner_id())
    for sandbox in (old, recent):
        daytona_env.pause_sandbox(sandbox)
        daytona_env.wait_for_state(sandbox, "paused")
    daytona_env.sandboxes[old].last_activity = time.time() - 8 * 86400
    daytona_env.sandboxes[recent].last_activity = time.time() - 86400
    code, lines = run_gc(dry_run=True)
    assert code == 0, lines
    assert [line for line in lines if old in line] == [
        f"would stop {old}: paused for 8.0 d (its disk is billed and held against the quota, and Daytona never archives "
        "or deletes a paused sandbox; stopping keeps its files, its variables are lost)"
    ]
    assert daytona_env.sandboxes[old].state == "paused"
    code, lines = run_gc()
    assert code == 0, lines
    assert daytona_env.sandboxes[old].state == "stopped"  # its disk, and the files on it, are kept
    assert daytona_env.sandboxes[recent].state == "paused" and not [line for line in lines if recent in line]
    daytona_env.sandboxes[recent].last_activity = time.time() - 30 * 86400
    lines = []
    assert admin.run(admin.gc(3600.0, False, lines.append, paused_older_than_s=None)) == 0  # --paused-older-than never
    assert daytona_env.sandboxes[recent].state == "paused"
