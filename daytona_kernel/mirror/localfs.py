"""The notebook's folder, written as if a hostile party chose the paths: every path the sandbox reports
is checked by ``safe_relpath``, and ``LocalFolder`` never follows a symlink and only ever creates
regular files and folders."""

from __future__ import annotations

import errno
import logging
import os
import posixpath
import re
import secrets
import stat
from pathlib import Path

from ..errors import MirrorError

NAME_MAX_BYTES = 255
PATH_MAX_CHARS = 4096
CONTROL_CHARS = re.compile("[\x00-\x1f\x7f]")
_DIR_FD = (
    os.open in os.supports_dir_fd and os.mkdir in os.supports_dir_fd and hasattr(os, "O_NOFOLLOW") and hasattr(os, "O_DIRECTORY")
)
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def safe_relpath(rel: object) -> str:
    """A path reported by the sandbox, normalised (``a//./b`` -> ``a/b``); MirrorError says why it is refused.

    Refused: anything but a non-empty string, absolute paths, ``..``, NUL and
    other control characters, backslashes, names over 255 bytes.

    Examples:
        >>> safe_relpath("plots/./chart.png")
        'plots/chart.png'
        >>> safe_relpath("../escape.txt")
        Traceback (most recent call last):
        ...
        daytona_kernel.errors.MirrorError: it goes up with '..'
    """
    if not isinstance(rel, str) or not rel:
        raise MirrorError("it is not a path")
    if len(rel) > PATH_MAX_CHARS:
        raise MirrorError(f"it is longer than {PATH_MAX_CHARS} characters")
    if CONTROL_CHARS.search(rel):
        raise MirrorError("it contains a NUL or control character")
    if "\\" in rel:
        raise MirrorError("it contains a backslash")
    if rel.startswith("/") or (os.name == "nt" and (":" in rel)):
        raise MirrorError("it is absolute")
    parts = [part for part in rel.split("/") if part not in ("", ".")]
    if not parts:
        raise MirrorError("it names the folder itself")
    if ".." in parts:
        raise MirrorError("it goes up with '..'")
    for part in parts:
        try:
            size = len(part.encode("utf-8"))
        except UnicodeEncodeError:
            raise MirrorError("it is not valid UTF-8") from None
        if size > NAME_MAX_BYTES:
            raise MirrorError(f"a name in it is longer than {NAME_MAX_BYTES} bytes")
    return "/".join(parts)


def shown(raw: object) -> str:
    """A reported path as it may be shown: quoted, control characters escaped, bounded."""
    text = repr(raw) if not isinstance(raw, str) or CONTROL_CHARS.search(raw) else raw
    return text if len(text) <= 200 else text[:200] + "…"


