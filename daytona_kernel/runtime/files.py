"""The working directory as the kernel sees it: change reports, the volume's copy, checkpoints.

Standard library only, Python 3.9+: it runs in the sandbox, sent with the runtime.
``WorkdirWatch`` tells the kernel which files a cell created, changed or deleted
(the mirror downloads them); ``open_volume`` restores a new sandbox's working
directory from the volume and keeps the volume's copy; ``save_checkpoint`` and
``load_checkpoint`` pickle the user's variables for ``%daytona checkpoint``.
"""

import hashlib
import os
import stat as _stat
import sys
import threading
import time
import types

try:
    import _daytona_kernel_durable as _durable
    import _daytona_kernel_pathrules as _pathrules
except ImportError:  # imported from the package (tests)
    from daytona_kernel.runtime import durable as _durable
    from daytona_kernel.runtime import pathrules as _pathrules

CHECKPOINT_FILE = ".daytona-kernel/checkpoint.pkl"  # relative to the working directory
SCAN_BUDGET_S = 2.0  # the per-cell scan of the working directory; past it the report says it is incomplete
RACY_WINDOW_NS = 2 * 1000000000  # mtimes this close to a scan may hide a rewrite (one-second and FAT file systems)
RACY_HASH_MAX_BYTES = 64 * 1024 * 1024
RESTORE_BUDGET_S = 15.0  # restoring in the bootstrap (a runtime call may take 30 s); the rest in the background


class WorkdirWatch(object):
    """The acknowledged snapshot of the working directory, which only the kernel's note moves on.

    Without ``rules`` (the kernel does not download changes) it only applies the modes of uploaded files.
    """

    def __init__(self, workdir, rules=None):
        self.workdir = workdir
        self.rules = rules
        self.snapshot = _pathrules.scan(workdir, rules)[0] if rules is not None else None
        self.racy = {}  # {path: (stat, sha256)} of files whose mtime cannot tell a rewrite in the same second
        self.mode_notice = None

    def note(self, note):
        """Apply the kernel's note about the last sync (``calls.Synced``, or None).

        ``up``: {path: permission bits} of files it uploaded: their modes are set
        here and they are not reported back as changed. ``acked``: {path: stat}
        of reported changes the kernel has handled; ``gone``: reported deletions
        it has handled. Changes it has not acknowledged are reported again.
        """
        if note is None:
            return
        for rel, mode in note.up.items():
            path = os.path.join(self.workdir, rel)
            if mode is not None:
                try:
                    os.chmod(path, mode & 0o777)
                except OSError as exc:  # a filesystem without chmod: said once, with the next report
                    if self.mode_notice is None:
                        self.mode_notice = "daytona-kernel: this folder does not keep file modes (%s: %s)\n" % (rel, exc)
            self.racy.pop(rel, None)  # its content is the kernel's: looked at afresh in the next scan
            if self.snapshot is None:
                continue
            try:
                self.snapshot[rel] = _pathrules.file_stat(os.lstat(path))
            except OSError:
                self.snapshot.pop(rel, None)
        if self.snapshot is None:
            return
        for rel, stat in note.acked.items():
            self.snapshot[rel] = tuple(stat) if len(stat) == 3 else (stat[0], stat[1], None)
        for rel in note.gone:
            self.snapshot.pop(rel, None)

    def take_notice(self):
        """The file-mode notice, once per runtime."""
        notice = self.mode_notice or ""
        if notice:
            self.mode_notice = ""  # set: later failures are not said again
        return notice

    def peek(self, sent):
        """While a cell runs: {path: stat} of the files changed against the acknowledged snapshot whose stat is not
        the one in ``sent`` (reported earlier in this cell). Only new and changed files: a deletion waits for the end."""
        if self.snapshot is None:
            return {}
        now, _ = _pathrules.scan(self.workdir, self.rules, budget_s=LIVE_SCAN_BUDGET_S)
        snapshot = self.snapshot
        return {rel: list(stat) for rel, stat in now.items() if snapshot.get(rel) != stat and sent.get(rel) != stat}

    def changes(self):
        """Changes against the acknowledged snapshot, or None.

        A path that is merely unreadable now (a folder without permission) is
        not reported as deleted.
        """
        if self.snapshot is None:
            return None
        started_ns = time.time_ns()
        now, complete = _pathrules.scan(self.workdir, self.rules, budget_s=SCAN_BUDGET_S)
        if not complete:  # a flood: the files the kernel already has are still looked at, one by one
            now.update(known_files(self.workdir, self.snapshot, now))
        changed = {rel: list(stat) for rel, stat in now.items() if self.snapshot.get(rel) != stat}
        rewritten, self.racy = rewritten_in_place(self.workdir, self.racy, now, changed, started_ns)
        for rel in rewritten:
            changed[rel] = list(now[rel])
        deleted = [rel for rel in self.snapshot if rel not in now and _pathrules.gone(self.workdir, rel)] if complete else []
        if changed or deleted or not complete:
            return {"changed": changed, "deleted": deleted, "truncated": not complete}
        return None


