"""The runtime: code that runs INSIDE the sandbox's interpreter context.

Standard library only, Python 3.9+. The kernel sends this source (after the
modules it imports) into a fresh context, then calls ``Runtime`` methods with one
short code string per request. Everything the kernel needs back (rich output,
results, errors, replies) travels as frames on stdout; user text travels as
plain, coalesced, chunked stdout/stderr writes (``streams.py``).

Cells run on IPython's own shell (``ipyshell.py``) when the sandbox's Python
can run it, else on the basic shell (``basic.py``); both answer ``execute``,
``complete_reply``, ``inspect_reply``, ``expressions_reply`` and
``send_payloads``. The runtime never knows which backend it runs on.
"""

import atexit
import builtins
import getpass
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import types

try:  # inside the sandbox the bootstrap installed these modules under these names
    import _daytona_kernel_basic as _basic
    import _daytona_kernel_calls as _calls
    import _daytona_kernel_comms as _comms
    import _daytona_kernel_debug as _debug
    import _daytona_kernel_display as _display
    import _daytona_kernel_files as _files
    import _daytona_kernel_framing as _framing
    import _daytona_kernel_journal as _journal
    import _daytona_kernel_pathmap as _pathmap
    import _daytona_kernel_pathrules as _pathrules
    import _daytona_kernel_streams as _streams
except ImportError:  # imported from the package (tests)
    from daytona_kernel.runtime import basic as _basic
    from daytona_kernel.runtime import calls as _calls
    from daytona_kernel.runtime import comms as _comms
    from daytona_kernel.runtime import debug as _debug
    from daytona_kernel.runtime import display as _display
    from daytona_kernel.runtime import files as _files
    from daytona_kernel.runtime import framing as _framing
    from daytona_kernel.runtime import journal as _journal
    from daytona_kernel.runtime import pathmap as _pathmap
    from daytona_kernel.runtime import pathrules as _pathrules
    from daytona_kernel.runtime import streams as _streams

Kind = _framing.Kind
VOLUME_FLUSH_TIMEOUT_S = 3.0  # at shutdown; Jupyter kills a kernel that takes 5 s to shut down
# A cell's end waits this long for the volume's copy of what it wrote (the rest goes on in the background): a
# stop the kernel does not see (an auto-stop, the dashboard, an ephemeral sandbox's end) SIGKILLs every process of
# the sandbox, so nothing may wait for the interpreter's exit (docs/daytona-platform.md, "Stop, delete").
CELL_COPY_TIMEOUT_S = 2.0
EXIT_COPY_TIMEOUT_S = 1.5  # the daemon kills a worker 2 s after the SIGTERM that deletes its context (repl_client.go)
INPUT_POLL_S = 0.01
# The kernel leaves this file (worker pid, execution count) for a cell it gave up on while the cell waited in the
# daemon's queue behind another job; the cell returns at once when its turn comes. The kernel writes the same name.
CANCELLED_CELL = "/tmp/daytona-kernel-cancelled-%d-%d"
CELL_BLOB_BYTES = 128 * 1024 * 1024  # large output strings one cell may leave in files; past this they go inline
# Comm frames wait as an explicit flush does (streams.FLUSH_GAP_S) and go out together: a widget's creation is about
# twenty messages, and each write is a pipe write, a daemon line and a wake-up of the kernel during the cell's loop.
BATCHED_KINDS = frozenset((Kind.COMM_OPEN, Kind.COMM_MSG, Kind.COMM_CLOSE))
BATCH_CHARS = 64 * 1024  # waiting frames past this go out at once (far under the daemon's 1 MiB line)


current = None  # this process's Runtime, set by the bootstrap


def _copy_at_exit():
    """The interpreter's last act: the volume's copy takes what the exit wrote (``VolumeCopy.last_pass``).

    A shutdown or restart has the copy finished by a runtime call first, while the interpreter lives; the daemon
    then deletes the context and answers only once the worker has exited. Registered when this module loads,
    before the shell registers its exit work, so it runs after that (IPython clears the namespace: a file left
    open is flushed) and after the handlers the user's code registered (which may write files too)."""
    runtime = current
    if runtime is not None and runtime.durable is not None:
        runtime.durable.last_pass(EXIT_COPY_TIMEOUT_S)


atexit.register(_copy_at_exit)


