"""The runtime: code that runs INSIDE the sandbox's interpreter context.

Standard library only, Python 3.9+. The kernel sends this source (after
``framing.py``) into a fresh context, then calls ``Runtime`` methods with one
short code string per request. Everything the kernel needs back (rich output,
results, errors, replies) travels as frames on stdout; user text travels as
plain, coalesced, chunked stdout/stderr writes.

The runtime never knows which backend it runs on.
"""

import ast
import base64
import builtins
import codecs
import getpass
import importlib.machinery
import importlib.util
import io
import json
import linecache
import os
import re
import select
import signal
import struct
import tempfile
import sys
import threading
import time
import tokenize
import traceback
import types
import uuid

try:
    import _daytona_kernel_durable as _durable
    import _daytona_kernel_framing as _framing
    import _daytona_kernel_pathrules as _pathrules
    import _daytona_kernel_shell as _shell
except ImportError:  # imported directly, e.g. by unit tests
    from daytona_kernel.runtime import durable as _durable
    from daytona_kernel.runtime import framing as _framing
    from daytona_kernel.runtime import pathrules as _pathrules
    from daytona_kernel.runtime import shell as _shell


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

Kind = _framing.Kind

INTERNAL_PREFIX = "<daytona-kernel-"
INLINE_BACKEND = "_daytona_kernel_inline"
FLUSH_INTERVAL_S = 0.015
WRITE_CHARS = 64 * 1024  # any text: even at 6 bytes a character in the daemon's JSON, far under 1 MiB
ASCII_WRITE_CHARS = 384 * 1024  # ASCII without control characters: at most 2 bytes a character in JSON
CONTROL_CHARS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f]")  # JSON escapes these as 6 bytes
IDLE_BUFFER_CHARS = 1024 * 1024
CHECKPOINT_FILE = ".daytona-kernel/checkpoint.pkl"  # relative to the working directory
SCAN_BUDGET_S = 2.0  # the per-cell scan of the working directory; past it the report says it is incomplete
RACY_WINDOW_NS = 2 * 1000000000  # mtimes this close to a scan may hide a rewrite (one-second and FAT file systems)
RACY_HASH_MAX_BYTES = 64 * 1024 * 1024
VOLUME_FLUSH_TIMEOUT_S = 3.0
RESTORE_BUDGET_S = 15.0  # restoring in the bootstrap (a runtime call may take 30 s); the rest in the background  # at shutdown; Jupyter kills a kernel that takes 5 s to shut down
FD_READ_BYTES = 64 * 1024
DRAIN_INTERVAL_S = 0.001  # a write this long after the last look at fds 1/2 looks again first (keeps order)
PIPE_BYTES = 1024 * 1024  # capture pipes this large rarely fill while a C call holds the GIL
F_SETPIPE_SZ = getattr(__import__("fcntl") if os.name == "posix" else None, "F_SETPIPE_SZ", 1031)
PROTOCOL_LINE_START = '{"type": "'  # how the daemon's worker (json.dump of a dict) starts every line
SIMPLE_TYPES = (int, float, complex, bool, str, bytes, type(None))

# One table: MIME type -> the _repr_*_ method that produces it.
REPR_METHODS = (
    ("text/html", "_repr_html_"),
    ("text/markdown", "_repr_markdown_"),
    ("image/svg+xml", "_repr_svg_"),
    ("image/png", "_repr_png_"),
    ("image/jpeg", "_repr_jpeg_"),
    ("text/latex", "_repr_latex_"),
    ("application/json", "_repr_json_"),
    ("application/javascript", "_repr_javascript_"),
    ("application/pdf", "_repr_pdf_"),
)
BINARY_MIMES = ("image/png", "image/jpeg", "application/pdf")

RED = "\x1b[0;31m"
GREEN = "\x1b[0;32m"
CYAN = "\x1b[0;36m"
RESET = "\x1b[0m"


class OutputStream(io.TextIOBase):
    """``sys.stdout``/``sys.stderr`` inside cells: coalesces writes into chunks.

    A write that ends a line goes out at once when nothing was sent for
    FLUSH_INTERVAL_S; anything else is buffered and sent by the flusher thread, so a flood of small prints
    becomes a few large writes (the Daytona daemon drops a client that falls
    1024 frames behind). No single write comes near the daemon's 1 MiB line
    limit: plain ASCII text goes in pieces of ASCII_WRITE_CHARS, other text in
    pieces of WRITE_CHARS. Larger pieces matter: the SDK appends each one to
    the run's whole stdout, so many small pieces cost quadratic copying.
    """

    def __init__(self, runtime, name):
        super().__init__()
        self._rt = runtime
        self.name = name
        self._buf = []
        self._size = 0
        self.target = None
        self.buffer = _BinaryWriter(self)

    @property
    def encoding(self):
        return "utf-8"

    @property
    def errors(self):
        return "replace"

    def isatty(self):
        return False

    def writable(self):
        return True

    def readable(self):
        return False

    def fileno(self):
        """fd 1 or 2, which the runtime captures, so ``subprocess.run(..., stdout=sys.stdout)`` shows up."""
        if self._rt.fds is None:
            raise io.UnsupportedOperation("%s has no file descriptor in a sandbox context" % self.name)
        return 1 if self.name == "stdout" else 2

    def write(self, s):
        if not isinstance(s, str):
            raise TypeError("write() argument must be str, not %s" % type(s).__name__)
        if not s:
            return 0
        rt = self._rt
        with rt.lock:
            fds = rt.fds
            if rt.active and fds is not None and not fds.reading and time.monotonic() - fds.last_drain >= DRAIN_INTERVAL_S:
                fds.drain()  # what os.system() & co. wrote to fd 1/2 before this write comes first
            if (not rt.active and self._size > IDLE_BUFFER_CHARS) or rt.over_budget:
                rt.dropped_chars += len(s) if rt.over_budget else 0
                return len(s)
            self._buf.append(s)
            self._size += len(s)
            if rt.active and (
                self._size >= ASCII_WRITE_CHARS or ("\n" in s and time.monotonic() - rt.last_flush >= FLUSH_INTERVAL_S)
            ):
                rt.flush_streams_locked()
            elif rt.active:
                rt.wake_flusher()
        return len(s)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        """Send soon: at once if nothing went out for FLUSH_INTERVAL_S, else from the flusher thread.

        So ``print(i, flush=True)`` in a loop still becomes a few large writes:
        one write per flush would leave a Daytona client 1024 frames behind.
        """
        rt = self._rt
        with rt.lock:
            if not rt.active:
                return
            if time.monotonic() - rt.last_flush >= FLUSH_INTERVAL_S:
                rt.flush_streams_locked()
            elif self._buf:
                rt.wake_flusher()

    def close(self):
        """Closing sys.stdout in a cell must not break the next cell: just flush."""
        self.flush()

    @property
    def closed(self):
        return False

    def _send_locked(self):
        if not self._buf or self.target is None:
            return
        text = self._rt.within_budget("".join(self._buf))
        self._buf = []
        self._size = 0
        step = ASCII_WRITE_CHARS if text.isascii() and not CONTROL_CHARS.search(text) else WRITE_CHARS
        for i in range(0, len(text), step):
            self.target.write(text[i : i + step])
        _flush_through(self.target)


