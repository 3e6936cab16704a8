"""WorkdirMirror: a two-way mirror between the notebook's folder and the sandbox's working directory.

This module does the mirror's I/O; what moves is decided in ``syncplan.py`` (pure), the local
folder is written through ``localfs.py``, and ``manifest.py`` remembers what was last synced.

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
import time
from pathlib import Path
from typing import Any

from .backends.base import FileError, ProgressCallback, Sandbox
from .cell import Frontend, stderr
from .config import DaytonaKernelConfig, MirrorSettings, settings_from
from .errors import DaytonaKernelError, MirrorError
from .localfs import NOFOLLOW, LocalFolder, safe_relpath, shown
from .manifest import SyncManifest
from .runtime.calls import RuntimeOptions, Synced
from .runtime.pathrules import NEVER_REASON, MirrorRules, file_stat, load_rules, scan
from .syncplan import (
    ENV_MARKERS,
    MB,
    Landing,
    Refusal,
    Stat,
    SyncReport,
    UpPlan,
    choose_up,
    code_refusal,
    conflict_name,
    describe_up,
    folders_above,
    parse_report,
    plan_down,
    sandbox_landing,
    size_text,
    why_not_down,
)

BATCH_FILES = 500
BATCH_BYTES = 64 * 1024 * 1024
SHOW_PROGRESS_FILES = 50
SCAN_BUDGET_S = 2.0  # the scan of the notebook folder before each cell
DEFAULT_FILE_MODE = 0o644


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
        root, home = self.local_root.resolve(), Path.home().resolve()
        if self.mode != "off" and (home == root or home.is_relative_to(root)):
            self.mode = "off"
            self.notice = (
                f"The automatic mirror is off because the notebook folder {self.local_root} holds your home "
                "folder, which is too broad to copy into a sandbox. Open the notebook from a project folder, "
                "or move files by hand with %upload / %download.\n"
            )
        self._rules = load_rules(str(self.local_root), config.sync_exclude, config.sync_include)
        self._manifest = SyncManifest(manifest_path, self.local_root, log)
        self._secrets_noticed: set[str] = set()
        self._acked: dict[str, list[int]] = {}  # changes handled since the runtime last heard from us
        self._gone: list[str] = []
        self._up_modes: dict[str, int] = {}  # permission bits of files uploaded since then
        self._failed: dict[str, Stat] = {}  # sandbox files that failed in a way a retry would repeat
        self._reported = Landing()  # the environments and repositories the last change report makes
        self._generation: int | None = None  # the sandbox the manifest describes (Sandbox.generation)

    @property
    def syncs_up(self) -> bool:
        """Local changes go to the sandbox before each cell (``SyncReport.up`` lists what went)."""
        return self.mode in ("both", "up")

    @property
    def syncs_down(self) -> bool:
        """Files a cell writes come back after it (``SyncReport.down`` lists what came)."""
        return self.mode in ("both", "down")

    def runtime_options(self) -> RuntimeOptions:
        """What the runtime needs to report a cell's file changes, and (mirroring both ways) the project
        folder here, for its word on paths outside it or left out (``files.OutsideTheMirror``)."""
        return RuntimeOptions(
            sync_down=self.syncs_down,
            sync_excludes=list(self._config.sync_exclude),
            sync_includes=list(self._config.sync_include),
            local_root=str(self.local_root) if self.syncs_up and self.syncs_down else "",
        )

    def handover(self) -> Synced:
        """What the runtime must learn on its next call (the ``synced`` argument), then forgotten here.

        ``up``: files uploaded since, with their permission bits (the runtime sets
        them and does not report the files back); ``acked``: reported changes the
        kernel has handled, with the stat it saw; ``gone``: reported deletions handled.
        """
        note = Synced(up=self._up_modes, acked=self._acked, gone=self._gone)
        self._up_modes, self._acked, self._gone = {}, {}, []
        return note

    # -- manifest ----------------------------------------------------------

    # -- up ------------------------------------------------------------------

    def plan_up(self) -> UpPlan:
        """What to upload, what is skipped and why, what was deleted here. No request is made.

        A file that is merely unreadable (a folder without permission) is never
        planned as deleted: only one that is really gone.
        """
        found_secrets: list[str] = []
        files, complete = scan(str(self.local_root), self._rules, skipped=found_secrets, budget_s=SCAN_BUDGET_S)
        plan = UpPlan(secrets=found_secrets)
        changed = []
        for rel in sorted(files):
            now = files[rel]
            try:
                if self._manifest.locally_changed(rel, now):
                    changed.append((rel, now[0]))
            except OSError as exc:
                plan.skipped.append((rel, f"could not read it here ({exc.strerror or exc})"))
        choose_up(plan, changed, self._config, self._sandbox.on_this_disk)
        if complete:
            plan.deleted = [rel for rel in self._manifest if rel not in files and _gone_here(self.local_root, rel)]
        else:
            plan.skipped.append(
                ("(folder)", f"over 50000 files or {SCAN_BUDGET_S:g} s to scan; the rest was not looked at. Add sync_exclude patterns.")
            )
        return plan

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
            progress(f"syncing {len(plan.todo)} files ({size_text(total)}) to the sandbox…")
        started = time.monotonic()
        start = 0
        while start < len(plan.todo):
            batch, records, start = await asyncio.to_thread(_read_batch, self.local_root, self._sandbox.workdir, plan.todo, start, report)
            if batch:
                await self._upload_batch(batch, records, report)
                _show_progress(progress, report, total, started)
        for rel in plan.placed:
            await self._place(rel, report)
        if self._config.sync_deletes and plan.deleted:
            await self._sandbox.remove(plan.deleted)
            report.deleted += plan.deleted
        for rel in plan.deleted:
            self._manifest.pop(rel, None)
        if report.up or plan.deleted:
            await asyncio.to_thread(self._manifest.save)
        return report

    async def _upload_batch(self, batch: list[tuple[bytes, str]], records: dict[str, list[Any]], report: SyncReport) -> None:
        await self._sandbox.upload(batch)
        self._manifest.update(records)  # only once the sandbox has them
        for rel, record in records.items():
            self._up_modes[rel] = record[3]
        report.up.extend(records)
        report.bytes_up += sum(len(content) for content, _ in batch)

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
        changed, deleted = parse_report(changes, report)
        self._rules.forget_gitignores()
        self._reported = sandbox_landing(_normalised([raw for raw, _ in changed]))
        landing = self._reported | await asyncio.to_thread(local_landing, self._folder, [raw for raw, _ in changed])
        plan = await asyncio.to_thread(
            plan_down, changed, report, self._config, self._rules, self._failed, self._secrets_noticed, landing, self._sandbox.on_this_disk
        )
        self._secrets_noticed.update(report.secrets_down + report.code_kept)
        for raw, reported in plan.acked:
            self._ack(raw, reported)
        wanted = plan.wanted
        max_file = int(self._config.sync_max_file_mb * MB)
        for start in range(0, len(wanted), BATCH_FILES):
            chunk = wanted[start : start + BATCH_FILES]
            limits = {self.remote_path(rel): min(reported[0], max_file) for rel, _, reported in chunk}
            try:
                contents = await self._sandbox.download(list(limits), limits)
            except DaytonaKernelError as exc:
                report.left_behind += [(rel, f"{exc}; it is tried again after the next cell") for rel, _, _ in chunk]
                continue
            await asyncio.to_thread(self._write_batch, chunk, contents, report)
        for rel, raw, reported in plan.placed:
            await self._fetch_placed(rel, raw, reported, report)
        if deleted:
            await asyncio.to_thread(self._apply_deletions, deleted, report)
        if report.down or report.deleted or report.conflicts:
            await asyncio.to_thread(self._manifest.save)
        return report

    # -- big files on a sandbox on this disk (the local backend) ------------------------------------

    @property
    def _links(self) -> bool:
        """Hard links only when changes travel both ways: a cell writing into one changes the user's
        file at once, which is what the mirror does after the cell anyway."""
        return self.mode == "both"

    async def _place(self, rel: str, report: SyncReport) -> None:
        """A file over sync_max_file_mb goes to a sandbox on this disk as a clone or a link (``share_file``)."""
        try:
            await self._sandbox.place(str(self.local_root / rel), self.remote_path(rel), self._links)
            await asyncio.to_thread(self._manifest.record_file, rel)
        except OSError as exc:
            report.skipped.append((rel, f"could not place it in the sandbox ({exc.strerror or exc})"))
            return
        self._up_modes[rel] = self._manifest[rel][3]
        report.up.append(rel)

    async def _fetch_placed(self, rel: str, raw: str, reported: Stat, report: SyncReport) -> None:
        """A file over sync_max_file_mb a cell wrote, from a sandbox on this disk: nothing to move when it is
        the user's own file (a link), else a clone or a link of it, or a conflict copy beside a changed one."""
        remote = self.remote_path(rel)
        landing = self._reported | await asyncio.to_thread(local_landing, self._folder, [rel])
        refusal = why_not_down(rel, self._rules, landing, not self._config.sync_code_down, reported[2])
        if refusal is not None:  # the writer asks the one decision too, with the folders as they are now
            if refusal[0] is Refusal.REFUSED:
                report.refused.append((rel, refusal[1]))
            self._ack(raw, reported)
            return
        try:
            if not self._sandbox.same_file(remote, str(self.local_root / rel)):
                st = self._folder.lstat(rel)
                target = rel
                if st is not None and not stat.S_ISREG(st.st_mode):
                    raise MirrorError("a folder, symlink or special file is in its place here, and is not replaced")
                if st is not None and (rel.lower().endswith(".ipynb") or self._manifest.locally_changed(rel, file_stat(st))):
                    target = _free_conflict_name(self._folder, rel)  # an earlier conflict copy is never replaced
                path = await asyncio.to_thread(self._folder.path_for_writing, target)
                await self._sandbox.fetch(remote, str(path), self._links)
                if target != rel:
                    report.conflicts.append((rel, target))
                    self._ack(raw, reported)
                    return
                report.down.append(rel)
            await asyncio.to_thread(self._manifest.record_file, rel)
        except (MirrorError, OSError) as exc:
            self._left_behind(rel, raw, reported, str(exc) if isinstance(exc, MirrorError) else exc.strerror or str(exc), False, report)
            return
        self._ack(raw, reported)

    def _ack(self, raw: str, reported: Stat) -> None:
        self._acked[raw] = [reported[0], reported[1], reported[2]] if reported[2] >= 0 else [reported[0], reported[1]]

    def _write_batch(self, chunk: list[tuple[str, str, Stat]], contents: dict[str, Any], report: SyncReport) -> None:
        max_file = int(self._config.sync_max_file_mb * MB)
        # The writer asks the one decision again, with the folders here as they are now (after the download).
        landing = self._reported | local_landing(self._folder, [rel for rel, _, _ in chunk])
        for rel, raw, reported in chunk:
            content = contents.get(self.remote_path(rel))
            if isinstance(content, FileError) and content.over_limit:
                why = f"it is more than the sandbox reported ({size_text(reported[0])})"
                self._left_behind(rel, raw, reported, why if reported[0] <= max_file else content.message, False, report)
                continue
            if isinstance(content, FileError) or not isinstance(content, bytes):
                error = content if isinstance(content, FileError) else FileError("the sandbox sent nothing for it", retry=True)
                self._left_behind(rel, raw, reported, error.message, error.retry, report)
                continue
            if len(content) > min(reported[0], max_file):  # a backend that ignored the limit
                self._left_behind(rel, raw, reported, f"it is {size_text(len(content))}, more than the sandbox reported", False, report)
                continue
            refusal = why_not_down(rel, self._rules, landing, not self._config.sync_code_down, reported[2])
            if refusal is not None:
                if refusal[0] is Refusal.REFUSED:
                    report.refused.append((rel, refusal[1]))
                self._ack(raw, reported)
                continue
            try:
                _write_down(self._folder, self._manifest, rel, content, reported[2], report)
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
                why = "a notebook is never deleted from the sandbox" if rel.lower().endswith(".ipynb") else None
                why = why or code_refusal(rel, local_landing(self._folder, [rel]))
                if why is not None:
                    report.refused.append((rel, f"not deleted here: {why}"))
                    continue
                st = self._folder.lstat(rel)
                if st is None or not stat.S_ISREG(st.st_mode) or self._manifest.locally_changed(rel, file_stat(st)):
                    continue
                self._folder.unlink(rel)
            except MirrorError as exc:
                report.refused.append((shown(raw), str(exc)))
                continue
            except OSError as exc:
                report.left_behind.append((raw, f"not deleted here: {exc.strerror or exc}"))
                continue
            self._manifest.pop(rel, None)
            report.deleted.append(rel)

    # -- by hand -------------------------------------------------------------

    def status(self) -> str:
        """What ``%sync status`` shows: the mode and what the next upload would do."""
        return describe_up(self.plan_up(), self.mode, str(self.local_root), self._sandbox.workdir, self._config.sync_deletes)

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
        files, modes = await asyncio.to_thread(_read_for_upload, src, target, self._config.sync_include, self._sandbox.workdir, report)
        for start in range(0, len(files), BATCH_FILES):
            await self._sandbox.upload(files[start : start + BATCH_FILES])
        self._up_modes.update(modes)
        return report

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
        await asyncio.to_thread(_write_down, self._folder, self._manifest, rel, content, -1, report)
        return report


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
    progress(f"syncing to the sandbox: {len(report.up)} files, {size_text(report.bytes_up)} of {size_text(total)} ({size_text(int(rate))}/s)")


