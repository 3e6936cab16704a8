"""The volume copy of the working directory on the volume, and its restore.

Standard library only, Python 3.9+: it runs in the sandbox, sent with the runtime.

The cell's working directory is on the sandbox's own disk, where every library
works (renames, appends, seeks, sqlite). The volume keeps a copy of it that
outlives the sandbox. On Daytona the volume is mount-s3, so the copy is written
the only way mount-s3 allows: each file opened new (or truncated) and written
front to back. Nothing on the volume is ever renamed, appended to, seeked,
chmod-ed or touched.

- ``restore()`` runs in the bootstrap, before the first cell: on a disk with no
  record of a copy (a new or recreated sandbox) it copies every file of the
  volume that the working directory lacks. A disk that has a record (a restarted
  context, a sandbox started again) is left as it is. What does not fit in the
  restore's time budget is restored by the background thread (``pending``).
- ``wake()``: a background thread scans the working directory and copies the
  files that changed since their last copy, and removes from the volume the files
  that were deleted. ``flush()`` runs a pass at once and waits for it, boundedly:
  at each cell's end (before the cell is reported done, so that a stop nobody
  announces, which SIGKILLs every process, finds the finished cell's files on the
  volume; what does not fit in the wait is copied on in the background) and at a
  shutdown. ``last_pass()`` copies what the interpreter's exit wrote, as far as it
  can finish before the daemon kills the worker (a context's deletion only: a
  sandbox's stop runs no exit at all).
- The record (``.daytona-kernel-volume-copy.json`` beside the working directory,
  on the disk) holds each file's size and mtime as last copied, so nothing
  already there is copied again. It stays out of the working directory, which
  starts empty as with ipykernel.
"""

import json
import os
import shutil
import threading
import time

RECORD = ".daytona-kernel-volume-copy.json"  # in the working directory's parent folder
COPY_BLOCK_BYTES = 1024 * 1024
SETTLE_S = 0.05  # after a wake, let a burst of wakes pass before scanning
# What the pass at the interpreter's exit may copy, in bytes. It has the daemon's 2 s between SIGTERM and SIGKILL,
# and a volume file is written in place (mount-s3 cannot rename): a copy cut off there would leave a truncated file
# where a whole one was. A file past what is left of this stays as last copied, and due (the record is not updated).
EXIT_COPY_BYTES = 16 * 1024 * 1024


def _copy_whole(src, dst):
    """Copy src to dst front to back (dst new or truncated): all that mount-s3 allows."""
    parent = os.path.dirname(dst)
    if parent:
        os.makedirs(parent, exist_ok=True)
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        shutil.copyfileobj(fin, fout, COPY_BLOCK_BYTES)


def _stat_key(path):
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns]