def _flush_through(stream):
    """The daemon's worker holds a partial line until a newline or 1024 characters: send it now."""
    flush = getattr(stream, "flush", None)
    if flush is not None:
        flush()


def _block_signals():
    """Keep SIGINT/SIGTERM for the main thread, where they interrupt the cell (not this helper thread)."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})


class ProtocolWriter(io.TextIOBase):
    """``sys.__stdout__`` once fds are captured: the worker's protocol lines, on a private fd.

    The daemon's worker writes each JSON line to ``sys.__stdout__`` and flushes.
    A line that looks like one of those goes to the original fd 1 in one piece
    (SIGINT held off, so no half line is left behind). Anything else written
    here (user code printing to ``sys.__stdout__``) is cell output.
    """

    def __init__(self, runtime, fd):
        super().__init__()
        self._rt = runtime
        self._fd = fd
        self._parts = []

    @property
    def encoding(self):
        return "utf-8"

    @property
    def errors(self):
        return "replace"

    def writable(self):
        return True

    def isatty(self):
        return False

    def fileno(self):
        return 1  # the captured fd 1: never the protocol fd

    def write(self, s):
        if s:
            self._parts.append(s)
            if s.endswith("\n"):
                self._release()
        return len(s)

    def flush(self):
        if self._parts:
            self._release()

    def _release(self):
        text = "".join(self._parts)
        self._parts = []
        if text.startswith(PROTOCOL_LINE_START) and text.endswith("}\n") and "\n" not in text[:-1]:
            self._write_line(text.encode("utf-8", "replace"))
        else:
            self._rt.out.write(text)

    def _write_line(self, data):
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if hasattr(signal, "pthread_sigmask") else None
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
        finally:
            if held is not None:
                signal.pthread_sigmask(signal.SIG_SETMASK, held)


class FdCapture(object):
    """fds 1 and 2 point at pipes whose contents become cell output, as under ipykernel.

    In the daemon's worker fd 1 IS the protocol pipe: a subprocess, ``os.system``
    or C code writing there is dropped by the daemon, or glues onto the next
    protocol line and loses it; fd 2 goes to the daemon's log (FACTS.md, "Daemon
    worker"). So the runtime keeps a private duplicate of fd 1 for the protocol
    (behind ``sys.__stdout__``, where the worker writes), points fds 1 and 2 at
    pipes, and a thread pumps them into its stdout/stderr streams. Children
    inherit only the pipes, never the protocol fd.
    """

    def __init__(self, runtime):
        self._rt = runtime
        self._readers = {}  # read end -> (stream, incremental decoder)
        self._libc = None
        self.original_stdout = None
        self.last_drain = 0.0
        self.reading = False

    def install(self):
        for stream in (sys.__stdout__, sys.__stderr__):
            if stream is not None:
                stream.flush()
        self.original_stdout = sys.__stdout__  # it wraps fd 1: kept alive so fd 1 is never closed
        protocol = ProtocolWriter(self._rt, os.dup(1))
        for fd, stream in ((1, self._rt.out), (2, self._rt.err)):
            read_end, write_end = os.pipe()
            try:
                __import__("fcntl").fcntl(write_end, F_SETPIPE_SZ, PIPE_BYTES)
            except (OSError, ImportError):
                pass  # not Linux, or over the system's limit: the default pipe size works too
            os.dup2(write_end, fd)
            os.close(write_end)
            os.set_blocking(read_end, False)
            self._readers[read_end] = (stream, codecs.getincrementaldecoder("utf-8")("replace"))
        sys.__stdout__ = protocol
        threading.Thread(target=self._pump, name="daytona-kernel-fd-pump", daemon=True).start()

    def _pump(self):
        _block_signals()
        while self._readers:
            ready, _, _ = select.select(list(self._readers), [], [])
            with self._rt.lock:
                self._read_locked(ready)

    def drain(self):
        """Move everything already written to fds 1 and 2 (and libc's buffer) into the streams."""
        with self._rt.lock:
            self.last_drain = time.monotonic()
            self._flush_c_stdio()
            self._read_locked(list(self._readers))

    def _flush_c_stdio(self):
        """C code's printf output sits in libc's buffer (fd 1 is a pipe): push it into the pipe."""
        if self._libc is None:
            try:
                import ctypes

                self._libc = ctypes.CDLL(None)
                self._libc.fflush(None)
            except (ImportError, OSError, AttributeError) as exc:
                self._libc = False
                self._rt.err.write("daytona-kernel: C-level output may arrive late (%r)\n" % (exc,))
        elif self._libc:
            self._libc.fflush(None)

    def _read_locked(self, fds):
        self.reading = True  # what it reads goes to the streams, whose writes must not drain again
        try:
            self._read_fds(fds)
        finally:
            self.reading = False

    def _read_fds(self, fds):
        for fd in fds:
            if fd not in self._readers:
                continue
            stream, decoder = self._readers[fd]
            while True:
                try:
                    data = os.read(fd, FD_READ_BYTES)
                except BlockingIOError:
                    break
                if not data:  # every write end is closed (user code closed fd 1 or 2)
                    del self._readers[fd]
                    os.close(fd)
                    break
                text = decoder.decode(data)
                if text:
                    stream.write(text)


class _BinaryWriter(object):
    """``sys.stdout.buffer``: bytes are decoded (invalid UTF-8 is replaced)."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, b):
        self._stream.write(bytes(b).decode("utf-8", "replace"))
        return len(b)

    def flush(self):
        self._stream.flush()


class DisplayHandle(object):
    """Returned by ``display(..., display_id=True)``: update the output in place."""

    def __init__(self, runtime, display_id=None):
        self._rt = runtime
        self.display_id = display_id or uuid.uuid4().hex

    def __repr__(self):
        return "<DisplayHandle display_id=%s>" % self.display_id

    def display(self, obj, **kwargs):
        self._rt.display(obj, display_id=self.display_id, **kwargs)

    def update(self, obj, **kwargs):
        self._rt.display(obj, display_id=self.display_id, update=True, **kwargs)


class _PatchingLoader(object):
    """Wraps a module's loader so the runtime can patch the module once it exists."""

    def __init__(self, loader, after):
        self._loader = loader
        self._after = after

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._after(module)


class _SourceLoader(object):
    def __init__(self, source):
        self._source = source

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        exec(compile(self._source, "<%s>" % module.__name__, "exec"), module.__dict__)


INLINE_BACKEND_SOURCE = '''
from matplotlib.backends.backend_agg import FigureCanvasAgg, new_figure_manager  # noqa: F401
from matplotlib.backend_bases import FigureManagerBase as FigureManager  # noqa: F401
FigureCanvas = FigureCanvasAgg

def show(close=None, block=None):
    import _daytona_kernel_runtime
    _daytona_kernel_runtime.current.flush_figures()

def draw_if_interactive():
    pass
'''

IPYTHON_DISPLAY_MODULES = ("IPython.core.display_functions", "IPython.core.display", "IPython.display")


class _RuntimeFinder(object):
    """Serves the inline matplotlib backend and patches modules once they are imported."""

    _PATCHES = dict(
        [(name, "patch_ipython_module") for name in IPYTHON_DISPLAY_MODULES],
        ipywidgets="widgets_notice",
        **{"tqdm.notebook": "tqdm_as_text"}
    )

    def __init__(self, runtime):
        self._rt = runtime

    def find_spec(self, name, path=None, target=None):
        if name == INLINE_BACKEND:
            return importlib.util.spec_from_loader(name, _SourceLoader(INLINE_BACKEND_SOURCE))
        after = self._PATCHES.get(name)
        if after == "patch_ipython_module" and self._rt.ipython is not None:
            return None  # IPython's own display functions publish through the shell
        if after is not None:
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader, getattr(self._rt, after))
            return spec
        return None

    def invalidate_caches(self):
        pass


