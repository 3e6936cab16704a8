"""What faces the daemon's worker: the cells' output streams and the capture of fds 1 and 2.

ipykernel's ``iostream.py`` for a worker whose fd 1 is the daemon's protocol pipe
(docs/daytona-platform.md, "The interpreter"): ``sys.stdout``/``sys.stderr`` coalesce writes into
chunks well under the daemon's 1 MiB line cap and flush past its 1024-character
hold-back; fds 1 and 2 point at pipes pumped into those streams, and the protocol
keeps a private duplicate of fd 1. Standard library only, Python 3.9+.
"""

import codecs
import io
import os
import select
import signal
import sys
import threading
import time

# ipykernel's OutStream.flush_interval: what a stream holds goes out this long after its first write, so prints in a row
# (and %%time's two lines) are one stream output, as under ipykernel
FLUSH_INTERVAL_S = 0.2
# An explicit flush (print(..., flush=True)) goes at once, unless a send went out less than this ago: a flood of them
# still becomes a few large writes (a Daytona client that falls 1024 frames behind is dropped)
FLUSH_GAP_S = 0.015
WRITE_CHARS = 64 * 1024  # any text: even at 6 bytes a character in the daemon's JSON, far under 1 MiB
ASCII_WRITE_CHARS = 384 * 1024  # ASCII without control characters: at most 2 bytes a character in JSON
# JSON escapes these as 6 bytes. Looked for one at a time (``in`` is a memchr): a character-class regex took 3 ms per
# 384 KiB of text, more than the worker's JSON encoding of it (docs/architecture.md, "Stream output")
CONTROL_CHARS = tuple(chr(c) for c in range(32) if chr(c) not in "\t\n\r")
IDLE_BUFFER_CHARS = 1024 * 1024
FD_READ_BYTES = 64 * 1024
DRAIN_INTERVAL_S = 0.001  # a write this long after the last look at fds 1/2 looks again first (keeps order)
PIPE_BYTES = 1024 * 1024  # capture pipes this large rarely fill while a C call holds the GIL
F_SETPIPE_SZ = getattr(__import__("fcntl") if os.name == "posix" else None, "F_SETPIPE_SZ", 1031)
PROTOCOL_LINE_START = '{"type": "'  # how the daemon's worker (json.dump of a dict) starts every line


class _TextSink(io.TextIOBase):
    """A write-only UTF-8 text stream that is not a terminal: what both of the runtime's streams are."""

    @property
    def encoding(self):  # type: ignore[override]  # read-only here
        return "utf-8"

    @property
    def errors(self):  # type: ignore[override]  # read-only here
        return "replace"

    def isatty(self):
        return False

    def writable(self):
        return True

    def readable(self):
        return False


class OutputStream(_TextSink):
    """``sys.stdout``/``sys.stderr`` inside cells: coalesces writes into chunks, as ipykernel's OutStream does.

    A write is buffered and the flusher thread sends it FLUSH_INTERVAL_S after the first write the buffer
    holds (ipykernel's flush interval), so prints in a row are one stream output and a flood of small prints
    becomes a few large writes (the Daytona daemon drops a client that falls 1024 frames behind); an
    explicit flush sends at once (within FLUSH_GAP_S of the last send). No single write comes near the
    daemon's 1 MiB line limit: plain ASCII text goes in pieces of ASCII_WRITE_CHARS, other text in
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
            first = not self._buf
            self._buf.append(s)
            self._size += len(s)
            if rt.active and self._size >= ASCII_WRITE_CHARS:
                rt.flush_streams_locked()
            elif rt.active and first:
                rt.flush_by(time.monotonic() + FLUSH_INTERVAL_S)
        return len(s)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        """Send now, as ipykernel does: at once if nothing went out for FLUSH_GAP_S, else from the flusher thread
        when that much has passed.

        So ``print(i, flush=True)`` in a loop still becomes a few large writes:
        one write per flush would leave a Daytona client 1024 frames behind.
        """
        rt = self._rt
        with rt.lock:
            if not rt.active:
                return
            if time.monotonic() - rt.last_flush >= FLUSH_GAP_S:
                rt.flush_streams_locked()
            elif self._buf:
                rt.flush_by(rt.last_flush + FLUSH_GAP_S)

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
        step = ASCII_WRITE_CHARS if text.isascii() and not any(c in text for c in CONTROL_CHARS) else WRITE_CHARS
        for i in range(0, len(text), step):
            self.target.write(text[i : i + step])
        flush_through(self.target)


def flush_through(stream):
    """The daemon's worker holds a partial line until a newline or 1024 characters: send it now."""
    flush = getattr(stream, "flush", None)
    if flush is not None:
        flush()


def block_signals():
    """Keep SIGINT/SIGTERM for the main thread, where they interrupt the cell (not this helper thread)."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})


class ProtocolWriter(_TextSink):
    """``sys.__stdout__`` once fds are captured: the worker's protocol lines, on a private fd.

    The daemon's worker writes each JSON line to ``sys.__stdout__`` and flushes.
    A line that looks like one of those goes to the original fd 1 in one piece
    (SIGINT held off, so no half line is left behind), after the session journal
    (``journal``, during a cell) has it. Anything else written here (user code
    printing to ``sys.__stdout__``) is cell output.
    """

    def __init__(self, runtime, fd):
        super().__init__()
        self._rt = runtime
        self._fd = fd
        self._parts = []
        self.journal = None

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
        if text.startswith(PROTOCOL_LINE_START) and text.endswith("}\n") and text.find("\n", 0, -1) < 0:
            self._write_line(text.encode("utf-8", "replace"))
        else:
            self._rt.out.write(text)

    def _write_line(self, data):
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if hasattr(signal, "pthread_sigmask") else None
        try:
            journal = self.journal
            if journal is not None:  # first: whatever the daemon got, an attaching kernel finds
                journal.record_line(data)
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
    protocol line and loses it; fd 2 goes to the daemon's log (docs/daytona-platform.md,
    "The interpreter"). So the runtime keeps a private duplicate of fd 1 for the protocol
    (behind ``sys.__stdout__``, where the worker writes), points fds 1 and 2 at
    pipes, and a thread pumps them into its stdout/stderr streams. Children
    inherit only the pipes, never the protocol fd.
    """

    def __init__(self, runtime):
        self._rt = runtime
        self._readers = {}  # read end -> (stream, incremental decoder)
        self._libc = None
        self.original_stdout = None
        self.protocol = None  # the ProtocolWriter, once installed
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
        sys.__stdout__ = protocol  # type: ignore[misc,assignment]  # where the worker writes its protocol
        self.protocol = protocol
        threading.Thread(target=self._pump, name="daytona-kernel-fd-pump", daemon=True).start()

    def _pump(self):
        block_signals()
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
