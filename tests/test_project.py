"""The user's project as ipykernel sees it (issue 21): the notebook's folder importable, nothing of
the kernel package on the cell's sys.path, UsageErrors, cell file names and interrupt tracebacks
as ipykernel shows them, and status lines that leave nothing in a saved notebook.

Each test runs the same cells under stock ipykernel (``python3``) and under our backend, side by side."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nbformat
import papermill
from kernels import Kernel, Run

ANSI = re.compile(r"\x1b\[[0-9;]*m")
Step = tuple[str, Callable[[Path], None] | None]  # a cell, and what the user does to their files before it


def plain(lines: list[str]) -> str:
    return ANSI.sub("", "\n".join(lines))


def project(root: Path) -> Path:
    """A git project shaped like a user's: notebooks/ beside data/, modules and a package beside the notebook,
    and modules named like the runtime's own (framing, journal, streams). Returns the notebook folder."""
    notebooks = root / "notebooks"
    (notebooks / "nbpackage").mkdir(parents=True)
    (root / "data").mkdir()
    (root / "data" / "x.csv").write_text("a,b\n1,2\n")
    (notebooks / "helpers.py").write_text("VALUE = 1\n\ndef double(x):\n    return 2 * x\n")
    (notebooks / "nbpackage" / "__init__.py").write_text("")
    (notebooks / "nbpackage" / "mynotebook.py").write_text("NAME = 'mynotebook'\n")
    for name in ("framing", "journal", "streams"):
        (notebooks / f"{name}.py").write_text("WHO = 'user'\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    return notebooks


def answer(run: Run) -> tuple[str, str]:
    """A cell's status and what it gave: its result's text, else its error's name."""
    results = run.of_type("execute_result")
    if results:
        return run.status, results[0]["data"]["text/plain"]
    if run.errors:
        return run.status, run.errors[0]["ename"]
    return run.status, run.text() + run.text("stderr")


def run_steps(name: str, folder: Path, steps: list[Step]) -> list[tuple[str, str]]:
    with Kernel(name, cwd=str(folder)) as k:
        k.execute("pass", store_history=False)
        answers = []
        for code, before in steps:
            if before is not None:
                before(folder)
            answers.append(answer(k.execute(code)))
        return answers


def edit_helpers(folder: Path) -> None:
    """The user edits helpers.py in their editor (a later mtime, as a save makes)."""
    path = folder / "helpers.py"
    path.write_text("VALUE = 2\n\ndef double(x):\n    return 2 * x\n")
    later = time.time() + 2
    os.utime(path, (later, later))


IMPORT_STEPS: list[Step] = [
    ("import helpers\nhelpers.VALUE, helpers.double(21)", None),
    ("from nbpackage import mynotebook\nmynotebook.NAME", None),
    ("%%writefile mod.py\nZ = 7\n", None),
    ("import mod\nmod.Z", None),
    ("import framing, journal, streams\nframing.WHO, journal.WHO, streams.WHO", None),
    ("from IPython.display import display\ndisplay('the runtime still works')\nprint('and prints')", None),
    ("import daytona\n'daytona_kernel' in daytona.__file__, daytona.__name__", None),
    ("import local", None),
    ("import base", None),
    ("import sys\n[p for p in sys.path if 'daytona_kernel' in p], sys.path.count('')", None),
    ("import pandas\npandas.read_csv('../data/x.csv').shape", None),
    ("%load_ext autoreload\n%autoreload 2", None),
    ("helpers.VALUE", edit_helpers),
]


def test_the_notebooks_folder_is_importable_and_the_kernel_package_is_not(kernel_name: str, tmp_path: Path) -> None:
    theirs = run_steps("python3", project(tmp_path / "ipykernel"), IMPORT_STEPS)
    ours = run_steps(kernel_name, project(tmp_path / "ours"), IMPORT_STEPS)
    assert theirs[0] == ("ok", "(1, 42)") and theirs[-1] == ("ok", "2")  # what ipykernel does, for the record
    assert theirs[6] == ("ok", "(False, 'daytona')") and theirs[7] == ("error", "ModuleNotFoundError")
    for (code, _), got, want in zip(IMPORT_STEPS, ours, theirs):
        assert got == want, code


def usage_error(run: Run) -> dict[str, Any]:
    reply = run.reply["content"]
    outputs: list[tuple[str, Any, Any]] = []
    for m in run.outputs:  # streams of one name joined: chunking is free to differ
        item = (m["msg_type"], m["content"].get("name"), m["content"].get("text"))
        if outputs and item[0] == "stream" and outputs[-1][:2] == item[:2]:
            item = (*item[:2], outputs.pop()[2] + item[2])
        outputs.append(item)
    return {
        "outputs": outputs,
        "reply": (reply["status"], reply.get("ename"), reply.get("evalue"), reply.get("traceback")),
    }


def test_a_usage_error_is_shown_on_stderr_as_ipykernel_shows_it(kernel_name: str, tmp_path: Path) -> None:
    cells = ["%lprun -f f f()", "%load_ext", "1 + 1"]
    runs = {}
    for name in ("python3", kernel_name):
        with Kernel(name, cwd=str(tmp_path)) as k:
            k.execute("pass", store_history=False)
            runs[name] = [k.execute(code) for code in cells]
    theirs, ours = runs["python3"], runs[kernel_name]
    assert usage_error(theirs[0]) == {
        "outputs": [("stream", "stderr", "UsageError: Line magic function `%lprun` not found.\n")],
        "reply": ("error", "UsageError", "Line magic function `%lprun` not found.", []),
    }
    for mine, stock in zip(ours[:2], theirs[:2]):
        assert usage_error(mine) == usage_error(stock)
    assert answer(ours[2]) == ("ok", "2")


CELL_FILE_STEPS = [
    "def g():\n    return 1 / 0",
    "g()",
    "import inspect, os\nos.path.basename(inspect.getsourcefile(g)), os.path.basename(os.path.dirname(g.__code__.co_filename)).split('_')[0]",
    "import linecache\nlinecache.getline(g.__code__.co_filename, 2).strip()",
]


def test_cells_are_named_as_ipykernel_names_them(kernel_name: str, tmp_path: Path) -> None:
    from ipykernel.compiler import get_tmp_hash_seed, murmur2_x86

    runs = {}
    for name in ("python3", kernel_name):
        with Kernel(name, cwd=str(tmp_path)) as k:
            runs[name] = [k.execute(code) for code in CELL_FILE_STEPS]
            runs[name].append(k.execute("%debug", stdin_answer=lambda content: "q"))
    theirs, ours = runs["python3"], runs[kernel_name]
    name = f"'{murmur2_x86(CELL_FILE_STEPS[0], get_tmp_hash_seed())}.py'"
    assert answer(theirs[2]) == ("ok", f"({name}, 'ipykernel')")
    assert [answer(r) for r in ours[2:4]] == [answer(r) for r in theirs[2:4]]
    assert plain(ours[1].errors[0]["traceback"]) == plain(theirs[1].errors[0]["traceback"])
    debug = re.compile(r"/\S*/ipykernel_\d+")  # the temporary folder: the local backend's is the sandbox's own
    assert debug.sub("ipykernel_N", ours[4].text()) == debug.sub("ipykernel_N", theirs[4].text())
    assert "ipykernel_" in ours[4].text()


def interrupted(name: str, folder: Path) -> Run:
    with Kernel(name, cwd=str(folder)) as k:
        k.execute("import time", store_history=False)
        thread = threading.Thread(target=lambda: (time.sleep(2), k.interrupt()))
        thread.start()
        run = k.execute("x = 1\ntime.sleep(60)", timeout=60)
        thread.join()
        return run


def test_an_interrupts_traceback_shows_only_the_cells_frames(kernel_name: str, tmp_path: Path) -> None:
    theirs, ours = interrupted("python3", tmp_path), interrupted(kernel_name, tmp_path)
    assert [e["ename"] for e in ours.errors] == [e["ename"] for e in theirs.errors] == ["KeyboardInterrupt"]
    tb = plain(ours.errors[0]["traceback"])
    assert "worker" not in tb and "sigint" not in tb, tb
    assert tb == plain(theirs.errors[0]["traceback"])


def test_status_lines_leave_nothing_in_the_saved_notebook(kernel_name: str, tmp_path: Path) -> None:
    folder = tmp_path / "project"
    (folder / "many").mkdir(parents=True)
    for i in range(60):  # enough files for the first cell's "syncing N files" status line
        (folder / "many" / f"f{i}.txt").write_text(str(i))
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("print('one')"), nbformat.v4.new_code_cell("2")]
    nbformat.write(nb, folder / "nb.ipynb")
    out = papermill.execute_notebook(
        str(folder / "nb.ipynb"), str(folder / "out.ipynb"), kernel_name=kernel_name, cwd=str(folder)
    )
    assert [o["output_type"] for o in out.cells[0].outputs] == ["stream"], out.cells[0].outputs
    assert out.cells[0].outputs[0]["text"] == "one\n"
    assert [o["output_type"] for o in out.cells[1].outputs] == ["execute_result"]
    shutil.rmtree(folder / "many")