def _ends_with_semicolon(code):
    """IPython's rule: a trailing ``;`` suppresses the cell's result."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return False
    skip = (tokenize.ENDMARKER, tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT)
    for tok in reversed(tokens):
        if tok.type in skip:
            continue
        return tok.type == tokenize.OP and tok.string == ";"
    return False


class Runtime(object):
    """One per interpreter context. See the module docstring."""

    def __init__(self, token, options=None):
        self.token = token
        self.options = options or {}
        self.lock = threading.RLock()
        self.active = False
        self.last_flush = 0.0
        self.out = OutputStream(self, "stdout")
        self.err = OutputStream(self, "stderr")
        self._frame_target = None
        self.fds = None
        self._flusher_wake = threading.Event()
        self._flusher = None
        self._cell_files = {}
        self._cell_seq = 0
        self._execution_count = 0
        self._loop = None
        self._ipy_formatter = None
        self._ipy_formatter_tried = False
        self._stdin_allowed = False
        self.output_budget = int(self.options.get("output_limit_chars") or 0)
        self.output_used = 0
        self.dropped_chars = 0
        self._input_seq = 0
        self._inbox_dir = None
        self._capture = []
        self._widgets_noticed = False
        self.inline_backend = INLINE_BACKEND
        self.user_module = types.ModuleType("__main__")
        self.user_ns = self.user_module.__dict__
        self.ipython = self._start_ipython()
        if self.ipython is None:
            self._init_namespace()
            self.initial_names = frozenset(self.user_ns)
            self.shell = _shell.Shell(self)
            os.environ["MPLBACKEND"] = "module://" + INLINE_BACKEND
        else:
            self.shell = self.ipython
            self.initial_names = frozenset(self.user_ns) | frozenset(self.ipython.user_ns_hidden)
        sys.modules["__main__"] = self.user_module
        os.environ.setdefault("PYTHONUNBUFFERED", "1")
        sys.meta_path.insert(0, _RuntimeFinder(self))
        if self.ipython is None:
            for name in IPYTHON_DISPLAY_MODULES:
                if name in sys.modules:
                    self.patch_ipython_module(sys.modules[name])
        self.workdir = os.getcwd()
        self.durable = None
        self._restore_notice = self._restore_from_volume()
        start_in = self.options.get("start_in")
        if start_in:  # the notebook's sub-folder of the mirrored folder
            os.makedirs(os.path.join(self.workdir, start_in), exist_ok=True)
            os.chdir(os.path.join(self.workdir, start_in))
        self._watch = None
        self._racy = {}  # {path: (stat, sha256)} of files whose mtime cannot tell a rewrite in the same second
        self._mode_notice = None
        if self.options.get("sync_down"):
            self._watch_rules = _pathrules.MirrorRules(
                self.workdir, self.options.get("sync_excludes") or (), self.options.get("sync_includes") or (), secrets=()
            )
            self._watch, _ = _pathrules.scan(self.workdir, self._watch_rules)
        if self.ipython is None:
            builtins.display = self.display
        builtins.get_ipython = lambda: self.shell
        builtins.input = self.input
        getpass.getpass = self.getpass
        if os.name == "posix" and not isinstance(sys.__stdout__, ProtocolWriter):
            capture = FdCapture(self)
            try:
                capture.install()
                self.fds = capture
            except OSError as exc:
                self.err.write("daytona-kernel: output written to fds 1 and 2 will not be shown (%r)\n" % (exc,))

    def _start_ipython(self):
        """IPython's shell for the cells when the sandbox's Python has a compatible IPython, else None."""
        self._fallback_notice = None
        if not self.options.get("ipython", True):
            return None  # the kernel asked for the basic shell
        module = _ipyshell_module()
        if module is None or not module.compatible():
            reason = self.options.get("ipython_error") or "IPython 8.0 or newer is not installed"
            self._fallback_notice = (
                "daytona-kernel: this sandbox's Python cannot run IPython (%s); cells run on a basic shell "
                "with fewer magics.\n" % reason
            )
            return None
        return module.make_shell(self, self.user_module)

    def _init_namespace(self):
        ns = self.user_ns
        ns.update(
            {
                "__name__": "__main__",
                "__builtins__": builtins,
                "__doc__": None,
                "In": [""],
                "Out": {},
                "_": "",
                "__": "",
                "___": "",
                "_i": "",
                "_ii": "",
                "_iii": "",
                "_ih": None,
                "_oh": None,
            }
        )
        ns["_ih"] = ns["In"]
        ns["_oh"] = ns["Out"]
        ns["exit"] = ns["quit"] = _ExitAutocall(self)

    def _restore_from_volume(self):
        """Set up the durable copy and fill a new sandbox's working directory from the volume."""
        volume = self.options.get("volume_dir")
        if not volume:
            return ""
        volume = os.path.normpath(os.path.join(self.workdir, volume))
        if not os.path.isdir(volume):
            return "daytona-kernel: the volume is not mounted at %s; files in the working directory are not kept on it.\n" % volume
        self.durable = _durable.DurableCopy(
            self.workdir, volume, self._durable_scan, always=(CHECKPOINT_FILE,), notice=lambda text: self.err.write(text)
        )
        restored, problems = self.durable.restore(RESTORE_BUDGET_S)
        notice = ""
        if restored:
            notice += "daytona-kernel: restored %d file(s) from the volume into this new sandbox's working directory.\n" % restored
        if self.durable.pending:
            notice += "daytona-kernel: %d more file(s) are being restored from the volume in the background.\n" % len(
                self.durable.pending
            )
            self.durable.wake()
        if problems:
            notice += "daytona-kernel: could not restore from the volume: %s\n" % ", ".join(problems[:10])
        return notice

    def _durable_scan(self):
        """What the volume keeps: the files the mirror would move (its own rules object: this runs in the copier's thread)."""
        excludes = list(self.options.get("sync_excludes") or ()) + list(self.options.get("volume_excludes") or ())
        rules = _pathrules.MirrorRules(self.workdir, excludes, self.options.get("sync_includes") or (), secrets=())
        return _pathrules.scan(self.workdir, rules)

    def sync_volume(self):
        """Wait (boundedly) until the volume holds the working directory's latest files (at shutdown)."""
        with self.session():
            done = self.durable.flush(VOLUME_FLUSH_TIMEOUT_S) if self.durable is not None else True
            self.send(Kind.REPLY, {"done": done})

    def hello(self):
        """First call after bootstrap: report who we are."""
        with self.session():
            self.send(
                Kind.HELLO,
                {
                    "pid": os.getpid(),
                    "python": "%d.%d.%d" % sys.version_info[:3],
                    "cwd": os.getcwd(),
                    "executable": sys.executable,
                    "ipython": _ipyshell_module().release.version if self.ipython else "",
                    "ipython_cache": "" if self.ipython else self.options.get("ipython_cache") or "",
                },
            )

    # -- output plumbing -------------------------------------------------

    def session(self):
        return _ActiveSession(self)

    def begin(self):
        with self.lock:
            self._frame_target = sys.stdout
            self.out.target = sys.stdout
            self.err.target = sys.stderr
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
            self.active = False
            if sys.stdout is self.out:
                sys.stdout = self._frame_target
            if sys.stderr is self.err:
                sys.stderr = self.err.target

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
                "\ndaytona-kernel: this cell's output passed the limit of %g MB; %.1f MB more were dropped. "
                "Raise DaytonaKernel.output_limit_mb to see more.\n"
                % (self.output_budget / 1048576.0, self.dropped_chars / 1048576.0)
            )

    def flush_streams_locked(self):
        """Send what both streams hold; only a real send starts a new FLUSH_INTERVAL_S (the first line of a cell goes at once)."""
        if self.out._buf or self.err._buf:
            self.out._send_locked()
            self.err._send_locked()
            self.last_flush = time.monotonic()

    def wake_flusher(self):
        self._flusher_wake.set()

    def _ensure_flusher(self):
        if self._flusher is not None and self._flusher.is_alive():
            return
        self._flusher = threading.Thread(target=self._flush_loop, name="daytona-kernel-flusher", daemon=True)
        self._flusher.start()

    def _flush_loop(self):
        _block_signals()
        while True:
            self._flusher_wake.wait()
            self._flusher_wake.clear()
            time.sleep(FLUSH_INTERVAL_S)
            with self.lock:
                if self.active:
                    self.flush_streams_locked()

    def send(self, kind, payload):
        """Emit one frame, after any user text written before it."""
        if kind in (Kind.DISPLAY, Kind.UPDATE, Kind.CLEAR) and self._capture and self._capture[-1] is not None:
            self._capture[-1].append((kind, payload))
            return
        with self.lock:
            if self.fds is not None:
                self.fds.drain()
            self.flush_streams_locked()
            target = self._frame_target
            if target is None:
                return
            for line in _framing.encode_frame(self.token, kind, payload):
                target.write(line)
            _flush_through(target)

    # -- display ---------------------------------------------------------

    def patch_ipython_module(self, module):
        """Make IPython.display's functions publish through this runtime."""
        for name, func in (
            ("display", self.display),
            ("update_display", self.update_display),
            ("clear_output", self.clear_output),
            ("publish_display_data", self.publish_display_data),
        ):
            if hasattr(module, name):
                setattr(module, name, func)

    def _ipython_formatter(self):
        if self.ipython is not None:
            return self.ipython.display_formatter
        if not self._ipy_formatter_tried:
            self._ipy_formatter_tried = True
            try:
                from IPython.core.formatters import DisplayFormatter

                self._ipy_formatter = DisplayFormatter()
            except Exception:  # IPython missing or broken in the sandbox: use our own
                self._ipy_formatter = None
        return self._ipy_formatter

    def format(self, obj, include=None, exclude=None):
        """Return (data, metadata): the MIME bundle for obj, like IPython's."""
        if type(obj) in SIMPLE_TYPES:
            return {"text/plain": repr(obj)}, {}
        if _is_figure(obj):
            return self.figure_bundle(obj)
        fmt = self._ipython_formatter()
        if fmt is not None:
            data, md = fmt.format(obj, include=include, exclude=exclude)
            return data, md
        return _fallback_format(obj, include, exclude)

    def display(self, *objs, **kwargs):
        include = kwargs.pop("include", None)
        exclude = kwargs.pop("exclude", None)
        metadata = kwargs.pop("metadata", None)
        transient = kwargs.pop("transient", None) or {}
        display_id = kwargs.pop("display_id", None)
        raw = kwargs.pop("raw", False)
        clear = kwargs.pop("clear", False)
        update = kwargs.pop("update", False)
        if display_id is True:
            display_id = uuid.uuid4().hex
        if display_id:
            transient = dict(transient, display_id=display_id)
        if clear:
            self.clear_output(wait=True)
        if not objs and display_id:
            return DisplayHandle(self, display_id)
        for obj in objs:
            if raw:
                data, md = obj, dict(metadata or {})
            else:
                data, md = self.format(obj, include=include, exclude=exclude)
                if not data:
                    continue
                if metadata:
                    md = dict(md or {}, **metadata)
            self.send(Kind.UPDATE if update else Kind.DISPLAY, {"data": data, "metadata": md or {}, "transient": transient})
        if display_id:
            return DisplayHandle(self, display_id)
        return None

    def update_display(self, obj, display_id=None, **kwargs):
        kwargs["update"] = True
        self.display(obj, display_id=display_id, **kwargs)

    def publish_display_data(self, data, metadata=None, source=None, transient=None, **kwargs):
        self.send(Kind.DISPLAY, {"data": data, "metadata": metadata or {}, "transient": transient or {}})

    def clear_output(self, wait=False):
        self.send(Kind.CLEAR, {"wait": bool(wait)})

    def figure_bundle(self, fig):
        """(data, metadata) for a figure, in the format %config InlineBackend.figure_format chose."""
        data, md = {"text/plain": repr(fig)}, {}
        if not (fig.axes or getattr(fig, "lines", None)):
            return data, md
        fmt = self.shell.figure_format
        buf = io.BytesIO()
        if fmt == "svg":
            fig.canvas.print_figure(buf, format="svg", bbox_inches="tight")
            data["image/svg+xml"] = buf.getvalue().decode("utf-8")
            return data, md
        retina = fmt == "retina"
        fig.canvas.print_figure(buf, format="png", bbox_inches="tight", dpi=fig.dpi * (2 if retina else 1))
        png = buf.getvalue()
        data["image/png"] = base64.b64encode(png).decode("ascii")
        if retina and png[12:16] == b"IHDR":
            width, height = struct.unpack(">II", png[16:24])
            md["image/png"] = {"width": width // 2, "height": height // 2}
        return data, md

    def flush_figures(self):
        """Show every open pyplot figure, then close it (matplotlib-inline's behaviour)."""
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is None:
            return
        try:
            if INLINE_BACKEND not in str(sys.modules["matplotlib"].get_backend()):
                return
            managers = plt._pylab_helpers.Gcf.get_all_fig_managers()
        except Exception as exc:
            self.err.write("daytona-kernel: could not list matplotlib figures: %r\n" % (exc,))
            return
        try:
            for manager in managers:
                data, md = self.figure_bundle(manager.canvas.figure)
                self.send(Kind.DISPLAY, {"data": data, "metadata": md, "transient": {}})
        finally:
            plt.close("all")

    # -- execution -------------------------------------------------------

    def run_cell(self, code, count, store_history=True, silent=False, allow_stdin=False, user_expressions=None, synced=None):
        """Run one cell. Errors become one ``error`` frame; nothing escapes.

        ``synced`` is what the kernel's mirror did since its last call (see ``_note_synced``).
        """
        self._note_synced(synced)
        self.output_used = self.dropped_chars = 0
        if self.ipython is not None:
            return self._run_ipython_cell(code, count, store_history, silent, allow_stdin, user_expressions)
        with self.session():
            self._say_notices()
            self._stdin_allowed = allow_stdin
            self._execution_count = count
            filename = self._register_cell(code, count)
            if store_history:
                self._store_input(code, count)
            try:
                result = self._execute(code, filename)
                if result is not None and not silent:
                    self._display_result(result, count, store_history)
            except BaseException:
                etype, evalue, tb = sys.exc_info()
                self.send(Kind.ERROR, self.error_content(etype, evalue, tb))
            finally:
                try:
                    self.flush_figures()
                except BaseException:
                    etype, evalue, tb = sys.exc_info()
                    self.send(Kind.ERROR, self.error_content(etype, evalue, tb))
            if user_expressions:
                self.send(Kind.USER_EXPRESSIONS, self._user_expressions(user_expressions))
            self._after_cell()

    def _after_cell(self):
        """What every cell ends with: its file changes, the volume copy, the last of its output."""
        self._report_file_changes()
        if self.durable is not None:
            self.durable.wake()  # copies to the volume after the reply, in the background
        with self.lock:
            self.flush_streams_locked()
            self._budget_notice()
        self.output_used = self.dropped_chars = 0

    def _say_notices(self):
        """Once per runtime, on the first cell's stderr: a restored working directory, the basic shell."""
        for name in ("_restore_notice", "_fallback_notice"):
            if getattr(self, name):
                self.err.write(getattr(self, name))
                setattr(self, name, "")

    def _run_ipython_cell(self, code, count, store_history, silent, allow_stdin, user_expressions):
        """Run one cell on IPython's shell: its displays, result and error travel as frames."""
        shell = self.ipython
        with self.session():
            self._say_notices()
            self._stdin_allowed = allow_stdin
            shell.execution_count = count
            try:
                shell.run_cell(code, store_history=store_history, silent=silent)
            finally:
                shell.send_payloads()
                if user_expressions:
                    results = self.ipython.user_expressions(user_expressions)
                    self.send(Kind.USER_EXPRESSIONS, _ipyshell_module().clean(results))
                self._after_cell()

    def _note_synced(self, note):
        """Apply the kernel's note about the last sync.

        ``up``: {path: permission bits} of files it uploaded: their modes are set
        here and they are not reported back as changed. ``acked``: {path: stat}
        of reported changes the kernel has handled; ``gone``: reported deletions
        it has handled. Changes it has not acknowledged are reported again.
        """
        note = note or {}
        for rel, mode in (note.get("up") or {}).items():
            path = os.path.join(self.workdir, rel)
            if mode is not None:
                try:
                    os.chmod(path, mode & 0o777)
                except OSError as exc:  # a filesystem without chmod: said once, with the next report
                    if self._mode_notice is None:
                        self._mode_notice = "daytona-kernel: this folder does not keep file modes (%s: %s)\n" % (rel, exc)
            self._racy.pop(rel, None)  # its content is the kernel's: looked at afresh in the next scan
            if self._watch is not None:
                try:
                    self._watch[rel] = _pathrules.file_stat(os.lstat(path))
                except OSError:
                    self._watch.pop(rel, None)
        if self._watch is None:
            return
        for rel, stat in (note.get("acked") or {}).items():
            self._watch[rel] = tuple(stat) if len(stat) == 3 else (stat[0], stat[1], None)
        for rel in note.get("gone") or ():
            self._watch.pop(rel, None)

    def file_changes(self, synced=None):
        """Reply with what changed in the working directory and is not yet acknowledged (for %sync)."""
        self._note_synced(synced)
        with self.session():
            self._say_mode_notice()
            self.send(Kind.REPLY, self._file_changes() or {"changed": {}, "deleted": [], "truncated": False})

    def _report_file_changes(self):
        """Tell the kernel which files in the working directory this cell created, changed or deleted."""
        self._say_mode_notice()
        changes = self._file_changes()
        if changes:
            self.send(Kind.FILES, changes)

    def _say_mode_notice(self):
        if self._mode_notice:
            self.err.write(self._mode_notice)
            self._mode_notice = ""  # once per runtime

    def _file_changes(self):
        """Changes against the acknowledged snapshot, which only the kernel's note moves on.

        A path that is merely unreadable now (a folder without permission) is
        not reported as deleted.
        """
        if self._watch is None:
            return None
        started_ns = time.time_ns()
        now, complete = _pathrules.scan(self.workdir, self._watch_rules, budget_s=SCAN_BUDGET_S)
        changed = {rel: list(stat) for rel, stat in now.items() if self._watch.get(rel) != stat}
        rewritten, self._racy = _rewritten_in_place(self.workdir, self._racy, now, changed, started_ns)
        for rel in rewritten:
            changed[rel] = list(now[rel])
        deleted = [rel for rel in self._watch if rel not in now and _pathrules.gone(self.workdir, rel)] if complete else []
        if changed or deleted or not complete:
            return {"changed": changed, "deleted": deleted, "truncated": not complete}
        return None

    def _user_expressions(self, expressions):
        results = {}
        for name, expr in expressions.items():
            try:
                data, md = self.format(eval(expr, self.user_ns))
                results[name] = {"status": "ok", "data": data, "metadata": md or {}}
            except Exception:
                etype, evalue, tb = sys.exc_info()
                results[name] = dict(self.error_content(etype, evalue, tb), status="error")
        return results

    def _register_cell(self, code, count):
        self._cell_seq += 1
        filename = "<cell-%d-%d>" % (count, self._cell_seq)
        lines = code.splitlines(True)
        if lines and not lines[-1].endswith("\n"):
            lines[-1] += "\n"
        linecache.cache[filename] = (len(code), None, lines, filename)
        self._cell_files[filename] = count
        return filename

    def _store_input(self, code, count):
        ns = self.user_ns
        ns["In"].append(code)
        ns["_iii"], ns["_ii"], ns["_i"] = ns["_ii"], ns["_i"], code
        ns["_i%d" % count] = code

    def _execute(self, code, filename):
        flags = getattr(ast, "PyCF_ALLOW_TOP_LEVEL_AWAIT", 0)
        tree = compile(code, filename, "exec", ast.PyCF_ONLY_AST | flags, dont_inherit=True)
        tree.body = [self._autocall_exit(node) for node in tree.body]
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr) and not _ends_with_semicolon(code):
            last = ast.Expression(tree.body.pop().value)
        ns = self.user_ns
        if tree.body:
            self._run(compile(tree, filename, "exec", flags, dont_inherit=True), ns)
        if last is not None:
            return self._run(compile(last, filename, "eval", flags, dont_inherit=True), ns)
        return None

    def _autocall_exit(self, node):
        """A bare ``exit`` or ``quit`` line calls it, as IPython autocalls its exit object."""
        named = isinstance(node, ast.Expr) and isinstance(node.value, ast.Name)
        if named and isinstance(self.user_ns.get(node.value.id), _ExitAutocall):
            call = ast.copy_location(ast.Call(func=node.value, args=[], keywords=[]), node.value)
            return ast.copy_location(ast.Expr(value=call), node)
        return node

    def _run(self, code_obj, ns):
        result = eval(code_obj, ns)
        if code_obj.co_flags & 0x80:  # CO_COROUTINE: the cell used top-level await
            import asyncio

            if self._loop is None or self._loop.is_closed():
                self._loop = asyncio.new_event_loop()
            result = self._loop.run_until_complete(result)
        return result

    def _display_result(self, result, count, store_history):
        ns = self.user_ns
        if store_history:
            ns["___"], ns["__"], ns["_"] = ns["__"], ns["_"], result
            ns["_%d" % count] = result
            ns["Out"][count] = result
        data, md = self.format(result)
        if data:
            self.send(Kind.RESULT, {"data": data, "metadata": md or {}, "execution_count": count})

    def run_nested(self, code):
        """Run code from a cell magic (%%time, %%capture ...) in the user namespace."""
        return self._execute(code, self._register_cell(code, self._execution_count))

    def capture(self, code, stdout=True, stderr=True, display=True):
        """%%capture: run code with its output collected instead of shown."""
        out, err = io.StringIO(), io.StringIO()
        outputs = []
        saved = sys.stdout, sys.stderr
        self._capture.append(outputs if display else None)
        if stdout:
            sys.stdout = out
        if stderr:
            sys.stderr = err
        try:
            self.run_nested(code)
        finally:
            sys.stdout, sys.stderr = saved
            self._capture.pop()
        return _shell.CapturedIO(out.getvalue(), err.getvalue(), outputs, self)

    def reset_namespace(self):
        """%reset: forget every user name."""
        for name in list(self.user_ns):
            if name not in self.initial_names:
                del self.user_ns[name]
        self.user_ns["Out"].clear()
        self.user_ns["_"] = self.user_ns["__"] = self.user_ns["___"] = ""

    def tqdm_as_text(self, module):
        """``tqdm.notebook`` (and so ``tqdm.auto`` in a notebook) draws its text bar until widgets work."""
        import tqdm.std

        module.tqdm = module.tqdm_notebook = tqdm.std.tqdm
        module.trange = module.tnrange = tqdm.std.trange

    def widgets_notice(self, module):
        if not self._widgets_noticed:
            self._widgets_noticed = True
            self.err.write(
                "daytona-kernel: interactive widgets are not supported yet; "
                "ipywidgets objects will show as static text.\n"
            )

    # -- input() -----------------------------------------------------------

    def input(self, prompt=""):
        return self._ask(str(prompt), False, "raw_input")

    def getpass(self, prompt="Password: ", stream=None):
        return self._ask(str(prompt), True, "getpass")

    def _ask(self, prompt, password, name):
        """Ask the frontend through an ``input`` frame; the kernel writes the answer to a file."""
        if not self._stdin_allowed:
            raise _shell.StdinNotImplementedError(
                "%s was called, but this frontend does not support input requests." % name
            )
        if self._inbox_dir is None:  # the pid tells `daytona-kernel gc` whether the folder is still in use
            self._inbox_dir = tempfile.mkdtemp(prefix="daytona-kernel-inbox-%d-" % os.getpid())
        self._input_seq += 1
        path = os.path.join(self._inbox_dir, "reply-%d.json" % self._input_seq)
        self.send(Kind.INPUT, {"prompt": prompt, "password": password, "path": path})
        reply = _read_reply(path)
        while reply is None:  # waiting outside any except block: Ctrl-C here is a plain KeyboardInterrupt
            time.sleep(0.01)
            reply = _read_reply(path)
        os.remove(path)
        if reply.get("value") == "\x04":
            raise EOFError
        return reply.get("value", "")

    # -- tracebacks ------------------------------------------------------

    def error_content(self, etype, evalue, tb):
        """ename/evalue/traceback like IPython's, showing only the user's frames."""
        if etype is None:
            etype, evalue = type(evalue), evalue
        lines = self._format_chain(etype, evalue, tb, set())
        return {"ename": etype.__name__, "evalue": str(evalue), "traceback": lines}

    def _format_chain(self, etype, evalue, tb, seen):
        seen.add(id(evalue))
        lines = []
        cause = getattr(evalue, "__cause__", None)
        context = getattr(evalue, "__context__", None)
        if cause is not None and id(cause) not in seen:
            lines += self._format_chain(type(cause), cause, cause.__traceback__, seen)
            lines.append("\nThe above exception was the direct cause of the following exception:\n")
        elif context is not None and id(context) not in seen and not getattr(evalue, "__suppress_context__", False):
            lines += self._format_chain(type(context), context, context.__traceback__, seen)
            lines.append("\nDuring handling of the above exception, another exception occurred:\n")
        return lines + self._format_one(etype, evalue, tb)

    def _format_one(self, etype, evalue, tb):
        name = etype.__name__
        if issubclass(etype, _shell.UsageError):  # like IPython: the message is enough
            return ["%s%s%s: %s" % (RED, name, RESET, _safe_str(evalue))]
        if issubclass(etype, SyntaxError) and self._cell_name(getattr(evalue, "filename", None)):
            return self._format_syntax_error(etype, evalue)
        frames = self._user_frames(tb)
        out = [RED + "-" * 75 + RESET, "%s%s%s%sTraceback (most recent call last)" % (RED, name, RESET, " " * max(1, 42 - len(name)))]
        for frame, lineno in frames:
            out.append(self._format_frame(frame, lineno))
        if issubclass(etype, SyntaxError):
            out.append("".join(traceback.format_exception_only(etype, evalue)).rstrip("\n"))
        else:
            out.append("%s%s%s: %s" % (RED, name, RESET, _safe_str(evalue)))
        return out

    def _cell_name(self, filename):
        count = self._cell_files.get(filename)
        return None if count is None else "Cell In[%d]" % count

    def _user_frames(self, tb):
        """Frames from the first cell frame on, without the runtime's own frames."""
        frames = list(traceback.walk_tb(tb))
        for i, (frame, _) in enumerate(frames):
            if frame.f_code.co_filename in self._cell_files:
                frames = frames[i:]
                break
        return [(f, n) for f, n in frames if not f.f_code.co_filename.startswith(INTERNAL_PREFIX)]

    def _format_frame(self, frame, lineno):
        filename = frame.f_code.co_filename
        func = frame.f_code.co_name
        cell = self._cell_name(filename)
        if cell:
            head = "%s%s, line %d%s" % (GREEN, cell, lineno, RESET)
            if func != "<module>":
                head += ", in %s%s()%s" % (CYAN, func, RESET)
        else:
            head = "File %s%s:%d%s, in %s%s()%s" % (GREEN, filename, lineno, RESET, CYAN, func, RESET)
        lines = linecache.getlines(filename, frame.f_globals)
        body = []
        if lines:
            first, last = max(1, lineno - 2), min(len(lines), lineno + 2)
            width = len(str(last))
            for n in range(first, last + 1):
                text = lines[n - 1].rstrip("\n")
                if n == lineno:
                    body.append("%s----> %s%s %s" % (GREEN, str(n).rjust(width), RESET, text))
                else:
                    body.append("      %s %s" % (str(n).rjust(width), text))
        return "\n".join([head] + body) + "\n"

    def _format_syntax_error(self, etype, evalue):
        cell = self._cell_name(evalue.filename)
        lines = ["  %s%s, line %s%s\n" % (GREEN, cell, evalue.lineno, RESET)]
        if evalue.text:
            text = evalue.text.rstrip("\n")
            stripped = text.lstrip()
            lines.append("    " + stripped + "\n")
            if evalue.offset:
                caret = max(0, evalue.offset - 1 - (len(text) - len(stripped)))
                lines.append("    " + " " * caret + "^\n")
        return ["".join(lines), "%s%s%s: %s" % (RED, etype.__name__, RESET, evalue.msg)]


    # -- completion and inspection -----------------------------------------

    def complete(self, code, cursor):
        """Reply with completions from the live namespace; never touches user state."""
        with self.session():
            if self.ipython is not None:
                self.send(Kind.REPLY, self.ipython.complete_reply(code, cursor))
                return
            reply = self._complete_magic(code, cursor)
            if reply is None and self.options.get("use_jedi", True):
                try:
                    reply = self._complete_jedi(code, cursor)
                except ImportError:
                    reply = None  # no jedi in the sandbox: the plain completer answers
                except Exception as exc:
                    self.err.write("daytona-kernel: jedi failed (%r); used the plain completer\n" % (exc,))
            if reply is None:
                reply = self._complete_plain(code, cursor)
            self.send(Kind.REPLY, reply)

    def _complete_magic(self, code, cursor):
        import re

        m = re.search(r"(?:^|\s)(%%?)(\w*)$", code[:cursor])
        if not m:
            return None
        prefix, word = m.group(1), m.group(2)
        names = self.shell.cell_magics if prefix == "%%" else self.shell.line_magics
        matches = [prefix + n for n in sorted(names) if n.startswith(word) and not n.startswith("pinfo")]
        start = cursor - len(prefix) - len(word)
        return {"matches": matches, "cursor_start": start, "cursor_end": cursor, "metadata": {}}

    def _complete_jedi(self, code, cursor):
        import jedi

        before = code[:cursor]
        line = before.count("\n") + 1
        column = len(before) - (before.rfind("\n") + 1)
        completions = jedi.Interpreter(code, [self.user_ns]).complete(line, column)
        matches, types = [], []
        start = cursor
        for comp in completions:
            begin = cursor - (len(comp.name) - len(comp.complete))
            start = min(start, begin)
        for comp in completions:
            begin = cursor - (len(comp.name) - len(comp.complete))
            text = code[start:begin] + comp.name
            if text in matches:
                continue
            matches.append(text)
            types.append({"start": start, "end": cursor, "text": text, "type": comp.type, "signature": ""})
        return {
            "matches": matches,
            "cursor_start": start,
            "cursor_end": cursor,
            "metadata": {"_jupyter_types_experimental": types},
        }

    def _complete_plain(self, code, cursor):
        import re
        import rlcompleter

        token = re.search(r"[\w.]*$", code[:cursor]).group()
        completer = rlcompleter.Completer(self.user_ns)
        matches = []
        state = 0
        while True:
            match = completer.complete(token, state)
            if match is None:
                break
            if match not in matches:
                matches.append(match)
            state += 1
        return {"matches": matches, "cursor_start": cursor - len(token), "cursor_end": cursor, "metadata": {}}

    def inspect(self, code, cursor, detail_level=0):
        """Reply with signature, docstring and type (and source for detail 1)."""
        with self.session():
            if self.ipython is not None:
                self.send(Kind.REPLY, self.ipython.inspect_reply(code, cursor, detail_level))
                return
            name = _name_at(code, cursor)
            found, obj = self.lookup(name) if name else (False, None)
            reply = {"found": found, "data": {}, "metadata": {}}
            if found:
                reply["data"] = {"text/plain": self.object_info(name, obj, detail_level)}
            self.send(Kind.REPLY, reply)

    def lookup(self, name):
        parts = name.split(".")
        if parts[0] in self.user_ns:
            obj = self.user_ns[parts[0]]
        elif hasattr(builtins, parts[0]):
            obj = getattr(builtins, parts[0])
        else:
            return False, None
        for part in parts[1:]:
            try:
                obj = getattr(obj, part)
            except Exception:
                return False, None
        return True, obj

    def object_info(self, name, obj, detail_level=0):
        """IPython-style object information (what ``obj?`` and Shift+Tab show)."""
        import inspect as _inspect

        fields = []
        if callable(obj):
            try:
                fields.append(("Signature", "%s%s" % (name.split(".")[-1], _inspect.signature(obj))))
            except (TypeError, ValueError):
                pass  # builtins without a text signature: IPython shows none either
        if not callable(obj) or isinstance(obj, (int, float, str, list, dict, tuple, set)):
            text = _safe_str(obj)
            fields.append(("String form", text if len(text) < 200 else text[:200] + "..."))
            try:
                fields.append(("Length", str(len(obj))))
            except Exception:
                pass  # no len(): nothing to show
        doc = _inspect.getdoc(obj)
        if detail_level and not isinstance(obj, SIMPLE_TYPES):
            try:
                fields.append(("Source", "\n" + _inspect.getsource(obj).rstrip("\n")))
            except (TypeError, OSError):
                if doc:
                    fields.append(("Docstring", doc))
        elif doc:
            fields.append(("Docstring", doc))
        try:
            fields.append(("File", _inspect.getfile(obj)))
        except TypeError:
            pass  # builtins and instances have no file
        fields.append(("Type", type(obj).__name__))
        width = max(len(k) for k, _ in fields) + 2
        return "\n".join("%s%s%s%s" % (RED, (k + ":").ljust(width), RESET, v) for k, v in fields)


    # -- checkpoints -------------------------------------------------------

    def _pickler(self):
        for name in ("cloudpickle", "dill"):
            try:
                return name, __import__(name)
            except ImportError:
                continue  # try the next one; the standard library's pickle is the last resort
        import pickle

        return "pickle", pickle

    def checkpoint(self, path):
        """Pickle every picklable user variable to path (on the disk, then copied to the volume); report what was skipped.

        A relative path is in the working directory (the kernel's sandbox paths are not this machine's
        paths on every backend)."""
        path = os.path.join(self.workdir, path)
        with self.session():
            name, pickler = self._pickler()
            saved, skipped = {}, []
            for var, value in list(self.user_ns.items()):
                if var in self.initial_names or var.startswith("_") or isinstance(value, types.ModuleType):
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
            if self.durable is not None:
                self.durable.wake()
            self.send(Kind.REPLY, {"saved": sorted(saved), "skipped": skipped, "pickler": name, "bytes": len(blob)})

    def restore(self, path):
        """Load the variables of a checkpoint back into the namespace (a relative path: in the working directory)."""
        path = os.path.join(self.workdir, path)
        with self.session():
            name, pickler = self._pickler()
            with open(path, "rb") as f:
                data = pickler.loads(f.read())
            restored, failed = [], []
            for var, blob in data["variables"].items():
                try:
                    self.user_ns[var] = pickler.loads(blob)
                    restored.append(var)
                except Exception as exc:
                    failed.append("%s (%s)" % (var, type(exc).__name__))
            self.send(Kind.REPLY, {"restored": sorted(restored), "failed": failed, "pickler": data.get("pickler")})


