"""Paths in the user's eyes (issue 36): where a file in the sandbox is the copy of the user's own file,
tracebacks, inspection and a module's repr name the user's file; the code itself (``__file__``,
``os.getcwd()``) keeps the sandbox's paths, where the files are."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from kernels import Kernel, result_text

from daytona_kernel.runtime.pathmap import PathMap

ANSI = re.compile(r"\x1b\[[0-9;]*m")
HELPERS = '"""Helpers."""\n\n\ndef load(name):\n    """Load a thing."""\n    return 1 / 0\n'


def test_a_traceback_inspection_and_a_module_name_the_users_file(kernel_name: str, workdir: Path) -> None:
    (workdir / "helpers.py").write_text(HELPERS)
    mine = str(workdir.resolve() / "helpers.py")
    with Kernel(kernel_name, cwd=str(workdir)) as k:
        sandbox_file = result_text(k.execute("import helpers\nhelpers.__file__")).strip("'")
        assert sandbox_file.endswith("/helpers.py")
        failed = k.execute("helpers.load('x')")
        traceback = ANSI.sub("", "\n".join(failed.errors[0]["traceback"]))
        assert f"File {mine}:6, in load" in traceback, traceback
        page = k.execute("helpers.load?").reply["content"]["payload"]
        assert f"File:      {mine}" in ANSI.sub("", page[0]["data"]["text/plain"])
        inspected = k.request("inspect", "helpers.load", 12)
        assert f"File:      {mine}" in ANSI.sub("", inspected["data"]["text/plain"])
        assert result_text(k.execute("helpers")) == f"<module 'helpers' from '{mine}'>"
        if sandbox_file != mine:  # the local backend's sandbox is a copy on this disk; Daytona's another machine
            assert sandbox_file not in traceback and sandbox_file not in inspected["data"]["text/plain"]
        assert result_text(k.execute("import os\nos.path.isfile(helpers.__file__)")) == "True"  # the code's paths work


@pytest.mark.parametrize(
    ("sandbox", "user", "path", "shown"),
    [
        ("/w/p", "/home/me/p", "/w/p/a/b.py", "/home/me/p/a/b.py"),
        ("/w/p", "/home/me/p", "/w/p2/b.py", "/w/p2/b.py"),
        ("/w/p", "/home/me/p", "/w/p", "/home/me/p"),
        ("/w/p", "C:\\Users\\me\\p", "/w/p/a/b.py", "C:\\Users\\me\\p\\a\\b.py"),
        ("/w/p", "", "/w/p/a.py", "/w/p/a.py"),
    ],
)
def test_the_path_map_both_ways(sandbox: str, user: str, path: str, shown: str) -> None:
    paths = PathMap(sandbox, user)
    assert paths.to_user(path) == shown
    assert paths.to_sandbox(shown) == path


def test_the_path_map_in_text() -> None:
    paths = PathMap("/w/p", "/home/me/p")
    line = "File \x1b[32m/w/p/helpers.py:2\x1b[0m <module 'h' from '/w/p/h.py'> /w/p2/x, in /w/p"
    assert (
        paths.in_text(line)
        == "File \x1b[32m/home/me/p/helpers.py:2\x1b[0m <module 'h' from '/home/me/p/h.py'> /w/p2/x, in /home/me/p"
    )
