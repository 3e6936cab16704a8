"""Each output once, for every client (issue 33; docs/status.md).

The same three cells for each client class: the first cell, behind a first sync of a few hundred
files (with a status line); a cell whose big file is skipped (with a notice); a ``%%daytona map``
cell. A raw jupyter_client reader and ``jupyter console`` see each output exactly once; a notebook
saved by papermill keeps the outputs and the notices and nothing of the status line.
(tests/test_browser.py runs them in JupyterLab.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import nbformat
import papermill
import pexpect
import pytest
from kernels import Kernel, Run
from test_console import TIMEOUT_S

pytestmark = pytest.mark.timeout(400)  # four cells per test, map cells among them, on a shared machine

FILES = 300  # the first sync: enough files for its status line (sync.SHOW_PROGRESS_FILES)
MAX_FILE_MB = "0.1"
SYNC_CELL = "print('after the sync')"
BIG_FILE = "print('after the skip')"  # runs once big.bin (over sync_max_file_mb) is in the folder
MAP_CELL = "%%daytona map 2\nprint('hi', rank, world)"
MAP_DISPLAY = "%%daytona map 2\nprint('again', rank)\ndisplay(f'shown by {rank}')"  # a rich output too
SKIP_NOTICE = "Not synced: big.bin"


def project(folder: Path) -> Path:
    (folder / "many").mkdir(parents=True)
    for i in range(FILES):
        (folder / "many" / f"f{i:03d}.txt").write_text(f"file {i}\n")
    return folder


def add_big_file(folder: Path) -> None:
    (folder / "big.bin").write_bytes(b"x" * 300_000)  # over MAX_FILE_MB


@pytest.fixture
def folder(kernel_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DAYTONA_KERNEL_SYNC_MAX_FILE_MB", MAX_FILE_MB)
    return project(tmp_path / "project")


def skips(kernel_name: str) -> bool:
    """The local backend shares a big file with its sandbox (a link), so only Daytona skips it."""
    return kernel_name == "daytona"


def stream_lines(run: Run) -> list[str]:
    return "".join(m["content"]["text"] for m in run.outputs if m["msg_type"] == "stream").splitlines()


def is_status(msg: dict[str, Any]) -> bool:
    return str(msg["content"].get("transient", {}).get("display_id", "")).startswith("daytona-kernel-status-")


def repeated(items: list[str]) -> list[str]:
    return [item for item, n in Counter(items).items() if n > 1]


# -- a raw jupyter_client reader ---------------------------------------------------------------------


def test_a_raw_reader_sees_each_output_once(kernel_name: str, folder: Path) -> None:
    with Kernel(kernel_name, cwd=str(folder)) as k:
        synced = k.execute(SYNC_CELL)
        add_big_file(folder)
        skipped = k.execute(BIG_FILE)
        mapped = k.execute(MAP_CELL)
        displayed = k.execute(MAP_DISPLAY)
    for run in (synced, skipped, mapped, displayed):
        assert run.status == "ok", run.outputs
        assert not repeated(stream_lines(run)), run.outputs
        displays = [str(m["content"]["data"]) for m in run.outputs if m["msg_type"] == "display_data" and not is_status(m)]
        assert not repeated(displays), displays
    assert any("syncing" in line for line in synced.status_lines), synced.status_lines  # live, for a client that asks
    assert stream_lines(synced) == ["after the sync"]
    assert ("[stdout:0] hi 0 2" in stream_lines(mapped)) and ("[stdout:1] hi 1 2" in stream_lines(mapped))
    assert sum("started 2 engines" in line for line in stream_lines(mapped)) == 1
    assert "[stdout:0] again 0" in stream_lines(displayed) and "[stdout:1] again 1" in stream_lines(displayed)
    shown = sorted(
        m["content"]["data"]["text/plain"] for m in displayed.outputs if m["msg_type"] == "display_data" and not is_status(m)
    )
    assert shown == ["'shown by 0'", "'shown by 1'"], shown
    if skips(kernel_name):
        assert sum(SKIP_NOTICE in line for line in stream_lines(skipped)) == 1, stream_lines(skipped)


def test_the_status_line_comes_first_and_goes_before_the_first_output(kernel_name: str, folder: Path) -> None:
    """Only at the top of a cell: a clear_output takes it away, and clears nothing else."""
    with Kernel(kernel_name, cwd=str(folder)) as k:
        runs = [k.execute(SYNC_CELL), k.execute(MAP_CELL), k.execute("%%daytona map 3\nprint(rank)")]
    for run in runs:
        status_at = [i for i, m in enumerate(run.outputs) if is_status(m)]
        clears = [i for i, m in enumerate(run.outputs) if m["msg_type"] == "clear_output"]
        others = [i for i, m in enumerate(run.outputs) if not is_status(m) and m["msg_type"] != "clear_output"]
        assert status_at, run.outputs  # each of these cells waits for something
        assert clears and max(status_at) < clears[-1] < min(others), [m["msg_type"] for m in run.outputs]


def test_a_headless_client_gets_no_status_line(kernel_name: str, folder: Path) -> None:
    """A client that cannot answer input (nbclient, papermill) asks with allow_stdin=False."""
    with Kernel(kernel_name, cwd=str(folder)) as k:
        run = k.execute(SYNC_CELL, allow_stdin=False)
    assert run.status == "ok"
    assert [m["msg_type"] for m in run.outputs] == ["stream"] and stream_lines(run) == ["after the sync"]


# -- papermill (nbclient) ----------------------------------------------------------------------------


def test_a_notebook_saved_by_papermill_keeps_outputs_and_notices_and_no_status(kernel_name: str, folder: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(cell) for cell in (SYNC_CELL, MAP_CELL, MAP_DISPLAY)]
    add_big_file(folder)
    nbformat.write(nb, folder / "nb.ipynb")
    out = papermill.execute_notebook(
        str(folder / "nb.ipynb"), str(folder / "out.ipynb"), kernel_name=kernel_name, cwd=str(folder)
    )
    texts: list[list[str]] = []
    for cell in out.cells:
        for o in cell.outputs:
            assert o["output_type"] in ("stream", "display_data"), o
            if o["output_type"] == "display_data":
                assert o["data"].get("text/plain", "").startswith("'shown by "), o  # no blank display, no hourglass
        texts.append("".join(o.get("text", "") for o in cell.outputs).splitlines())
    synced, mapped, displayed = texts
    assert synced[-1] == "after the sync" and not repeated(synced), synced
    assert not any("⏳" in line for line in synced + mapped + displayed)
    assert "[stdout:0] hi 0 2" in mapped and "[stdout:1] hi 1 2" in mapped and not repeated(mapped), mapped
    assert "[stdout:0] again 0" in displayed and not repeated(displayed), displayed
    if skips(kernel_name):
        assert sum(SKIP_NOTICE in line for line in synced) == 1, synced


# -- jupyter console -----------------------------------------------------------------------------------


# The console's own shell (ZMQTerminalInteractiveShell, as `jupyter console` makes it), in a pseudo-terminal:
# its simple prompt, which pexpect can read, takes one line per cell, and a map cell has several.
CONSOLE = """
import subprocess
import sys
from jupyter_console.app import ZMQTerminalIPythonApp
app = ZMQTerminalIPythonApp.instance()
app.initialize(["--kernel", sys.argv[1], "--simple-prompt"])
for line in sys.stdin:
    app.shell.run_cell(line.encode().decode("unicode_escape"))
    print("<<cell done>>", flush=True)
