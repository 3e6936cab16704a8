"""The session journal: what a cell printed, kept on the sandbox's disk, so a new kernel can attach.

Standard library only, Python 3.9+. It has two users:

- the runtime (inside the interpreter context): ``Journal`` records every write of a
  cell's output (frames and text, exactly what goes to the daemon) and the session's
  state: running or idle, execution count, variables, when the last cell ended;
- the kernel, through ``process.exec`` (``python3 -c <this source> VERB ...``): ``scan``
  lists the sessions, ``read`` returns what a cell wrote since an offset, ``claim`` makes
  a kernel the session's owner (compare-and-swap under a lock), ``remove`` deletes one.
  ``process.exec`` runs beside the interpreter, so it works while the cell still runs
  (a new execute on the context would wait behind it: see docs/reattach.md).

Layout, under the journal root (``/home/daytona/.daytona-kernel/journal``), one folder
per interpreter context::

    <context id>/meta.json     the session's state, rewritten whole (tmp + rename)
    <context id>/owner.json    which kernel process owns it; only ``claim`` changes it
    <context id>/out.<n>.jsonl the current cell's output, one {"type", "text"} line per
                               write; rotated at FILE_BYTES, the last two files kept

The daemon drains the worker's stdout whether or not a client listens (output with no
client is dropped), so the journal is the only copy of what a detached cell prints.
"""

import json
import os
import re
import sys
import time
import types

VERSION = 1
FILE_BYTES = 4 * 1024 * 1024  # one journal file; two are kept, so a replay shows up to the last 8 MiB
READ_BYTES = 2 * 1024 * 1024  # the most one ``read`` returns (the next read goes on from there)
SESSION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
OUT_FILE = re.compile(r"^out\.(\d+)\.jsonl$")
INPUTS_KEPT = 1000  # how many past inputs an attaching kernel gets for its history
PIECE_MARK = " + "  # after "<MARK><token>": a frame piece that more pieces follow


def _write_json(path, value):
    tmp = "%s.tmp-%d" % (path, os.getpid())
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(value, f)
    os.replace(tmp, path)


def _read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _out_files(folder):
    """[(n, name)] of the journal files, oldest first."""
    found = []
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    for name in names:
        match = OUT_FILE.match(name)
        if match:
            found.append((int(match.group(1)), name))
    return sorted(found)


def _frame_mark():
    try:
        import _daytona_kernel_framing as framing
    except ImportError:  # imported directly, e.g. by unit tests
        from daytona_kernel.runtime import framing
    return framing.MARK


def _alive(pid):
    try:
        os.kill(int(pid), 0)
    except (OSError, ValueError, TypeError):
        return False
    return True


class _Tee(object):
    """A worker stream that also appends what passes through it to the journal."""

    def __init__(self, journal, inner, kind):
        self._journal = journal
        self.inner = inner
        self._kind = kind

    def write(self, text):
        self._journal.record(self._kind, text)
        return self.inner.write(text)

    def flush(self):
        flush = getattr(self.inner, "flush", None)
        if flush is not None:
            flush()

    def __getattr__(self, name):
        return getattr(self.inner, name)