class _ExitAutocall(object):
    """``exit``/``quit`` as in ipykernel: ask the frontend to close, do not kill the interpreter."""

    def __init__(self, runtime):
        self._rt = runtime

    def __repr__(self):
        return "Use exit() to ask the notebook to close the kernel."

    def __call__(self, keep_kernel=False):
        self._rt.send(Kind.PAYLOAD, {"source": "ask_exit", "keepkernel": bool(keep_kernel)})


class _ActiveSession(object):
    def __init__(self, runtime):
        self._rt = runtime

    def __enter__(self):
        self._rt.begin()
        return self._rt

    def __exit__(self, *exc):
        self._rt.end()
        return False


def _name_at(code, cursor):
    """The dotted name at the cursor, or the function whose call the cursor is in."""
    import re

    left = re.search(r"[A-Za-z_][\w.]*$", code[:cursor])
    right = re.match(r"\w*", code[cursor:])
    if left:
        return (left.group() + right.group()).rstrip(".")
    depth = 0
    for i in range(cursor - 1, -1, -1):
        ch = code[i]
        if ch == ")":
            depth += 1
        elif ch == "(":
            if depth == 0:
                m = re.search(r"[A-Za-z_][\w.]*$", code[:i])
                return m.group().rstrip(".") if m else None
            depth -= 1
    return None