def _read_for_upload(src: Path, target: str, include: list[str], workdir: str, report: SyncReport) -> tuple[list[tuple[bytes, str]], dict[str, int]]:
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


def _write_down(folder: LocalFolder, manifest: SyncManifest, rel: str, content: bytes, mode: int, report: SyncReport) -> None:
    """Write one downloaded file here, or a conflict copy beside it. Raises MirrorError or OSError.

    Modes only narrow: the sandbox's bits, without any the local file lacks (a 0600 file never
    becomes readable by others). A notebook is never overwritten, nor is an earlier conflict copy."""
    mode = DEFAULT_FILE_MODE if mode < 0 else mode & 0o777
    digest = hashlib.sha256(content).hexdigest()
    st = folder.lstat(rel)
    if st is not None:
        if not stat.S_ISREG(st.st_mode):
            what = "folder" if stat.S_ISDIR(st.st_mode) else "symlink" if stat.S_ISLNK(st.st_mode) else "special file"
            raise MirrorError(f"a {what} is in its place here, and is not replaced")
        now = file_stat(st)
        mode &= now[2]
        known = manifest.get(rel)
        locally_changed = manifest.locally_changed(rel, now)
        if known is not None and known[2] == digest and not locally_changed:
            if now[2] != mode:
                folder.chmod(rel, mode)
                manifest.record(rel, digest, folder.lstat(rel))
            return  # already the same here
        if rel.lower().endswith(".ipynb") or locally_changed:
            report.conflicts.append((rel, _write_conflict_copy(folder, rel, content, mode)))
            return
    folder.write(rel, content, mode)
    manifest.record(rel, digest, folder.lstat(rel))
    report.down.append(rel)
    report.bytes_down += len(content)


