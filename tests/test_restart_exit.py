"""How the sandbox's interpreter ends at a restart: the daemon deletes the context with SIGTERM and answers only
once the worker has exited, and the restart waits for that answer (docs/reattach.md, "The first cell after a
restart")."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import sandboxes_of
from kernels import Kernel, result_text

# Runs in every Python started with this PYTHONPATH, before anything else registers an exit handler: its
# handler therefore runs last, just before the interpreter's own teardown, and says whether the heap is frozen.
REPORTER = """\
import atexit, gc, os

def _report():
    with open(os.path.join(os.environ["EXIT_REPORTS"], str(os.getpid())), "w") as f:
        f.write(str(gc.get_freeze_count()))

atexit.register(_report)
"""


def test_a_restart_ends_the_old_interpreter_after_its_exit_work_without_a_collection_of_the_whole_heap(
    kernel_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site, reports = tmp_path / "site", tmp_path / "reports"
    site.mkdir()
    reports.mkdir()
    (site / "sitecustomize.py").write_text(REPORTER)
    monkeypatch.setenv("PYTHONPATH", str(site))  # the kernel's worker, and the emulator's (it runs here)
    monkeypatch.setenv("EXIT_REPORTS", str(reports))
    user_atexit, unclosed, in_module = tmp_path / "user-atexit.txt", tmp_path / "unclosed.txt", tmp_path / "in-module.txt"
    project = tmp_path / "project"
    project.mkdir()
    (project / "helper.py").write_text(  # a module's object in a cycle: alive until Python's teardown clears the module
        "class Recorder:\n"
        "    def __init__(self, path):\n"
        "        self.f = open(path, 'w')\n"
        "        self.me = self\n"
        f"rec = Recorder({str(in_module)!r})\n"
        "rec.f.write('kept')\n"
    )
    with Kernel(kernel_name, cwd=str(project)) as k:
        pid = result_text(k.execute("import os\nos.getpid()"))
        run = k.execute(
            "import atexit, helper\n"
            f"atexit.register(lambda: open({str(user_atexit)!r}, 'w').write('ran'))\n"
            "class Holder: pass\n"
            f"h = Holder(); h.me = h; h.f = open({str(unclosed)!r}, 'w'); h.f.write('kept')\n"
        )
        assert run.reply["content"]["status"] == "ok", run.errors
        k.restart()
        report = reports / pid
        deadline = time.monotonic() + 10
        while not report.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert report.read_text() != "0"  # frozen: the interpreter's final collections skip the heap
        assert user_atexit.read_text() == "ran"  # the user's exit handlers still run
        assert unclosed.read_text() == "kept"  # IPython's exit work (the namespace cleared and collected) still runs
        assert in_module.read_text() == "kept"  # and the teardown still finalizes what modules held in cycles
        assert result_text(k.execute("1 + 1")) == "2"


def volume_copy(k: Kernel, kernel_name: str, emulator: Any, folder: Path) -> Path:
    """Where the volume keeps the working directory's copy, as this machine sees it."""
    if kernel_name == "daytona":
        (sandbox,) = [s for s in sandboxes_of(emulator, folder) if s.state != "destroyed"]
        return emulator.bucket_path("daytona-kernel", sandbox.spec["volumes"][0]["subpath"])
    status = k.execute("%daytona status").text()
    return Path(re.search(r"\(local folder (.+)\)", status).group(1))  # type: ignore[union-attr]


def test_a_restart_leaves_on_the_volume_what_the_old_interpreter_wrote_as_it_ended(
    kernel_name: str, emulator: Any, tmp_path: Path
) -> None:
    """The restart waits for the old context's deletion, which waits for its worker's exit; the worker's last
    act is the volume copy's last pass, after the user's exit handlers and IPython's (which flushes a file left
    open). Before, the copy was brought up to date before the deletion, and what the exit wrote reached the
    volume only after the next process's first cell, or never (a sandbox lost meanwhile)."""
    env = {"DAYTONA_KERNEL_SYNC": "off"}
    with Kernel(kernel_name, cwd=str(tmp_path), env=env) as k:
        run = k.execute(
            "import atexit\n"
            "atexit.register(lambda: open('saved.txt', 'w').write('state'))\n"
            "log = open('unclosed.txt', 'w'); log.write('buffered')\n"
        )
        assert run.errors == [], run.errors
        volume = volume_copy(k, kernel_name, emulator, tmp_path)
        k.restart()
        assert (volume / "saved.txt").read_text() == "state"
        assert (volume / "unclosed.txt").read_text() == "buffered"


def test_the_sandboxs_heap_of_ipython_is_frozen_once_the_runtime_is_installed(kernel_name: str, tmp_path: Path) -> None:
    """IPython's objects (most of the worker's heap) are made once, at the bootstrap: no collection needs to
    look at them again, the interpreter's exit included (its last collection then costs the user's objects
    only)."""
    with Kernel(kernel_name, cwd=str(tmp_path)) as k:
        assert result_text(k.execute("import gc\ngc.get_freeze_count() > 10000")) == "True"
