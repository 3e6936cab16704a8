"""The sync manifest: what the mirror last synced, per file: size, mtime, content hash, permission
bits and when it was recorded. Kept per workspace in Jupyter's data folder, readable only by its user.

Change detection hashes a file only when its size or mtime moved (or its mtime is too close to the
recording to tell a same-second rewrite), so a cell where nothing changed costs no hashing at all.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import stat
import time
from pathlib import Path
from typing import Any

from .localfs import NOFOLLOW
from .plan import Stat

RACY_WINDOW_NS = 2 * 1_000_000_000  # an mtime this close to a sync cannot tell a same-second rewrite
PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def _racy(known: list[Any]) -> bool:
    """A manifest entry whose mtime was within RACY_WINDOW_NS of its recording: a same-size rewrite in the
    same second would keep size and mtime (one-second file systems), so only the content can tell."""
    return len(known) > 4 and known[1] >= known[4] - RACY_WINDOW_NS


NOT_REGULAR = "not a regular file"  # _hash of a FIFO or device in a file's place: never a sha256, so "changed"


def _hash(path: Path) -> str:
    """The sha256 of a file, read without a buffered file object (a third of the time on a small file,
    which is what a check right after a checkout hashes by the thousand), without following a symlink,
    and without waiting on a FIFO that took the file's place since the scan."""
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a device (/dev/zero) would be read without end
            return NOT_REGULAR
        while block := os.read(fd, 1024 * 1024):
            digest.update(block)
    finally:
        os.close(fd)
    return digest.hexdigest()


class SyncManifest(dict[str, list[Any]]):
    """Path (relative to the mirrored folder) -> [size, mtime_ns, sha256, mode, recorded at (ns)]."""

    def __init__(self, path: Path, root: Path, log: logging.Logger) -> None:
        super().__init__()
        self._path = path
        self._root = root
        self._log = log
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = None
        if isinstance(data, dict):
            self.update(data)

    def save(self) -> None:
        """Write the manifest where only this user can read it (it lists the folder's files): the file is
        0600, and its folder 0700 when this makes it. A folder that exists keeps its mode (it may be shared)."""
        folder = self._path.parent
        tmp = self._path.with_suffix(f".{secrets.token_hex(4)}.tmp")
        try:
            folder.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, PRIVATE_FILE_MODE)
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(self))
            os.replace(tmp, self._path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            self._log.warning("could not save the sync manifest %s: %s", self._path, exc)

    def locally_changed(self, rel: str, now: Stat) -> bool:
        """Changed since the last sync? Hash only when size or mtime moved, or when the mtime is too
        close to the time of the last sync to tell a rewrite in the same second (see ``_racy``)."""
        known = self.get(rel)
        if known is None:
            return True
        if [now[0], now[1]] == known[:2]:
            if _racy(known):
                if _hash(self._root / rel) != known[2]:
                    return True
                if now[1] < time.time_ns() - RACY_WINDOW_NS:
                    known[4] = time.time_ns()  # no longer racy: stop hashing it
            return len(known) > 3 and known[3] != now[2]
        if now[0] != known[0]:
            return True
        changed = _hash(self._root / rel) != known[2]
        if not changed:  # touched but identical: remember the new mtime
            known[1] = now[1]
        return changed or (len(known) > 3 and known[3] != now[2])

    def changes(self, files: dict[str, Stat]) -> tuple[list[tuple[str, int]], list[tuple[str, str]], int]:
        """Of a scan's files: those changed since the last sync, as (path, size); those that could not be
        read, with why (both sorted); and how many of them this manifest knows.

        One lookup per file: an entry with the same size, mtime and mode whose mtime was not racy
        when it was recorded is unchanged (``locally_changed``'s first answer); only the others go
        through ``locally_changed``."""
        changed: list[tuple[str, int]] = []
        unreadable: list[tuple[str, str]] = []
        known_here = 0
        get = self.get
        for rel, now in files.items():
            known = get(rel)
            if known is not None:
                known_here += 1
                if (
                    len(known) > 4
                    and known[0] == now[0]
                    and known[1] == now[1]
                    and known[3] == now[2]
                    and known[1] < known[4] - RACY_WINDOW_NS
                ):
                    continue
            try:
                if self.locally_changed(rel, now):
                    changed.append((rel, now[0]))
            except OSError as exc:
                unreadable.append((rel, f"could not read it here ({exc.strerror or exc})"))
        changed.sort()
        unreadable.sort()
        return changed, unreadable, known_here

    def record_file(self, rel: str) -> None:
        """Remember a file as it is here now, hashing it (a big file the sandbox shares with this disk)."""
        st = os.lstat(self._root / rel)
        self.record(rel, _hash(self._root / rel), st)

    def record(self, rel: str, digest: str, st: os.stat_result | None) -> None:
        """Remember a file as synced, with the stat it has now (``st``: None when it is gone again)."""
        if st is not None:
            self[rel] = [st.st_size, st.st_mtime_ns, digest, st.st_mode & 0o777, time.time_ns()]
