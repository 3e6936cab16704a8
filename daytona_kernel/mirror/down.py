"""The workdir mirror's down half: what a cell changed in the sandbox, written here (and ``%download``).

The sandbox's change report is untrusted: ``plan`` decides what comes down (``plan_down``, and
``why_not_down`` asked again by the writer with the folders as they are now); files are written through
``LocalFolder`` (never following a symlink), a file changed on both sides keeps both versions (a conflict
copy beside it), and a notebook is never downloaded over a local file. What was handled is acknowledged
to the runtime on its next call (``take_handled``). See ``mirror/mirror.py`` for the whole mirror.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import posixpath
import shutil
import stat
from typing import Any

from ..backends.base import FileError, NotShared, Sandbox
from ..config import MirrorSettings
from ..errors import DaytonaKernelError, MirrorError
from ..protocol import FileChanges
from ..runtime.pathrules import NEVER_REASON, MirrorRules, file_stat, name_key, path_key
from .localfs import LocalFolder, safe_relpath, shown
from .manifest import SyncManifest
from .plan import (
    MARKER_FOLDERS,
    MARKERS,
    MB,
    Landing,
    Refusal,
    Stat,
    SyncReport,
    code_refusal,
    conflict_name,
    folders_above,
    landing_of,
    over_the_cap,
    plan_down,
    reported_paths,
    size_text,
    why_not_down,
)

BATCH_FILES = 500  # files per download request
DEFAULT_FILE_MODE = 0o644
NEW_FILES_PER_CELL = 500  # new files one cell brings down; the rest of a flood stays in the sandbox (%sync fetches it)
DISK_MARGIN_BYTES = 1024 * MB  # a download stops before it leaves less free on this disk (or 5% of a small disk)

log = logging.getLogger(__name__)


def disk_margin(total: int) -> int:
    """The free space a down-sync leaves on a disk of ``total`` bytes: 1 GiB, or 5% of a disk under 20 GiB."""
    return min(DISK_MARGIN_BYTES, total // 20)


class MirrorDown:
    """See the module docstring. ``links``: a big file on a sandbox on this disk comes back as a hard link
    (only when the mirror runs both ways). ``failed`` holds the sandbox files that failed in a way a retry
    would repeat (cleared by ``%sync`` and for a new sandbox)."""

    def __init__(
        self,
        folder: LocalFolder,
        sandbox: Sandbox,
        config: MirrorSettings,
        rules: MirrorRules,
        manifest: SyncManifest,
        secrets_noticed: set[str],
        links: bool,
    ) -> None:
        self._folder = folder
        self._sandbox = sandbox
        self._config = config
        self._rules = rules
        self._manifest = manifest
        self._secrets_noticed = secrets_noticed  # shared with the up half: each secret is named once
        self._links = links
        self._acked: dict[str, list[int]] = {}  # changes handled since the runtime last heard from us
        self._gone: list[str] = []
        self.failed: dict[str, Stat] = {}
        self._truncated_said = False  # the sandbox's last scan was cut short, and the user was told
        self._new_left = NEW_FILES_PER_CELL  # new files the running cell may still bring down
        self.held: dict[str, Stat] = {}  # new files a flood left in the sandbox (NEW_FILES_PER_CELL), for %sync
        self._reported = Landing()  # the environments and repositories the last change report makes

    def take_handled(self) -> tuple[dict[str, list[int]], list[str]]:
        """The reported changes and deletions handled since the last call, for the runtime (``Synced``)."""
        handled = (self._acked, self._gone)
        self._acked, self._gone = {}, []
        self._new_left = NEW_FILES_PER_CELL  # a new cell (or %sync) begins
        return handled

    def remote_path(self, rel: str) -> str:
        return posixpath.join(self._sandbox.workdir, rel)

    async def pull(self, changes: FileChanges, retry_failed: bool = False) -> SyncReport:
        """Download what a cell changed, as the runtime reported it (checked in ``protocol.py``, still untrusted).

        ``retry_failed`` (for %sync) tries again the files that failed in a way
        a plain retry would repeat.
        """
        report = SyncReport()
        changed, deleted = reported_paths(changes, report, say_truncated=not self._truncated_said)
        if not changes.partial:
            self._truncated_said = changes.truncated
        changed = [(raw, st) for raw, st in changed if self._acked.get(raw) != _ack_form(st)]  # came down while the cell ran
        if retry_failed:  # %sync: what failed before, and what a flood left in the sandbox
            self.failed.clear()
            named = {raw for raw, _ in changed}
            changed = sorted(changed + [(raw, st) for raw, st in self.held.items() if raw not in named])
            self.held.clear()
        await asyncio.to_thread(self._rules.forget_gitignores)  # reads files, and git's config the first time
        self._reported = landing_of(_normalised([raw for raw, _ in changed]))
        landing = self._reported | await asyncio.to_thread(local_landing, self._folder, [raw for raw, _ in changed])
        plan = await asyncio.to_thread(
            plan_down,
            changed,
            report,
            self._config,
            self._rules,
            self.failed,
            self._secrets_noticed,
            landing,
            self._sandbox.toolbox.on_this_disk,
        )
        self._secrets_noticed.update(report.secrets_down + report.code_kept)
        for raw, reported in plan.acked:
            self._ack(raw, reported)
        wanted = plan.wanted if retry_failed else self._hold_flood(plan.wanted, report)
        max_file = int(self._config.sync_max_file_mb * MB)
        for start in range(0, len(wanted), BATCH_FILES):
            chunk = wanted[start : start + BATCH_FILES]
            if not await asyncio.to_thread(self._room_for, chunk, wanted[start:], report):
                break
            limits = {self.remote_path(rel): min(reported[0], max_file) for rel, _, reported in chunk}
            try:
                contents = await self._sandbox.toolbox.download(list(limits), limits)
            except DaytonaKernelError as exc:
                report.left_behind += [(rel, f"{exc}; it is tried again after the next cell") for rel, _, _ in chunk]
                continue
            await asyncio.to_thread(self._write_batch, chunk, contents, report)
        for rel, raw, reported in plan.placed:
            await self._fetch_placed(rel, raw, reported, report)
        if deleted:
            await asyncio.to_thread(self._apply_deletions, deleted, report)
        if report.down or report.trashed or report.conflicts:
            await asyncio.to_thread(self._manifest.save)
        return report

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
            if not self._sandbox.toolbox.same_file(remote, str(self._folder.root / rel)):
                st = self._folder.lstat(rel)
                target = rel
                if st is not None and not stat.S_ISREG(st.st_mode):
                    raise MirrorError("a folder, symlink or special file is in its place here, and is not replaced")
                if st is not None and (rel.lower().endswith(".ipynb") or self._manifest.locally_changed(rel, file_stat(st))):
                    target = _free_conflict_name(self._folder, rel)  # an earlier conflict copy is never replaced
                path = await asyncio.to_thread(self._folder.path_for_writing, target)
                try:
                    await self._sandbox.toolbox.fetch(remote, str(path), self._links)
                except NotShared:  # never a copy of a file over the cap: skipped, as on Daytona
                    report.skipped.append((rel, over_the_cap(reported[0], self._config)))
                    self._ack(raw, reported)
                    return
                if target != rel:
                    report.conflicts.append((rel, target))
                    self._ack(raw, reported)
                    return
                report.down.append(rel)
            await asyncio.to_thread(self._manifest.record_file, rel)
        except (MirrorError, OSError) as exc:
            self._left_behind(
                rel, raw, reported, str(exc) if isinstance(exc, MirrorError) else exc.strerror or str(exc), False, report
            )
            return
        self._ack(raw, reported)

    def _hold_flood(self, wanted: list[tuple[str, str, Stat]], report: SyncReport) -> list[tuple[str, str, Stat]]:
        """At most NEW_FILES_PER_CELL files this folder has never had come down with one cell; the others stay in
        the sandbox, acknowledged (not reported again) and remembered for %sync, with one notice."""
        taken: list[tuple[str, str, Stat]] = []
        held: list[tuple[str, str, Stat]] = []
        for entry in wanted:
            if entry[0] not in self._manifest:
                if self._new_left <= 0:
                    held.append(entry)
                    continue
                self._new_left -= 1
            taken.append(entry)
        for _, raw, reported in held:
            self.held[raw] = reported
            self._ack(raw, reported)
        report.held = [rel for rel, _, _ in held]
        return taken

    def _room_for(self, chunk: list[tuple[str, str, Stat]], rest: list[tuple[str, str, Stat]], report: SyncReport) -> bool:
        """Would writing ``chunk`` leave this disk with at least ``disk_margin`` free? If not, nothing more comes
        down with this sync (the files stay in the sandbox, reported again after the next cell) and a notice says so."""
        try:
            usage = shutil.disk_usage(self._folder.root)
        except OSError as exc:
            log.warning("could not tell the free space of %s (%s); the download goes on unchecked", self._folder.root, exc)
            return True
        need = sum(reported[0] for _, _, reported in chunk)
        margin = disk_margin(usage.total)
        if usage.free - need >= margin:
            return True
        report.disk_full = (
            f"{len(rest)} file(s) ({size_text(sum(st[0] for _, _, st in rest))}) stay in the sandbox: copying them would "
            f"leave less than {size_text(margin)} free on this disk ({size_text(usage.free)} free now). Free some space; they "
            "come after the next cell, or with %sync."
        )
        return False

    def _ack(self, raw: str, reported: Stat) -> None:
        self._acked[raw] = _ack_form(reported)

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
                self._left_behind(
                    rel, raw, reported, f"it is {size_text(len(content))}, more than the sandbox reported", False, report
                )
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
            self.failed[raw] = reported
            report.left_behind.append((rel, f"{why}; run %sync to try again, or fetch it with %download {rel}"))

    def _apply_deletions(self, deleted: list[str], report: SyncReport) -> None:
        """Deletions the sandbox reported (with sync_deletes): each file goes to this machine's trash, unless it is a
        notebook, code, or changed here since the last sync (kept, and sent up again with the next cell)."""
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
                if st is not None and not stat.S_ISREG(st.st_mode):
                    continue
                if st is not None and self._manifest.locally_changed(rel, file_stat(st)):
                    report.kept.append(rel)
                    continue
                if st is not None:
                    self._folder.trash(rel)
                    report.trashed.append(rel)
            except MirrorError as exc:
                report.refused.append((shown(raw), str(exc)))
                continue
            except OSError as exc:
                report.left_behind.append((raw, f"not moved to the trash here, so kept: {exc.strerror or exc}"))
                continue
            self._manifest.pop(rel, None)

    async def download_paths(self, remote: str, dest: str | None, start_in: str) -> SyncReport:
        """%download: fetch a sandbox file here (a conflict copy if the local one changed).

        The local path stays inside the notebook folder and out of .git; a file
        that looks like a secret may be fetched this way.
        """
        report = SyncReport()
        remote_path = remote if remote.startswith("/") else self.remote_path(posixpath.join(start_in, remote))
        name = posixpath.join(start_in, dest or (remote if not remote.startswith("/") else posixpath.basename(remote)))
        try:
            rel = safe_relpath(name)
        except MirrorError as exc:
            raise MirrorError(
                f"%download: {name} cannot be written here: {exc}. Give a DEST inside the notebook folder."
            ) from None
        if any(self._rules.classify(part, True) == NEVER_REASON for part in rel.split("/")):
            raise MirrorError(f"%download: {rel} is inside a version-control folder; the mirror never writes there.")
        content = (await self._sandbox.toolbox.download([remote_path]))[remote_path]
        if isinstance(content, FileError):
            raise MirrorError(f"%download: could not fetch {remote} from the sandbox: {content.message}")
        await asyncio.to_thread(_write_down, self._folder, self._manifest, rel, content, -1, report)
        return report


def _ack_form(reported: Stat) -> list[int]:
    """A handled change as the runtime learns it (``Synced.acked``): [size, mtime, mode], without an unknown mode."""
    return [reported[0], reported[1], reported[2]] if reported[2] >= 0 else [reported[0], reported[1]]


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
    """What the folders on the way of these reported paths hold here (``Landing``): the markers of a Python
    environment or a repository, keyed as the rule keys them (``path_key``). Every folder here whose name has the
    same key counts (``Evil/`` and ``evil/`` are one folder on a case-insensitive disk). Each folder here is
    listed and its names keyed once, however many of its sub-folders the report names."""
    keyed: dict[str, dict[str, list[tuple[str, str]]]] = {}  # folder here -> {name key: [(name, kind)]}

    def names_in(here: str) -> dict[str, list[tuple[str, str]]]:
        if here not in keyed:
            by_key: dict[str, list[tuple[str, str]]] = {}
            for entry, kind in folder.listing(here).items():
                by_key.setdefault(name_key(entry), []).append((entry, kind))
            keyed[here] = by_key
        return keyed[here]

    matches: dict[str, list[str]] = {"": [""]}  # folder key -> the folders here with that key
    markers: dict[str, frozenset[str]] = {}
    for rel in _normalised(raws):
        for above in folders_above(path_key(rel)):
            if above in markers:
                continue
            if above not in matches:
                parent, _, name = above.rpartition("/")
                matches[above] = [
                    posixpath.join(here, entry)
                    for here in matches.get(parent, [])
                    for entry, kind in names_in(here).get(name, [])
                    if kind == "dir"
                ]
            markers[above] = frozenset(
                marker
                for here in matches[above]
                for marker in MARKERS
                for _, kind in names_in(here).get(marker, [])
                if (kind == "dir") == (marker in MARKER_FOLDERS)
            )
    return Landing(markers)