class Journal(object):
    """The runtime's side. ``options`` come from the kernel (see ``journal_options`` there)."""

    def __init__(self, runtime, options):
        self._rt = runtime
        self.folder = os.path.join(runtime.workdir, options["root"], options["session"])
        self.instance = options["instance"]
        self.meta = {
            "version": VERSION,
            "session": options["session"],
            "notebook": options.get("notebook") or "",
            "token": runtime.token,
            "pid": os.getpid(),
            "python": "%d.%d.%d" % sys.version_info[:3],
            "count": 0,
            "variables": 0,
            "state": "idle",
            "cell": 0,
            "cell_count": 0,
            "started_at": time.time(),
            "last_cell_at": 0.0,
        }
        self._armed = None  # the count of the cell about to run
        self._file = None
        self._n = 0
        self._size = 0
        self._mid_frame = False
        self._piece_head = None
        self.broken = ""
        os.makedirs(self.folder, mode=0o700, exist_ok=True)
        _write_json(os.path.join(self.folder, "owner.json"), options["owner"])
        _write_json(os.path.join(self.folder, "meta.json"), self.meta)

    # -- per cell ---------------------------------------------------------------

    def owned(self):
        """Whether this kernel process still owns the session (another kernel may have attached)."""
        owner = _read_json(os.path.join(self.folder, "owner.json")) or {}
        return owner.get("instance") == self.instance

    def arm(self, count):
        """The next session is a cell: journal it. False if another kernel owns the session now."""
        if not self.owned():
            return False
        self._armed = count
        return True

    def refuse(self):
        """A cell from a kernel that lost the session: one error, nothing run."""
        owner = _read_json(os.path.join(self.folder, "owner.json")) or {}
        with self._rt.session():
            self._rt.send(
                "error",
                {
                    "ename": "DaytonaKernelDetached",
                    "evalue": "this session was attached by another kernel (%s on %s); restart this kernel to "
                    "get a fresh one" % (owner.get("kernel") or "?", owner.get("host") or "?"),
                    "traceback": [],
                },
            )

    def begin(self):
        """The runtime's session began: if it is an armed cell, tee its output into a fresh journal."""
        if self._armed is None or self.broken:
            return
        rt = self._rt
        try:
            for _, name in _out_files(self.folder):
                os.remove(os.path.join(self.folder, name))
            self._n, self._size, self._mid_frame = 0, 0, False
            self._piece_head = _frame_mark() + rt.token + PIECE_MARK
            self._file = open(os.path.join(self.folder, "out.0.jsonl"), "a", encoding="utf-8")  # noqa: SIM115 (open for the cell)
            self.meta.update(state="running", cell=self.meta["cell"] + 1, cell_count=self._armed, cell_started_at=time.time())
            _write_json(os.path.join(self.folder, "meta.json"), self.meta)
        except OSError as exc:
            self._fail(exc)
            return
        rt.out.target = _Tee(self, rt.out.target, "stdout")
        rt.err.target = _Tee(self, rt.err.target, "stderr")
        rt._frame_target = rt.out.target

    def end(self):
        """The session's output is flushed: stop teeing, record the cell as done."""
        rt = self._rt
        if self._armed is None:
            return
        count, self._armed = self._armed, None
        for name in ("out", "err"):
            stream = getattr(rt, name)
            if isinstance(stream.target, _Tee):
                stream.target = stream.target.inner
        if isinstance(rt._frame_target, _Tee):
            rt._frame_target = rt._frame_target.inner
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.broken:
            return
        ns = rt.user_ns
        self.meta.update(
            state="idle",
            count=max(self.meta["count"], count),
            last_cell_at=time.time(),
            variables=sum(
                1
                for name, value in list(ns.items())
                if not name.startswith("_") and name not in rt.initial_names and not isinstance(value, types.ModuleType)
            ),
        )
        try:
            _write_json(os.path.join(self.folder, "meta.json"), self.meta)
        except OSError as exc:
            self._fail(exc)

    def record(self, kind, text):
        """One write of the cell's output. Never raises: a full disk stops the journal, not the cell."""
        f = self._file
        if f is None or not text:
            return
        try:
            if self._size >= FILE_BYTES and not self._mid_frame:
                self._rotate()
                f = self._file
            line = json.dumps({"type": kind, "text": text}) + "\n"
            f.write(line)
            f.flush()
            self._size += len(line)
            if kind == "stdout":  # never rotate between the pieces of one frame
                self._mid_frame = text.startswith(self._piece_head)
        except OSError as exc:
            self._fail(exc)

    def _rotate(self):
        self._file.close()
        old = os.path.join(self.folder, "out.%d.jsonl" % (self._n - 1))
        if os.path.exists(old):
            os.remove(old)
        self._n += 1
        self._size = 0
        self._file = open(os.path.join(self.folder, "out.%d.jsonl" % self._n), "a", encoding="utf-8")  # noqa: SIM115

    def _fail(self, exc):
        self.broken = "%s: %s" % (type(exc).__name__, exc)
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                self.broken += " (and closing it failed)"
            self._file = None

    # -- the attaching kernel's call ---------------------------------------------

    def adopt(self, instance):
        """A kernel claimed this session (``claim``) and now takes it over: reply with the
        execution count, the past inputs and the variables count."""
        self.instance = instance
        ns = self._rt.user_ns
        inputs = []
        for name, value in list(ns.items()):
            match = re.match(r"^_i(\d+)$", name)
            if match and isinstance(value, str):
                inputs.append([int(match.group(1)), value])
        inputs.sort()
        with self._rt.session():
            self._rt.send(
                "reply",
                {"count": self.meta["count"], "inputs": inputs[-INPUTS_KEPT:], "variables": self.meta["variables"]},
            )