CONFLICT_COPIES = 100  # data.sandbox-conflict.csv, then data.sandbox-conflict-2.csv ... up to this many


def _conflict_names(rel: str) -> list[str]:
    """``data.sandbox-conflict.csv``, ``data.sandbox-conflict-2.csv`` ... up to CONFLICT_COPIES."""
    first = conflict_name(rel)
    stem, dot, ext = first.rpartition(".sandbox-conflict")
    return [first] + [f"{stem}{dot}-{n}{ext}" for n in range(2, CONFLICT_COPIES + 1)]


def _free_conflict_name(folder: LocalFolder, rel: str) -> str:
    for copy in _conflict_names(rel):
        if folder.lstat(copy) is None:
            return copy
    raise MirrorError(f"{CONFLICT_COPIES} conflict copies of it are here already; merge or remove them")


def _write_conflict_copy(folder: LocalFolder, rel: str, content: bytes, mode: int) -> str:
    """Write the sandbox's version beside the local file under a name nothing has: an existing conflict copy
    (which the user may be merging in) is never overwritten."""
    for copy in _conflict_names(rel):
        if folder.lstat(copy) is not None:
            continue
        try:
            folder.write(copy, content, mode, exclusive=True)
        except FileExistsError:
            continue  # made meanwhile
        return copy
    raise MirrorError(f"{CONFLICT_COPIES} conflict copies of it are here already; merge or remove them")


