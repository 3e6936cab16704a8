"""Storage: the working directory behaves like a disk, and the volume keeps a volume copy of it.

On Daytona the volume is mount-s3 (no rename, no append, no seek-back writes); the
emulator mounts the same semantics with FUSE (tests/mounts3.py). These tests run
ordinary code in the working directory on both backends, and check that a file
outlives its sandbox. Where FUSE is missing the Daytona tests that need mount-s3
semantics skip with the reason (under CI=true they fail instead).
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import sandboxes_of
from kernels import Kernel

COPY_WAIT_S = 30.0  # the volume's copy is written in the background: under load it can take a while

ORDINARY_CODE = """
import os, shutil, sqlite3, zipfile
open('data.txt', 'w').write('v1')
os.replace('data.txt', 'renamed.txt')
with zipfile.ZipFile('archive.zip', 'w') as z:
    z.writestr('inner.txt', 'zipped')
db = sqlite3.connect('db.sqlite')
db.execute('create table t(x)')
db.execute('insert into t values (42)')
db.commit()
db.close()
with open('log.txt', 'a') as f:
    f.write('one\\n')
with open('log.txt', 'a') as f:
    f.write('two\\n')
shutil.copy2('renamed.txt', 'copy.txt')
print(open('log.txt').read().split(), zipfile.ZipFile('archive.zip').read('inner.txt'),
      sqlite3.connect('db.sqlite').execute('select x from t').fetchone(), open('copy.txt').read())
"""


def require_mount_s3(kernel_name: str, emulator) -> None:  # type: ignore[no-untyped-def]
    """A Daytona test whose point is mount-s3's semantics needs FUSE."""
    if kernel_name != "daytona" or emulator.fuse_missing is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must run the mount-s3 storage tests, but {emulator.fuse_missing}: .ci/run installs fuse3")
    pytest.skip(emulator.fuse_missing)


def wait_for(path: Path, content: bytes | None = None) -> None:
    deadline = time.monotonic() + COPY_WAIT_S
    while not (path.is_file() and (content is None or path.read_bytes() == content)):
        assert time.monotonic() < deadline, f"{path} was not written to the volume within {COPY_WAIT_S} s"
        time.sleep(0.05)


