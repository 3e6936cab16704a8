"""WorkdirMirror: a two-way mirror between the notebook's folder and the sandbox's working directory.

This module does the mirror's I/O; what moves is decided in ``mirror/plan.py`` (pure), the local
folder is written through ``mirror/localfs.py``, and ``mirror/manifest.py`` remembers what was last synced.

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
import logging
import os
import posixpath
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

from ..backends.base import ProgressCallback, Sandbox
from ..cell import Frontend
from ..config import DaytonaKernelConfig, MirrorSettings, settings_from
from ..errors import MirrorError
from ..protocol import FileChanges
from ..runtime.calls import RuntimeOptions, Synced
from ..runtime.pathrules import MirrorRules, file_stat, load_rules, scan
from .down import BATCH_FILES, MirrorDown
from .localfs import NOFOLLOW, LocalFolder
from .manifest import SyncManifest
from .plan import Stat, SyncReport, UpPlan, choose_up, describe_up, not_yet_synced, size_text
from .project import home_mirror

BATCH_BYTES = 64 * 1024 * 1024
SHOW_PROGRESS_FILES = 50
SCAN_BUDGET_S = 2.0  # the scan of the notebook folder before each cell
SCAN_MAX_FILES = 50000  # ... and the files it lists at most (pathrules.scan's max_files)
GIT_CONFIG_TIMEOUT_S = 5.0  # `git config` for the global excludes file, once per kernel


def open_mirror(
    config: DaytonaKernelConfig, sandbox: Sandbox, folder: str, log: logging.Logger, start_in: str = ""
) -> WorkdirMirror:
    """The mirror for a notebook folder. With ``sync=off`` it only serves %upload/%download.

    Its manifest (what was last synced) is kept per backend, volume and workspace,
    because that is what identifies the remote working directory.
    """
    from jupyter_core.paths import jupyter_data_dir

    from ..backends import workspace_key

    key = f"{config.backend}-{config.volume_name}-{workspace_key(config, folder)}"
    manifest = Path(jupyter_data_dir()) / "daytona-kernel" / "manifests" / f"{key}.json"
    return WorkdirMirror(folder, sandbox, settings_from(MirrorSettings, config), manifest, log, start_in)


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
        self._log = log
        self.mode = config.sync
        self.notice = ""
        self._excludes = list(config.sync_exclude)
        root, home = self.local_root.resolve(), Path.home().resolve()
        if self.mode != "off" and (home == root or home.is_relative_to(root)):
            top_only, self.notice = home_mirror(root)  # the files directly in home, or nothing
            if top_only is None:
                self.mode = "off"
            else:
                self._excludes += top_only
        self._rules = load_rules(
            str(self.local_root),
            self._excludes,
            config.sync_include,
            repository=True,
            global_excludes=lambda: git_global_excludes(self.local_root),
        )
        self._manifest = SyncManifest(manifest_path, self.local_root, log)
        self._secrets_noticed: set[str] = set()
        self._up_modes: dict[str, int] = {}  # permission bits of files uploaded since the runtime last heard from us
        self._generation: int | None = None  # the sandbox the manifest describes (Sandbox.generation)
        self._scan_noticed = False  # the user was told the last scans stopped early (said again once one completes)
        self._down = MirrorDown(
            self._folder, sandbox, config, self._rules, self._manifest, self._secrets_noticed, self.mode == "both"
        )

    @property
    def syncs_up(self) -> bool:
        """Local changes go to the sandbox before each cell (``SyncReport.up`` lists what went)."""
        return self.mode in ("both", "up")

    @property
    def syncs_down(self) -> bool:
        """Files a cell writes come back after it (``SyncReport.down`` lists what came)."""
        return self.mode in ("both", "down")

    def runtime_options(self) -> RuntimeOptions:
        """What the runtime needs to report a cell's file changes, and (whenever it mirrors) the project folder
        here, for its word on paths outside it or left out (``files.OutsideTheMirror``)."""
        return RuntimeOptions(
            sync_down=self.syncs_down,
            sync_excludes=list(self._excludes),
            sync_includes=list(self._config.sync_include),
            local_root=str(self.local_root) if self.mode != "off" else "",
        )

    def handover(self) -> Synced:
        """What the runtime must learn on its next call (the ``synced`` argument), then forgotten here.

        ``up``: files uploaded since, with their permission bits (the runtime sets
        them and does not report the files back); ``acked``: reported changes the
        kernel has handled, with the stat it saw; ``gone``: reported deletions handled.
        """
        acked, gone = self._down.take_handled()
        note = Synced(up=self._up_modes, acked=acked, gone=gone)
        self._up_modes = {}
        return note

    # -- up ------------------------------------------------------------------

    def plan_up(self) -> UpPlan:
        """What to upload, what is skipped and why, what was deleted here. No request is made.

        A file that is merely unreadable (a folder without permission) is never planned as deleted: only one
        that is really gone. When the scan stops early (a huge folder), every file the manifest knows is still
        looked at, one by one, so an edit to the user's own files always reaches the sandbox.
        """
        found_secrets: list[str] = []
        files, complete = scan(str(self.local_root), self._rules, SCAN_MAX_FILES, found_secrets, SCAN_BUDGET_S)
        if not complete:
            files.update(self._known_files(files))
        changed, unreadable, known_here = self._manifest.changes(files)
        plan = UpPlan(secrets=found_secrets, skipped=unreadable)
        choose_up(plan, changed, self._config, self._sandbox.toolbox.on_this_disk)
        if known_here < len(self._manifest):  # some file the manifest knows was not found
            newer = self._down.failed  # the sandbox's newer copy did not come down: not deleted there
            plan.deleted = [
                rel for rel in self._manifest if rel not in files and rel not in newer and _gone_here(self.local_root, rel)
            ]
        if not complete and not self._scan_noticed:
            self._scan_noticed = True
            plan.skipped.append(
                (
                    "(folder)",
                    f"over {SCAN_MAX_FILES} files or {SCAN_BUDGET_S:g} s to scan: the files already synced were all "
                    "checked, but new files in the folders not reached were not looked at. Add sync_exclude patterns.",
                )
            )
        self._scan_noticed = self._scan_noticed and not complete
        return plan

    def _known_files(self, found: dict[str, Stat]) -> dict[str, Stat]:
        """The manifest's files a scan did not reach, as they are here (never through a link), unless gone or left out."""
        known = {}
        for rel in list(self._manifest):
            if rel in found or self._rules.check(rel, False) is not None:
                continue
            try:
                st = self._folder.lstat(rel)
            except (OSError, MirrorError):
                continue  # unreadable, or a link on the way: not a file to send (nor a deletion: _gone_here decides)
            if st is not None and stat.S_ISREG(st.st_mode):
                known[rel] = file_stat(st)
        return known

    def _follow_sandbox(self) -> None:
        """A new sandbox (recreated, or the old one gone) holds only what the volume's copy restored, which
        may lack files the old one had: the manifest no longer describes it, so every file is sent again."""
        generation = self._sandbox.generation
        if self._generation is not None and generation != self._generation and self._manifest:
            self._log.info("a new sandbox: the %d file(s) synced to the old one are checked again", len(self._manifest))
            self._manifest.clear()
            self._down.failed.clear()
        self._generation = generation

    async def push(self, progress: ProgressCallback | None = None) -> SyncReport:
        """Upload what changed locally (everything, in a new sandbox). A no-change push makes no request."""
        self._follow_sandbox()
        report = SyncReport()
        if not self.syncs_up:
            return report
        plan = await asyncio.to_thread(self.plan_up)
        report.skipped = plan.skipped
        if plan.waiting:
            report.waiting = [rel for rel, _ in plan.waiting]
            report.waiting_bytes = sum(size for _, size in plan.waiting)
            report.waiting_note = not_yet_synced(report.waiting, report.waiting_bytes, self._config.sync_max_total_mb)
        report.secrets = [rel for rel in plan.secrets if rel not in self._secrets_noticed]
        self._secrets_noticed.update(report.secrets)
        total = plan.total
        if progress is not None and len(plan.todo) >= SHOW_PROGRESS_FILES:
            progress(f"syncing {len(plan.todo)} files ({size_text(total)}) to the sandbox…")
        started = time.monotonic()
        start = 0
        while start < len(plan.todo):
            batch, records, start = await asyncio.to_thread(
                _read_batch, self.local_root, self._sandbox.workdir, plan.todo, start, report
            )
            if batch:
                await self._upload_batch(batch, records, report)
                _show_progress(progress, report, total, started)
        for rel in plan.placed:
            await self._place(rel, report)
        if self._config.sync_deletes and plan.deleted:
            await self._sandbox.toolbox.remove(plan.deleted)
            report.deleted += plan.deleted
        for rel in plan.deleted:
            self._manifest.pop(rel, None)
        if report.up or plan.deleted:
            await asyncio.to_thread(self._manifest.save)
        return report

    async def _upload_batch(self, batch: list[tuple[bytes, str]], records: dict[str, list[Any]], report: SyncReport) -> None:
        await self._sandbox.toolbox.upload(batch)
        self._manifest.update(records)  # only once the sandbox has them
        for rel, record in records.items():
            self._up_modes[rel] = record[3]
        report.up.extend(records)
        report.bytes_up += sum(len(content) for content, _ in batch)

    def remote_path(self, rel: str) -> str:
        return posixpath.join(self._sandbox.workdir, rel)

    # -- down ----------------------------------------------------------------

    # -- down: MirrorDown (mirror/down.py) ----------------------------------------

    async def pull(self, changes: FileChanges, retry_failed: bool = False) -> SyncReport:
        """Download what a cell changed, as the runtime reported it (``MirrorDown.pull``)."""
        if not self.syncs_down:
            return SyncReport()
        return await self._down.pull(changes, retry_failed)

    @property
    def holds_files(self) -> bool:
        """A flood left new files in the sandbox (``MirrorDown.held``), for %sync to fetch."""
        return bool(self._down.held)

    async def download_paths(self, remote: str, dest: str | None) -> SyncReport:
        """%download (``MirrorDown.download_paths``)."""
        return await self._down.download_paths(remote, dest, self.start_in)

    # -- big files on a sandbox on this disk (the local backend) ------------------------------------

    async def _place(self, rel: str, report: SyncReport) -> None:
        """A file over sync_max_file_mb goes to a sandbox on this disk as a clone or a link (``share_file``)."""
        try:
            await self._sandbox.toolbox.place(str(self.local_root / rel), self.remote_path(rel), self.mode == "both")
            await asyncio.to_thread(self._manifest.record_file, rel)
        except OSError as exc:
            report.skipped.append((rel, f"could not place it in the sandbox ({exc.strerror or exc})"))
            return
        self._up_modes[rel] = self._manifest[rel][3]
        report.up.append(rel)

    # -- by hand -------------------------------------------------------------

    def status(self) -> str:
        """What ``%sync status`` shows: the mode and what the next upload would do."""
        return describe_up(self.plan_up(), self.mode, str(self.local_root), self._sandbox.workdir, self._config.sync_deletes)

    def _inside(self, local: str, magic: str) -> Path:
        """A local path given to %upload, resolved, and refused when it leaves the notebook folder."""
        root = self.local_root.resolve()
        src = (self.local_root / self.start_in / local).resolve()
        if src != root and not src.is_relative_to(root):
            raise MirrorError(
                f"%{magic}: {local} is outside the notebook folder {self.local_root}; only files inside it can be sent."
            )
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
        files, modes = await asyncio.to_thread(
            _read_for_upload, src, target, self._config.sync_include, self._sandbox.workdir, report
        )
        for start in range(0, len(files), BATCH_FILES):
            await self._sandbox.toolbox.upload(files[start : start + BATCH_FILES])
        self._up_modes.update(modes)
        return report