def _normalised(raws: list[str]) -> list[str]:
    """The reported paths that are paths at all (``safe_relpath``); the others are refused by the planner."""
    found = []
    for raw in raws:
        try:
            found.append(safe_relpath(raw))
        except MirrorError:
            continue
    return found


def local_landing(folder: LocalFolder, raws: list[str]) -> Landing:
    """Which folders on the way of these reported paths are, here, a Python environment (a pyvenv.cfg or a
    conda-meta/ in it) or a folder git takes for a repository (HEAD beside objects/, refs/ or commondir)."""
    envs: set[str] = set()
    repos: set[str] = set()
    looked: set[str] = set()
    for rel in _normalised(raws):
        for above in folders_above(rel):
            if above in looked:
                continue
            looked.add(above)
            kinds = folder.kinds(above, (*ENV_MARKERS, "HEAD", "objects", "refs", "commondir"))
            if kinds["pyvenv.cfg"] == "file" or kinds["conda-meta"] == "dir":
                envs.add(above)
            if kinds["HEAD"] == "file" and (kinds["commondir"] == "file" or "dir" in (kinds["objects"], kinds["refs"])):
                repos.add(above)
    return Landing(frozenset(envs), frozenset(repos))


def notify(report: SyncReport, frontend: Frontend) -> None:
    """Show what a sync skipped or could not do, if anything."""
    notices = report.notices()
    if notices:
        frontend.emit("stream", stderr(notices))