def known_files(workdir, snapshot, found):
    """The snapshot's regular files that a scan cut short did not reach, with their stat now."""
    known = {}
    for rel in snapshot:
        if rel in found:
            continue
        try:
            st = os.lstat(os.path.join(workdir, rel))
        except OSError:
            continue  # gone or unreadable: not listed (a deletion is only reported after a complete scan)
        if _stat.S_ISREG(st.st_mode):
            known[rel] = _pathrules.file_stat(st)
    return known


def rewritten_in_place(workdir, racy, now, changed, started_ns):
    """(files whose size and mtime stayed the same while their content changed, the new racy table).

    With one-second mtimes a same-size rewrite within the second looks
    unchanged, so the content of every file whose mtime is that close to a scan
    is hashed, and compared at the next scan (as git treats "racily clean"
    entries). Only such recent files are hashed. ``racy`` is {path: (stat, sha256)}.
    """
    rewritten, still_racy = [], {}
    for rel, stat in now.items():
        known = racy.get(rel)
        recent = stat[1] >= started_ns - RACY_WINDOW_NS
        if (known is None and not recent) or stat[0] > RACY_HASH_MAX_BYTES:
            continue
        try:
            digest = _file_digest(os.path.join(workdir, rel))
        except OSError:
            continue  # gone or unreadable since the scan: the next scan says so
        if known is not None and known[0] == stat and known[1] != digest and rel not in changed:
            rewritten.append(rel)
        if recent:
            still_racy[rel] = (stat, digest)
    return rewritten, still_racy


LIVE_REPORT_S = 2.0  # a running cell's new and changed files are reported this often, for the kernel to copy
LIVE_SCAN_SHARE = 20  # ... or less often: a live scan takes at most a twentieth of the cell's time
LIVE_SCAN_BUDGET_S = 0.5  # and stops after this long (what it did not reach comes with the cell's own report)


class LiveReports(object):
    """While one cell runs: every LIVE_REPORT_S seconds (longer when a scan is slow: at most a twentieth of the time
    goes to scanning) the files changed since the last report, sent as a ``files`` frame marked ``partial``. A cell
    shorter than LIVE_REPORT_S never scans. The report at the cell's end is the complete one, as before.
    The scan holds the interpreter's lock while it runs, which slows a cell doing many small writes (each
    write waits for the lock): hence its small share of the time (LIVE_SCAN_SHARE) and budget."""

    def __init__(self, watch, send, write_err):
        self._watch = watch
        self._send = send
        self._write_err = write_err
        self._sent = {}
        self._stop = threading.Event()
        self._busy = threading.Lock()  # held while a scan and its report are under way
        threading.Thread(target=self._run, name="daytona-kernel-live-files", daemon=True).start()

    def _run(self):
        wait = LIVE_REPORT_S
        while not self._stop.wait(wait):
            with self._busy:
                if self._stop.is_set():
                    return
                started = time.monotonic()
                try:
                    changed = self._watch.peek(self._sent)
                except Exception as exc:  # never into the cell: the report at its end still comes
                    self._write_err(
                        "daytona-kernel: files are copied back only when this cell ends (%s: %s)\n" % (type(exc).__name__, exc)
                    )
                    return
                if changed:
                    for rel, stat in changed.items():
                        self._sent[rel] = tuple(stat)
                    self._send({"changed": changed, "deleted": [], "truncated": False, "partial": True})
                wait = max(LIVE_REPORT_S, LIVE_SCAN_SHARE * (time.monotonic() - started))

    def stop(self):
        """Before the cell's own report: a scan under way finishes first, and no partial report comes after it.
        A short cell's thread, still waiting, is not waited for: it ends by itself."""
        self._stop.set()
        with self._busy:
            pass