def _read_reply(path):
    """The kernel's answer to an input request, or None while it is not (completely) written."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.loads(f.read())
    except (OSError, ValueError):
        return None


def _rewritten_in_place(workdir, racy, now, changed, started_ns):
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


def _file_digest(path):
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1024 * 1024), b""):
            digest.update(block)
    return digest.hexdigest()


def _safe_str(value):
    try:
        return str(value)
    except Exception as exc:
        return "<unprintable %s object: %r>" % (type(value).__name__, exc)


def _is_figure(obj):
    cls = type(obj)
    return cls.__module__ == "matplotlib.figure" and cls.__name__ in ("Figure", "SubFigure")


def _fallback_format(obj, include=None, exclude=None):
    """IPython-free formatter: _repr_mimebundle_, the _repr_*_ table, then repr."""
    data, md = {}, {}
    method = getattr(obj, "_repr_mimebundle_", None)
    if callable(method) and not isinstance(obj, type):
        bundle = method(include=include, exclude=exclude)
        if isinstance(bundle, tuple):
            bundle, extra = bundle
            md.update(extra or {})
        data.update(bundle or {})
    for mime, name in REPR_METHODS:
        if mime in data:
            continue
        method = getattr(obj, name, None)
        if not callable(method) or isinstance(obj, type):
            continue
        value = method()
        if isinstance(value, tuple):
            value, extra = value
            md[mime] = extra
        if value is None:
            continue
        if mime in BINARY_MIMES and isinstance(value, bytes):
            value = base64.b64encode(value).decode("ascii")
        data[mime] = value
    if "text/plain" not in data:
        import pprint

        data["text/plain"] = pprint.pformat(obj) if type(obj) in (list, dict, tuple, set) else repr(obj)
    if include:
        data = {k: v for k, v in data.items() if k in include}
    if exclude:
        data = {k: v for k, v in data.items() if k not in exclude}
    return data, md
