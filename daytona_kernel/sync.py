"""WorkdirMirror: a two-way mirror between the notebook's folder and the sandbox's working directory.

- Up: before a cell runs, local files that changed since the last sync are
  uploaded in bulk (batched ``upload`` calls, never one request per file).
- Down: the runtime reports, in the cell's own frames, what the cell created or
  changed; those files are downloaded in bulk when the cell ends.
- Change detection uses a manifest of size, mtime and content hash (the hash
  only when size or mtime moved), so a cell where nothing changed costs no
  request at all.
- A file changed on both sides since the last sync keeps both versions: the
  sandbox's copy is written beside the local one as ``name.sandbox-conflict.ext``.
  Nothing is ever silently overwritten, and a notebook (``.ipynb``) is never
  downloaded over a local file.
- Deletions travel only when ``sync_deletes`` is on.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import posixpath
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .backends.base import ProgressCallback, Sandbox
from .config import DaytonaKernelConfig
from .errors import DaytonaKernelError
from .runtime.pathrules import load_rules, scan

BATCH_FILES = 500
BATCH_BYTES = 64 * 1024 * 1024
MB = 1024 * 1024
SHOW_PROGRESS_FILES = 50


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

    def summary(self) -> str:
        parts = [
            f"{len(self.up)} up ({_size(self.bytes_up)})",
            f"{len(self.down)} down ({_size(self.bytes_down)})",
            f"{len(self.conflicts)} conflicts",
            f"{len(self.skipped)} skipped",
        ]
        if self.deleted:
            parts.append(f"{len(self.deleted)} deleted")
        return "sync: " + ", ".join(parts)

    def notices(self) -> str:
        """Lines the user must see: conflicts and skipped files, with the reason."""
        lines = [
            f"Conflict: {path} changed both here and in the sandbox; your copy is kept and the sandbox's is {copy}."
            for path, copy in self.conflicts
        ]
        lines += [f"Not synced: {path}: {reason}" for path, reason in self.skipped]
        return "".join(line + "\n" for line in lines)


def _size(n: int) -> str:
    return f"{n / MB:.1f} MB" if n >= MB else f"{n / 1024:.1f} KB" if n >= 1024 else f"{n} B"


def open_mirror(config: DaytonaKernelConfig, sandbox: Sandbox, folder: str, log: logging.Logger) -> WorkdirMirror:
    """The mirror for a notebook folder. With ``sync=off`` it only serves %upload/%download.

    Its manifest (what was last synced) is kept per backend, volume and workspace,
    because that is what identifies the remote working directory.
    """
    from jupyter_core.paths import jupyter_data_dir

    from .backends import workspace_key

    key = f"{config.backend}-{config.volume_name}-{workspace_key(config, folder)}"
    manifest = Path(jupyter_data_dir()) / "daytona-kernel" / "manifests" / f"{key}.json"
    return WorkdirMirror(folder, sandbox, config, manifest, log)


def conflict_name(rel: str) -> str:
    """``data/table.csv`` -> ``data/table.sandbox-conflict.csv``."""
    head, tail = posixpath.split(rel)
    stem, dot, ext = tail.rpartition(".")
    name = f"{stem}.sandbox-conflict.{ext}" if dot and stem else f"{tail}.sandbox-conflict"
    return posixpath.join(head, name) if head else name


def _hash(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1024 * 1024), b""):
            digest.update(block)
    return digest.hexdigest()


class WorkdirMirror:
    """See the module docstring. One per kernel; ``local_root`` is the notebook's folder."""

    def __init__(
        self,
        local_root: str,
        sandbox: Sandbox,
        config: DaytonaKernelConfig,
        manifest_path: Path,
        log: logging.Logger,
    ) -> None:
        self.local_root = Path(local_root)
        self._sandbox = sandbox
        self._config = config
        self._manifest_path = manifest_path
        self._log = log
        self.mode = config.sync
        self.notice = ""
        if self.mode != "off" and self.local_root.resolve() in (Path.home().resolve(), Path("/")):
            self.mode = "off"
            self.notice = (
                f"The automatic mirror is off because the notebook folder is {self.local_root}, which is too "
                "broad to copy into a sandbox. Open the notebook from a project folder, or move files by "
                "hand with %upload / %download.\n"
            )
        self._rules = load_rules(str(self.local_root), config.sync_exclude)
        self._manifest: dict[str, list[Any]] = self._load_manifest()

    @property
    def up(self) -> bool:
        return self.mode in ("both", "up")

    @property
    def down(self) -> bool:
        return self.mode in ("both", "down")

    def runtime_options(self) -> dict[str, Any]:
        """What the runtime needs to report a cell's file changes."""
        return {"sync_down": self.down, "sync_excludes": list(self._config.sync_exclude)}

    # -- manifest ----------------------------------------------------------

    def _load_manifest(self) -> dict[str, list[Any]]:
        try:
            data = json.loads(self._manifest_path.read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def _save_manifest(self) -> None:
        try:
            self._manifest_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self._manifest_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self._manifest))
            os.replace(tmp, self._manifest_path)
        except OSError as exc:
            self._log.warning("could not save the sync manifest %s: %s", self._manifest_path, exc)

    def _record(self, rel: str, digest: str | None = None) -> None:
        st = (self.local_root / rel).stat()
        self._manifest[rel] = [st.st_size, st.st_mtime_ns, digest or _hash(self.local_root / rel)]

    def _locally_changed(self, rel: str, stat: tuple[int, int] | None = None) -> bool:
        """Changed since the last sync? Hash only when size or mtime moved."""
        path = self.local_root / rel
        if stat is None:
            try:
                st = path.stat()
            except FileNotFoundError:
                return rel in self._manifest
            stat = (st.st_size, st.st_mtime_ns)
        known = self._manifest.get(rel)
        if known is None:
            return True
        if [stat[0], stat[1]] == known[:2]:
            return False
        if stat[0] != known[0]:
            return True
        changed = _hash(path) != known[2]
        if not changed:  # touched but identical: remember the new mtime
            known[1] = stat[1]
        return changed

    # -- up ------------------------------------------------------------------

    def plan_up(self) -> tuple[list[str], list[tuple[str, str]], list[str]]:
        """(files to upload, skipped with reasons, local deletions) — no request is made."""
        files, complete = scan(str(self.local_root), self._rules)
        max_file = int(self._config.sync_max_file_mb * MB)
        budget = int(self._config.sync_max_total_mb * MB)
        todo, skipped = [], []
        for rel in sorted(files):
            size, mtime = files[rel]
            if not self._locally_changed(rel, (size, mtime)):
                continue
            if size > max_file:
                skipped.append((rel, f"{_size(size)} is over sync_max_file_mb={self._config.sync_max_file_mb:g}"))
                continue
            if size > budget:
                skipped.append((rel, f"the total of this sync would pass sync_max_total_mb={self._config.sync_max_total_mb:g}"))
                continue
            budget -= size
            todo.append(rel)
        deleted = [rel for rel in self._manifest if rel not in files] if complete else []
        if not complete:
            skipped.append(("(folder)", "more than 50000 files; the rest were not looked at. Add sync_exclude patterns."))
        return todo, skipped, deleted

    async def push(self, progress: ProgressCallback | None = None) -> SyncReport:
        """Upload what changed locally. A no-change push makes no request."""
        report = SyncReport()
        if not self.up:
            return report
        todo, report.skipped, deleted = self.plan_up()
        total = sum((self.local_root / rel).stat().st_size for rel in todo)
        if progress is not None and len(todo) >= SHOW_PROGRESS_FILES:
            progress(f"syncing {len(todo)} files ({_size(total)}) to the sandbox…")
        started = time.monotonic()
        batch: list[tuple[bytes, str]] = []
        records: dict[str, list[Any]] = {}
        for rel in todo:
            path = self.local_root / rel
            content = path.read_bytes()
            batch.append((content, self.remote_path(rel)))
            records[rel] = [len(content), path.stat().st_mtime_ns, hashlib.sha256(content).hexdigest()]
            if len(batch) >= BATCH_FILES or sum(len(c) for c, _ in batch) >= BATCH_BYTES:
                await self._upload_batch(batch, records, report)
                batch, records = [], {}
                self._progress(progress, report, total, started)
        if batch:
            await self._upload_batch(batch, records, report)
        if self._config.sync_deletes and deleted:
            await self._sandbox.remove(deleted)
            report.deleted += deleted
        for rel in deleted:
            self._manifest.pop(rel, None)
        if report.up or deleted:
            self._save_manifest()
        return report

    async def _upload_batch(self, batch: list[tuple[bytes, str]], records: dict[str, list[Any]], report: SyncReport) -> None:
        await self._sandbox.upload(batch)
        self._manifest.update(records)  # only once the sandbox has them
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

    async def pull(self, changes: dict[str, Any]) -> SyncReport:
        """Download what a cell changed (as the runtime reported it)."""
        report = SyncReport()
        if not self.down:
            return report
        max_file = int(self._config.sync_max_file_mb * MB)
        wanted = []
        for rel, (size, _mtime) in sorted(changes.get("changed", {}).items()):
            if self._rules.excluded(rel, False):
                continue
            if size > max_file:
                report.skipped.append((rel, f"{_size(size)} is over sync_max_file_mb={self._config.sync_max_file_mb:g}"))
                continue
            wanted.append(rel)
        if changes.get("truncated"):
            report.skipped.append(("(sandbox folder)", "too many files to watch; add sync_exclude patterns."))
        for start in range(0, len(wanted), BATCH_FILES):
            chunk = wanted[start : start + BATCH_FILES]
            contents = await self._sandbox.download([self.remote_path(rel) for rel in chunk])
            for rel in chunk:
                self._write_local(rel, contents[self.remote_path(rel)], report)
        if self._config.sync_deletes:
            for rel in changes.get("deleted", []):
                if (self.local_root / rel).exists() and not self._locally_changed(rel):
                    (self.local_root / rel).unlink()
                    self._manifest.pop(rel, None)
                    report.deleted.append(rel)
        if report.down or report.deleted:
            self._save_manifest()
        return report

    def _write_local(self, rel: str, content: bytes, report: SyncReport) -> None:
        path = self.local_root / rel
        digest = hashlib.sha256(content).hexdigest()
        if path.exists():
            known = self._manifest.get(rel)
            if known is not None and known[2] == digest and not self._locally_changed(rel):
                return  # already the same here
            if rel.endswith(".ipynb") or self._locally_changed(rel):
                copy = conflict_name(rel)
                self._atomic_write(self.local_root / copy, content)
                report.conflicts.append((rel, copy))
                return
        self._atomic_write(path, content)
        self._record(rel, digest)
        report.down.append(rel)
        report.bytes_down += len(content)

    @staticmethod
    def _atomic_write(path: Path, content: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.daytona-kernel-tmp")
        tmp.write_bytes(content)
        os.replace(tmp, path)

    # -- by hand -------------------------------------------------------------

    def status(self) -> str:
        todo, skipped, deleted = self.plan_up()
        lines = [f"sync mode: {self.mode}; {self.local_root} <-> {self._sandbox.workdir}"]
        lines.append(f"would upload {len(todo)} file(s)" + (": " + ", ".join(todo[:20]) if todo else ""))
        if len(todo) > 20:
            lines.append(f"  ... and {len(todo) - 20} more")
        if deleted:
            verb = "would delete in the sandbox" if self._config.sync_deletes else "deleted here (sync_deletes is off, kept there)"
            lines.append(f"{verb}: " + ", ".join(deleted[:20]))
        lines += [f"would skip {path}: {reason}" for path, reason in skipped]
        return "\n".join(lines) + "\n"

    async def upload_paths(self, local: str, dest: str | None) -> SyncReport:
        """%upload: send a file or folder from here, to ``dest`` (default: the same relative path)."""
        report = SyncReport()
        src = (self.local_root / local).resolve()
        if not src.exists():
            raise DaytonaKernelError(f"%upload: {local} does not exist here.")
        sources = [p for p in src.rglob("*") if p.is_file()] if src.is_dir() else [src]
        base = src if src.is_dir() else src.parent
        target = dest or (os.path.relpath(src, self.local_root) if src.is_relative_to(self.local_root) else src.name)
        files = []
        for path in sources:
            rel_in = os.path.relpath(path, base) if src.is_dir() else ""
            remote_rel = posixpath.join(target, rel_in) if rel_in else target
            content = path.read_bytes()
            files.append((content, remote_rel if remote_rel.startswith("/") else self.remote_path(remote_rel)))
            report.up.append(remote_rel)
            report.bytes_up += len(content)
        for start in range(0, len(files), BATCH_FILES):
            await self._sandbox.upload(files[start : start + BATCH_FILES])
        return report

    async def download_paths(self, remote: str, dest: str | None) -> SyncReport:
        """%download: fetch a sandbox file here (a conflict copy if the local one changed)."""
        report = SyncReport()
        remote_path = remote if remote.startswith("/") else self.remote_path(remote)
        content = (await self._sandbox.download([remote_path]))[remote_path]
        rel = dest or (remote if not remote.startswith("/") else posixpath.basename(remote))
        self._write_local(rel, content, report)
        return report
