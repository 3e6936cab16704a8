"""IPython in a sandbox whose Python has none, offline (issue 15.3): the kernel ships its own,
once per sandbox, and the first cell already runs on it."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from daytona_emulator import DaytonaEmulator
from kernels import Kernel, result_text

from daytona_kernel import ipython_bundle

UPLOAD = "POST /toolbox/{sid}/files/bulk-upload"


@pytest.fixture
def bare_emulator(tmp_path: Path):  # type: ignore[no-untyped-def]
    """An emulator whose sandboxes run a Python with only the standard library."""
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    missing = subprocess.run([str(python), "-c", "import IPython"], capture_output=True)
    assert missing.returncode != 0, "the bare venv must not see IPython"
    emu = DaytonaEmulator(tmp_path / "emu", python=str(python)).start()
    yield emu
    emu.close()


def test_an_offline_sandbox_without_ipython_gets_the_kernels(
    bare_emulator: DaytonaEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    kernel_home = os.environ.get("HOME", "")
    monkeypatch.setenv("HOME", str(home))  # the emulated sandboxes' Python sees this home; the kernel keeps its own
    env = dict(bare_emulator.env(), DAYTONA_KERNEL_NETWORK_BLOCK_ALL="1", HOME=kernel_home)
    folder = tmp_path / "nb"
    folder.mkdir()
    started = time.monotonic()
    with Kernel("daytona", env=env, cwd=str(folder)) as k:
        run = k.execute("import IPython\ntype(get_ipython()).__name__, IPython.__version__, IPython.__file__")
        first = time.monotonic() - started
        name, version, where = ast.literal_eval(result_text(run))
        assert (name, version) == ("SandboxShell", ipython_bundle.ipython_version())
        assert where.startswith(str(home / ".cache" / "daytona-kernel"))
        assert result_text(k.execute("%who_ls")) == "['IPython']"
        order = "import sys, os, json\n[sys.path.index(p) for p in (os.path.dirname(os.path.dirname(json.__file__)), '', os.path.dirname(os.path.dirname(IPython.__file__)))]"
        stdlib, cwd, shipped = ast.literal_eval(result_text(k.execute(order)))
        assert stdlib < cwd < shipped  # as under ipykernel: the cell's folder after the stdlib, before third-party packages
        code = "import json\njson.JSONDec"  # jedi's stdlib stubs are shipped (its third-party ones are not)
        assert "JSONDecoder" in k.request("complete", code, len(code))["matches"]
        assert [s.spec.get("networkBlockAll") for s in bare_emulator.sandboxes.values()] == [True]
        uploads = bare_emulator.counts[UPLOAD]
        assert uploads >= 1
        started = time.monotonic()
        k.restart()
        assert result_text(k.execute("type(get_ipython()).__name__")) == "'SandboxShell'"
        warm = time.monotonic() - started
        assert bare_emulator.counts[UPLOAD] == uploads  # cached on the sandbox's disk: shipped once
    print(f"first start with the IPython upload: {first:.2f} s; restart: {warm:.2f} s")


def shipping_kernel(emu: DaytonaEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, str], Path, Path]:
    """The kernel's environment, its notebook folder and the sandboxes' cache folder for the shipped IPython."""
    home = tmp_path / "home"
    home.mkdir()
    kernel_home = os.environ.get("HOME", "")
    monkeypatch.setenv("HOME", str(home))  # the emulated sandboxes' Python sees this home; the kernel keeps its own
    folder = tmp_path / "nb"
    folder.mkdir()
    return dict(emu.env(), HOME=kernel_home), folder, home / ".cache" / "daytona-kernel"


def test_a_full_disk_leaves_no_truncated_archive_and_nothing_accumulates(
    bare_emulator: DaytonaEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env, folder, cache = shipping_kernel(bare_emulator, tmp_path, monkeypatch)
    for _ in range(2):  # every start tries again, and leaves nothing behind
        bare_emulator.upload_space = 64 * 1024  # the sandbox's disk takes 64 KiB more, then ENOSPC
        with Kernel("daytona", env=env, cwd=str(folder)) as k:
            run = k.execute("1 + 1")
            assert result_text(run) == "2", run.errors
            assert "could not install IPython in the sandbox" in run.text("stderr")
            assert "no space left on device" in run.text("stderr")
        assert sorted(p.name for p in cache.iterdir()) == [], "a truncated archive or a partial folder was left"
    bare_emulator.upload_space = None


def test_what_an_interrupted_shipping_left_is_removed_by_the_next(
    bare_emulator: DaytonaEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env, folder, cache = shipping_kernel(bare_emulator, tmp_path, monkeypatch)
    name = f"ipython-{ipython_bundle.ipython_version()}-py{sys.version_info[0]}.{sys.version_info[1]}"
    cache.mkdir(parents=True)
    stale_part = cache / f"{name}.part-4242"  # a kernel that died while unpacking
    (stale_part / "IPython").mkdir(parents=True)
    stale_archive = cache / f"{name}.tar.gz"  # and one whose upload was cut
    stale_archive.write_bytes(b"\x1f\x8b truncated")
    for stale in (stale_part, stale_archive):
        os.utime(stale, (time.time() - 3600, time.time() - 3600))
    with Kernel("daytona", env=env, cwd=str(folder)) as k:
        assert result_text(k.execute("type(get_ipython()).__name__")) == "'SandboxShell'"
    assert sorted(p.name for p in cache.iterdir()) == [name]