def test_a_status_line_is_shown_live_then_cleared(kernel_name: str, tmp_path: Path) -> None:
    for i in range(60):
        (tmp_path / f"f{i}.txt").write_text(str(i))
    with Kernel(kernel_name, cwd=str(tmp_path)) as k:
        run = k.execute("import sys\nprint('before', file=sys.stderr)")
    kinds = [m["msg_type"] for m in run.outputs]
    assert any("syncing" in line for line in run.status_lines), run.status_lines
    assert kinds[0] == "display_data" and "clear_output" in kinds
    after = kinds[len(kinds) - kinds[::-1].index("clear_output") :]  # after the last status line went
    assert set(after) == {"stream"} and run.text("stderr").endswith("before\n")


def test_the_cell_file_name_hash_is_ipykernels() -> None:
    from ipykernel.compiler import get_tmp_hash_seed
    from ipykernel.compiler import murmur2_x86 as ipykernels

    from daytona_kernel.runtime.ipyshell import CELL_HASH_SEED, murmur2_x86

    assert get_tmp_hash_seed() == CELL_HASH_SEED
    for text in ("", "a", "ab", "abc", "abcd", "def g():\n    return 1 / 0", "é漢字🙂x", "x" * 1001):
        assert murmur2_x86(text, CELL_HASH_SEED) == ipykernels(text, CELL_HASH_SEED), text