def _ipyshell_module():
    """The IPython shell module the bootstrap installed, or None when the sandbox has no usable IPython."""
    if "_daytona_kernel_ipyshell" in sys.modules:
        return sys.modules["_daytona_kernel_ipyshell"]
    if "_daytona_kernel_framing" in sys.modules:  # bootstrapped, and the module could not load
        return None
    try:
        from daytona_kernel.runtime import ipyshell
    except ImportError:
        return None
    return ipyshell


class StdinNotImplementedError(NotImplementedError):
    """input() was called but the frontend cannot answer input requests (IPython's name)."""


class Runtime(object):
    """One per interpreter context. See the module docstring."""

    def __init__(self, token, options=None):
        self.token = token
        self.options = _calls.options_from(options or {})
        self.lock = threading.RLock()
        self.active = False
        self.last_flush = 0.0
        self.out = _streams.OutputStream(self, "stdout")
        self.err = _streams.OutputStream(self, "stderr")
        self._frame_target = None
        self._waiting_frames = []  # comm frame lines held for one write (BATCHED_KINDS), before any newer text
        self._waiting_chars = 0
        self.fds = None
        self._flusher_wake = threading.Event()
        self._flush_due = None  # when the flusher sends what waits (time.monotonic()), or None
        self._flusher = None
        self._stdin_allowed = False
        self.output_budget = self.options.output_limit_chars
        self.output_used = 0
        self.dropped_chars = 0
        sweep_private_dirs(tempfile.gettempdir())  # what the last cell of an ended runtime left (its large outputs)
        self.private = PrivateFolder(self.options.blob_chars)  # input() replies, files of large output strings
        self._in_cell = False
        self._widgets_noticed = False
        self.user_module = types.ModuleType("__main__")
        self.user_ns = self.user_module.__dict__
        self._notices = []  # type: list
        self.comms = _comms.Bridge(self)
        self.paths = _pathmap.PathMap(os.getcwd(), self.options.local_root)  # what the user reads names their files
        self.shell = self._start_shell()
        self.ipython = self.shell if not isinstance(self.shell, _basic.BasicShell) else None
        self.initial_names = frozenset(self.user_ns) | frozenset(self.shell.user_ns_hidden)
        self.debugger = _debug.Channel(self)  # debugpy starts when the frontend first asks for it
        sys.modules["__main__"] = self.user_module
        os.environ.setdefault("PYTHONUNBUFFERED", "1")
        if self.ipython is not None:  # widgets need IPython: comms work, and tqdm.notebook draws a widget
            self.ipython.kernel = self.comms.facade
            patches = {"comm": self.comms.install, "tqdm.notebook": _display.tqdm_as_text_without_widgets}
        else:
            patches = {"ipywidgets": self._widgets_notice, "tqdm.notebook": _display.tqdm_as_text}
        sys.meta_path.insert(0, _display.ModuleHooks(patches, {_basic.INLINE_BACKEND: _basic.INLINE_BACKEND_SOURCE}))
        if "comm" in sys.modules and self.ipython is not None:
            self.comms.install(sys.modules["comm"])
        self.workdir = os.getcwd()
        self.journal = _journal.current = _journal.open_journal(self, self.options.journal)  # for reattaching
        self.durable, restored = _files.open_volume(self.workdir, self.options, self.err.write)
        self._notices.insert(0, restored)
        start_in = self.options.start_in
        if start_in:  # the notebook's sub-folder of the mirrored folder
            os.makedirs(os.path.join(self.workdir, start_in), exist_ok=True)
            os.chdir(os.path.join(self.workdir, start_in))
        rules = None
        if self.options.sync_down:
            rules = _pathrules.MirrorRules(self.workdir, self.options.sync_excludes, self.options.sync_includes, secrets=())
        self.watch = _files.WorkdirWatch(self.workdir, rules)
        local_root = self.options.local_root  # the user's project folder, mirrored here
        self.outside = None
        if local_root:
            excludes, includes = self.options.sync_excludes, self.options.sync_includes
            self.outside = _files.OutsideTheMirror(self.workdir, local_root, excludes, includes)
        if threading.current_thread() is threading.main_thread():
            # Python's own SIGINT handler, as under ipykernel: the worker's (a Python function) would
            # add its frame (worker.py on_sigint, the daemon's sigint_handler) to the cell's traceback.
            signal.signal(signal.SIGINT, signal.default_int_handler)
        builtins.get_ipython = lambda: self.ipython  # type: ignore[attr-defined]  # as IPython puts it there
        builtins.input = self.input
        getpass.getpass = self.getpass
        if os.name == "posix" and not isinstance(sys.__stdout__, _streams.ProtocolWriter):
            capture = _streams.FdCapture(self)
            try:
                capture.install()
                self.fds = capture
            except OSError as exc:
                self.err.write("daytona-kernel: output written to fds 1 and 2 will not be shown (%r)\n" % (exc,))

    def _start_shell(self):
        """IPython's shell when the sandbox's Python can run it, else the basic shell (said once, in the first cell)."""
        module = _ipyshell_module()
        if not self.options.ipython:
            reason = "the kernel asked for it"
        elif module is None or not module.compatible():
            why = self.options.ipython_error or "IPython 8.0 or newer is not installed"
            reason = "Python %d.%d here cannot run IPython: %s" % (sys.version_info[:2] + (why,))
        else:
            return module.make_shell(self, self.user_module)
        self._notices.append(
            "daytona-kernel: cells run as plain Python (%s); IPython features (magics, ! commands, completion "
            "beyond basics) need Python 3.11+ or IPython 8+ in the sandbox.\n" % reason
        )
        os.environ["MPLBACKEND"] = "module://" + _basic.INLINE_BACKEND
        return _basic.BasicShell(self, self.user_module, reason)

    def sync_volume(self):
        """Wait (boundedly) until the volume holds the working directory's latest files (at shutdown)."""
        with self.request_output():
            done = self.durable.flush(VOLUME_FLUSH_TIMEOUT_S) if self.durable is not None else True
            self.send(Kind.REPLY, {"done": done})

    def hello(self):
        """First call after bootstrap: report who we are."""
        with self.request_output():
            self.send(
                Kind.HELLO,
                {
                    "pid": os.getpid(),
                    "python": "%d.%d.%d" % sys.version_info[:3],
                    "cwd": os.getcwd(),
                    "executable": sys.executable,
                    "ipython": _ipyshell_module().release.version if self.ipython else "",
                    "ipython_cache": "" if self.ipython else self.options.ipython_cache,
                    "journal": _journal.hello_sessions(self.journal),
                },
            )

    # -- output plumbing -------------------------------------------------

    def request_output(self):
        """``with rt.request_output():`` one request's stretch of output: streams and frames go to the kernel."""
        return _RequestOutput(self)

    def begin(self):
        with self.lock:
            self._frame_target = sys.stdout
            self.out.target = sys.stdout
            self.err.target = sys.stderr
            if self.journal is not None:
                self.journal.begin()
            self.active = True
            sys.stdout = self.out
            sys.stderr = self.err
            self.flush_streams_locked()
        self._ensure_flusher()

    def end(self):
        with self.lock:
            if self.fds is not None:
                self.fds.drain()
            self.flush_streams_locked()
            if self.journal is not None:
                self.journal.end()
            self.active = False
            if sys.stdout is self.out:
                sys.stdout = self._frame_target
            err_target = self.err.target
            if sys.stderr is self.err:
                sys.stderr = err_target

    @property
    def over_budget(self):
        return bool(self.output_budget) and self.output_used >= self.output_budget

    def within_budget(self, text):
        """Cut text at the cell's output limit; count what is dropped."""
        if not self.output_budget:
            return text
        room = max(0, self.output_budget - self.output_used)
        self.output_used += min(len(text), room)
        if len(text) > room:
            self.dropped_chars += len(text) - room
            return text[:room]
        return text

    def _budget_notice(self):
        if self.dropped_chars:
            self.err.target.write(
                "\ndaytona-kernel: this cell's output passed the limit of %s; %.1f MB more were dropped. "
                "Raise DaytonaKernel.output_limit_mb to see more.\n"
                % (_calls.limit_text(self.output_budget), self.dropped_chars / float(_calls.MB_CHARS))
            )

    def flush_streams_locked(self):
        """Send the waiting comm frames, then what both streams hold (in that order: the frames were sent before
        the text); only a real send starts a new FLUSH_GAP_S (the first explicit flush of a cell goes at once)."""
        self._flush_due = None
        target = self._frame_target
        if self._waiting_frames and target is not None:
            lines, self._waiting_frames, self._waiting_chars = self._waiting_frames, [], 0
            target.write("".join(lines))
            self.last_flush = time.monotonic()
        if self.out._buf or self.err._buf:
            self.out._send_locked()
            self.err._send_locked()
            self.last_flush = time.monotonic()

    def flush_by(self, due):
        """Have the flusher thread send what waits at ``due`` (time.monotonic()) at the latest. Called with the lock
        held, once per batch (its first write), not at every print of a flood."""
        if self._flush_due is None or due < self._flush_due:
            self._flush_due = due
            self._flusher_wake.set()

    def _ensure_flusher(self):
        if self._flusher is not None and self._flusher.is_alive():
            return
        self._flusher = threading.Thread(target=self._flush_loop, name="daytona-kernel-flusher", daemon=True)
        self._flusher.start()

    def _flush_loop(self):
        _streams.block_signals()
        wait = None
        while True:
            self._flusher_wake.wait(wait)
            self._flusher_wake.clear()
            with self.lock:
                due = self._flush_due
                wait = None if due is None else due - time.monotonic()
                if wait is not None and wait <= 0:
                    wait = None
                    if self.active:
                        self.flush_streams_locked()
                    self._flush_due = None

    def send(self, kind, payload):
        """Emit one frame, after any user text written before it."""
        with self.lock:
            if self.fds is not None:
                self.fds.drain()
            if self.out._buf or self.err._buf:
                self.flush_streams_locked()  # the text written before this frame
            target = self._frame_target
            if target is None:
                return
            payload, blobs = self.private.spill(payload) if self._in_cell else (payload, None)
            lines = _framing.encode_frame(self.token, kind, payload, blobs=blobs)
            if kind in BATCHED_KINDS and self.active and len(lines) == 1:
                self._waiting_frames.append(lines[0])
                self._waiting_chars += len(lines[0])
                if self._waiting_chars >= BATCH_CHARS or time.monotonic() - self.last_flush >= _streams.FLUSH_GAP_S:
                    self.flush_streams_locked()
                else:
                    self.flush_by(self.last_flush + _streams.FLUSH_GAP_S)
                return
            self.flush_streams_locked()  # the comm frames waiting before this one
            for line in lines:
                target.write(line)

    # -- requests ----------------------------------------------------------

    def call(self, text):
        """One call from the kernel (``calls.encode``): decoded by name, then made with keyword arguments."""
        request = _calls.decode(text)
        kwargs = _calls.arguments(request)
        if request.TARGET == "journal":
            if self.journal is None:
                raise _calls.missing_runtime("the session journal")
            return getattr(self.journal, request.METHOD)(**kwargs)
        if request.TARGET == "fanout":
            module = sys.modules.get("_daytona_kernel_fanout")
            if module is None:
                raise _calls.missing_runtime("the fanout module")
            return getattr(module, request.METHOD)(self, **kwargs)
        return getattr(self, request.METHOD)(**kwargs)

    def run_cell(
        self, code, count, store_history=True, silent=False, allow_stdin=False, user_expressions=None, synced=None, comms=None
    ):
        """Run one cell: its displays, result and error travel as frames; nothing escapes.

        ``synced`` is what the kernel's mirror did since its last call (see ``WorkdirWatch.note``);
        ``comms`` the request's message id and the comm inbox (see ``comms.Bridge.begin_request``).
        """
        cancelled = CANCELLED_CELL % (os.getpid(), count)
        if os.path.exists(cancelled):  # interrupted while it waited behind another job: it must not run now
            os.remove(cancelled)
            return None
        self.watch.note(synced)
        if self.journal is not None and not self.journal.arm(count):
            return self.journal.refuse()  # another kernel attached to this session
        self.output_used = self.dropped_chars = 0
        self.private.start_cell()
        with self.request_output():
            self._in_cell = True
            live = (
                _files.LiveReports(self.watch, lambda report: self.send(Kind.FILES, report), self.err.write)
                if self.watch.snapshot is not None
                else None
            )
            for notice in self._notices:  # once per runtime, on the first cell's stderr
                self.err.write(notice)
            self._notices = []
            self._stdin_allowed = allow_stdin
            try:
                self.comms.begin_request(comms)
                self.comms.start_cell()
                self.debugger.start_cell()
                self.shell.execute(code, count, store_history, silent)
            finally:
                self.debugger.end_cell()
                if live is not None:
                    live.stop()
                self.comms.end_request()
                self.shell.send_payloads()
                if user_expressions:
                    self.send(Kind.USER_EXPRESSIONS, self.shell.expressions_reply(user_expressions))
                self.err.write(self.watch.take_notice())
                if self.outside is not None:
                    self.err.write(self.outside.take_notice())
                changes = self.watch.changes()
                if changes:  # the cell's new, changed and deleted files, for the kernel to download
                    self.send(Kind.FILES, changes)
                self._copy_to_volume()
                with self.lock:
                    self.flush_streams_locked()
                    self._budget_notice()
                    self._in_cell = False
                self.private.end_cell()
                self.output_used = self.dropped_chars = 0

    def _copy_to_volume(self):
        """Before the cell's end is reported: the volume gets what the cell wrote (``CELL_COPY_TIMEOUT_S`` at most; a
        longer copy goes on in the background). A finished cell's files are then on the volume before the sandbox can
        be idle long enough to stop, or stopped by anyone who saw the cell end."""
        if self.durable is None:
            return
        try:
            self.durable.flush(CELL_COPY_TIMEOUT_S)
        except KeyboardInterrupt:  # an interrupt after the cell: the copy goes on in its thread
            self.err.write(
                "daytona-kernel: interrupted while the cell's files were copied to the volume; the copy goes on in the background.\n"
            )

    def deliver(self, messages, comms=None):
        """Frontend comm messages while no cell runs (and a background thread's held updates)."""
        with self.request_output():
            try:
                self.comms.begin_request(comms)
                self.comms.handle(messages)
            finally:
                self.comms.end_request()

    def debug(self, requests):
        """The kernel's debug requests while no cell runs (``debug.Debugger``)."""
        with self.request_output():
            self.debugger.call(requests)

    def comm_table(self):
        """Reply with the comms open here (a kernel that attaches takes them over: ``CommBridge.adopt``)."""
        with self.request_output():
            self.send(Kind.REPLY, {"comms": self.comms.table()})

    def complete(self, code, cursor):
        """Reply with completions from the live namespace; never touches user state."""
        with self.request_output():
            self.send(Kind.REPLY, self.shell.complete_reply(code, cursor))

    def inspect(self, code, cursor, detail_level=0):
        """Reply with what ``obj?`` and Shift+Tab show."""
        with self.request_output():
            self.send(Kind.REPLY, self.shell.inspect_reply(code, cursor, detail_level))

    def file_changes(self, synced=None):
        """Reply with what changed in the working directory and is not yet acknowledged (for %sync)."""
        self.watch.note(synced)
        with self.request_output():
            self.err.write(self.watch.take_notice())
            self.send(Kind.REPLY, self.watch.changes() or {"changed": {}, "deleted": [], "truncated": False})

    def checkpoint(self, path):
        """Pickle the user's variables to path (relative: in the working directory); the volume's copy follows."""
        with self.request_output():
            reply = _files.save_checkpoint(os.path.join(self.workdir, path), self.user_ns, self.initial_names)
            if self.durable is not None:
                self.durable.wake()
            self.send(Kind.REPLY, reply)

    def restore(self, path):
        """Load the variables of a checkpoint back into the namespace (relative: in the working directory)."""
        with self.request_output():
            self.send(Kind.REPLY, _files.load_checkpoint(os.path.join(self.workdir, path), self.user_ns))

    def explain(self, exc):
        """Before a cell's error is shown: say so when it is about a path outside the mirrored folder."""
        if self.outside is not None:
            self.outside.explain(exc)

    def _widgets_notice(self, module):
        if not self._widgets_noticed:
            self._widgets_noticed = True
            self.err.write(_display.WIDGETS_NOTICE)

    # -- input() -----------------------------------------------------------

    def input(self, prompt=""):
        return self._ask(str(prompt), False, "raw_input")

    def getpass(self, prompt="Password: ", stream=None):
        return self._ask(str(prompt), True, "getpass")

    def _ask(self, prompt, password, name):
        """Ask the frontend through an ``input`` frame; the kernel writes the answer to a file."""
        if not self._stdin_allowed:
            raise StdinNotImplementedError("%s was called, but this frontend does not support input requests." % name)
        path = self.private.reply_path()
        self.send(Kind.INPUT, {"prompt": prompt, "password": password, "path": path})
        reply = _read_reply(path)
        while reply is None:  # waiting outside any except block: Ctrl-C here is a plain KeyboardInterrupt
            time.sleep(INPUT_POLL_S)
            reply = _read_reply(path)
        os.remove(path)
        if reply.get("value") == "\x04":
            raise EOFError
        return reply.get("value", "")


