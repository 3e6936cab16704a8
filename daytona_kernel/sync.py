"""WorkdirMirror: a two-way mirror between the notebook's folder and the sandbox's working directory.

- Up: before a cell runs, local files that changed since the last sync are
  uploaded in bulk (batched ``upload`` calls, never one request per file).
  Files that look like secrets (``.env``, ``id_rsa``, ``*.pem`` ...) stay here
  unless ``sync_include`` names them; one notice says which.
- Down: the runtime reports, in the cell's own frames, what the cell created or
  changed; those files are downloaded in bulk when the cell ends. The report is
  acknowledged: the kernel tells the runtime, on its next call, which changes
  it has handled, and the runtime reports the others again. A file that could
  not be written is named in a notice; a transient failure (a 5xx) is retried
  on the next cell, one that would fail the same way again waits until the
  file changes or ``%sync`` runs.
- The sandbox is untrusted: every reported path is normalised and refused when
  it is absolute, goes up with ``..``, holds a control character, or lands in
  an excluded folder (``.git`` ...). Files are written through folder handles
  that never follow a symlink, and only regular files are ever created here.
- Change detection uses a manifest of size, mtime, mode and content hash (the
  hash only when size or mtime moved), so a cell where nothing changed costs no
  request at all. Scanning, hashing, reading and writing run in a worker
  thread, never on the kernel's event loop.
- A file changed on both sides since the last sync keeps both versions: the
  sandbox's copy is written beside the local one as ``name.sandbox-conflict.ext``.
  Nothing is ever silently overwritten, and a notebook (``.ipynb``) is never
  downloaded over a local file.
- Permission bits travel both ways (a 0600 file stays 0600, an executable keeps
  its execute bit); deletions travel only when ``sync_deletes`` is on.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import logging
import os
import posixpath
import re
import secrets
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .backends.base import FileError, ProgressCallback, Sandbox
from .config import DaytonaKernelConfig, MirrorSettings, settings_from
from .errors import DaytonaKernelError, MirrorError
from .runtime.pathrules import (
    NEVER_REASON,
    SECRET_REASON,
    MirrorRules,
    file_stat,
    load_rules,
    scan,
)

Stat = tuple[int, int, int]  # size, mtime in ns, permission bits
BATCH_FILES = 500
BATCH_BYTES = 64 * 1024 * 1024
MB = 1024 * 1024
SHOW_PROGRESS_FILES = 50
RACY_WINDOW_NS = 2 * 1_000_000_000  # an mtime this close to a sync cannot tell a same-second rewrite
SCAN_BUDGET_S = 2.0  # the scan of the notebook folder before each cell
NAME_MAX_BYTES = 255
PATH_MAX_CHARS = 4096
MAX_REPORTED_PATHS = 100_000
DEFAULT_FILE_MODE = 0o644
PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
_CONTROL_CHARS = re.compile("[\x00-\x1f\x7f]")
# Folders whose files editors and tools act on when the folder is opened (a devcontainer's
# initializeCommand, an interpreter path, an auto-run task): they never come down by themselves.
NEVER_DOWN = frozenset({".vscode", ".idea", ".devcontainer", ".fleet", ".zed", ".theia"})
_DIR_FD = (
    os.open in os.supports_dir_fd
    and os.mkdir in os.supports_dir_fd
    and hasattr(os, "O_NOFOLLOW")
    and hasattr(os, "O_DIRECTORY")
)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


@dataclass
class SyncReport:
    """What one sync moved, and what it did not and why."""

    up: list[str] = field(default_factory=list)
    down: list[str] = field(default_factory=list)
    bytes_up: int = 0
    bytes_down: int = 0
    deleted: list[str] = field(default_factory=list)
    conflicts: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    secrets: list[str] = field(default_factory=list)  # kept here because they look like secrets
    secrets_down: list[str] = field(default_factory=list)  # left in the sandbox for the same reason
    left_behind: list[tuple[str, str]] = field(default_factory=list)  # (path, why) not written here
    refused: list[tuple[str, str]] = field(default_factory=list)  # (reported path, why) never written

    def summary(self) -> str:
        parts = [
            f"{len(self.up)} up ({_size(self.bytes_up)})",
            f"{len(self.down)} down ({_size(self.bytes_down)})",
            f"{len(self.conflicts)} conflicts",
            f"{len(self.skipped) + len(self.secrets) + len(self.secrets_down)} skipped",
        ]
        if self.left_behind:
            parts.append(f"{len(self.left_behind)} failed")
        if self.deleted:
            parts.append(f"{len(self.deleted)} deleted")
        return "sync: " + ", ".join(parts)

    def notices(self) -> str:
        """Lines the user must see: conflicts, skipped and failed files, with the reason."""
        lines = [
            f"Conflict: {path} changed both here and in the sandbox; your copy is kept and the sandbox's is {copy}."
            for path, copy in self.conflicts
        ]
        lines += [f"Not synced: {path}: {reason}" for path, reason in self.skipped]
        if self.secrets:
            first = min(self.secrets).rstrip("/")
            lines.append(
                f"Not sent to the sandbox because they look like secrets: {_listing(self.secrets)}. "
                f"To send one, add it to DaytonaKernel.sync_include (for example "
                f"DAYTONA_KERNEL_SYNC_INCLUDE='[\"{first}\"]'), or send it once with %upload {first}"
            )
        if self.secrets_down:
            lines.append(
                f"Not copied from the sandbox because they look like secrets: {_listing(self.secrets_down)}. "
                f"Fetch one with %download {min(self.secrets_down)}"
            )
        lines += [f"Not copied from the sandbox: {path}: {reason}" for path, reason in self.left_behind]
        lines += [f"Refused a path the sandbox reported: {path}: {reason}" for path, reason in self.refused]
        return "".join(line + "\n" for line in lines)

    def merge(self, other: SyncReport) -> None:
        """Add a pull's report to a push's (for %sync)."""
        self.down += other.down
        self.bytes_down += other.bytes_down
        self.conflicts += other.conflicts
        self.skipped += other.skipped
        self.secrets_down += other.secrets_down
        self.left_behind += other.left_behind
        self.refused += other.refused
        self.deleted += other.deleted


def _size(n: int) -> str:
    return f"{n / MB:.1f} MB" if n >= MB else f"{n / 1024:.1f} KB" if n >= 1024 else f"{n} B"


def _listing(paths: list[str], limit: int = 20) -> str:
    paths = sorted(paths)
    shown = ", ".join(paths[:limit])
    return shown + (f" and {len(paths) - limit} more" if len(paths) > limit else "")


def mirror_root(folder: str) -> tuple[str, str]:
    """The folder to mirror for a notebook in ``folder``, and the notebook's sub-folder of it.

    The enclosing git repository's root, so that ``../data/x.csv`` from
    ``repo/notebooks`` works as with ipykernel; else the notebook's folder. A
    repository at the home folder or above it counts as no repository (too broad).

    Examples:
        >>> mirror_root("/work/repo/notebooks")  # doctest: +SKIP
        ('/work/repo', 'notebooks')
    """
    start = Path(os.path.abspath(folder))
    home = Path.home()
    for candidate in (start, *start.parents):
        if candidate == home or candidate in home.parents:
            break
        if (candidate / ".git").exists():
            sub = start.relative_to(candidate).as_posix()
            return str(candidate), "" if sub == "." else sub
    return str(start), ""


def open_mirror(
    config: DaytonaKernelConfig, sandbox: Sandbox, folder: str, log: logging.Logger, start_in: str = ""
) -> WorkdirMirror:
    """The mirror for a notebook folder. With ``sync=off`` it only serves %upload/%download.

    Its manifest (what was last synced) is kept per backend, volume and workspace,
    because that is what identifies the remote working directory.
    """
    from jupyter_core.paths import jupyter_data_dir

    from .backends import workspace_key

    key = f"{config.backend}-{config.volume_name}-{workspace_key(config, folder)}"
    manifest = Path(jupyter_data_dir()) / "daytona-kernel" / "manifests" / f"{key}.json"
    return WorkdirMirror(folder, sandbox, settings_from(MirrorSettings, config), manifest, log, start_in)


def conflict_name(rel: str) -> str:
    """``data/table.csv`` -> ``data/table.sandbox-conflict.csv``."""
    head, tail = posixpath.split(rel)
    stem, dot, ext = tail.rpartition(".")
    name = f"{stem}.sandbox-conflict.{ext}" if dot and stem else f"{tail}.sandbox-conflict"
    return posixpath.join(head, name) if head else name


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
    if _CONTROL_CHARS.search(rel):
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


def _racy(known: list[Any]) -> bool:
    """A manifest entry whose mtime was within RACY_WINDOW_NS of its recording: a same-size rewrite in the
    same second would keep size and mtime (one-second file systems), so only the content can tell."""
    return len(known) > 4 and known[1] >= known[4] - RACY_WINDOW_NS


def _hash(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1024 * 1024), b""):
            digest.update(block)
    return digest.hexdigest()


def _parse_stat(value: Any) -> Stat | None:
    """A reported [size, mtime_ns, mode] (mode optional), or None when malformed."""
    if not isinstance(value, (list, tuple)) or len(value) not in (2, 3):
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        return None
    return (value[0], value[1], value[2] if len(value) == 3 else -1)


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
                        raise MirrorError(f"{where} here is a symlink or a file, not a folder; nothing is written through it") from None
                    raise
                os.close(fd)
                fd = inner
        except BaseException:
            os.close(fd)
            raise
        return fd

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

    def write(self, rel: str, content: bytes, mode: int) -> None:
        """Write a regular file atomically (temporary file, then rename), with permission bits ``mode``.

        A partial temporary file is removed on failure. The temporary name is
        short, so a name that fits the folder still fits while being written.
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