def git_global_excludes(root: Path) -> str:
    """The user's global git ignore file (core.excludesFile) as git itself reports it in ``root``, or git's
    default ($XDG_CONFIG_HOME/git/ignore, else ~/.config/git/ignore) when it is unset or git is not installed."""
    try:
        found = subprocess.run(
            ["git", "config", "--path", "--get", "core.excludesFile"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=GIT_CONFIG_TIMEOUT_S,
        )
        if found.returncode == 0 and found.stdout.strip():
            return os.path.join(root, found.stdout.strip())  # (an absolute path stays as it is)
    except (OSError, subprocess.SubprocessError):
        pass
    config_home = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(config_home, "git", "ignore")


def _gone_here(root: Path, rel: str) -> bool:
    """Really deleted here (not just unreadable, and not just newly excluded)."""
    try:
        os.lstat(root / rel)
    except OSError as exc:
        return exc.errno in (errno.ENOENT, errno.ENOTDIR)
    return False


def _read_batch(
    root: Path, workdir: str, todo: list[str], start: int, report: SyncReport
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
            fd = os.open(root / rel, os.O_RDONLY | NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
            st = os.fstat(fd)  # before reading: a write during the read shows up next time
            if not stat.S_ISREG(st.st_mode):
                os.close(fd)
                continue  # replaced by a folder or a pipe since the scan
            with os.fdopen(fd, "rb") as f:
                content = f.read()
        except OSError as exc:
            report.skipped.append((rel, f"could not read it here ({exc.strerror or exc})"))
            continue
        batch.append((content, posixpath.join(workdir, rel)))
        records[rel] = [st.st_size, st.st_mtime_ns, hashlib.sha256(content).hexdigest(), st.st_mode & 0o777, time.time_ns()]
        size += len(content)
    return batch, records, index


def _show_progress(progress: ProgressCallback | None, report: SyncReport, total: int, started: float) -> None:
    if progress is None or len(report.up) < SHOW_PROGRESS_FILES:
        return
    rate = report.bytes_up / max(time.monotonic() - started, 1e-6)
    progress(
        f"syncing to the sandbox: {len(report.up)} files, {size_text(report.bytes_up)} of {size_text(total)} ({size_text(int(rate))}/s)"
    )


def _read_for_upload(
    src: Path, target: str, include: list[str], workdir: str, report: SyncReport
) -> tuple[list[tuple[bytes, str]], dict[str, int]]:
    if src.is_dir():
        rules = MirrorRules(str(src), include=include, defaults=(), gitignore=False)
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
        remote = remote_rel if remote_rel.startswith("/") else posixpath.join(workdir, remote_rel)
        files.append((content, remote))
        if not remote_rel.startswith("/"):
            modes[posixpath.normpath(remote_rel)] = st.st_mode & 0o777
        report.up.append(remote_rel)
        report.bytes_up += len(content)
    return files, modes


def notify(report: SyncReport, frontend: Frontend) -> None:
    """Show what a sync skipped or could not do, if anything."""
    frontend.notice(report.notices())
