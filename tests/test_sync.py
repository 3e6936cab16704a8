"""The workdir mirror: pure rules, then real kernels on both backends (Daytona via the emulator)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import nbformat
import papermill
import pytest
from kernels import Kernel

from daytona_kernel.mirror.plan import conflict_name
from daytona_kernel.runtime.pathrules import PathRules, load_rules, scan

UPLOAD = "POST /toolbox/{sid}/files/bulk-upload"
WS = "GET /toolbox/{sid}/process/interpreter/execute"


# -- pure ------------------------------------------------------------------------


def test_rules_follow_gitignore_semantics() -> None:
    rules = PathRules(["*.log", "build/", "/top.txt", "!keep.log", "docs/*.tmp"])
    assert rules.excluded("x.log", False) and rules.excluded("a/b/x.log", False)
    assert not rules.excluded("keep.log", False)
    assert rules.excluded("build", True) and not rules.excluded("build", False)
    assert rules.excluded("top.txt", False) and not rules.excluded("sub/top.txt", False)
    assert rules.excluded("docs/a.tmp", False) and not rules.excluded("other/a.tmp", False)


def test_scan_skips_defaults_gitignore_and_virtualenvs(tmp_path: Path) -> None:
    for rel in ("a.py", "sub/b.csv", ".git/config", "__pycache__/x.pyc", "env/pyvenv.cfg", "env/lib/x.py", "ignored.dat",
                "conda/conda-meta/history", "conda/lib/y.py"):  # fmt: skip
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(rel)
    (tmp_path / ".gitignore").write_text("*.dat\n")
    files, complete = scan(str(tmp_path), load_rules(str(tmp_path), ["sub/"]))
    assert complete
    assert sorted(files) == [".gitignore", "a.py"]


def test_a_repeated_scan_classifies_only_paths_it_has_not_seen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scan remembers each path's verdict while the .gitignore files it depends on stay the same."""
    for rel in ("a.txt", "sub/b.csv", "sub/deep/c.txt", "x.dat"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(rel)
    (tmp_path / ".gitignore").write_text("*.dat\n")
    rules = load_rules(str(tmp_path))
    assert sorted(scan(str(tmp_path), rules)[0]) == [".gitignore", "a.txt", "sub/b.csv", "sub/deep/c.txt"]
    classified: list[str] = []
    real = rules.classify
    monkeypatch.setattr(rules, "classify", lambda rel, *args: classified.append(rel) or real(rel, *args))
    assert sorted(scan(str(tmp_path), rules)[0]) == [".gitignore", "a.txt", "sub/b.csv", "sub/deep/c.txt"]
    assert classified == []
    (tmp_path / "new.txt").write_text("new")
    assert "new.txt" in scan(str(tmp_path), rules)[0] and classified == ["new.txt"]


def test_a_remembered_verdict_never_outlives_what_it_was_decided_on(tmp_path: Path) -> None:
    """A changed, added or removed .gitignore, a new secret, a renamed folder, a file turned folder and a
    folder turned Python environment are all seen at the next scan of the same rules."""
    for rel in ("a.txt", "sub/b.csv", "sub/deep/c.txt", "x.dat", "venv"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(rel)
    (tmp_path / ".gitignore").write_text("*.dat\n")
    rules = load_rules(str(tmp_path))

    def listed() -> tuple[list[str], list[str]]:
        secrets: list[str] = []
        files, complete = scan(str(tmp_path), rules, skipped=secrets)
        assert complete
        return sorted(files), sorted(secrets)

    assert listed() == ([".gitignore", "a.txt", "sub/b.csv", "sub/deep/c.txt", "venv"], [])
    (tmp_path / ".gitignore").write_text("*.csv\n")  # changed: x.dat comes back, b.csv goes
    assert listed() == ([".gitignore", "a.txt", "sub/deep/c.txt", "venv", "x.dat"], [])
    (tmp_path / "sub" / "deep" / ".gitignore").write_text("c.txt\n")  # added below
    assert listed() == ([".gitignore", "a.txt", "sub/deep/.gitignore", "venv", "x.dat"], [])
    (tmp_path / "sub" / "deep" / ".gitignore").unlink()
    (tmp_path / ".gitignore").unlink()  # removed: everything is back
    assert listed() == (["a.txt", "sub/b.csv", "sub/deep/c.txt", "venv", "x.dat"], [])
    (tmp_path / "sub" / "ID_RSA").write_text("key")  # a new file with a secret's name
    (tmp_path / "sub").rename(tmp_path / "renamed")
    assert listed() == (["a.txt", "renamed/b.csv", "renamed/deep/c.txt", "venv", "x.dat"], ["renamed/ID_RSA"])
    (tmp_path / "venv").unlink()  # a file called venv was mirrored; a folder called venv/ is a default exclude
    (tmp_path / "venv").mkdir()
    (tmp_path / "venv" / "lib.py").write_text("")
    (tmp_path / "renamed" / "deep" / "pyvenv.cfg").write_text("")  # a folder that became a Python environment
    assert listed() == (["a.txt", "renamed/b.csv", "x.dat"], ["renamed/ID_RSA"])


def test_conflict_names() -> None:
    assert conflict_name("data/table.csv") == "data/table.sandbox-conflict.csv"
    assert conflict_name("Makefile") == "Makefile.sandbox-conflict"
    assert conflict_name(".env") == ".env.sandbox-conflict"


def test_no_change_plan_makes_no_request_and_hashes_only_moved_files(tmp_path: Path) -> None:
    from daytona_kernel.config import DaytonaKernelConfig
    from daytona_kernel.mirror.mirror import WorkdirMirror

    class NoRequests:
        workdir = "/remote"
        generation = 1
        on_this_disk = False

        @property
        def toolbox(self):  # type: ignore[no-untyped-def]
            return self  # its own toolbox

        async def upload(self, files):  # type: ignore[no-untyped-def]
            self.uploaded = files

    folder = tmp_path / "notebooks"
    folder.mkdir()
    (folder / "a.txt").write_text("one")
    sandbox = NoRequests()
    mirror = WorkdirMirror(str(folder), sandbox, DaytonaKernelConfig(), tmp_path / "m.json", logging.getLogger())  # type: ignore[arg-type]
    import asyncio

    report = asyncio.run(mirror.push())
    assert report.up == ["a.txt"] and sandbox.uploaded == [(b"one", "/remote/a.txt")]
    del sandbox.uploaded
    assert mirror.plan_up().todo == []
    assert asyncio.run(mirror.push()).up == [] and not hasattr(sandbox, "uploaded")
    import os

    os.utime(folder / "a.txt", ns=(1, 1))  # touched, same content: not a change
    assert mirror.plan_up().todo == []
    sandbox.generation = 2  # another sandbox: it has only what the volume restored
    assert asyncio.run(mirror.push()).up == ["a.txt"] and sandbox.uploaded == [(b"one", "/remote/a.txt")]


def test_a_same_size_rewrite_that_keeps_the_mtime_is_seen_only_while_the_mtime_cannot_tell(tmp_path: Path) -> None:
    """The manifest hashes a file whose size and mtime did not move only while its mtime was too close to
    its recording to tell a rewrite (``RACY_WINDOW_NS``); a deleted file is planned as deleted."""
    import os

    from daytona_kernel.mirror.manifest import RACY_WINDOW_NS, SyncManifest

    for name in ("a.txt", "b.txt", "c.txt"):
        (tmp_path / name).write_text("one")
    manifest = SyncManifest(tmp_path / "m.json", tmp_path, logging.getLogger())
    for name in ("a.txt", "b.txt", "c.txt"):
        manifest.record_file(name)

    def stat_of(name: str) -> tuple[int, int, int]:
        st = os.lstat(tmp_path / name)
        return (st.st_size, st.st_mtime_ns, st.st_mode & 0o777)

    assert manifest.changes({name: stat_of(name) for name in ("a.txt", "b.txt", "c.txt")}) == ([], [], 3)
    recorded = manifest["b.txt"][1]
    manifest["b.txt"][4] = recorded + 2 * RACY_WINDOW_NS  # recorded long after its last write: its mtime can tell
    for name in ("a.txt", "b.txt"):  # rewritten with the same size, and the old mtime put back
        (tmp_path / name).write_text("two")
        os.utime(tmp_path / name, ns=(manifest[name][1], manifest[name][1]))
    os.chmod(tmp_path / "c.txt", 0o600)
    changed, unreadable, known = manifest.changes({name: stat_of(name) for name in ("a.txt", "b.txt", "c.txt")})
    assert changed == [("a.txt", 3), ("c.txt", 3)] and unreadable == [] and known == 3
    assert manifest.changes({"a.txt": stat_of("a.txt"), "new.txt": (1, 1, 0o644)})[0] == [("a.txt", 3), ("new.txt", 1)]


def test_a_file_replaced_by_a_fifo_after_the_scan_does_not_hang_the_check(tmp_path: Path) -> None:
    """The manifest hashes a file the scan found regular; if a FIFO took its place meanwhile, the hash
    must not wait for a writer that never comes (the check runs before every cell)."""
    import os

    from daytona_kernel.mirror.manifest import SyncManifest

    (tmp_path / "a.txt").write_text("one")
    manifest = SyncManifest(tmp_path / "m.json", tmp_path, logging.getLogger())
    manifest.record_file("a.txt")
    size, mtime = manifest["a.txt"][:2]
    (tmp_path / "a.txt").unlink()
    os.mkfifo(tmp_path / "a.txt")
    answer: list[bool] = []
    checker = threading.Thread(
        target=lambda: answer.append(manifest.locally_changed("a.txt", (size, mtime + 1, 0o644))), daemon=True
    )
    checker.start()
    checker.join(10)
    if checker.is_alive():  # let the stuck open() go before failing
        os.close(os.open(tmp_path / "a.txt", os.O_WRONLY | os.O_NONBLOCK))
    assert answer == [True]


def test_a_deleted_file_is_planned_as_deleted_beside_a_new_one(tmp_path: Path) -> None:
    import asyncio

    from daytona_kernel.config import DaytonaKernelConfig
    from daytona_kernel.mirror.mirror import WorkdirMirror

    class NoRequests:
        workdir = "/remote"
        generation = 1
        on_this_disk = False

        @property
        def toolbox(self):  # type: ignore[no-untyped-def]
            return self  # its own toolbox

        async def upload(self, files):  # type: ignore[no-untyped-def]
            pass

    for name in ("a.txt", "b.txt"):
        (tmp_path / "project" / name).parent.mkdir(exist_ok=True)
        (tmp_path / "project" / name).write_text(name)
    mirror = WorkdirMirror(
        str(tmp_path / "project"), NoRequests(), DaytonaKernelConfig(), tmp_path / "m.json", logging.getLogger()
    )  # type: ignore[arg-type]
    asyncio.run(mirror.push())
    nothing = mirror.plan_up()
    assert (nothing.todo, nothing.deleted, nothing.skipped, nothing.secrets) == ([], [], [], [])
    (tmp_path / "project" / "b.txt").unlink()
    assert mirror.plan_up().deleted == ["b.txt"]
    (tmp_path / "project" / "c.txt").write_text("c")
    plan = mirror.plan_up()
    assert plan.deleted == ["b.txt"] and plan.todo == ["c.txt"]


# -- through kernels, on both backends -----------------------------------------------


def test_local_files_are_there_in_the_first_cell(kernel_name: str, tmp_path: Path) -> None:
    (tmp_path / "data.csv").write_text("x,y\n1,2\n")
    with Kernel(kernel_name, cwd=str(tmp_path)) as k:
        run = k.execute("import csv\nprint(list(csv.reader(open('data.csv'))))")
        assert run.text() == "[['x', 'y'], ['1', '2']]\n"


def test_files_written_by_a_cell_appear_locally(kernel_name: str, tmp_path: Path) -> None:
    with Kernel(kernel_name, cwd=str(tmp_path)) as k:
        code = (
            "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
            "fig = plt.figure()\nplt.plot([1, 2])\nfig.savefig('plots/chart.png')\nplt.close(fig)"
        )
        k.execute("import os\nos.makedirs('plots', exist_ok=True)")
        assert k.execute(code).status == "ok"
        assert (tmp_path / "plots" / "chart.png").read_bytes()[:4] == b"\x89PNG"


def test_papermill_leaves_the_produced_files_locally(kernel_name: str, tmp_path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("with open('report.txt', 'w') as f:\n    f.write('done')")]
    nb.metadata["kernelspec"] = {"name": kernel_name, "language": "python", "display_name": kernel_name}
    nbformat.write(nb, tmp_path / "job.ipynb")
    papermill.execute_notebook(
        str(tmp_path / "job.ipynb"), str(tmp_path / "out.ipynb"), kernel_name=kernel_name, cwd=str(tmp_path)
    )
    assert (tmp_path / "report.txt").read_text() == "done"


def test_a_file_changed_on_both_sides_keeps_both(kernel_name: str, tmp_path: Path) -> None:
    (tmp_path / "data.csv").write_text("original\n")
    with Kernel(kernel_name, cwd=str(tmp_path)) as k:
        k.execute("pass")
        edit = threading.Timer(1.0, lambda: (tmp_path / "data.csv").write_text("edited here\n"))
        edit.start()
        run = k.execute("import time\ntime.sleep(2.5)\nopen('data.csv', 'w').write('written in the sandbox\\n')")
        edit.join()
        assert (tmp_path / "data.csv").read_text() == "edited here\n"
        assert (tmp_path / "data.sandbox-conflict.csv").read_text() == "written in the sandbox\n"
        assert "Conflict: data.csv changed both here and in the sandbox" in run.text("stderr")


def test_a_notebook_is_never_downloaded_over_the_local_one(kernel_name: str, tmp_path: Path) -> None:
    (tmp_path / "analysis.ipynb").write_text("{}")
    with Kernel(kernel_name, cwd=str(tmp_path)) as k:
        k.execute("open('analysis.ipynb', 'w').write('{\"from\": \"sandbox\"}')")
    assert (tmp_path / "analysis.ipynb").read_text() == "{}"
    assert (tmp_path / "analysis.sandbox-conflict.ipynb").exists()


def test_excludes_and_size_caps(kernel_name: str, tmp_path: Path) -> None:
    (tmp_path / ".gitignore").write_text("private.txt\n")
    (tmp_path / "private.txt").write_text("no")
    (tmp_path / "scratch.tmp").write_text("no")
    (tmp_path / "big.bin").write_bytes(b"x" * 20000)
    (tmp_path / "ok.txt").write_text("yes")
    env = {"DAYTONA_KERNEL_SYNC_EXCLUDE": '["*.tmp"]', "DAYTONA_KERNEL_SYNC_MAX_FILE_MB": "0.01"}
    local = kernel_name == "daytona-local"  # its sandbox is a folder on this disk: big files are shared, not refused
    with Kernel(kernel_name, cwd=str(tmp_path), env=env) as k:
        run = k.execute("import os\nsorted(f for f in os.listdir('.') if not f.startswith('.'))")
        assert run.of_type("execute_result")[0]["data"]["text/plain"] == ("['big.bin', 'ok.txt']" if local else "['ok.txt']")
        assert ("Not synced: big.bin" in run.text("stderr") and "sync_max_file_mb" in run.text("stderr")) is not local
        out = k.execute("open('huge.bin', 'wb').write(b'y' * 20000)")
        assert ("Not synced: huge.bin" in out.text("stderr")) is not local
        assert (tmp_path / "huge.bin").exists() is local


def test_upload_download_and_sync_by_hand(kernel_name: str, tmp_path: Path) -> None:
    with Kernel(kernel_name, cwd=str(tmp_path), env={"DAYTONA_KERNEL_SYNC": "off"}) as k:
        (tmp_path / "input.txt").write_text("by hand")
        assert k.execute("%upload input.txt copied.txt").text() == "uploaded 1 file(s), 7 bytes\n"
        k.execute("open('made.txt', 'w').write(open('copied.txt').read().upper())")
        assert not (tmp_path / "made.txt").exists()
        assert k.execute("%download made.txt").text() == "downloaded 1 file(s), 7 bytes\n"
        assert (tmp_path / "made.txt").read_text() == "BY HAND"
    with Kernel(kernel_name, cwd=str(tmp_path)) as k:
        (tmp_path / "later.txt").write_text("later")
        assert "would upload" in k.execute("%sync status").text()
        summary = k.execute("%sync").text()
        assert summary.startswith("sync: ") and "up" in summary and "conflicts" in summary
        mixed = k.execute("x = 1\n%sync")
        error = mixed.reply["content"]
        assert error["ename"] == "UsageError" and "cell of its own" in error["evalue"]


def test_deletions_stay_on_their_side_when_turned_off(kernel_name: str, tmp_path: Path) -> None:
    """sync_deletes=False: a file deleted on one side stays on the other (by default they pass: test_folder.py)."""
    (tmp_path / "gone.txt").write_text("x")
    with Kernel(kernel_name, cwd=str(tmp_path), env={"DAYTONA_KERNEL_SYNC_DELETES": "false"}) as k:
        k.execute("pass")
        (tmp_path / "gone.txt").unlink()
        assert k.execute("import os\nos.path.exists('gone.txt')").of_type("execute_result")[0]["data"]["text/plain"] == "True"
        (tmp_path / "remote_made.txt").write_text("y")
        k.execute("pass")
        k.execute("os.remove('remote_made.txt')")
        assert (tmp_path / "remote_made.txt").read_text() == "y"


def test_files_outlive_the_sandbox(kernel_name: str, tmp_path: Path) -> None:
    env = {"DAYTONA_KERNEL_SANDBOX_POLICY": "ephemeral", "DAYTONA_KERNEL_SYNC": "off"}
    with Kernel(kernel_name, cwd=str(tmp_path), env=env) as k:
        k.execute("open('durable.txt', 'w').write('still here')")
    with Kernel(kernel_name, cwd=str(tmp_path), env=env) as k:
        assert k.execute("print(open('durable.txt').read())").text() == "still here\n"


def test_request_counts(emulator, monkeypatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    for key, value in emulator.env().items():
        monkeypatch.setenv(key, value)
    for i in range(1000):
        (tmp_path / "many" / f"f{i:04d}.txt").parent.mkdir(exist_ok=True)
        (tmp_path / "many" / f"f{i:04d}.txt").write_text(f"file {i}\n" * 100)
    with Kernel("daytona", cwd=str(tmp_path)) as k:
        emulator.reset_counts()
        run = k.execute("import os\nlen(os.listdir('many'))")
        assert run.of_type("execute_result")[0]["data"]["text/plain"] == "1000"
        assert 1 <= emulator.count(UPLOAD) <= 2
        progress = [m["content"]["data"]["text/plain"] for m in run.outputs if "display" in m["msg_type"]]
        assert any(text.startswith("⏳ syncing 1000 files") for text in progress), progress
        assert run.outputs[-2]["msg_type"] == "clear_output"  # the progress line goes when the sync is done
        emulator.reset_counts()
        k.execute("x = 1")
        assert dict(emulator.counts) == {WS: 1}


def test_a_repository_is_staged_once(kernel_name: str, tmp_path: Path) -> None:
    import subprocess

    repo = tmp_path / "src" / "project"
    repo.mkdir(parents=True)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    (repo / "lib.py").write_text("VALUE = 7\n")
    subprocess.run(git + ["-C", str(repo), "add", "."], check=True)
    subprocess.run(git + ["-C", str(repo), "commit", "-qm", "init"], check=True)
    folder = tmp_path / "nb"
    folder.mkdir()
    env = {"DAYTONA_KERNEL_REPO_URL": str(repo), "DAYTONA_KERNEL_REPO_REF": "main", "DAYTONA_KERNEL_SYNC": "off"}
    with Kernel(kernel_name, cwd=str(folder), env=env) as k:
        run = k.execute("import sys\nsys.path.insert(0, 'project')\nimport lib\nlib.VALUE")
        assert "Cloned project/ into the working directory." in run.text("stderr")
        assert run.of_type("execute_result")[0]["data"]["text/plain"] == "7"
    with Kernel(kernel_name, cwd=str(folder), env=env) as k:
        assert "already cloned" in k.execute("pass").text("stderr")


@pytest.mark.parametrize("replaced_by", ["%daytona recreate", "a delete in the dashboard"])
def test_a_new_sandbox_gets_the_local_files_its_volume_copy_lacks(daytona_env, tmp_path: Path, replaced_by: str) -> None:  # type: ignore[no-untyped-def]
    """The volume's copy is written in the background; a sandbox lost before it was written must not lose
    local files: the mirror uploads again what the new sandbox lacks."""
    from conftest import sandboxes_of
    from test_storage import delete_sandbox, wait_for

    (tmp_path / "local.txt").write_text("mine")
    with Kernel("daytona", cwd=str(tmp_path)) as k:
        assert k.execute("print(open('local.txt').read())").text() == "mine\n"
        (old,) = [s for s in sandboxes_of(daytona_env, tmp_path) if s.state == "started"]
        copy = daytona_env.bucket_path("daytona-kernel", old.spec["volumes"][0]["subpath"], "local.txt")
        wait_for(copy, b"mine")
        copy.unlink()  # as if the sandbox went before its copy was written
        if replaced_by == "%daytona recreate":
            assert k.execute("%daytona recreate", timeout=60).errors == []
        else:
            delete_sandbox(daytona_env, old.id)
            daytona_env.wait_for_state(old.id, "destroyed")
        run = k.execute("print(open('local.txt').read())", timeout=60)
        assert run.errors == [] and run.text() == "mine\n", (run.errors, run.text("stderr"))
        assert [s.id for s in sandboxes_of(daytona_env, tmp_path) if s.state == "started"] != [old.id]
        assert k.execute("print(open('local.txt').read())").text() == "mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["local.txt"]  # nothing came back as a conflict


def test_a_character_device_in_a_files_place_is_not_read_forever(tmp_path: Path) -> None:
    """A device that took a file's place (``/dev/zero``'s numbers) would be read without end by the hash
    before a cell; it reads as changed, and the upload's own check refuses what is not a regular file."""
    import os
    import stat

    from daytona_kernel.mirror.manifest import SyncManifest

    (tmp_path / "a.txt").write_text("one")
    manifest = SyncManifest(tmp_path / "m.json", tmp_path, logging.getLogger())
    manifest.record_file("a.txt")
    size, mtime = manifest["a.txt"][:2]
    (tmp_path / "a.txt").unlink()
    try:
        os.mknod(tmp_path / "a.txt", stat.S_IFCHR | 0o600, os.makedev(1, 5))
    except PermissionError:
        pytest.skip("making a character device needs CAP_MKNOD")
    answer: list[bool] = []
    checker = threading.Thread(target=lambda: answer.append(manifest.locally_changed("a.txt", (size, mtime, 0o600))), daemon=True)
    checker.start()
    checker.join(10)
    assert answer == [True]


def test_a_dotfiles_repository_in_the_home_folder_does_not_hide_a_project_under_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Git's ignore files from outside the project come from its repository, but never from one whose top is the
    home folder or above it (dotfiles repositories often ignore "*"; the project root never reaches home either)."""
    from daytona_kernel.runtime.pathrules import load_rules

    home = tmp_path / "home"
    (home / ".git" / "info").mkdir(parents=True)
    (home / ".git" / "info" / "exclude").write_text("*\n")
    (home / ".gitignore").write_text("*\n")
    project = home / "work" / "proj"
    project.mkdir(parents=True)
    (project / "analysis.py").write_text("x")
    monkeypatch.setenv("HOME", str(home))
    files, _ = scan(str(project), load_rules(str(project), repository=True))
    assert set(files) == {"analysis.py"}