@dataclass
class UpPlan:
    """What the next upload would do; computed without any request."""

    todo: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    secrets: list[str] = field(default_factory=list)
    total: int = 0  # bytes to upload


class WorkdirMirror:
    """See the module docstring. One per kernel; ``local_root`` is the notebook's folder."""

    def __init__(
        self,
        local_root: str,
        sandbox: Sandbox,
        config: MirrorSettings,
        manifest_path: Path,
        log: logging.Logger,
        start_in: str = "",
    ) -> None:
        self.local_root = Path(local_root)
        self.start_in = start_in  # the notebook's sub-folder: where cells start and %upload/%download paths begin
        self._folder = LocalFolder(self.local_root)
        self._sandbox = sandbox
        self._config = config
        self._manifest_path = manifest_path
        self._log = log
        self.mode = config.sync
        self.notice = ""
        root, home = self.local_root.resolve(), Path.home().resolve()
        if self.mode != "off" and (home == root or home.is_relative_to(root)):
            self.mode = "off"
            self.notice = (
                f"The automatic mirror is off because the notebook folder {self.local_root} holds your home "
                "folder, which is too broad to copy into a sandbox. Open the notebook from a project folder, "
                "or move files by hand with %upload / %download.\n"
            )
        self._rules = load_rules(str(self.local_root), config.sync_exclude, config.sync_include)
        self._manifest: dict[str, list[Any]] = self._load_manifest()
        self._secrets_noticed: set[str] = set()
        self._acked: dict[str, list[int]] = {}  # changes handled since the runtime last heard from us
        self._gone: list[str] = []
        self._up_modes: dict[str, int] = {}  # permission bits of files uploaded since then
        self._failed: dict[str, Stat] = {}  # sandbox files that failed in a way a retry would repeat
        self._generation: int | None = None  # the sandbox the manifest describes (Sandbox.generation)

    @property
    def syncs_up(self) -> bool:
        """Local changes go to the sandbox before each cell (``SyncReport.up`` lists what went)."""
        return self.mode in ("both", "up")

    @property
    def syncs_down(self) -> bool:
        """Files a cell writes come back after it (``SyncReport.down`` lists what came)."""
        return self.mode in ("both", "down")

    def runtime_options(self) -> dict[str, Any]:
        """What the runtime needs to report a cell's file changes."""
        return {
            "sync_down": self.syncs_down,
            "sync_excludes": list(self._config.sync_exclude),
            "sync_includes": list(self._config.sync_include),
        }

    def handover(self) -> dict[str, Any]:
        """What the runtime must learn on its next call (the ``synced`` argument), then forgotten here.

        ``up``: files uploaded since, with their permission bits (the runtime sets
        them and does not report the files back); ``acked``: reported changes the
        kernel has handled, with the stat it saw; ``gone``: reported deletions handled.
        """
        note: dict[str, Any] = {"up": self._up_modes, "acked": self._acked, "gone": self._gone}
        self._up_modes, self._acked, self._gone = {}, {}, []
        return note

    # -- manifest ----------------------------------------------------------

    def _load_manifest(self) -> dict[str, list[Any]]:
        try:
            data = json.loads(self._manifest_path.read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def _save_manifest(self) -> None:
        """Write the manifest where only this user can read it (it lists the folder's files)."""
        folder = self._manifest_path.parent
        tmp = self._manifest_path.with_suffix(f".{secrets.token_hex(4)}.tmp")
        try:
            folder.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
            os.chmod(folder, PRIVATE_DIR_MODE)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, PRIVATE_FILE_MODE)
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(self._manifest))
            os.replace(tmp, self._manifest_path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            self._log.warning("could not save the sync manifest %s: %s", self._manifest_path, exc)

    def _locally_changed(self, rel: str, now: Stat) -> bool:
        """Changed since the last sync? Hash only when size or mtime moved, or when the mtime is too
        close to the time of the last sync to tell a rewrite in the same second (see ``_racy``)."""
        known = self._manifest.get(rel)
        if known is None:
            return True
        if [now[0], now[1]] == known[:2]:
            if _racy(known):
                if _hash(self.local_root / rel) != known[2]:
                    return True
                if now[1] < time.time_ns() - RACY_WINDOW_NS:
                    known[4] = time.time_ns()  # no longer racy: stop hashing it
            return len(known) > 3 and known[3] != now[2]
        if now[0] != known[0]:
            return True
        changed = _hash(self.local_root / rel) != known[2]
        if not changed:  # touched but identical: remember the new mtime
            known[1] = now[1]
        return changed or (len(known) > 3 and known[3] != now[2])

    # -- up ------------------------------------------------------------------

    def plan_up(self) -> UpPlan:
        """What to upload, what is skipped and why, what was deleted here. No request is made.

        A file that is merely unreadable (a folder without permission) is never
        planned as deleted: only one that is really gone.
        """
        found_secrets: list[str] = []
        files, complete = scan(str(self.local_root), self._rules, skipped=found_secrets, budget_s=SCAN_BUDGET_S)
        max_file = int(self._config.sync_max_file_mb * MB)
        budget = int(self._config.sync_max_total_mb * MB)
        plan = UpPlan(secrets=found_secrets)
        for rel in sorted(files):
            now = files[rel]
            try:
                if not self._locally_changed(rel, now):
                    continue
            except OSError as exc:
                plan.skipped.append((rel, f"could not read it here ({exc.strerror or exc})"))
                continue
            size = now[0]
            if size > max_file:
                plan.skipped.append((rel, f"{_size(size)} is over sync_max_file_mb={self._config.sync_max_file_mb:g}"))
                continue
            if size > budget:
                plan.skipped.append((rel, f"the total of this sync would pass sync_max_total_mb={self._config.sync_max_total_mb:g}"))
                continue
            budget -= size
            plan.todo.append(rel)
            plan.total += size
        if complete:
            plan.deleted = [rel for rel in self._manifest if rel not in files and self._gone_here(rel)]
        else:
            plan.skipped.append(
                ("(folder)", f"over 50000 files or {SCAN_BUDGET_S:g} s to scan; the rest was not looked at. Add sync_exclude patterns.")
            )
        return plan

    def _gone_here(self, rel: str) -> bool:
        """Really deleted here (not just unreadable, and not just newly excluded)."""
        try:
            os.lstat(self.local_root / rel)
        except OSError as exc:
            return exc.errno in (errno.ENOENT, errno.ENOTDIR)
        return False

    def _follow_sandbox(self) -> None:
        """A new sandbox (recreated, or the old one gone) holds only what the volume's copy restored, which
        may lack files the old one had: the manifest no longer describes it, so every file is sent again."""
        generation = self._sandbox.generation
        if self._generation is not None and generation != self._generation and self._manifest:
            self._log.info("a new sandbox: the %d file(s) synced to the old one are checked again", len(self._manifest))
            self._manifest.clear()
            self._failed.clear()
        self._generation = generation

    async def push(self, progress: ProgressCallback | None = None) -> SyncReport:
        """Upload what changed locally (everything, in a new sandbox). A no-change push makes no request."""
        self._follow_sandbox()
        report = SyncReport()
        if not self.syncs_up:
            return report
        plan = await asyncio.to_thread(self.plan_up)
        report.skipped = plan.skipped
        report.secrets = [rel for rel in plan.secrets if rel not in self._secrets_noticed]
        self._secrets_noticed.update(report.secrets)
        total = plan.total
        if progress is not None and len(plan.todo) >= SHOW_PROGRESS_FILES:
            progress(f"syncing {len(plan.todo)} files ({_size(total)}) to the sandbox…")
        started = time.monotonic()
        start = 0
        while start < len(plan.todo):
            batch, records, start = await asyncio.to_thread(self._read_batch, plan.todo, start, report)
            if batch:
                await self._upload_batch(batch, records, report)
                self._progress(progress, report, total, started)
        if self._config.sync_deletes and plan.deleted:
            await self._sandbox.remove(plan.deleted)
            report.deleted += plan.deleted
        for rel in plan.deleted:
            self._manifest.pop(rel, None)
        if report.up or plan.deleted:
            await asyncio.to_thread(self._save_manifest)
        return report

    def _read_batch(
        self, todo: list[str], start: int, report: SyncReport
    ) -> tuple[list[tuple[bytes, str]], dict[str, list[Any]], int]:
        """Read files from ``todo[start:]`` until a batch is full: (batch, manifest records, next start)."""
        batch: list[tuple[bytes, str]] = []
        records: dict[str, list[Any]] = {}
        size = 0
        index = start
        while index < len(todo) and len(batch) < BATCH_FILES and size < BATCH_BYTES:
            rel = todo[index]
            index += 1
            try:
                fd = os.open(self.local_root / rel, os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
                st = os.fstat(fd)  # before reading: a write during the read shows up next time
                if not stat.S_ISREG(st.st_mode):
                    os.close(fd)
                    continue  # replaced by a folder or a pipe since the scan
                with os.fdopen(fd, "rb") as f:
                    content = f.read()
            except OSError as exc:
                report.skipped.append((rel, f"could not read it here ({exc.strerror or exc})"))
                continue
            batch.append((content, self.remote_path(rel)))
            records[rel] = [st.st_size, st.st_mtime_ns, hashlib.sha256(content).hexdigest(), st.st_mode & 0o777, time.time_ns()]
            size += len(content)
        return batch, records, index

    async def _upload_batch(self, batch: list[tuple[bytes, str]], records: dict[str, list[Any]], report: SyncReport) -> None:
        await self._sandbox.upload(batch)
        self._manifest.update(records)  # only once the sandbox has them
        for rel, record in records.items():
            self._up_modes[rel] = record[3]
        report.up.extend(records)
        report.bytes_up += sum(len(content) for content, _ in batch)

    def _progress(self, progress: ProgressCallback | None, report: SyncReport, total: int, started: float) -> None:
        if progress is None or len(report.up) < SHOW_PROGRESS_FILES:
            return
        rate = report.bytes_up / max(time.monotonic() - started, 1e-6)
        progress(f"syncing to the sandbox: {len(report.up)} files, {_size(report.bytes_up)} of {_size(total)} ({_size(int(rate))}/s)")

    def remote_path(self, rel: str) -> str:
        return posixpath.join(self._sandbox.workdir, rel)

    # -- down ----------------------------------------------------------------

    async def pull(self, changes: Any, retry_failed: bool = False) -> SyncReport:
        """Download what a cell changed, as the runtime reported it (untrusted input).

        ``retry_failed`` (for %sync) tries again the files that failed in a way
        a plain retry would repeat.
        """
        report = SyncReport()
        if not self.syncs_down:
            return report
        if retry_failed:
            self._failed.clear()
        changed, deleted = self._parse_report(changes, report)
        wanted = await asyncio.to_thread(self._plan_down, changed, report)
        for start in range(0, len(wanted), BATCH_FILES):
            chunk = wanted[start : start + BATCH_FILES]
            try:
                contents = await self._sandbox.download([self.remote_path(rel) for rel, _, _ in chunk])
            except DaytonaKernelError as exc:
                report.left_behind += [(rel, f"{exc}; it is tried again after the next cell") for rel, _, _ in chunk]
                continue
            await asyncio.to_thread(self._write_batch, chunk, contents, report)
        if deleted:
            await asyncio.to_thread(self._apply_deletions, deleted, report)
        if report.down or report.deleted or report.conflicts:
            await asyncio.to_thread(self._save_manifest)
        return report

    def _parse_report(self, changes: Any, report: SyncReport) -> tuple[list[tuple[str, Stat]], list[str]]:
        """(changed, deleted) from a change report; whatever is malformed is named and dropped."""
        if not isinstance(changes, dict):
            report.refused.append(("(change report)", "it is not a mapping; nothing was copied"))
            return [], []
        raw_changed = changes.get("changed", {})
        raw_deleted = changes.get("deleted", [])
        if not isinstance(raw_changed, dict) or not isinstance(raw_deleted, list):
            report.refused.append(("(change report)", "its 'changed' or 'deleted' part is malformed; nothing was copied"))
            return [], []
        if len(raw_changed) + len(raw_deleted) > MAX_REPORTED_PATHS:
            report.refused.append(("(change report)", f"it lists more than {MAX_REPORTED_PATHS} paths; nothing was copied"))
            return [], []
        changed = []
        for rel, value in raw_changed.items():
            parsed = _parse_stat(value)
            if parsed is None:
                report.refused.append((_shown(rel), "its size, time and mode are malformed"))
                continue
            changed.append((rel, parsed))
        if changes.get("truncated"):
            report.skipped.append(
                ("(sandbox folder)", "too many files to scan after each cell; the rest was not looked at. Add sync_exclude patterns.")
            )
        return sorted(changed), [rel for rel in raw_deleted if isinstance(rel, str)]

    def _plan_down(self, changed: list[tuple[str, Stat]], report: SyncReport) -> list[tuple[str, str, Stat]]:
        """(path here, path reported, stat) of the files to download; the rest is decided and acknowledged."""
        max_file = int(self._config.sync_max_file_mb * MB)
        budget = int(self._config.sync_max_total_mb * MB)
        self._rules.forget_gitignores()
        wanted = []
        for raw, reported in changed:
            try:
                rel = safe_relpath(raw)
            except MirrorError as exc:
                report.refused.append((_shown(raw), str(exc)))
                self._ack(raw, reported)
                continue
            if self._failed.get(raw) == reported:
                continue  # failed before in a way a retry would repeat, and named then
            if any(part.lower() in NEVER_DOWN for part in rel.split("/")[:-1]):
                report.refused.append((rel, f"editor settings could run code here; fetch it with %download {rel} if you trust it"))
                self._ack(raw, reported)
                continue
            reason = self._rules.check(rel, False)
            if reason == SECRET_REASON and rel not in self._secrets_noticed:
                self._secrets_noticed.add(rel)
                report.secrets_down.append(rel)
            if reason is not None:
                self._ack(raw, reported)
                continue
            if reported[0] > max_file:
                report.skipped.append((rel, f"{_size(reported[0])} is over sync_max_file_mb={self._config.sync_max_file_mb:g}"))
                self._ack(raw, reported)
                continue
            if reported[0] > budget:  # not acknowledged: it comes with a later cell
                report.left_behind.append(
                    (rel, f"this sync would pass sync_max_total_mb={self._config.sync_max_total_mb:g}; it comes after a later cell")
                )
                continue
            budget -= reported[0]
            wanted.append((rel, raw, reported))
        return wanted

    def _ack(self, raw: str, reported: Stat) -> None:
        self._acked[raw] = [reported[0], reported[1], reported[2]] if reported[2] >= 0 else [reported[0], reported[1]]

    def _write_batch(self, chunk: list[tuple[str, str, Stat]], contents: dict[str, Any], report: SyncReport) -> None:
        for rel, raw, reported in chunk:
            content = contents.get(self.remote_path(rel))
            if isinstance(content, FileError) or not isinstance(content, bytes):
                error = content if isinstance(content, FileError) else FileError("the sandbox sent nothing for it", retry=True)
                self._left_behind(rel, raw, reported, error.message, error.retry, report)
                continue
            if len(content) > max(reported[0], int(self._config.sync_max_file_mb * MB)):
                self._left_behind(rel, raw, reported, f"it is {_size(len(content))}, more than the sandbox reported", False, report)
                continue
            try:
                self._write_local(rel, content, reported[2], report)
            except MirrorError as exc:
                self._left_behind(rel, raw, reported, str(exc), False, report)
                continue
            except OSError as exc:
                self._left_behind(rel, raw, reported, exc.strerror or str(exc), False, report)
                continue
            self._ack(raw, reported)

    def _left_behind(self, rel: str, raw: str, reported: Stat, why: str, retry: bool, report: SyncReport) -> None:
        if retry:
            report.left_behind.append((rel, f"{why}; it is tried again after the next cell"))
        else:
            self._failed[raw] = reported
            report.left_behind.append((rel, f"{why}; run %sync to try again, or fetch it with %download {rel}"))

    def _write_local(self, rel: str, content: bytes, mode: int, report: SyncReport) -> None:
        """Write one downloaded file here, or a conflict copy beside it. Raises MirrorError or OSError."""
        mode = DEFAULT_FILE_MODE if mode < 0 else mode & 0o777
        digest = hashlib.sha256(content).hexdigest()
        st = self._folder.lstat(rel)
        if st is not None:
            if not stat.S_ISREG(st.st_mode):
                what = "folder" if stat.S_ISDIR(st.st_mode) else "symlink" if stat.S_ISLNK(st.st_mode) else "special file"
                raise MirrorError(f"a {what} is in its place here, and is not replaced")
            now = file_stat(st)
            known = self._manifest.get(rel)
            locally_changed = self._locally_changed(rel, now)
            if known is not None and known[2] == digest and not locally_changed:
                if now[2] != mode:
                    self._folder.chmod(rel, mode)
                    self._record(rel, digest)
                return  # already the same here
            if rel.endswith(".ipynb") or locally_changed:
                copy = conflict_name(rel)
                self._folder.write(copy, content, mode)
                report.conflicts.append((rel, copy))
                return
        self._folder.write(rel, content, mode)
        self._record(rel, digest)
        report.down.append(rel)
        report.bytes_down += len(content)

    def _record(self, rel: str, digest: str) -> None:
        st = self._folder.lstat(rel)
        if st is not None:
            self._manifest[rel] = [st.st_size, st.st_mtime_ns, digest, st.st_mode & 0o777, time.time_ns()]

    def _apply_deletions(self, deleted: list[str], report: SyncReport) -> None:
        """Deletions the sandbox reported: applied only with sync_deletes, and only to unchanged files."""
        for raw in deleted:
            self._gone.append(raw)
            if not self._config.sync_deletes:
                continue
            try:
                rel = safe_relpath(raw)
                if self._rules.check(rel, False) is not None:
                    continue
                st = self._folder.lstat(rel)
                if st is None or not stat.S_ISREG(st.st_mode) or self._locally_changed(rel, file_stat(st)):
                    continue
                self._folder.unlink(rel)
            except MirrorError as exc:
                report.refused.append((_shown(raw), str(exc)))
                continue
            except OSError as exc:
                report.left_behind.append((raw, f"not deleted here: {exc.strerror or exc}"))
                continue
            self._manifest.pop(rel, None)
            report.deleted.append(rel)

    # -- by hand -------------------------------------------------------------

    def status(self) -> str:
        plan = self.plan_up()
        lines = [f"sync mode: {self.mode}; {self.local_root} <-> {self._sandbox.workdir}"]
        lines.append(f"would upload {len(plan.todo)} file(s)" + (": " + ", ".join(plan.todo[:20]) if plan.todo else ""))
        if len(plan.todo) > 20:
            lines.append(f"  ... and {len(plan.todo) - 20} more")
        if plan.deleted:
            verb = "would delete in the sandbox" if self._config.sync_deletes else "deleted here (sync_deletes is off, kept there)"
            lines.append(f"{verb}: " + ", ".join(plan.deleted[:20]))
        if plan.secrets:
            lines.append(f"would keep here (they look like secrets; see sync_include): {_listing(plan.secrets)}")
        lines += [f"would skip {path}: {reason}" for path, reason in plan.skipped]
        return "\n".join(lines) + "\n"

    def _inside(self, local: str, magic: str) -> Path:
        """A local path given to %upload, resolved, and refused when it leaves the notebook folder."""
        root = self.local_root.resolve()
        src = (self.local_root / self.start_in / local).resolve()
        if src != root and not src.is_relative_to(root):
            raise MirrorError(f"%{magic}: {local} is outside the notebook folder {self.local_root}; only files inside it can be sent.")
        return src

    async def upload_paths(self, local: str, dest: str | None) -> SyncReport:
        """%upload: send a file or folder from here, to ``dest`` (default: the same relative path).

        A file named here goes even if it looks like a secret (that is how to send
        one); inside a folder, secrets and version-control folders are skipped.
        """
        report = SyncReport()
        src = self._inside(local, "upload")
        if not src.exists():
            raise MirrorError(f"%upload: {local} does not exist here.")
        root = self.local_root.resolve()
        if dest and not dest.startswith("/"):
            dest = posixpath.join(self.start_in, dest)
        target = dest or (os.path.relpath(src, root) if src != root else ".")
        files, modes = await asyncio.to_thread(self._read_for_upload, src, target, report)
        for start in range(0, len(files), BATCH_FILES):
            await self._sandbox.upload(files[start : start + BATCH_FILES])
        self._up_modes.update(modes)
        return report

    def _read_for_upload(self, src: Path, target: str, report: SyncReport) -> tuple[list[tuple[bytes, str]], dict[str, int]]:
        if src.is_dir():
            rules = MirrorRules(str(src), include=self._config.sync_include, defaults=(), gitignore=False)
            found_secrets: list[str] = []
            listed, _ = scan(str(src), rules, skipped=found_secrets)
            report.secrets = found_secrets
            sources = [(src / rel, posixpath.join(target, rel)) for rel in sorted(listed)]
        else:
            sources = [(src, target)]
        files, modes = [], {}
        for path, remote_rel in sources:
            st = os.stat(path)
            if not stat.S_ISREG(st.st_mode):
                raise MirrorError(f"%upload: {path.name} is not a regular file.")
            content = path.read_bytes()
            remote = remote_rel if remote_rel.startswith("/") else self.remote_path(remote_rel)
            files.append((content, remote))
            if not remote_rel.startswith("/"):
                modes[posixpath.normpath(remote_rel)] = st.st_mode & 0o777
            report.up.append(remote_rel)
            report.bytes_up += len(content)
        return files, modes

    async def download_paths(self, remote: str, dest: str | None) -> SyncReport:
        """%download: fetch a sandbox file here (a conflict copy if the local one changed).

        The local path stays inside the notebook folder and out of .git; a file
        that looks like a secret may be fetched this way.
        """
        report = SyncReport()
        remote_path = remote if remote.startswith("/") else self.remote_path(posixpath.join(self.start_in, remote))
        name = posixpath.join(self.start_in, dest or (remote if not remote.startswith("/") else posixpath.basename(remote)))
        try:
            rel = safe_relpath(name)
        except MirrorError as exc:
            raise MirrorError(f"%download: {name} cannot be written here: {exc}. Give a DEST inside the notebook folder.") from None
        if any(self._rules.classify(part, True) == NEVER_REASON for part in rel.split("/")):
            raise MirrorError(f"%download: {rel} is inside a version-control folder; the mirror never writes there.")
        content = (await self._sandbox.download([remote_path]))[remote_path]
        if isinstance(content, FileError):
            raise MirrorError(f"%download: could not fetch {remote} from the sandbox: {content.message}")
        await asyncio.to_thread(self._write_local, rel, content, -1, report)
        return report


def _shown(raw: object) -> str:
    """A reported path as it may be shown: quoted, control characters escaped, bounded."""
    text = repr(raw) if not isinstance(raw, str) or _CONTROL_CHARS.search(raw) else raw
    return text if len(text) <= 200 else text[:200] + "…"