def open_journal(runtime, options):
    """The runtime's journal, or None when the kernel did not ask for one (or it cannot be written)."""
    if not options or not SESSION_NAME.match(str(options.get("session") or "")):
        return None
    try:
        return Journal(runtime, options)
    except (OSError, KeyError, TypeError) as exc:
        runtime.err.write("daytona-kernel: this session is not journaled; reattaching to it will not work (%r)\n" % (exc,))
        return None


current = None  # the runtime's Journal, for ``adopt`` calls


def hello_sessions(journal):
    """For the runtime's hello: the sessions beside this one, so a new kernel learns of a detached
    session without another round trip. Journals of ended interpreters are removed on the way."""
    if journal is None:
        return {}
    return scan(os.path.dirname(journal.folder), prune=True)


# -- the kernel's verbs, run through process.exec ------------------------------------


def scan(root, prune=False):
    """Every session under ``root``: its meta, owner and whether its interpreter still runs.
    ``prune`` removes the folders of sessions whose interpreter is gone (their context was deleted)."""
    sessions = []
    try:
        names = sorted(os.listdir(root))
    except OSError:
        names = []
    for name in names:
        folder = os.path.join(root, name)
        meta = _read_json(os.path.join(folder, "meta.json"))
        if not SESSION_NAME.match(name) or not isinstance(meta, dict):
            continue
        if prune and not _alive(meta.get("pid")):
            remove(folder)
            continue
        sessions.append(
            {"meta": meta, "owner": _read_json(os.path.join(folder, "owner.json")) or {}, "alive": _alive(meta.get("pid"))}
        )
    return {"now": time.time(), "sessions": sessions}


def read(folder, n, offset):
    """The output records written since (file ``n``, byte ``offset``), at most READ_BYTES of them.

    Returns the meta read *before* the files (so a meta that says idle means every record
    is in), the records, where to go on from, and whether older output was rotated away.
    """
    meta = _read_json(os.path.join(folder, "meta.json")) or {}
    records, lost, size = [], False, 0
    files = [(k, name) for k, name in _out_files(folder) if k >= n]
    if files and files[0][0] > n:
        lost, n, offset = True, files[0][0], 0
    for k, name in files:
        if k > n:
            n, offset = k, 0
        try:
            with open(os.path.join(folder, name), "rb") as f:
                f.seek(offset)
                data = f.read(READ_BYTES - size)
        except OSError:
            break
        end = data.rfind(b"\n") + 1  # only whole lines; a line being written is read next time
        for line in data[:end].splitlines():
            try:
                records.append(json.loads(line.decode("utf-8", "replace")))
            except ValueError:
                continue  # a torn line after a crash: nothing to show
        offset += end
        size += end
        if size >= READ_BYTES or end < len(data):
            break
    return {"meta": meta, "records": records, "n": n, "offset": offset, "lost": lost, "alive": _alive(meta.get("pid"))}


def claim(folder, expected, owner):
    """Make ``owner`` the session's owner if ``expected`` (an instance id) still is: two kernels
    that claim at once cannot both win."""
    import fcntl

    with open(os.path.join(folder, "owner.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        current_owner = _read_json(os.path.join(folder, "owner.json")) or {}
        if current_owner.get("instance") != expected:
            return {"ok": False, "owner": current_owner}
        _write_json(os.path.join(folder, "owner.json"), owner)
        return {"ok": True, "owner": owner}


def remove(folder):
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
    return {"ok": not os.path.exists(folder)}


def main(argv):
    verb = argv[0]
    if verb == "scan":
        result = scan(argv[1])
    elif verb == "read":
        result = read(argv[1], int(argv[2]), int(argv[3]))
    elif verb == "claim":
        result = claim(argv[1], argv[2], json.loads(argv[3]))
    elif verb == "remove":
        result = remove(argv[1])
    else:
        result = {"error": "unknown verb %r" % verb}
    sys.stdout.write(json.dumps(result))


if __name__ == "__main__" and len(sys.argv) > 1:
    main(sys.argv[1:])