# -- the project root ------------------------------------------------------------------------------------


def test_the_project_root_is_the_git_root_else_the_nearest_marked_folder(tmp_path: Path, monkeypatch: Any) -> None:
    import pytest

    from daytona_kernel.errors import ConfigError
    from daytona_kernel.mirror.project import PROJECT_MARKERS, project_root

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "repo" / ".git").mkdir(parents=True)
    (tmp_path / "repo" / "a" / "b").mkdir(parents=True)
    (tmp_path / "repo" / "a" / "requirements.txt").write_text("")  # git wins over a nearer marker
    (tmp_path / "plain" / "nb").mkdir(parents=True)
    assert project_root(str(tmp_path / "repo" / "a" / "b")) == (str(tmp_path / "repo"), "a/b")
    assert project_root(str(tmp_path / "repo")) == (str(tmp_path / "repo"), "")
    assert project_root(str(tmp_path / "plain" / "nb")) == (str(tmp_path / "plain" / "nb"), "")
    for marker in PROJECT_MARKERS:
        proj = tmp_path / "marked" / marker.strip(".")
        (proj / "notebooks" / "deep").mkdir(parents=True)
        (proj / marker).write_text("")
        assert project_root(str(proj / "notebooks" / "deep")) == (str(proj), "notebooks/deep"), marker
    home = tmp_path / "home"
    (home / "work" / "nb").mkdir(parents=True)
    (home / "requirements.txt").write_text("")
    (home / ".git").mkdir()
    (tmp_path / "pyproject.toml").write_text("")  # above home: never
    assert project_root(str(home / "work" / "nb")) == (str(home / "work" / "nb"), "")  # never home, nor above it
    assert project_root(str(home / "work" / "nb"), "..") == (str(home / "work"), "nb")  # sync_root overrides
    assert project_root(str(home / "work" / "nb"), str(home / "work")) == (str(home / "work"), "nb")
    with pytest.raises(ConfigError, match="does not contain the notebook's folder"):
        project_root(str(home / "work" / "nb"), str(tmp_path / "plain"))
    with pytest.raises(ConfigError, match="is not a folder"):
        project_root(str(home / "work" / "nb"), "missing")


