"""The emulated mount-s3 filesystem (tests/mounts3.py) behaves like a Daytona volume.

Each test pins one rule from "Volumes" in docs/daytona-platform.md, with the ordinary
library call that trips over it on a real volume. Where FUSE is missing these tests
skip with the reason; under CI=true that is a failure instead.
"""

from __future__ import annotations

import errno
import os
import shutil
import sqlite3
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from mounts3 import MountS3, fuse_missing

pytestmark = pytest.mark.slow  # every test mounts a filesystem in a subprocess

MISSING = fuse_missing()
if MISSING is not None and os.environ.get("CI") == "true":
    pytest.fail(f"CI must run the mount-s3 tests, but {MISSING}: .ci/run installs fuse3", pytrace=False)
if MISSING is not None:
    pytest.skip(MISSING, allow_module_level=True)


@pytest.fixture
def volume(tmp_path: Path) -> Iterator[Path]:
    """A mounted volume; the bucket (backing folder) is ``tmp_path / "bucket"``."""
    with MountS3(tmp_path / "bucket", tmp_path / "mnt") as mount:
        yield mount.mountpoint


def errno_of(fn) -> int:  # type: ignore[no-untyped-def]
    with pytest.raises(OSError) as info:  # noqa: PT011 - any OSError: the caller judges its errno
        fn()
    return info.value.errno


def test_whole_files_are_written_read_and_replaced(volume: Path, tmp_path: Path) -> None:
    (volume / "sub").mkdir()
    (volume / "sub" / "a.txt").write_text("first")
    assert (volume / "sub" / "a.txt").read_text() == "first"
    (volume / "sub" / "a.txt").write_text("second, longer")  # open(..., "w") truncates: allowed
    assert (volume / "sub" / "a.txt").read_text() == "second, longer"
    assert (tmp_path / "bucket" / "sub" / "a.txt").read_text() == "second, longer"
    (volume / "sub" / "a.txt").unlink()
    (volume / "sub").rmdir()
    assert os.listdir(volume) == []


def test_no_rename(volume: Path) -> None:
    (volume / "a").write_text("x")
    assert errno_of(lambda: os.replace(volume / "a", volume / "b")) == errno.EXDEV
    assert errno_of(lambda: os.rename(volume / "a", volume / "c")) == errno.EXDEV
    assert (volume / "a").read_text() == "x"


def test_no_symlinks_or_hard_links(volume: Path) -> None:
    (volume / "a").write_text("x")
    assert errno_of(lambda: os.symlink("a", volume / "l")) == errno.EPERM
    assert errno_of(lambda: os.link(volume / "a", volume / "h")) == errno.EPERM


def test_no_chmod_chown_or_utime_on_a_closed_file(volume: Path) -> None:
    (volume / "a").write_text("x")
    assert errno_of(lambda: os.chmod(volume / "a", 0o600)) == errno.EPERM
    assert errno_of(lambda: os.chown(volume / "a", os.getuid(), os.getgid())) == errno.EPERM
    assert errno_of(lambda: os.utime(volume / "a", (1, 1))) == errno.EPERM
    assert errno_of(lambda: shutil.copy2(volume / "a", volume / "b")) == errno.EPERM  # copystat
    assert (volume / "a").stat().st_mode & 0o777 == 0o666
    assert (volume / "b").read_text() == "x"  # the data was copied before copystat failed


def test_no_append_to_an_existing_file(volume: Path) -> None:
    with open(volume / "new.log", "a") as f:  # a new file may be opened for append
        f.write("one\n")
    assert errno_of(lambda: open(volume / "new.log", "a")) == errno.EPERM
    assert errno_of(lambda: open(volume / "new.log", "r+")) == errno.EPERM
    assert errno_of(lambda: os.truncate(volume / "new.log", 2)) == errno.EPERM
    assert (volume / "new.log").read_text() == "one\n"


def test_no_seek_back_writes(volume: Path) -> None:
    def seek_back() -> None:
        with open(volume / "s.bin", "wb") as f:
            f.write(b"abcd")
            f.flush()
            f.seek(0)
            f.write(b"z")

    assert errno_of(seek_back) == errno.EINVAL


def test_libraries_that_seek_or_rename_fail(volume: Path) -> None:
    def write_zip() -> None:
        with zipfile.ZipFile(volume / "z.zip", "w") as z:
            z.writestr("x.txt", "y" * 100)

    assert errno_of(write_zip) == errno.EINVAL

    def write_sqlite() -> None:
        db = sqlite3.connect(volume / "db.sqlite")
        try:
            db.execute("create table t(x)")
            db.commit()
        finally:
            db.close()

    with pytest.raises(sqlite3.OperationalError):
        write_sqlite()


def test_a_file_is_unreadable_while_it_is_written(volume: Path) -> None:
    with open(volume / "w.txt", "wb") as f:
        f.write(b"partial")
        f.flush()
        assert errno_of(lambda: open(volume / "w.txt", "rb")) == errno.EPERM
        assert errno_of(lambda: open(volume / "w.txt", "wb")) == errno.EPERM  # one writer
    assert (volume / "w.txt").read_bytes() == b"partial"


def test_mtime_is_whole_seconds(volume: Path) -> None:
    (volume / "a").write_text("x")
    for _ in range(3):  # a write on an exact second is possible; three in a row are not
        (volume / "a").write_text("y")
        if (volume / "a").stat().st_mtime_ns % 1_000_000_000:
            break
        time.sleep(0.37)
    st = (volume / "a").stat()
    assert st.st_mtime_ns % 1_000_000_000 == 0
    assert abs(st.st_mtime - time.time()) < 5


def test_unmount_with_a_file_still_open(tmp_path: Path) -> None:
    mount = MountS3(tmp_path / "bucket", tmp_path / "mnt").start()
    held = open(mount.mountpoint / "held.txt", "w")
    held.write("x")
    try:
        mount.stop()
        assert not os.path.ismount(tmp_path / "mnt")
    finally:
        try:
            held.close()
        except OSError as exc:  # the filesystem is gone; what the file held is lost, as intended
            print("closing after unmount:", exc)
