"""The runtime's sweep of private folders that ended runtimes left in the sandbox's temporary folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from daytona_kernel.runtime.runtime import sweep_private_dirs


def test_the_folders_of_ended_runtimes_go_and_the_others_stay(tmp_path: Path) -> None:
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    gone = tmp_path / f"daytona-kernel-inbox-{ended.stdout.strip()}-abc"
    mine = tmp_path / f"daytona-kernel-inbox-{os.getpid()}-def"
    comms = tmp_path / f"daytona-kernel-inbox-{os.getpid()}-comms-0123"
    other = tmp_path / "daytona-kernel-doctor-1-x"
    for folder in (gone, mine, comms, other):
        folder.mkdir()
        (folder / "out-0").write_bytes(b"A" * 1000)
    sweep_private_dirs(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([mine.name, comms.name, other.name])
    sweep_private_dirs(str(tmp_path / "missing"))  # no folder: nothing to do, no error