OUTSIDE_STEPS = [
    "open('../data/x.csv').read()",
    "import os\nos.makedirs('../results', exist_ok=True)\nopen('../results/out.csv', 'w').write('r,1\\n')",
    "open('../../outside.csv').read()",
    "open('../../written.csv', 'w').write('lost')",
    "open('../data/private/p.csv').read()",
]


def test_a_project_without_git_is_found_by_its_marker_and_paths_outside_it_say_so(kernel_name: str, tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    (proj / "notebooks").mkdir(parents=True)
    (proj / "data").mkdir()
    (proj / "requirements.txt").write_text("pandas\n")
    (proj / "data" / "x.csv").write_text("a,b\n1,2\n")
    (proj / "data" / "private").mkdir()
    (proj / "data" / "private" / "p.csv").write_text("kept here")
    (proj / ".gitignore").write_text("data/private/\n")
    (tmp_path / "outside.csv").write_text("far away")
    with Kernel(kernel_name, cwd=str(proj / "notebooks")) as k:
        read, write, outside, lost, ignored = (k.execute(code) for code in OUTSIDE_STEPS)
    assert answer(read) == ("ok", repr("a,b\n1,2\n"))
    assert write.status == "ok" and (proj / "results" / "out.csv").read_text() == "r,1\n"  # brought down
    assert outside.errors[0]["ename"] == "FileNotFoundError"
    note = plain(outside.errors[0]["traceback"])
    assert f"{tmp_path / 'outside.csv'} is outside the project folder mirrored into the sandbox ({proj})" in note
    assert "DaytonaKernel.sync_root" in note
    assert lost.status == "ok" and not (tmp_path / "written.csv").exists()
    notice = lost.text("stderr")
    assert f"this cell wrote {tmp_path / 'written.csv'} outside the project folder" in notice and "sync_root" in notice
    note = plain(ignored.errors[0]["traceback"])  # inside the project folder, left out by .gitignore
    assert f"{proj / 'data' / 'private' / 'p.csv'} is not mirrored into the sandbox: .gitignore" in note
    assert "DaytonaKernel.sync_include" in note
    with Kernel(kernel_name, cwd=str(proj / "notebooks"), env={"DAYTONA_KERNEL_SYNC_ROOT": str(tmp_path)}) as k:
        assert answer(k.execute(OUTSIDE_STEPS[2])) == ("ok", "'far away'")  # sync_root takes the folder above


# -- big files on the local backend ----------------------------------------------------------------------

MB = 1024 * 1024


def sandbox_copies(name: str) -> list[Path]:
    """Every copy of a file called ``name`` under the local backend's sandboxes and volumes."""
    root = Path(os.environ["JUPYTER_DATA_DIR"]) / "daytona-kernel"
    return [p for folder in ("sandboxes", "volumes") for p in (root / folder).rglob(name)]


def test_big_files_on_the_local_backend_are_shared_not_copied(tmp_path: Path) -> None:
    from daytona_kernel.backends.local.toolbox import share_file

    probe = tmp_path / "probe"
    probe.write_text("x")
    how = share_file(probe, tmp_path / "probe2", link=True)  # what this file system allows
    proj = tmp_path / "proj"
    (proj / "notebooks").mkdir(parents=True)
    (proj / "requirements.txt").write_text("")
    big = proj / "notebooks" / "big.csv"
    with open(big, "w") as f:
        f.write("a,b\n1,2\n")
        f.truncate(114 * MB)  # a 114 MB CSV beside the notebook (sparse: cheap to make)
    cells = [
        "import os\nos.path.getsize('big.csv'), open('big.csv').readline()",
        "with open('made.bin', 'wb') as f:\n    f.truncate(101 * 1024 * 1024)",
        "with open('big.csv', 'r+') as f:\n    f.write('c,d')",
        "open('big.csv').readline()",
    ]
    with Kernel("daytona-local", cwd=str(proj / "notebooks")) as k:
        runs = [k.execute(code) for code in cells]
        assert [r.status for r in runs] == ["ok"] * 4, [r.errors for r in runs]
        assert result_of(runs[0]) == f"({114 * MB}, 'a,b\\n')"
        assert not any("sync_max_file_mb" in r.text("stderr") or "Not synced" in r.text("stderr") for r in runs)
        made = proj / "notebooks" / "made.bin"
        assert made.stat().st_size == 101 * MB  # the big file the cell wrote came down
        assert result_of(runs[3]) == "'c,d\\n'"
        assert big.read_text()[:4] == "c,d\n"  # the cell's write reached the user's file
        assert not list(proj.rglob("*sandbox-conflict*"))
        for name, original in (("big.csv", big), ("made.bin", made)):
            copies = sandbox_copies(name)
            assert copies, name
            for copy in copies:
                if how == "link":  # one file under several names: no second copy on this disk
                    assert os.path.samefile(copy, original), copy
                else:
                    assert how == "clone" and copy.stat().st_size == original.stat().st_size


def result_of(run: Run) -> str:
    return str(run.of_type("execute_result")[0]["data"]["text/plain"])


def test_share_file_never_truncates_what_the_old_name_shared(tmp_path: Path) -> None:
    from daytona_kernel.backends.local.toolbox import share_file

    original, linked, other = tmp_path / "original", tmp_path / "linked", tmp_path / "other"
    original.write_text("the user's data")
    other.write_text("new")
    os.chmod(other, 0o640)
    os.link(original, linked)  # the sandbox's name for the user's file
    assert share_file(other, linked, link=False) in ("clone", "copy")  # replaced by a rename, not written into
    assert original.read_text() == "the user's data" and linked.read_text() == "new"
    assert not os.path.samefile(linked, other) and (linked.stat().st_mode & 0o777) == 0o640
    how = share_file(original, tmp_path / "sub" / "shared", link=True)
    assert how in ("clone", "link") and (tmp_path / "sub" / "shared").read_text() == "the user's data"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["linked", "original", "other", "sub"]  # no temporary left


def test_big_files_are_placed_only_on_a_sandbox_on_this_disk() -> None:
    from daytona_kernel.config import MirrorSettings
    from daytona_kernel.mirror.plan import UpPlan, choose_up

    config = MirrorSettings(sync_max_file_mb=1)
    changed = [("small.csv", 10), ("big.csv", 2 * MB)]
    remote, local = UpPlan(), UpPlan()
    choose_up(remote, changed, config)
    choose_up(local, changed, config, on_this_disk=True)
    assert (remote.todo, [rel for rel, _ in remote.skipped], remote.placed) == (["small.csv"], ["big.csv"], [])
    assert (local.todo, local.skipped, local.placed) == (["small.csv"], [], ["big.csv"])


# -- a project-shaped notebook, cell by cell against ipykernel ---------------------------------------------

PROJECT = Path(__file__).parent / "notebooks" / "project"
INEXACT = ("%%time",)  # timings


def run_project_tour(name: str, folder: Path) -> list[list[tuple[Any, ...]]]:
    from test_parity import signature

    shutil.copytree(PROJECT, folder)
    nb = nbformat.read(folder / "notebooks" / "project-tour.ipynb", as_version=4)
    with Kernel(name, cwd=str(folder / "notebooks")) as k:
        k.execute("pass", store_history=False)  # the sandbox's start is shown in the first cell
        sources = [cell.source for cell in nb.cells if cell.cell_type == "code"]
        runs = [k.execute(source, allow_stdin=False) for source in sources]
    return [  # output types, stream text and MIME types (as test_parity compares), and each result's text
        signature(run, not source.startswith(INEXACT))
        + [("text", r["data"].get("text/plain")) for r in run.of_type("execute_result")]
        for source, run in zip(sources, runs)
    ]


def test_a_project_tour_notebook_matches_ipykernel_cell_by_cell(kernel_name: str, tmp_path: Path) -> None:
    """tests/notebooks/project: a notebook beside helpers.py, a package and another notebook, images in
    ../images, results written to ../results (IPython's "IPython Kernel" examples and the Python Data
    Science Handbook's first chapters do these); not a git repository, marked by a requirements.txt."""
    theirs = run_project_tour("python3", tmp_path / "ipykernel")
    ours = run_project_tour(kernel_name, tmp_path / "ours")
    cells = [
        c.source for c in nbformat.read(PROJECT / "notebooks" / "project-tour.ipynb", as_version=4).cells if c.cell_type == "code"
    ]
    assert sum(o[0] == "error" for sig in theirs for o in sig) == 2  # the two tracebacks, nothing else failed
    for source, got, want in zip(cells, ours, theirs):
        assert got == want, source
    assert (tmp_path / "ours" / "results" / "squares.csv").read_text() == "0\n1\n4\n9"  # brought down
