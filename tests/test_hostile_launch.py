"""Threat: files the sandbox wrote beside the notebook are imported by the kernel on the host.

The mirror copies whatever a cell writes into the notebook's folder, and Jupyter starts the
kernel with that folder as its working directory. Python puts the working directory first on
``sys.path``, so a ``secrets.py`` or ``asyncio.py`` written by a cell would run on the user's
machine at the next kernel start. The kernel must never have that folder on its import path.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from kernels import Kernel

# Modules the kernel process imports at start or at its first cell (its own package included).
HOSTILE_MODULES = ("asyncio.py", "secrets.py", "zmq.py", "aiohttp.py", "daytona_kernel/__init__.py")


def plant(folder: Path, markers: Path) -> None:
    """Write modules that leave a marker (named after the importing process) when imported."""
    payload = textwrap.dedent(
        f"""
        import os as _os
        open(_os.path.join({str(markers)!r}, "imported-by-%d" % _os.getpid()), "w").close()
        """
    )
    for name in HOSTILE_MODULES:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(payload)


@pytest.mark.parametrize("kernel_name", ["daytona-local", "daytona"], indirect=True)
def test_modules_in_the_notebook_folder_are_never_imported_by_the_kernel(kernel_name: str, tmp_path: Path) -> None:
    folder = tmp_path / "notebook"
    markers = tmp_path / "markers"
    folder.mkdir()
    markers.mkdir()
    plant(folder, markers)
    kernel = None
    try:
        kernel = Kernel(kernel_name, cwd=str(folder))
        run = kernel.execute("import json\nprint(json.dumps([6 * 7]))")
        assert run.status == "ok", run.errors
        assert run.text() == "[42]\n"
        kernel_pid = kernel.km.provisioner.process.pid  # type: ignore[union-attr]
    except RuntimeError:  # the kernel died at start: that is the planted package at work
        kernel_pid = None
    finally:
        if kernel is not None:
            kernel.close()
    imported_by = {int(p.name.rsplit("-", 1)[1]) for p in markers.iterdir()}
    # The cell itself runs in the sandbox (a worker process), which may import what it likes.
    assert kernel_pid is not None and kernel_pid not in imported_by, (
        f"the kernel process imported a module planted in the notebook folder: {sorted(imported_by)}"
    )