class VolumeCopy(object):
    """See the module docstring. ``scan()`` returns ({rel: (size, mtime_ns, ...)}, complete)."""

    def __init__(self, workdir, volume, scan, always=(), notice=None, link=False):
        self.workdir = workdir
        self.volume = volume
        self._link = link  # the volume is a folder on the same disk (the local backend): its copy is hard links
        self._scan = scan
        self._always = tuple(always)  # copied even where the mirror's rules exclude them (the checkpoint)
        self._notice = notice or (lambda text: None)
        self._record = {}
        self._wake = threading.Event()
        self._idle = threading.Condition()
        self._passes = 0
        self._running = False
        self._hurried = threading.Event()  # a flush waits: no settle pause before its pass, or the end of one begun
        self._exit_budget = None  # bytes the exit's pass may copy (``last_pass``); None: no limit
        self._thread = None
        self._failed = set()  # paths whose copy failed and was already reported
        self.pending = []  # volume files still to restore, after the restore's budget ran out

    # -- restore -------------------------------------------------------------

    def restore(self, budget_s=None):
        """Fill a fresh working directory from the volume. Returns (files restored, problems).

        Files left when ``budget_s`` runs out go to ``pending``; ``wake()`` restores them.
        """
        try:
            with open(self._record_path(), encoding="utf-8") as f:
                self._record = json.load(f)
            return 0, []
        except (OSError, ValueError):
            self._record = {}  # a new disk (or an unreadable record): restore
        files = self._volume_files()
        deadline = None if budget_s is None else time.monotonic() + budget_s
        restored, problems = 0, []  # type: int, list
        for index, rel in enumerate(files):
            if deadline is not None and time.monotonic() > deadline:
                self.pending = files[index:]
                break
            done = self._restore_one(rel, problems)
            restored += done
        self._save()
        return restored, problems

    def _restore_one(self, rel, problems):
        dst = os.path.join(self.workdir, rel)
        if os.path.lexists(dst):
            return 0  # the disk's version is the newer one; it is copied up after the next cell
        src = os.path.join(self.volume, rel)
        try:
            _copy_whole(src, dst)  # a copy: two sandboxes restored from one volume must not share files
            mtime = os.stat(src).st_mtime_ns
            os.utime(dst, ns=(mtime, mtime))
            self._record[rel] = _stat_key(dst)
            return 1
        except OSError as exc:  # e.g. being written by another sandbox right now
            problems.append("%s (%s)" % (rel, exc.strerror or exc))
            return 0

    def _restore_pending(self):
        pending, self.pending = self.pending, []
        problems = []  # type: list
        restored = sum(self._restore_one(rel, problems) for rel in pending)
        self._save()
        text = "daytona-kernel: restored the last %d file(s) from the volume.\n" % restored
        if problems:
            text += "daytona-kernel: could not restore from the volume: %s\n" % ", ".join(problems[:10])
        self._notice(text)

    def _volume_files(self):
        files = []
        for folder, dirs, names in os.walk(self.volume):
            dirs.sort()
            rel_folder = os.path.relpath(folder, self.volume)
            for name in sorted(names):
                files.append(name if rel_folder == "." else os.path.join(rel_folder, name).replace(os.sep, "/"))
        return files

    # -- the copy ------------------------------------------------------------

    def _put(self, src, dst):
        """dst gets src's content: a hard link where ``link`` allows (dst's old name is removed first,
        never truncated: it may share its file with src), else a whole copy."""
        if self._link:
            try:
                if os.path.lexists(dst):
                    os.unlink(dst)
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                os.link(src, dst)
                return
            except OSError:
                pass  # another disk after all: copy
        _copy_whole(src, dst)

    def wake(self):
        """Something may have changed: copy it in the background."""
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="daytona-kernel-durable-copy", daemon=True)
            self._thread.start()
        self._wake.set()

    def flush(self, timeout):
        """Wake the copier and wait until a full pass has run. True if it finished in time."""
        with self._idle:  # a pass already running may have scanned too early: wait for the next one
            target = self._passes + (2 if self._running else 1)
            self._hurried.set()
        self.wake()
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._passes < target:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def last_pass(self, timeout):
        """At the interpreter's exit: a full pass, by the copier's thread when it runs (it may be in a pass),
        else here (from Python 3.12 no thread can start once the interpreter exits). True if it finished in time."""
        self._exit_budget = EXIT_COPY_BYTES  # read when its pass starts (a running pass is waited out, not used)
        if self._thread is not None and self._thread.is_alive():
            return self.flush(timeout)
        self.copy_changes()
        return True

    def _loop(self):
        while True:
            self._wake.wait()
            self._hurried.wait(SETTLE_S)
            with self._idle:
                self._running = True
                self._hurried.clear()
                self._wake.clear()
            try:
                if self.pending:
                    self._restore_pending()
                self.copy_changes()
            except Exception as exc:  # the thread must survive anything; the next wake tries again
                self._notice("daytona-kernel: the copy of the working directory to the volume failed: %r\n" % (exc,))
            with self._idle:
                self._running = False
                self._passes += 1
                self._idle.notify_all()

    def copy_changes(self):
        """One pass: copy changed files to the volume, remove deleted ones. Returns the paths copied."""
        now, complete = self._scan()
        current = {rel: [st[0], st[1]] for rel, st in now.items()}
        for rel in self._always:
            try:
                current[rel] = _stat_key(os.path.join(self.workdir, rel))
            except OSError:
                continue  # not made yet
        copied, removed = [], []
        budget, self._exit_budget = self._exit_budget, None
        for rel in sorted(current):
            if self._record.get(rel) == current[rel]:
                continue
            if budget is not None:
                if current[rel][0] > budget:
                    continue  # the exit's pass: no copy it may not finish (the file stays due)
                budget -= current[rel][0]
            src = os.path.join(self.workdir, rel)
            try:
                self._put(src, os.path.join(self.volume, rel))
                after = _stat_key(src)
            except OSError as exc:
                if not os.path.lexists(src):  # a cell deleted it meanwhile: the volume ends as the disk does
                    self._forget(rel)
                    removed.append(rel)  # the record changed either way: saved below
                    continue
                if rel not in self._failed:
                    self._failed.add(rel)
                    self._notice(
                        "daytona-kernel: could not copy %s to the volume (%s); it stays on the sandbox's disk\n" % (rel, exc)
                    )
                continue
            self._failed.discard(rel)
            if after == current[rel]:  # changed while we copied: the next pass copies it again
                self._record[rel] = after
            copied.append(rel)
        if complete:
            removed += self._remove_deleted(current)
        if copied or removed:
            self._save()
        return copied

    def _remove_deleted(self, current):
        """A complete scan's deletions: what the record has and the disk no longer does leaves the volume."""
        removed = []
        for rel in [r for r in self._record if r not in current]:
            if os.path.lexists(os.path.join(self.workdir, rel)):
                del self._record[rel]  # excluded now, not deleted: the volume keeps its copy
            elif self._forget(rel):
                removed.append(rel)
        return removed

    def _forget(self, rel):
        """rel is gone from the disk: its copy (whole or partial) leaves the volume, then the record. If the
        volume refuses, the record keeps a key no scan matches, so the next complete pass removes it again.
        True once the volume no longer has it."""
        self._failed.discard(rel)
        try:
            os.remove(os.path.join(self.volume, rel))
        except FileNotFoundError:
            pass  # never reached the volume, or already gone from it: nothing lost
        except OSError as exc:
            self._notice("daytona-kernel: could not remove %s from the volume (%s)\n" % (rel, exc))
            self._record[rel] = [-1, -1]
            return False
        self._record.pop(rel, None)
        return True

    def _record_path(self):
        return os.path.join(os.path.dirname(os.path.abspath(self.workdir)), RECORD)

    def _save(self):
        path = self._record_path()
        try:
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                json.dump(self._record, f)
            os.replace(path + ".tmp", path)  # on the disk, where rename works
        except OSError as exc:
            self._notice(
                "daytona-kernel: could not save the record of the volume copy (%s); the next start restores again\n" % (exc,)
            )