class LocalFolder:
    """Reads and writes files under one folder without ever following a symlink.

    On POSIX every path is opened component by component from a handle on the
    folder, with O_NOFOLLOW; elsewhere each component is checked with lstat.
    Only regular files and folders are ever created.
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    def _open_dir(self, parts: list[str], create: bool) -> int:
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for depth, name in enumerate(parts):
                flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                try:
                    inner = os.open(name, flags, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    os.mkdir(name, 0o777, dir_fd=fd)
                    inner = os.open(name, flags, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                        where = "/".join(parts[: depth + 1])
                        raise MirrorError(
                            f"{where} here is a symlink or a file, not a folder; nothing is written through it"
                        ) from None
                    raise
                os.close(fd)
                fd = inner
        except BaseException:
            os.close(fd)
            raise
        return fd

    def path_for_writing(self, rel: str) -> Path:
        """The path of ``rel`` here, its folders made, refused when a folder on the way is a link."""
        return self._checked_path(rel, create=True)

    def _checked_path(self, rel: str, create: bool) -> Path:
        """The lstat fallback (no dir_fd support): refuse when a folder on the way is a link."""
        parts = rel.split("/")
        current = self.root
        for name in parts[:-1]:
            current = current / name
            try:
                st = os.lstat(current)
            except FileNotFoundError:
                if not create:
                    raise
                current.mkdir()
                continue
            if not stat.S_ISDIR(st.st_mode):
                raise MirrorError(f"{current.relative_to(self.root)} here is a symlink or a file, not a folder")
        return current / parts[-1]

    def lstat(self, rel: str) -> os.stat_result | None:
        """The entry at ``rel`` itself (a link is not followed), or None when there is none."""
        parts = rel.split("/")
        try:
            if not _DIR_FD:
                return os.lstat(self._checked_path(rel, create=False))
            fd = self._open_dir(parts[:-1], create=False)
            try:
                return os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
            finally:
                os.close(fd)
        except FileNotFoundError:
            return None

    def listing(self, folder: str) -> dict[str, str]:
        """What is inside the folder ``folder`` here (relative, "" for the root): {name: "file" or "dir"}, without
        other kinds; {} when it is not there, cannot be read, or a symlink is on the way (never followed)."""
        found: dict[str, str] = {}
        try:
            if not _DIR_FD:
                path = self._checked_path(posixpath.join(folder, "x"), create=False).parent
                if not stat.S_ISDIR(os.lstat(path).st_mode):
                    return found
                target: int | Path = path
            else:
                target = self._open_dir(folder.split("/") if folder else [], create=False)
            try:
                with os.scandir(target) as entries:
                    for entry in entries:
                        if entry.is_dir(follow_symlinks=False):
                            found[entry.name] = "dir"
                        elif entry.is_file(follow_symlinks=False):
                            found[entry.name] = "file"
            finally:
                if isinstance(target, int):
                    os.close(target)
        except (OSError, MirrorError):
            return found
        return found

    def write(self, rel: str, content: bytes, mode: int, exclusive: bool = False) -> None:
        """Write a regular file atomically (temporary file, then rename), with permission bits ``mode``.

        A partial temporary file is removed on failure. The temporary name is
        short, so a name that fits the folder still fits while being written.
        ``exclusive``: never replace a file that is there (FileExistsError): linked, not renamed.
        """
        parts = rel.split("/")
        tmp = f".dk-{secrets.token_hex(4)}.tmp"
        if not _DIR_FD:
            path = self._checked_path(rel, create=True)
            tmp_path = path.with_name(tmp)
            try:
                with open(tmp_path, "xb") as f:
                    f.write(content)
                os.chmod(tmp_path, mode & 0o777)
                if exclusive:
                    os.link(tmp_path, path)
                    tmp_path.unlink()
                else:
                    os.replace(tmp_path, path)
            except BaseException:
                tmp_path.unlink(missing_ok=True)
                raise
            return
        dfd = self._open_dir(parts[:-1], create=True)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode & 0o777, dir_fd=dfd)
            try:
                try:
                    view = memoryview(content)
                    while view:
                        view = view[os.write(fd, view) :]
                finally:
                    os.close(fd)
                if exclusive:
                    os.link(tmp, parts[-1], src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
                    os.unlink(tmp, dir_fd=dfd)
                else:
                    os.replace(tmp, parts[-1], src_dir_fd=dfd, dst_dir_fd=dfd)
            except BaseException:
                try:
                    os.unlink(tmp, dir_fd=dfd)
                except OSError as exc:
                    logging.getLogger(__name__).warning("could not remove the partial file %s: %s", tmp, exc)
                raise
        finally:
            os.close(dfd)

    def chmod(self, rel: str, mode: int) -> None:
        """Set the permission bits of a regular file (not through a link)."""
        parts = rel.split("/")
        if not _DIR_FD:
            os.chmod(self._checked_path(rel, create=False), mode & 0o777)
            return
        dfd = self._open_dir(parts[:-1], create=False)
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
            try:
                os.fchmod(fd, mode & 0o777)
            finally:
                os.close(fd)
        finally:
            os.close(dfd)

    def unlink(self, rel: str) -> None:
        parts = rel.split("/")
        if not _DIR_FD:
            os.unlink(self._checked_path(rel, create=False))
            return
        dfd = self._open_dir(parts[:-1], create=False)
        try:
            os.unlink(parts[-1], dir_fd=dfd)
        finally:
            os.close(dfd)

    def trash(self, rel: str) -> None:
        """Move the regular file ``rel`` to this machine's trash (``send2trash``: the freedesktop trash on Linux,
        the Finder's on macOS), where the user can restore it. Never through a link: every folder on the way is
        checked to be a folder, and only a regular file goes. Raises MirrorError or OSError."""
        from send2trash import send2trash

        path = self._checked_path(rel, create=False)
        if not stat.S_ISREG(os.lstat(path).st_mode):
            raise MirrorError("it is not a regular file here")
        send2trash(os.fspath(path))