def delete_sandbox(emulator, sandbox_id: str) -> None:  # type: ignore[no-untyped-def]
    """What someone deleting the sandbox in the dashboard does: DELETE /sandbox/{id}."""
    request = urllib.request.Request(
        f"{emulator.api_url}/sandbox/{sandbox_id}", method="DELETE", headers={"Authorization": f"Bearer {emulator.api_key}"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200


def test_ordinary_code_works_in_the_working_directory(kernel_name: str, emulator, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    require_mount_s3(kernel_name, emulator)
    with Kernel(kernel_name, cwd=str(tmp_path), env={"DAYTONA_KERNEL_SYNC": "off"}) as k:
        run = k.execute(ORDINARY_CODE)
        assert run.errors == [], run.errors
        assert run.text() == "['one', 'two'] b'zipped' (42,) v1\n"
        run = k.execute("%%writefile -a notes.txt\nfirst\n")
        assert run.errors == [], run.errors
        run = k.execute("%%writefile -a notes.txt\nsecond\n")
        assert run.errors == [], run.errors
        assert k.execute("print(open('notes.txt').read(), end='')").text() == "first\nsecond\n"


def test_the_volume_itself_is_mount_s3(emulator, daytona_env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The emulator is faithful: on the volume's mount, a rename fails as it does on Daytona."""
    require_mount_s3("daytona", emulator)
    with Kernel("daytona", cwd=str(tmp_path), env={"DAYTONA_KERNEL_SYNC": "off"}) as k:
        code = (
            "import errno, os\n"
            "v = '/home/daytona/.daytona-kernel-volume'\n"
            "vol = os.path.normpath(os.path.join(os.getcwd(), os.path.relpath(v, '/home/daytona/workspace')))\n"
            "open(os.path.join(vol, 'r.txt'), 'w').write('x')\n"
            "try:\n"
            "    os.replace(os.path.join(vol, 'r.txt'), os.path.join(vol, 's.txt'))\n"
            "except OSError as exc:\n"
            "    print(errno.errorcode[exc.errno])\n"
        )
        assert k.execute(code).text() == "EXDEV\n"


def test_a_file_survives_the_loss_of_its_sandbox(emulator, daytona_env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Delete the sandbox in the dashboard; the next kernel restores the working directory from the volume."""
    require_mount_s3("daytona", emulator)
    env = {"DAYTONA_KERNEL_SYNC": "off"}  # only the volume can bring the files back
    with Kernel("daytona", cwd=str(tmp_path), env=env) as k:
        run = k.execute(
            "import sqlite3\n"
            "open('keep.txt', 'w').write('still here')\n"
            "db = sqlite3.connect('keep.sqlite'); db.execute('create table t(x)'); db.execute('insert into t values (7)')\n"
            "db.commit(); db.close()"
        )
        assert run.errors == [], run.errors
        (sandbox,) = [s for s in sandboxes_of(emulator, tmp_path) if s.state != "destroyed"]
        subpath = sandbox.spec["volumes"][0]["subpath"]
        wait_for(emulator.bucket_path("daytona-kernel", subpath, "keep.txt"), b"still here")
        wait_for(emulator.bucket_path("daytona-kernel", subpath, "keep.sqlite"))
        run = k.execute("import os; os.remove('keep.txt'); open('keep.txt', 'w').write('changed')")
        wait_for(emulator.bucket_path("daytona-kernel", subpath, "keep.txt"), b"changed")
    delete_sandbox(emulator, sandbox.id)
    with Kernel("daytona", cwd=str(tmp_path), env=env) as k:
        run = k.execute(
            "print(open('keep.txt').read()); import sqlite3; print(sqlite3.connect('keep.sqlite').execute('select x from t').fetchone())"
        )
        assert run.text() == "changed\n(7,)\n"
        assert "restored 2 file(s) from the volume" in run.text("stderr")
        assert len([s for s in sandboxes_of(emulator, tmp_path) if s.state not in ("destroying", "destroyed")]) == 1
    with Kernel("daytona", cwd=str(tmp_path), env=env) as k:  # the same sandbox again: its disk is intact
        run = k.execute("print(open('keep.txt').read())")
        assert run.text() == "changed\n"
        assert "restored" not in run.text("stderr")


def test_files_deleted_in_the_sandbox_leave_the_volume(kernel_name: str, emulator, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    env = {"DAYTONA_KERNEL_SANDBOX_POLICY": "ephemeral", "DAYTONA_KERNEL_SYNC": "off"}
    with Kernel(kernel_name, cwd=str(tmp_path), env=env) as k:
        k.execute("open('gone.txt', 'w').write('x'); open('kept.txt', 'w').write('y')")
        k.execute("import os; os.remove('gone.txt')")
    with Kernel(kernel_name, cwd=str(tmp_path), env=env) as k:
        assert k.execute("import os; print(sorted(f for f in os.listdir() if f.endswith('.txt')))").text() == "['kept.txt']\n"


def test_checkpoints_survive_the_sandbox(kernel_name: str, emulator, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """%daytona checkpoint writes to the disk (it renames) and the volume keeps a copy for a new sandbox."""
    require_mount_s3(kernel_name, emulator)
    env = {"DAYTONA_KERNEL_SANDBOX_POLICY": "ephemeral", "DAYTONA_KERNEL_SYNC": "off"}
    with Kernel(kernel_name, cwd=str(tmp_path), env=env) as k:
        k.execute("answer = 42")
        run = k.execute("%daytona checkpoint")
        assert run.errors == [], run.errors
        assert "saved 1 variable(s)" in run.text()
    with Kernel(kernel_name, cwd=str(tmp_path), env=env) as k:
        run = k.execute("%daytona restore")
        assert run.errors == [], run.errors
        assert k.execute("print(answer)").text() == "42\n"


@pytest.mark.slow  # mounts a filesystem in a subprocess
def test_the_durable_copy_writes_only_what_mount_s3_allows(tmp_path: Path) -> None:
    """VolumeCopy against the emulated mount-s3 directly: copy, overwrite, delete, restore."""
    from mounts3 import MountS3, fuse_missing

    from daytona_kernel.runtime.durable import VolumeCopy
    from daytona_kernel.runtime.pathrules import load_rules, scan

    missing = fuse_missing()
    if missing is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the mount-s3 storage tests, but {missing}")
        pytest.skip(missing)
    disk = tmp_path / "sandbox-1" / "workspace"  # the record goes beside the working directory
    (disk / "sub").mkdir(parents=True)
    with MountS3(tmp_path / "bucket", tmp_path / "volume") as mount:
        volume = mount.mountpoint

        def copier(workdir: Path) -> VolumeCopy:
            return VolumeCopy(str(workdir), str(volume), lambda: scan(str(workdir), load_rules(str(workdir))), notice=print)

        first = copier(disk)
        assert first.restore() == (0, [])
        (disk / "a.txt").write_text("one")
        (disk / "sub" / "b.bin").write_bytes(b"\0" * 3_000_000)  # several write calls, in order
        assert sorted(first.copy_changes()) == ["a.txt", "sub/b.bin"]
        assert first.copy_changes() == []  # nothing changed: nothing written
        (disk / "a.txt").write_text("two, longer")  # an existing object is replaced whole
        (disk / "sub" / "b.bin").unlink()
        assert first.copy_changes() == ["a.txt"]
        assert (volume / "a.txt").read_text() == "two, longer"
        assert not (volume / "sub" / "b.bin").exists()

        fresh = tmp_path / "sandbox-2" / "workspace"  # a new sandbox: its disk is empty
        fresh.mkdir(parents=True)
        second = copier(fresh)
        assert second.restore() == (1, [])
        assert (fresh / "a.txt").read_text() == "two, longer"
        assert second.copy_changes() == []  # what was restored is not copied back
        assert copier(fresh).restore() == (0, [])  # the same disk again: left as it is

        slow = tmp_path / "sandbox-3" / "workspace"  # a restore over its time budget finishes in the background
        slow.mkdir(parents=True)
        third = copier(slow)
        assert third.restore(budget_s=-1.0) == (0, [])
        assert third.pending == ["a.txt"]
        assert third.flush(10)
        assert (slow / "a.txt").read_text() == "two, longer" and third.pending == []


def test_relative_paths_from_a_notebook_in_a_repository(kernel_name: str, tmp_path: Path) -> None:
    """A notebook in repo/notebooks reads ../data/x.csv as with ipykernel: the repository root is mirrored."""
    repo = tmp_path / "repo"
    (repo / "notebooks").mkdir(parents=True)
    (repo / "data").mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / ".gitignore").write_text("scratch/\n")
    (repo / "data" / "x.csv").write_text("a,b\n1,2\n")
    (repo / "scratch").mkdir()
    (repo / "scratch" / "big.bin").write_bytes(b"x" * 100)
    (repo / "notebooks" / "local.txt").write_text("sent by hand")
    # deletions stay on their side, so the file a cell removes below is still here for %upload
    with Kernel(kernel_name, cwd=str(repo / "notebooks"), env={"DAYTONA_KERNEL_SYNC_DELETES": "false"}) as k:
        run = k.execute(
            "import os\n"
            "print(open('../data/x.csv').read(), end='')\n"
            "print(os.path.basename(os.getcwd()), os.path.exists('../scratch/big.bin'))\n"
            "open('../data/out.csv', 'w').write('written in the sandbox')\n"
            "open('here.txt', 'w').write('next to the notebook')"
        )
        assert run.errors == [], run.errors
        assert run.text() == "a,b\n1,2\nnotebooks False\n"
        assert (repo / "data" / "out.csv").read_text() == "written in the sandbox"
        assert (repo / "notebooks" / "here.txt").read_text() == "next to the notebook"
        k.execute("os.remove('local.txt')")
        assert k.execute("%upload local.txt").errors == []
        assert k.execute("print(open('local.txt').read())").text() == "sent by hand\n"
        assert k.execute("open('fetch.txt', 'w').write('fetched')").errors == []
        (repo / "notebooks" / "fetch.txt").unlink()
        assert k.execute("%download fetch.txt").errors == []
        assert (repo / "notebooks" / "fetch.txt").read_text() == "fetched"


def test_outside_a_repository_the_notebook_folder_is_mirrored(kernel_name: str, tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.csv").write_text("not mirrored")
    (tmp_path / "nb").mkdir()
    (tmp_path / "nb" / "y.csv").write_text("mirrored")
    with Kernel(kernel_name, cwd=str(tmp_path / "nb")) as k:
        run = k.execute("import os\nprint(open('y.csv').read(), os.path.exists('../data/x.csv'))")
        assert run.text() == "mirrored False\n"


def test_a_same_size_rewrite_in_the_same_second_syncs_both_ways(kernel_name: str, tmp_path: Path) -> None:
    """On a file system with one-second mtimes, a rewrite keeps size and mtime; the content must still travel."""

    def this_second() -> int:  # an mtime just ahead of the clock: the syncs that follow fall in "its second"
        return (int(time.time()) + 2) * 1_000_000_000

    path = tmp_path / "same.txt"
    with Kernel(kernel_name, cwd=str(tmp_path)) as k:
        assert k.execute("pass").errors == []  # the sandbox is up: the syncs below follow the writes at once
        second = this_second()
        path.write_text("aaaa")
        os.utime(path, ns=(second, second))
        assert k.execute("print(open('same.txt').read())").text() == "aaaa\n"
        path.write_text("bbbb")
        os.utime(path, ns=(second, second))
        assert k.execute("print(open('same.txt').read())").text() == "bbbb\n"  # up
        code = "import os\nopen('same.txt', 'w').write('{}')\nos.utime('same.txt', ns=({s}, {s}))"
        second = this_second()
        assert k.execute(code.format("cccc", s=second)).errors == []
        assert path.read_text() == "cccc"
        assert k.execute(code.format("dddd", s=second)).errors == []
        assert path.read_text() == "dddd"  # down


def test_a_scan_stops_at_its_time_budget(tmp_path: Path) -> None:
    """The per-cell scans (here and in the sandbox) are bounded in time; an incomplete scan says so."""
    from daytona_kernel.runtime.pathrules import load_rules, scan

    for i in range(3):
        (tmp_path / f"d{i}").mkdir()
        (tmp_path / f"d{i}" / "f.txt").write_text("x")
    files, complete = scan(str(tmp_path), load_rules(str(tmp_path)), budget_s=60.0)
    assert (sorted(files), complete) == (["d0/f.txt", "d1/f.txt", "d2/f.txt"], True)
    files, complete = scan(str(tmp_path), load_rules(str(tmp_path)), budget_s=-1.0)  # already spent
    assert (files, complete) == ({}, False)


def test_a_cloned_repository_comes_back_in_a_new_sandbox(kernel_name: str, tmp_path: Path) -> None:
    """The clone is on the sandbox's disk and not on the volume: a new sandbox clones again, nothing half-restored."""
    repo = tmp_path / "src" / "project"
    repo.mkdir(parents=True)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    (repo / "lib.py").write_text("VALUE = 7\n")
    subprocess.run(git + ["-C", str(repo), "add", "."], check=True)
    subprocess.run(git + ["-C", str(repo), "commit", "-qm", "init"], check=True)
    folder = tmp_path / "nb"
    folder.mkdir()
    env = {"DAYTONA_KERNEL_REPO_URL": str(repo), "DAYTONA_KERNEL_SANDBOX_POLICY": "ephemeral", "DAYTONA_KERNEL_SYNC": "off"}
    for _ in range(2):
        with Kernel(kernel_name, cwd=str(folder), env=env) as k:
            run = k.execute("import sys\nsys.path.insert(0, 'project')\nimport lib\nopen('mine.txt', 'w').write('x')\nlib.VALUE")
            assert run.errors == [], run.errors
            assert "Cloned project/ into the working directory." in run.text("stderr")
            assert run.of_type("execute_result")[0]["data"]["text/plain"] == "7"


def fresh_durable_copy(tmp_path: Path) -> tuple[Any, Path, Path]:
    """A VolumeCopy of an empty sandbox working directory to an empty volume folder, restored: (copy, workdir, volume)."""
    from daytona_kernel.runtime.durable import VolumeCopy
    from daytona_kernel.runtime.pathrules import load_rules, scan

    workdir, volume = tmp_path / "sandbox" / "workspace", tmp_path / "volume"
    workdir.mkdir(parents=True)
    volume.mkdir()
    copy = VolumeCopy(str(workdir), str(volume), lambda: scan(str(workdir), load_rules(str(workdir))))
    assert copy.restore() == (0, [])
    return copy, workdir, volume


def test_a_flush_runs_its_pass_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A flush (at a shutdown, which waits for it) runs the copier's pass at once: the settle pause, which lets
    a burst of wakes after cells pass before a scan, would only delay the kernel. (The pause is made long here:
    a flush that waited it out would time out.)"""
    from daytona_kernel.runtime import durable

    monkeypatch.setattr(durable, "SETTLE_S", 60.0)
    copy, workdir, volume = fresh_durable_copy(tmp_path)
    (workdir / "a.txt").write_text("one")
    assert copy.flush(10)
    assert (volume / "a.txt").read_text() == "one"
    (workdir / "a.txt").write_text("two")
    assert copy.flush(10)
    assert (volume / "a.txt").read_text() == "two"


def test_the_last_pass_at_exit_starts_no_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As the interpreter exits (the runtime's exit handler) a copier that never ran cannot be started (from
    Python 3.12 no thread starts at exit): the pass runs in the exiting thread; a running copier does it."""
    import threading

    copy, workdir, volume = fresh_durable_copy(tmp_path)
    (workdir / "a.txt").write_text("one")

    def refused(self: threading.Thread) -> None:
        raise RuntimeError("can't create new thread at interpreter shutdown")

    with monkeypatch.context() as patched:
        patched.setattr(threading.Thread, "start", refused)
        assert copy.last_pass(10)
    assert (volume / "a.txt").read_text() == "one"
    copy.wake()  # a cell ended: the copier runs from now on
    assert copy.flush(10)
    (workdir / "a.txt").write_text("two")
    assert copy.last_pass(10)
    assert (volume / "a.txt").read_text() == "two"


def test_a_flush_during_a_wakes_settle_pause_does_not_wait_it_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A restart right after a cell: the cell's wake has the copier in its settle pause (meant for bursts of
    cells) when the exit's pass is asked for; that pass runs at once. (The pause is made long here: the flush
    would time out waiting it out.)"""
    from daytona_kernel.runtime import durable

    monkeypatch.setattr(durable, "SETTLE_S", 60.0)
    copy, workdir, volume = fresh_durable_copy(tmp_path)
    (workdir / "a.txt").write_text("one")
    copy.wake()  # a cell ended
    time.sleep(0.1)  # the copier is in its pause
    assert copy.last_pass(10)
    assert (volume / "a.txt").read_text() == "one"


@pytest.mark.parametrize("copier_running", [False, True])
def test_the_last_pass_at_exit_never_starts_a_copy_it_may_not_finish(tmp_path: Path, copier_running: bool) -> None:
    """The exit's pass has the daemon's 2 s before it kills the worker, and a volume file is written in place
    (mount-s3 cannot rename): a copy cut off there would leave a truncated file where a whole one was. So it
    copies small files only, up to a byte budget; the rest keeps its last whole copy, and the record says it is
    still to be copied (the next pass in this sandbox copies it)."""
    from daytona_kernel.runtime import durable

    copy, workdir, volume = fresh_durable_copy(tmp_path)
    big = b"A" * (durable.EXIT_COPY_BYTES + 1)
    (workdir / "big.bin").write_bytes(big)
    assert copy.copy_changes() == ["big.bin"]
    if copier_running:
        copy.wake()
        assert copy.flush(10)
    (workdir / "big.bin").write_bytes(b"B" * len(big))
    (workdir / "small.txt").write_text("written at exit")
    assert copy.last_pass(10)
    assert (volume / "small.txt").read_text() == "written at exit"
    assert (volume / "big.bin").read_bytes() == big  # the last whole copy, not a cut one
    assert copy.copy_changes() == ["big.bin"]  # still due: a later pass copies it


def test_a_file_deleted_while_it_is_copied_leaves_the_volume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cell deletes a file while the copier copies it (the copy of the cell before runs beside the next cell):
    the volume ends without it, as the disk does, and no notice claims it stays on the disk."""
    from daytona_kernel.runtime import durable
    from daytona_kernel.runtime.pathrules import load_rules, scan

    workdir, volume = tmp_path / "sandbox" / "workspace", tmp_path / "volume"
    workdir.mkdir(parents=True)
    volume.mkdir()
    (workdir / "kept.txt").write_text("y")
    (workdir / "gone.txt").write_text("x")
    notices: list[str] = []
    copy = durable.VolumeCopy(
        str(workdir), str(volume), lambda: scan(str(workdir), load_rules(str(workdir))), notice=notices.append
    )
    copy_whole = durable._copy_whole

    def copy_then_the_cell_deletes(src: str, dst: str) -> None:
        copy_whole(src, dst)
        if src.endswith("gone.txt"):
            os.remove(src)

    monkeypatch.setattr(durable, "_copy_whole", copy_then_the_cell_deletes)
    copy.copy_changes()
    monkeypatch.setattr(durable, "_copy_whole", copy_whole)
    copy.copy_changes()
    assert sorted(p.name for p in volume.iterdir()) == ["kept.txt"]
    assert not [n for n in notices if "gone.txt" in n], notices


def test_a_deleted_file_the_volume_would_not_remove_is_removed_by_a_later_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, but the volume refuses the first removal (a mount-s3 hiccup): a later pass removes it."""
    from daytona_kernel.runtime import durable
    from daytona_kernel.runtime.pathrules import load_rules, scan

    workdir, volume = tmp_path / "sandbox" / "workspace", tmp_path / "volume"
    workdir.mkdir(parents=True)
    volume.mkdir()
    (workdir / "gone.txt").write_text("x")
    copy = durable.VolumeCopy(str(workdir), str(volume), lambda: scan(str(workdir), load_rules(str(workdir))))
    copy_whole, remove = durable._copy_whole, os.remove

    def copy_then_the_cell_deletes(src: str, dst: str) -> None:
        copy_whole(src, dst)
        remove(src)

    def refused_once(path: str) -> None:
        monkeypatch.setattr(os, "remove", remove)
        raise OSError(5, "Input/output error", path)

    monkeypatch.setattr(durable, "_copy_whole", copy_then_the_cell_deletes)
    monkeypatch.setattr(os, "remove", refused_once)
    copy.copy_changes()
    assert (volume / "gone.txt").exists()  # refused this time
    copy.copy_changes()
    assert not (volume / "gone.txt").exists()
