"""The session journal: what a cell printed, kept on the sandbox's disk, so a new kernel can attach.

Standard library only, Python 3.9+. It has two users:

- the runtime (inside the interpreter context): ``Journal`` records a cell's output (frames
  and text: the worker's own stdout and stderr lines, exactly what goes to the daemon) and the
  session's state: running or idle, execution count, variables, when the last cell ended;
- the kernel, through ``process.exec`` (``runtime.journal_command``: this source run by
  ``python3 -I -c``, its argument a ``calls.JournalCall`` as keyword JSON): ``scan``
  lists the sessions, ``read`` returns what a cell wrote since an offset, ``claim`` makes
  a kernel the session's owner (compare-and-swap under a lock), ``remove`` deletes one.
  ``process.exec`` runs beside the interpreter, so it works while the cell still runs
  (a new execute on the context would wait behind it: see docs/reattach.md).

Layout, under the journal root (``/home/daytona/.daytona-kernel/journal``), one folder
per interpreter context::

    <context id>/meta.json     the session's state, rewritten whole (tmp + rename)
    <context id>/owner.json    which kernel process owns it; only ``claim`` changes it
    <context id>/out.<n>.jsonl the current cell's output, the worker's {"type", "text"} lines
                               to the daemon; rotated at FILE_BYTES, the last two files kept

The daemon drains the worker's stdout whether or not a client listens (output with no
client is dropped), so the journal is the only copy of what a detached cell prints.
"""

import json
import os
import re
import sys
import time
import types
from typing import Any, Callable, Dict

VERSION = 2  # 2: the worker's process stamp (boot id and start time) beside its pid
FILE_BYTES = 4 * 1024 * 1024  # one journal file; two are kept, so a replay shows up to the last 8 MiB
READ_BYTES = 2 * 1024 * 1024  # the most one ``read`` returns (the next read goes on from there)
SESSION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
OUT_FILE = re.compile(r"^out\.(\d+)\.jsonl$")
INPUTS_KEPT = 1000  # how many past inputs an attaching kernel gets for its history
PIECE_MARK = " + "  # after "<MARK><token>": a frame piece that more pieces follow
JSON_BYTES = 64 * 1024  # meta.json and owner.json are a few hundred bytes; anything bigger is not ours
PID_MAX = 4194304  # Linux's PID_MAX_LIMIT: no pid is bigger
SKIPPED = "skipped"  # a record that stands for a line too long to read (its size is its "text")
# How the daemon's worker starts its line of a stdout or stderr chunk (json.dump of {"type": ..., "text": ...}, in that
# order: apps/daemon/pkg/toolbox/process/interpreter/repl_worker.py, _emit and _StreamEmitter): the journal keeps these
# lines as they are (``record_line``), and reads a chunk line that has another field before its text
STDOUT_CHUNK, STDERR_CHUNK = b'{"type": "stdout",', b'{"type": "stderr",'
STDOUT_LINE, STDERR_LINE = STDOUT_CHUNK + b' "text": ', STDERR_CHUNK + b' "text": '


def _write_json(path, value):
    tmp = "%s.tmp-%d" % (path, os.getpid())
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(value, f)
    os.replace(tmp, path)


def _finite(text):
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError("not a finite number: %s" % text[:20])
    return value


def _no_constant(name):
    raise ValueError("%s is not a number" % name)