app.kernel_manager.shutdown_kernel()
"""


def run_in_console(child: pexpect.spawn, cell: str) -> str:
    """Run one cell in the console and return what it printed."""
    typed = cell.encode("unicode_escape").decode()
    child.sendline(typed)
    child.expect_exact("<<cell done>>")
    shown = child.before.replace("\r\n", "\n").split("\n")
    return "\n".join(line for line in shown if line.strip() and line.strip() != typed)  # less the echo of the line typed


def test_jupyter_console_prints_each_line_once(kernel_name: str, folder: Path) -> None:
    child = pexpect.spawn(
        sys.executable,
        ["-c", CONSOLE, kernel_name],
        cwd=str(folder),
        env=dict(os.environ),
        encoding="utf-8",
        timeout=TIMEOUT_S,
        dimensions=(40, 400),
    )
    try:
        synced = run_in_console(child, SYNC_CELL)
        add_big_file(folder)
        skipped = run_in_console(child, BIG_FILE)
        mapped = run_in_console(child, MAP_CELL)
        displayed = run_in_console(child, MAP_DISPLAY)
    finally:
        child.sendeof()
        child.expect(pexpect.EOF)
        child.close()
    assert synced.count("after the sync") == 1, synced
    assert synced.count("⏳ syncing") == 1, synced  # the status line's first version; a console does not update it
    assert mapped.count("[stdout:0] hi 0 2") == 1 and mapped.count("[stdout:1] hi 1 2") == 1, mapped
    assert mapped.count("started 2 engines") == 1, mapped
    assert skipped.count("after the skip") == 1, skipped
    if skips(kernel_name):
        assert skipped.count(SKIP_NOTICE) == 1, skipped
    assert displayed.count("[stdout:1] again 1") == 1 and displayed.count("'shown by 1'") == 1, displayed
    for shown in (synced, skipped, mapped, displayed):
        assert not repeated([line.strip() for line in shown.splitlines() if line.strip()]), shown


def test_a_notice_from_the_sandbox_start_does_not_hide_the_first_syncs_status(
    kernel_name: str, folder: Path, tmp_path: Path
) -> None:
    """The status line shows only before a cell's first output, so the kernel says what the start of the
    sandbox took (here: a repository cloned) after the first sync, not before it."""
    repo = tmp_path / "src" / "lib"
    repo.mkdir(parents=True)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-C", str(repo)]
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    (repo / "lib.py").write_text("VALUE = 7\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "init"], check=True)
    with Kernel(kernel_name, cwd=str(folder), env={"DAYTONA_KERNEL_REPO_URL": str(repo)}) as k:
        run = k.execute(SYNC_CELL)
    assert run.status == "ok", run.outputs
    assert any("syncing" in line for line in run.status_lines), run.status_lines
    assert sum("Cloned lib/" in line for line in stream_lines(run)) == 1, stream_lines(run)
    assert stream_lines(run)[-1] == "after the sync" and not repeated(stream_lines(run))
