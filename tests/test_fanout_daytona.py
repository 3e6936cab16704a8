"""``%%daytona map`` on the Daytona backend against the emulator: what only the platform does. Workers
are labelled, ephemeral sandboxes without the volume; creates back off on 429 as told; the pool starts
as many workers as the organisation's quota allows and says so; shutdown deletes the workers, and
``daytona-kernel gc`` reclaims those of a SIGKILLed kernel. (The contract itself runs on both backends
in test_fanout.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from conftest import sandboxes_of
from kernels import Kernel
from test_fanout import shown

WORKER = "daytona-kernel-worker"


def workers_of(emulator: Any, kernel_id: str | None = None) -> list[Any]:
    return [
        s
        for s in emulator.live_sandboxes()
        if WORKER in s.labels and (kernel_id is None or s.labels.get("daytona-kernel-kernel-id") == kernel_id)
    ]


def kernel_id(k: Kernel) -> str:
    from daytona_kernel.compose import kernel_id_of

    return kernel_id_of(k.km.connection_file)


def test_workers_are_labelled_ephemeral_sandboxes_without_the_volume(daytona_env: Any, tmp_path: Path) -> None:
    with Kernel("daytona", cwd=str(tmp_path)) as k:
        run = k.execute("%%daytona map 2\nprint(rank)")
        assert run.status == "ok", run.errors
        assert "started 2 engines; each is a Daytona sandbox of 1 CPU, 1 GiB memory, 3 GiB disk" in shown(run, "stderr")
        workers = workers_of(daytona_env, kernel_id(k))
        assert sorted(w.labels[WORKER] for w in workers) == ["0", "1"]
        assert all(w.spec.get("autoDeleteInterval") == 0 and not w.mounts for w in workers)
        assert all(w.labels["daytona-kernel-policy"] == "ephemeral" for w in workers)
        status = k.execute("%daytona status").text()
        assert all(w.id in status for w in workers)
    assert not workers_of(daytona_env, kernel_id(k))  # shutdown deleted them


def test_creates_back_off_as_the_429_says_and_every_worker_starts(daytona_env: Any, tmp_path: Path) -> None:
    with Kernel("daytona", cwd=str(tmp_path)) as k:
        k.execute("pass")
        daytona_env.create_rate = (2, 2.0)
        try:
            run = k.execute("%%daytona map 4\nprint(world)", timeout=120)
        finally:
            daytona_env.create_rate = None
        assert run.status == "ok", run.errors
        assert daytona_env.throttled >= 1
        assert sorted(shown(run).splitlines()) == [f"[stdout:{r}] 4" for r in range(4)]
        assert any("asks to wait" in line for line in run.status_lines)


def test_the_pool_starts_what_the_quota_allows_says_so_and_leaves_nothing_half_made(daytona_env: Any, tmp_path: Path) -> None:
    with Kernel("daytona", cwd=str(tmp_path)) as k:
        k.execute("pass")
        # The emulator is shared by the tests of one xdist worker: the sandboxes earlier tests left
        # started (a kept sandbox waits for its auto-stop) would count against this quota too.
        for s in daytona_env.live_sandboxes():
            if s.state == "started" and s not in sandboxes_of(daytona_env, tmp_path):
                daytona_env.stop_sandbox(s.id)
        daytona_env.quota = {"cpu": 3}  # the main sandbox uses one
        try:
            run = k.execute("%%daytona map 4\nprint(rank, world)", timeout=120)
            assert run.status == "ok", run.errors
            (line,) = [x for x in shown(run, "stderr").splitlines() if "engines started" in x]
            assert line.startswith("daytona-kernel: 2 of 4 engines started; the organisation's quota is used up: ")
            assert "Total CPU limit exceeded. Maximum allowed: 3" in line and line.endswith("(world = 2).")
            assert sorted(shown(run).splitlines()) == ["[stdout:0] 0 2", "[stdout:1] 1 2"]
            assert len(workers_of(daytona_env, kernel_id(k))) == 2  # the refused ones left nothing behind
            refused = k.execute("%daytona map --close\n")
            assert refused.status == "ok"
            daytona_env.quota = {"cpu": 1}
            none = k.execute("%%daytona map 2\npass", timeout=120)
            assert none.status == "error" and none.errors[0]["ename"] == "DaytonaQuotaExceeded"
            assert "Total CPU limit exceeded" in none.errors[0]["evalue"]
        finally:
            daytona_env.quota = {}


def test_gc_deletes_the_workers_of_a_sigkilled_kernel(daytona_env: Any, tmp_path: Path) -> None:
    k = Kernel("daytona", cwd=str(tmp_path), env={"DAYTONA_KERNEL_SANDBOX_POLICY": "ephemeral"})
    try:
        assert k.execute("%%daytona map 2\npass").status == "ok"
        ident = kernel_id(k)
        workers = workers_of(daytona_env, ident)
        assert len(workers) == 2
    finally:
        k.kc.stop_channels()
        k.km.shutdown_kernel(now=True)  # SIGKILL: no chance to clean up
    assert all(w.state == "started" for w in workers)
    env = {key: v for key, v in os.environ.items() if not key.startswith("DAYTONA_")}
    env.update(daytona_env.env(), JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"))
    gc = subprocess.run([sys.executable, "-m", "daytona_kernel.cli", "gc"], env=env, capture_output=True, text=True, timeout=120)
    assert gc.returncode == 0, gc.stdout + gc.stderr
    assert all(f"deleted {w.id}" in gc.stdout for w in workers)
    assert not workers_of(daytona_env, ident)


def test_scatter_and_gather_resume_a_paused_main_sandbox_first(daytona_env: Any, tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(daytona_env, "sandbox_class", "linux-vm")  # a class that pauses
    with Kernel("daytona", cwd=str(tmp_path)) as k:
        k.execute("xs = [1, 2, 3, 4]")
        (main,) = [s for s in sandboxes_of(daytona_env, tmp_path) if s.state == "started"]
        daytona_env.pause_sandbox(main.id)  # auto-pause, or the dashboard
        daytona_env.wait_for_state(main.id, "paused")
        run = k.execute("%%daytona map 2 --scatter xs --gather total\ntotal = sum(xs)", timeout=60)
        assert run.status == "ok", run.errors
        assert "resumed the paused sandbox" in shown(run, "stderr")
        assert k.execute("print(total)").text() == "[3, 7]\n"


def test_workers_that_auto_stop_deleted_are_made_again_with_the_files_and_chunks(daytona_env: Any, tmp_path: Path) -> None:
    (tmp_path / "data.txt").write_text("5\n")
    with Kernel("daytona", cwd=str(tmp_path), env={"DAYTONA_KERNEL_AUTO_STOP_INTERVAL": "1"}) as k:
        k.execute("xs = [1, 2, 3, 4]")
        assert k.execute("%%daytona map 2\nkept = rank").status == "ok"
        workers = workers_of(daytona_env, kernel_id(k))
        for worker in workers:
            worker.last_activity -= 120  # idle past its 1 minute
        assert sorted(daytona_env.run_auto_stop()) == sorted(w.id for w in workers)  # ephemeral: deleted
        run = k.execute(
            "%%daytona map 2 --scatter xs\nprint(rank, open('data.txt').read().strip(), xs, globals().get('kept'))", timeout=60
        )
        assert run.status == "ok", run.errors
        assert sorted(shown(run).splitlines()) == ["[stdout:0] 0 5 [1, 2] None", "[stdout:1] 1 5 [3, 4] None"]
        assert shown(run, "stderr").count("It was started again: its variables were reset") == 2
        assert not {w.id for w in workers} & {w.id for w in workers_of(daytona_env, kernel_id(k))}