EXPLAINED_CHAIN = 10  # errors of a chain (raise ... from, or during handling) that get the note
OUTSIDE_LISTED = 5  # paths named in the notice of writes outside the mirrored folder
_watcher = None  # the process's OutsideTheMirror, seen by the audit hook (installed once per process)


def _on_audit(event, args):
    if event == "open" and _watcher is not None:
        _watcher.opened(*args[:3])


class OutsideTheMirror(object):
    """Paths a cell reaches outside the working directory, which is the mirrored project folder.

    A read there fails (the file is not in the sandbox): ``explain`` adds a note to the error
    naming the user's path and the setting. A write there succeeds in the sandbox but never
    comes back: ``opened`` (an audit hook on ``open``) records it and ``take_notice`` says so
    after the cell. Only relative paths count: they are the user's own (``../results/x.csv``);
    libraries and the runtime write absolute paths (temporary files, caches, the journal).
    """

    def __init__(self, workdir, local_root, excludes=(), includes=()):
        global _watcher
        self.workdir = os.path.realpath(workdir)
        self.local_root = local_root
        self._patterns = (list(excludes), list(includes))
        self._written = []
        if _watcher is None:
            sys.addaudithook(_on_audit)
        _watcher = self

    def _outside(self, path):
        """(the path as text, its absolute sandbox path) when it is outside the working directory, else None."""
        try:
            path = os.fsdecode(path)
        except TypeError:
            return None  # a file descriptor
        if not path:
            return None
        full = os.path.normpath(os.path.join(os.getcwd(), path))
        if full == self.workdir or full.startswith(self.workdir + os.sep):
            return None
        return path, full

    def _shown(self, path, full):
        """The path as the user knows it: on their machine, for a relative one."""
        if os.path.isabs(path):
            return path
        return os.path.normpath(os.path.join(self.local_root, os.path.relpath(full, self.workdir)))

    def opened(self, path, mode, flags):
        if isinstance(flags, int):
            writes = flags & (os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT)
        else:
            writes = isinstance(mode, str) and any(c in mode for c in "wax+")
        found = self._outside(path) if writes else None
        if found is None or os.path.isabs(found[0]) or len(self._written) >= 1000:
            return
        shown = self._shown(*found)
        if shown not in self._written:
            self._written.append(shown)

    def explain(self, exc):
        """Add a note to a FileNotFoundError (or NotADirectoryError) for a path outside the mirrored folder,
        or inside it but left out by the mirror's rules (.gitignore, sync_exclude, secrets ...): the error
        itself or one it was raised from or while handling (a library's own error around it)."""
        seen = 0
        while exc is not None and seen < EXPLAINED_CHAIN:
            self._explain_one(exc)
            exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
            seen += 1

    def _explain_one(self, exc):
        if not isinstance(exc, (FileNotFoundError, NotADirectoryError)) or exc.filename is None:
            return
        found = self._outside(exc.filename)
        if found is not None and not os.path.exists(found[1]):
            note = (
                "daytona-kernel: %s is outside the project folder mirrored into the sandbox (%s), so it is not here. "
                "Set DaytonaKernel.sync_root to a folder that contains it." % (self._shown(*found), self.local_root)
            )
        else:
            note = self._left_out(exc.filename)
        if note is None:
            return
        notes = getattr(exc, "__notes__", None)
        if not isinstance(notes, list):
            notes = exc.__notes__ = []  # type: ignore[union-attr]  # Python 3.11's notes, set by hand on older ones
        if note not in notes:
            notes.append(note)

    def _left_out(self, path):
        """The note for a missing path inside the mirrored folder that the mirror's rules leave out, or None."""
        try:
            full = os.path.normpath(os.path.join(os.getcwd(), os.fsdecode(path)))
        except TypeError:
            return None
        if os.path.exists(full) or not full.startswith(self.workdir + os.sep):
            return None
        rel = os.path.relpath(full, self.workdir).replace(os.sep, "/")
        excludes, includes = self._patterns
        reason = _pathrules.MirrorRules(self.workdir, excludes, includes).check(rel, False)
        why = {
            _pathrules.NEVER_REASON: "it is never mirrored",
            _pathrules.SECRET_REASON: "it looks like a secret, which stays on your machine",
            _pathrules.IGNORED_REASON: ".gitignore, sync_exclude or a default exclude leaves it out",
        }.get(reason)
        if why is None:
            return None
        return (
            "daytona-kernel: %s is not mirrored into the sandbox: %s. Name it in DaytonaKernel.sync_include to mirror it, "
            "or send it once with %%upload." % (os.path.join(self.local_root, rel), why)
        )

    def take_notice(self):
        """After a cell: the writes outside the mirrored folder, once."""
        written, self._written = self._written, []
        if not written:
            return ""
        more = " and %d more" % (len(written) - OUTSIDE_LISTED) if len(written) > OUTSIDE_LISTED else ""
        return (
            "daytona-kernel: this cell wrote %s%s outside the project folder mirrored back from the sandbox (%s); "
            "it stays in the sandbox. Set DaytonaKernel.sync_root to a folder that contains it.\n"
            % (", ".join(written[:OUTSIDE_LISTED]), more, self.local_root)
        )


