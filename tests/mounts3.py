"""A FUSE filesystem with the semantics of mount-s3 (Mountpoint for Amazon S3), for the emulator.

Daytona mounts every volume with mount-s3 (``apps/runner/pkg/docker/volumes_mountpaths.go``,
with ``--allow-delete --allow-overwrite --file-mode 0666 --dir-mode 0777``). The emulator
mounts this filesystem instead, over a plain folder that stands in for the bucket, so code
that would fail on a real volume fails here too (see "Volumes" in docs/daytona-platform.md and
Mountpoint's doc/SEMANTICS.md):

- no rename (``EXDEV``), no symlinks or hard links (``EPERM``), no chmod or chown (``EPERM``),
  no ``utime`` on a file that is not open for writing (``EPERM``), no locks;
- a file is written sequentially from offset 0, and only when it is new or opened with
  ``O_TRUNC``: opening an existing file for writing without truncating it (an append,
  ``r+``) is ``EPERM``, a write at any other offset than the end (a seek back, a hole) is
  ``EINVAL``, as mount-s3 reports an out-of-order write;
- a file is unreadable while it is being written (``EPERM`` on open), and it has one writer;
- modes are fixed (files 0666, folders 0777) and mtime is whole seconds, like an object's
  Last-Modified time.

Run it as a process (``python tests/mounts3.py BUCKET MOUNTPOINT``); ``MountS3`` does that,
waits for the mount and unmounts it. ``fuse_missing()`` says why FUSE cannot be used here.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self from Python 3.11

MOUNT_WAIT_S = 10.0
UNMOUNT_WAIT_S = 3.0
ORPHAN_POLL_S = 1.0
FILE_MODE = 0o666
DIR_MODE = 0o777
NS_PER_S = 1_000_000_000


def fuse_missing() -> str | None:
    """Why this machine cannot mount a FUSE filesystem, or None when it can."""
    if not os.path.exists("/dev/fuse"):
        return "FUSE is missing: no /dev/fuse (install fuse3, or run the container with --device /dev/fuse)"
    if shutil.which("fusermount3") is None:
        return "FUSE is missing: no fusermount3 (apt-get install fuse3)"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as exc:  # OSError: libfuse itself could not be loaded
        return f"FUSE is missing: mfusepy cannot load libfuse ({exc}); pip install mfusepy and apt-get install fuse3"
    return None


@dataclass
class _Handle:
    path: str
    file: BinaryIO
    writing: bool
    offset: int = 0  # where the next sequential write must start


def _operations_class() -> type:
    """The mfusepy Operations subclass (built lazily, so this module imports without libfuse)."""
    from mfusepy import FuseOSError, Operations

    def refuse(code: int) -> FuseOSError:
        return FuseOSError(code)

    class MountS3Operations(Operations):  # type: ignore[misc]
        use_ns = True

        def __init__(self, bucket: str) -> None:
            self.bucket = os.path.realpath(bucket)
            self.handles: dict[int, _Handle] = {}
            self.next_fh = 1
            self.mutex = threading.Lock()
            self.uid, self.gid = os.getuid(), os.getgid()

        def _real(self, path: str) -> str:
            return os.path.join(self.bucket, path.lstrip("/"))

        def _writer(self, path: str) -> _Handle | None:
            return next((h for h in self.handles.values() if h.writing and h.path == path), None)

        def _add(self, handle: _Handle) -> int:
            fh = self.next_fh
            self.next_fh += 1
            self.handles[fh] = handle
            return fh

        # -- metadata ------------------------------------------------------

        def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
            try:
                st = os.lstat(self._real(path))
            except FileNotFoundError:
                raise refuse(errno.ENOENT) from None
            is_dir = stat.S_ISDIR(st.st_mode)
            mtime = (st.st_mtime_ns // NS_PER_S) * NS_PER_S  # an object's Last-Modified: whole seconds
            return {
                "st_mode": (stat.S_IFDIR | DIR_MODE) if is_dir else (stat.S_IFREG | FILE_MODE),
                "st_nlink": 2 if is_dir else 1,
                "st_size": 0 if is_dir else st.st_size,
                "st_uid": self.uid,
                "st_gid": self.gid,
                "st_mtime": mtime,
                "st_ctime": mtime,
                "st_atime": mtime,
            }

        def readdir(self, path: str, fh: int) -> list[str]:
            return [".", "..", *sorted(os.listdir(self._real(path)))]

        def statfs(self, path: str) -> dict[str, int]:
            st = os.statvfs(self.bucket)
            return {
                k: getattr(st, k)
                for k in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree", "f_namemax")
            }

        def chmod(self, path: str, mode: int) -> int:
            raise refuse(errno.EPERM)

        def chown(self, path: str, uid: int, gid: int) -> int:
            raise refuse(errno.EPERM)

        def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
            with self.mutex:
                if self._writer(path) is None:  # mount-s3 sets times only on a file being written
                    raise refuse(errno.EPERM)
            return 0

        def rename(self, old: str, new: str) -> int:
            raise refuse(errno.EXDEV)

        def symlink(self, target: str, source: str) -> int:
            raise refuse(errno.EPERM)

        def link(self, target: str, source: str) -> int:
            raise refuse(errno.EPERM)

        def mknod(self, path: str, mode: int, dev: int) -> int:
            raise refuse(errno.EPERM)

        lock = None  # no byte-range locks, as with mount-s3: the kernel keeps them locally

        # -- folders -------------------------------------------------------

        def mkdir(self, path: str, mode: int) -> int:
            os.mkdir(self._real(path))
            return 0

        def rmdir(self, path: str) -> int:
            os.rmdir(self._real(path))
            return 0

        def unlink(self, path: str) -> int:
            with self.mutex:
                if self._writer(path) is not None:
                    raise refuse(errno.EPERM)
            os.unlink(self._real(path))
            return 0

        # -- files ---------------------------------------------------------

        def create(self, path: str, mode: int, flags: int) -> int:
            with self.mutex:
                if self._writer(path) is not None:
                    raise refuse(errno.EPERM)
                real = self._real(path)
                if os.path.isdir(real):
                    raise refuse(errno.EISDIR)
                exists = os.path.exists(real)
                if exists and not flags & os.O_TRUNC:
                    raise refuse(errno.EPERM)  # an existing file is only ever replaced whole
                return self._add(_Handle(path, open(real, "wb"), True))

        def open(self, path: str, flags: int) -> int:
            with self.mutex:
                real = self._real(path)
                if not os.path.exists(real):
                    raise refuse(errno.ENOENT)
                if self._writer(path) is not None:
                    raise refuse(errno.EPERM)  # unreadable (and unwritable) while it is being written
                if flags & os.O_ACCMODE == os.O_RDONLY:
                    return self._add(_Handle(path, open(real, "rb"), False))
                if not flags & os.O_TRUNC:
                    raise refuse(errno.EPERM)  # an append or an update in place
                return self._add(_Handle(path, open(real, "wb"), True))

        def truncate(self, path: str, length: int, fh: int | None = None) -> int:
            with self.mutex:
                writer = self._writer(path)
                if writer is not None and length == writer.offset:
                    return 0
                if writer is None and length == 0 and os.path.exists(self._real(path)):
                    # what an O_TRUNC open turns into when the kernel sends it separately;
                    # the bucket's object is only replaced once the new one is written
                    return 0
                raise refuse(errno.EPERM)

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            handle = self.handles[fh]
            if handle.writing:
                raise refuse(errno.EBADF)
            handle.file.seek(offset)
            return handle.file.read(size)

        def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
            handle = self.handles[fh]
            if not handle.writing:
                raise refuse(errno.EBADF)
            if offset != handle.offset:  # mount-s3: "out of order write NOT supported"
                raise refuse(errno.EINVAL)
            handle.file.write(data)
            handle.offset += len(data)
            return len(data)

        def flush(self, path: str, fh: int) -> int:
            handle = self.handles.get(fh)
            if handle is not None and handle.writing:
                handle.file.flush()
            return 0

        def release(self, path: str, fh: int) -> int:
            with self.mutex:
                handle = self.handles.pop(fh, None)
            if handle is not None:
                handle.file.close()
            return 0

    return MountS3Operations


def _unmount_when_orphaned(mountpoint: str, parent: int) -> None:
    """A test run that dies without unmounting must not leave the mount behind."""
    while os.getppid() == parent:
        time.sleep(ORPHAN_POLL_S)
    subprocess.run(["fusermount3", "-u", "-z", mountpoint], capture_output=True)


def serve(bucket: str, mountpoint: str) -> None:
    """Mount the filesystem and serve it until it is unmounted (blocks)."""
    from mfusepy import FUSE

    threading.Thread(target=_unmount_when_orphaned, args=(mountpoint, os.getppid()), daemon=True).start()

    # attr and entry caching off: every stat reaches the filesystem, as with mount-s3's defaults
    FUSE(
        _operations_class()(bucket),
        mountpoint,
        foreground=True,
        nothreads=True,
        attr_timeout=0,
        entry_timeout=0,
        negative_timeout=0,
        fsname="mount-s3-emulated",
    )


class MountS3:
    """A mount of the emulated mount-s3 filesystem in its own process.

    Examples:
        >>> with MountS3(bucket_dir, mountpoint):  # doctest: +SKIP
        ...     (mountpoint / "a.txt").write_text("whole files only")
    """

    def __init__(self, bucket: Path, mountpoint: Path) -> None:
        self.bucket = Path(bucket)
        self.mountpoint = Path(mountpoint)
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None  # the process's stderr: a file, since a full pipe would hang the filesystem

    def start(self) -> Self:
        reason = fuse_missing()
        if reason is not None:
            raise RuntimeError(reason)
        self.bucket.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self._log = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(
            [sys.executable, __file__, str(self.bucket), str(self.mountpoint)],
            stdout=subprocess.DEVNULL,
            stderr=self._log,
        )
        deadline = time.monotonic() + MOUNT_WAIT_S
        while not os.path.ismount(self.mountpoint):
            if self._proc.poll() is not None:
                self._log.seek(0)
                err = self._log.read().decode(errors="replace")
                raise RuntimeError(f"the mount-s3 emulation exited with {self._proc.returncode}: {err.strip()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the mount-s3 emulation did not mount {self.mountpoint} within {MOUNT_WAIT_S:g} s")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        """Unmount (lazily if something still holds a file open) and end the filesystem's process."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if os.path.ismount(self.mountpoint):
            done = subprocess.run(["fusermount3", "-u", str(self.mountpoint)], capture_output=True, text=True)
            if done.returncode:  # busy: detach now, the process ends when the last file closes
                done = subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)], capture_output=True, text=True)
            if done.returncode:
                print(f"mounts3: unmounting {self.mountpoint} failed: {done.stderr.strip()}", file=sys.stderr)
        try:
            proc.wait(UNMOUNT_WAIT_S)
        except subprocess.TimeoutExpired:
            print(
                f"mounts3: the filesystem of {self.mountpoint} was still in use after {UNMOUNT_WAIT_S:g} s; killed",
                file=sys.stderr,
            )
            proc.kill()
            proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python tests/mounts3.py BUCKET_FOLDER MOUNTPOINT")
    serve(sys.argv[1], sys.argv[2])