class PrivateFolder(object):
    """The runtime's private folder in the temporary folder, made when first needed: the files of a cell's
    large output strings (the kernel downloads them) and input()'s answers (the kernel uploads them). Its
    name carries the interpreter's pid, so ``daytona-kernel gc`` and a later runtime (``sweep_private_dirs``)
    know when it is no longer in use."""

    def __init__(self, blob_chars):
        self._path = None
        self._blob_chars = blob_chars  # a cell's strings of at least this many characters go into files (0: never)
        self._blob_files = []  # this cell's files of large output strings (the kernel has fetched the last cell's)
        self._last_files = []  # the last cell's, while a cell runs
        self._blob_bytes = 0
        self._input_seq = 0

    def path(self):
        if self._path is None:
            self._path = tempfile.mkdtemp(prefix="daytona-kernel-inbox-%d-" % os.getpid())
        return self._path

    def reply_path(self):
        """Where the kernel writes the answer to the next input request."""
        self._input_seq += 1
        return os.path.join(self.path(), "reply-%d.json" % self._input_seq)

    def spill(self, payload):
        """A cell's large output strings go into a file the kernel downloads in one request, instead of
        through JSON and the daemon's lines (framing's ``split_blobs``). Returns (payload, blobs or None);
        when the file cannot be written (a full disk) or the cell wrote too many, the frame carries everything."""
        if not self._blob_chars:
            return payload, None
        thin, found = _framing.split_blobs(payload, self._blob_chars)
        size = sum(len(data) for _, data in found)
        if not found or self._blob_bytes + size > CELL_BLOB_BYTES:
            return payload, None
        try:
            path = os.path.join(self.path(), "out-%d" % len(self._blob_files))
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
            with os.fdopen(fd, "wb") as f:  # the last cell's file of this name is written over: its pages are reused
                for _, data in found:
                    for piece in _framing.blob_pieces(data):
                        f.write(piece)
                f.flush()
                if os.fstat(fd).st_size > size:  # it was longer
                    f.truncate(size)
        except OSError:
            return payload, None
        self._blob_files.append(path)
        self._blob_bytes += size
        return thin, {"path": path, "sizes": [[keys, len(data)] for keys, data in found]}

    def start_cell(self):
        """A cell starts: the last cell's files of large output strings (the kernel fetched them before it sent
        this cell) are written over by this cell's, and those it does not need are removed when it ends."""
        self._last_files, self._blob_files = self._blob_files, []
        self._blob_bytes = 0

    def end_cell(self):
        for path in self._last_files[len(self._blob_files) :]:
            try:
                os.remove(path)
            except OSError:
                pass  # already gone; what an ended runtime leaves is swept at the next start (sweep_private_dirs)
        self._last_files = []


def sweep_private_dirs(base):
    """Remove this user's ``daytona-kernel-inbox-<pid>-*`` folders in ``base`` whose interpreter is gone:
    a runtime writes over or removes its large-output files at its next cell, so its last cell's stay until here."""
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        match = re.match(r"daytona-kernel-inbox-(\d+)-", name)
        path = os.path.join(base, name)
        try:
            if match is None or _alive(int(match.group(1))) or os.lstat(path).st_uid != os.getuid():
                continue
        except (OSError, AttributeError):
            continue
        shutil.rmtree(path, ignore_errors=True)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


class _RequestOutput(object):
    def __init__(self, runtime):
        self._rt = runtime

    def __enter__(self):
        self._rt.begin()
        return self._rt

    def __exit__(self, *exc):
        self._rt.end()
        return False


def _read_reply(path):
    """The kernel's answer to an input request, or None while it is not (completely) written."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.loads(f.read())
    except (OSError, ValueError):
        return None