def _file_digest(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1024 * 1024), b""):
            digest.update(block)
    return digest.hexdigest()


def open_volume(workdir, options, notice):
    """(the volume's VolumeCopy or None, the notice for the first cell): a new sandbox's files come back from the volume."""
    volume = options.volume_dir
    if not volume:
        return None, ""
    volume = os.path.normpath(os.path.join(workdir, volume))
    if not os.path.isdir(volume):
        return (
            None,
            "daytona-kernel: the volume is not mounted at %s; files in the working directory are not kept on it.\n" % volume,
        )

    def scan():  # what the volume keeps: what the mirror would move (its own rules: this runs in the copier's thread)
        excludes = list(options.sync_excludes) + list(options.volume_excludes)
        return _pathrules.scan(workdir, _pathrules.MirrorRules(workdir, excludes, options.sync_includes, secrets=()))

    link = options.volume_link
    durable = _durable.VolumeCopy(workdir, volume, scan, always=(CHECKPOINT_FILE,), notice=notice, link=link)
    restored, problems = durable.restore(RESTORE_BUDGET_S)
    text = ""
    if restored:
        text += "daytona-kernel: restored %d file(s) from the volume into this new sandbox's working directory.\n" % restored
    if durable.pending:
        text += "daytona-kernel: %d more file(s) are being restored from the volume in the background.\n" % len(durable.pending)
        durable.wake()
    if problems:
        text += "daytona-kernel: could not restore from the volume: %s\n" % ", ".join(problems[:10])
    return durable, text


def _pickler():
    for name in ("cloudpickle", "dill"):
        try:
            return name, __import__(name)
        except ImportError:
            continue  # try the next one; the standard library's pickle is the last resort
    import pickle

    return "pickle", pickle


def save_checkpoint(path, user_ns, hidden):
    """Pickle every picklable user variable to path; the reply says what was saved and skipped."""
    name, pickler = _pickler()
    saved, skipped = {}, []
    for var, value in list(user_ns.items()):
        if var in hidden or var.startswith("_") or isinstance(value, types.ModuleType):
            continue
        try:
            saved[var] = pickler.dumps(value)
        except Exception as exc:
            skipped.append("%s (%s)" % (var, type(exc).__name__))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    blob = pickler.dumps({"pickler": name, "variables": saved})
    with open(path + ".tmp", "wb") as f:
        f.write(blob)
    os.replace(path + ".tmp", path)
    return {"saved": sorted(saved), "skipped": skipped, "pickler": name, "bytes": len(blob)}


def load_checkpoint(path, user_ns):
    """Load a checkpoint's variables back into user_ns; the reply says what came back and what failed."""
    _, pickler = _pickler()
    with open(path, "rb") as f:
        data = pickler.loads(f.read())
    restored, failed = [], []
    for var, blob in data["variables"].items():
        try:
            user_ns[var] = pickler.loads(blob)
            restored.append(var)
        except Exception as exc:
            failed.append("%s (%s)" % (var, type(exc).__name__))
    return {"restored": sorted(restored), "failed": failed, "pickler": data.get("pickler")}
