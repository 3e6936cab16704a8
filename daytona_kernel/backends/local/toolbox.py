"""The local backend's toolbox: interpreter contexts (``interpreter.LocalContext``), a shell, git and
the files of a local sandbox's folder, which is on this machine's disk (``on_this_disk``): big files
are cloned or hard-linked (``share_file``), never copied twice.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import shutil
import stat
import uuid
from pathlib import Path

from ...config import SECRET_ENV_VARS, LocalSettings
from ...errors import BackendError
from ..base import ExecResult, FileError, NotShared, Toolbox, read_capped
from .interpreter import LocalContext

INLINE_READ_BYTES = 16 * 1024 * 1024  # one file this small is read in the event loop: less than a hop to a thread and back
FICLONE = 0x40049409  # _IOW(0x94, 9, int) in linux/fs.h (fcntl.FICLONE from Python 3.12)


def share_file(src: str | Path, dst: str | Path, link: bool, copy: bool = True) -> str:
    """Make ``dst`` hold ``src``'s content without a second copy where the file system allows.

    In order: a reflink (a copy-on-write clone: FICLONE on Linux btrfs, XFS, bcachefs ...), whose
    blocks are shared until either side writes; else, when ``link``, a hard link (one file under two
    names: a cell writing into it in place changes the user's file at once, which the mirror would
    bring down after the cell anyway); else, when ``copy``, a copy made by the OS (sendfile, never in
    memory), and otherwise ``NotShared``. ``src`` must be a regular file (a symlink is not followed).
    ``dst`` is replaced by a rename, never truncated (it may be a hard link of something else).
    Returns how: "clone", "link" or "copy".
    """
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.daytona-kernel-{uuid.uuid4().hex[:8]}")
    how = "copy"
    try:
        with open(os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK), "rb") as fin:
            source = os.fstat(fin.fileno())
            if not stat.S_ISREG(source.st_mode):
                raise OSError(errno.EINVAL, "not a regular file", str(src))
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                fcntl.ioctl(fd, getattr(fcntl, "FICLONE", FICLONE), fin.fileno())
                how = "clone"
            except OSError:
                pass  # this file system cannot clone (ext4, tmpfs, another disk ...)
            finally:
                os.close(fd)
            if how != "clone" and link:
                os.unlink(tmp)
                how = _hard_link(src, tmp, source)
            if how == "copy" and not copy:
                raise NotShared(errno.EXDEV, "the file system can neither clone nor link it here")
        if how == "copy":
            shutil.copyfile(src, tmp)
        if how != "link":
            shutil.copymode(src, tmp)
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)  # left only by a failure: a rename took it otherwise
    return how


def _hard_link(src: str | Path, tmp: Path, opened: os.stat_result) -> str:
    """Hard-link ``src`` as ``tmp`` if it is still the file that was opened: "link", else "copy"."""
    try:
        os.link(src, tmp, follow_symlinks=False)
    except OSError:  # another disk, or a file system without hard links
        return "copy"
    now = os.lstat(tmp)
    if (now.st_dev, now.st_ino) != (opened.st_dev, opened.st_ino):  # replaced (by a symlink ...) since it was opened
        tmp.unlink()
        return "copy"
    return "link"


class LocalToolbox(Toolbox):
    """Contexts, commands and files in a local sandbox's folder ``path``: its working directory ``workdir``
    and its temporary folder ``tmp``."""

    on_this_disk = True

    def __init__(self, config: LocalSettings, path: Path, workdir: str, tmp: Path) -> None:
        self._config = config
        self._path = path
        self.workdir = workdir
        self._tmp = tmp
        self.contexts: list[LocalContext] = []  # ours, ended at shutdown

    def _worker_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in SECRET_ENV_VARS and not k.startswith("JPY_")}
        env.update(self._config.env)
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONIOENCODING"] = "utf-8"
        env["TMPDIR"] = str(self._tmp)  # temporary files (input() inboxes ...) go when the kernel does
        return env

    async def create_context(self) -> LocalContext:
        ctx = await LocalContext.spawn(self._config.local_python, self.workdir, self._worker_env())
        self.contexts.append(ctx)
        return ctx

    async def exec(self, command: str, timeout: float | None = None) -> ExecResult:
        proc = await asyncio.create_subprocess_shell(
            command,
            cwd=self.workdir,
            env=self._worker_env(),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout)
        except asyncio.TimeoutError as exc:
            proc.kill()
            await proc.wait()
            raise BackendError(f"Command timed out after {timeout} s: {command}") from exc
        return ExecResult(proc.returncode or 0, out.decode("utf-8", "replace"))

    def _local_path(self, path: str) -> Path:
        p = Path(path)
        return p if p.is_absolute() else Path(self.workdir) / p

    async def upload(self, files: list[tuple[bytes, str]]) -> None:
        await asyncio.to_thread(self._write_files, files)

    def _write_files(self, files: list[tuple[bytes, str]]) -> None:
        for content, dest in files:
            target = self._local_path(dest)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)

    async def download(self, paths: list[str], limits: dict[str, int] | None = None) -> dict[str, bytes | FileError]:
        """Each file's bytes, read in a thread. One file of at most ``INLINE_READ_BYTES`` in the sandbox's
        temporary folder (a cell's large output strings, in the runtime's private folder there: written moments
        ago, still in the page cache, 0.3 ms for 2.7 MB) is read at once instead: only there, since a forged
        frame can name any file, and reading one on a network file system that hangs would stop the event loop."""
        limits = limits or {}
        if len(paths) == 1 and limits.get(paths[0], INLINE_READ_BYTES + 1) <= INLINE_READ_BYTES:
            content = self._read_temporary(paths[0], limits[paths[0]])
            if content is not None:
                return {paths[0]: content}
        return await asyncio.to_thread(lambda: {p: self._read_file(p, limits.get(p)) for p in paths})

    def _read_temporary(self, path: str, limit: int) -> bytes | FileError | None:
        """``_read_file`` for a file in the sandbox's temporary folder, reached from it without a symlink or
        ``..`` (each folder opened relative to the last, O_NOFOLLOW): nothing outside that folder is touched.
        None when ``path`` is not such a file (then it is read in a thread, as any other)."""
        tmp = str(self._tmp)
        full = str(self._local_path(path))
        parts = full[len(tmp) + 1 :].split(os.sep) if full.startswith(tmp + os.sep) else [""]
        if any(part in ("", ".", "..") for part in parts):
            return None
        folder_flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
        try:
            folder = os.open(tmp, folder_flags)
        except OSError:
            return None
        try:
            for part in parts[:-1]:
                inner = os.open(part, folder_flags, dir_fd=folder)
                os.close(folder)
                folder = inner
        except OSError:  # a symlink (or not a folder) on the way
            os.close(folder)
            return None
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
        except OSError as exc:
            return FileError(f"{exc.strerror or exc}", retry=False)
        finally:
            os.close(folder)
        return self._read_fd(fd, limit)

    def _read_file(self, path: str, limit: int | None = None) -> bytes | FileError:
        """A regular file's bytes, at most ``limit``: never through a final symlink, never blocking on a FIFO."""
        try:
            fd = os.open(self._local_path(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as exc:
            return FileError(f"{exc.strerror or exc}", retry=False)
        return self._read_fd(fd, limit)

    @staticmethod
    def _read_fd(fd: int, limit: int | None) -> bytes | FileError:
        """An opened file's bytes, at most ``limit``, if it is a regular file; the fd is closed."""
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                return FileError("not a regular file", retry=False)
            with os.fdopen(fd, "rb") as f:
                return read_capped(f, limit)
        except OSError as exc:
            return FileError(f"{exc.strerror or exc}", retry=False)

    async def clone(self, url: str, ref: str | None, dest: str, username: str | None, password: str | None) -> None:
        argv = ["git", "clone", "--quiet"] + (["--branch", ref] if ref else []) + [url, dest]
        env = self._worker_env()
        if password:  # handed to git by an askpass helper, never on a command line
            helper = self._path / "git-askpass.sh"
            helper.write_text('#!/bin/sh\ncase "$1" in Username*) echo "$GIT_USERNAME";; *) echo "$GIT_TOKEN";; esac\n')
            helper.chmod(0o700)
            env.update(GIT_ASKPASS=str(helper), GIT_TERMINAL_PROMPT="0", GIT_USERNAME=username or "git", GIT_TOKEN=password)
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=self.workdir, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        out, _ = await proc.communicate()
        if proc.returncode:
            text = out.decode("utf-8", "replace").strip()
            raise BackendError(f"git clone of the repository failed: {text.replace(password, '***') if password else text}")

    async def remove(self, paths: list[str]) -> None:
        for p in paths:
            self._local_path(p).unlink(missing_ok=True)

    async def place(self, local: str, dest: str, link: bool) -> None:
        await asyncio.to_thread(share_file, local, self._local_path(dest), link)

    async def fetch(self, path: str, local: str, link: bool) -> None:
        await asyncio.to_thread(share_file, self._local_path(path), local, link, False)

    def same_file(self, path: str, local: str) -> bool:
        try:
            return os.path.samefile(self._local_path(path), local)
        except OSError:
            return False