def loads(text):
    """JSON that a cell may have written: finite numbers only (no NaN, Infinity or 1e400); ValueError otherwise."""
    try:
        return json.loads(text, parse_float=_finite, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _read_json(path):
    """A small JSON object a cell may have forged: None when it is missing, too big or not an object."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            data = f.read(JSON_BYTES + 1)
        if len(data) > JSON_BYTES:
            return None
        value = loads(data.decode("utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


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


def _pid(value):
    """A pid as a cell may have written it: a positive int no bigger than any pid, else None."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= PID_MAX:
        return value
    return None


def process_stamp(pid):
    """What tells this process apart from a later one with the same pid: the boot's id and the process's
    start time (clock ticks since boot). A stop or restart of the sandbox starts pids from 1 again, and
    both parts change. "" where /proc does not say (then only the pid is checked)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read(64).strip()
        with open("/proc/%d/stat" % pid, "rb") as f:
            stat = f.read(4096)
        start = stat[stat.rindex(b")") + 2 :].split()[19].decode("ascii")  # field 22; the name may hold spaces
    except (OSError, ValueError, IndexError, UnicodeDecodeError):
        return ""
    return "%s:%s" % (boot, start)


def _alive(meta):
    """Whether the interpreter a session's meta names still runs: the same pid *and* the same process
    (its stamp), so a pid reused after a restart of the sandbox is not taken for it."""
    if not isinstance(meta, dict):
        return False
    pid = _pid(meta.get("pid"))
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except PermissionError:
        pass  # another user's process: it runs, but it is not ours unless its stamp says so
    except OSError:
        return False
    stamp = meta.get("stamp")
    now = process_stamp(pid)
    if now or stamp:
        return isinstance(stamp, str) and stamp == now
    return True


class _Tee(object):
    """A worker stream that also appends what passes through it to the journal: only where the runtime has no
    ProtocolWriter (fds 1 and 2 could not be captured), which otherwise hands the journal the worker's lines."""

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
    """The runtime's side. ``options``: the kernel's ``calls.JournalOptions``."""

    def __init__(self, runtime, options):
        self._rt = runtime
        self.folder = os.path.join(runtime.workdir, options.root, options.session)
        self.instance = options.instance
        self.meta = {
            "version": VERSION,
            "session": options.session,
            "notebook": options.notebook,
            "name": options.name,
            "token": runtime.token,
            "pid": os.getpid(),
            "stamp": process_stamp(os.getpid()),
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
        self._piece_line = None  # how the worker's line of a frame piece that more pieces follow starts
        self._writer = None  # type: Any  # the runtime's ProtocolWriter while it hands this journal the cell's lines
        self.broken = ""
        os.makedirs(self.folder, mode=0o700, exist_ok=True)
        _write_json(os.path.join(self.folder, "owner.json"), options.owner)
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
        kernel = owner.get("kernel")
        kernel = re.sub(r"[^A-Za-z0-9_.-]", "", kernel)[:40] if isinstance(kernel, str) else ""
        with self._rt.request_output():
            self._rt.send(
                "error",
                {
                    "ename": "DaytonaKernelDetached",
                    "evalue": "this session was attached by another kernel (%s); restart this kernel to "
                    "get a fresh one" % (kernel or "?"),
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
            self._piece_line = STDOUT_LINE + json.dumps(self._piece_head)[:-1].encode("ascii")
            self._file = open(os.path.join(self.folder, "out.0.jsonl"), "ab")  # noqa: SIM115 (open for the cell)
            self.meta.update(state="running", cell=self.meta["cell"] + 1, cell_count=self._armed, cell_started_at=time.time())
            _write_json(os.path.join(self.folder, "meta.json"), self.meta)
        except OSError as exc:
            self._fail(exc)
            return
        writer = getattr(rt.fds, "protocol", None)
        if writer is not None:  # the worker's lines, as they go to the daemon: no second JSON encoding of the text
            self._writer = writer
            writer.journal = self
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
        if self._writer is not None:
            self._writer.journal = None
            self._writer = None
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

    def record_line(self, line):
        """One line (bytes) the worker sends the daemon during the cell (``streams.ProtocolWriter``): a stdout or
        stderr chunk is kept as it is, the worker's JSON being the journal's (the text is not encoded again)."""
        if line.startswith(STDOUT_LINE):
            self._append(line, line.startswith(self._piece_line))
        elif line.startswith(STDERR_LINE):
            self._append(line, None)
        elif line.startswith((STDOUT_CHUNK, STDERR_CHUNK)):  # another field before the text: read it
            try:
                chunk = json.loads(line)
            except (ValueError, RecursionError):  # a line a cell forged: the journal never breaks the write it sees
                return
            if isinstance(chunk, dict) and isinstance(chunk.get("text"), str):
                self.record(chunk["type"], chunk["text"])

    def record(self, kind, text):
        """One write of the cell's output (``_Tee``), as the worker's line for it."""
        if text:
            line = (json.dumps({"type": kind, "text": text}) + "\n").encode("ascii")
            self._append(line, text.startswith(self._piece_head) if kind == "stdout" else None)

    def _append(self, line, mid_frame):
        """``mid_frame``: whether the line is a frame's piece that more follow (None: a stderr line, which says
        nothing about it). Never raises: a full disk stops the journal, not the cell."""
        f = self._file
        if f is None:
            return
        try:
            if self._size >= FILE_BYTES and not self._mid_frame:
                f = self._rotate()
            f.write(line)
            f.flush()
            self._size += len(line)
            if mid_frame is not None:  # never rotate between the pieces of one frame
                self._mid_frame = mid_frame
        except OSError as exc:
            self._fail(exc)

    def _rotate(self):
        """Start the next output file (the one before the last is removed); returns it."""
        if self._file is not None:
            self._file.close()
        old = os.path.join(self.folder, "out.%d.jsonl" % (self._n - 1))
        if os.path.exists(old):
            os.remove(old)
        self._n += 1
        self._size = 0
        self._file = open(os.path.join(self.folder, "out.%d.jsonl" % self._n), "ab")  # noqa: SIM115
        return self._file

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
        with self._rt.request_output():
            self._rt.send(
                "reply",
                {"count": self.meta["count"], "inputs": inputs[-INPUTS_KEPT:], "variables": self.meta["variables"]},
            )


def open_journal(runtime, options):
    """The runtime's journal, or None when the kernel did not ask for one (or it cannot be written)."""
    if options is None or not SESSION_NAME.match(options.session):
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
        alive = _alive(meta)
        if prune and not alive:
            remove(folder)
            continue
        sessions.append({"meta": meta, "owner": _read_json(os.path.join(folder, "owner.json")) or {}, "alive": alive})
    return {"now": time.time(), "sessions": sessions}


def _skip_line(f, start):
    """The offset just past the line that starts at ``start`` (a line longer than READ_BYTES), or None
    while it is still being written (no newline yet)."""
    f.seek(start)
    pos = start
    while True:
        block = f.read(1024 * 1024)
        if not block:
            return None
        cut = block.find(b"\n")
        if cut >= 0:
            return pos + cut + 1
        pos += len(block)


def _record(line):
    """One journal line as {"type", "text"} (stdout or stderr), or None when it is not one."""
    try:
        record = loads(line.decode("utf-8", "replace"))
    except ValueError:
        return None  # a torn line after a crash, or a forged one: nothing to show
    if not isinstance(record, dict) or record.get("type") not in ("stdout", "stderr") or not isinstance(record.get("text"), str):
        return None
    return {"type": record["type"], "text": record["text"]}


def read(folder, n, offset):
    """The output records written since (file ``n``, byte ``offset``), at most READ_BYTES of them.

    Returns the meta read *before* the files (so a meta that says idle means every record
    is in), the records, where to go on from, and whether older output was rotated away.
    A line longer than READ_BYTES (a cell can write one into the journal) is passed over,
    as one record of type SKIPPED whose text is its size, so the reader can say so.
    """
    meta = _read_json(os.path.join(folder, "meta.json")) or {}
    records, lost, size = [], False, 0  # type: list, bool, int
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
                end = data.rfind(b"\n") + 1  # only whole lines; a line being written is read next time
                if not end and not records and len(data) == READ_BYTES:
                    past = _skip_line(f, offset)
                    if past is None:
                        break
                    records.append({"type": SKIPPED, "text": str(past - offset)})
                    offset = past
                    break
        except OSError:
            break
        for line in data[:end].splitlines():
            record = _record(line)
            if record is not None:
                records.append(record)
        offset += end
        size += end
        if size >= READ_BYTES or end < len(data):
            break
    return {"meta": meta, "records": records, "n": n, "offset": offset, "lost": lost, "alive": _alive(meta)}


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


def _calls():
    try:
        import _daytona_kernel_calls as calls
    except ImportError:  # imported directly, e.g. by unit tests
        from daytona_kernel.runtime import calls
    return calls


VERBS: Dict[str, Callable[..., Any]] = {"scan": scan, "read": read, "claim": claim, "remove": remove}


def main(argv):
    """One verb from the kernel: ``argv[0]`` is a ``calls.JournalCall`` as keyword JSON, checked
    by name and type before it runs; the result (or the error) is printed as JSON."""
    calls = _calls()
    try:
        call = calls.decode(argv[0] if argv else "", calls.JOURNAL_CALLS)
    except calls.CallError as exc:
        result = {"error": str(exc)}
    else:
        result = VERBS[call.METHOD](**calls.arguments(call))
    sys.stdout.write(json.dumps(result))


if __name__ == "__main__" and len(sys.argv) > 1:
    main(sys.argv[1:])
