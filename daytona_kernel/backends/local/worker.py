"""Local interpreter worker: one process per context, behaving like Daytona's.

The Daytona daemon runs one ``python3`` worker per interpreter context
(``apps/daemon/pkg/toolbox/process/interpreter/repl_worker.py``). This worker
imitates it, traps included, so that whatever works on the local backend works
the same on Daytona (see "The interpreter" in docs/daytona-platform.md):

- requests arrive as JSON lines ``{"code": ..., "envs": {...}}`` on stdin;
- ``exec(compile(code, "<string>", "exec"))`` runs in persistent globals;
- **fd 1 is the protocol pipe.** Each chunk is one JSON line written to
  ``sys.__stdout__`` (looked up at every write). Anything else written to
  fd 1 (a subprocess, ``os.system``, C code) lands in the same pipe; the
  reader drops lines that are not JSON, and output without a newline glues
  onto the next JSON line;
- ``sys.stdout``/``sys.stderr`` are emitters that send a chunk only when a
  write contains a newline or 1024 characters are buffered, or on ``flush()``;
- an uncaught exception becomes ``{"type": "error", ...}`` with a traceback of
  ``File "<stdin>", line N`` lines only; SystemExit is a normal completion;
- a KeyboardInterrupt that escapes the code ends the request with
  ``{"type": "control", "text": "interrupted"}``, otherwise
  ``{"type": "control", "text": "completed"}``;
- environment variables passed with a request are restored after it;
- SIGTERM asks the worker to exit once the current request is over.

One addition of our own: on Linux the worker asks the kernel to kill it when
its parent dies (PR_SET_PDEATHSIG), so a SIGKILLed kernel leaves no orphan; on
other systems a thread watches the parent pid. Standard library only; Python 3.9+.
"""

import contextlib
import io
import json
import os
import signal
import sys
import threading
import time
import traceback

EMIT_CHARS = 1024
PARENT_POLL_S = 0.5
PR_SET_PDEATHSIG = 1


def emit(chunk):
    """One protocol line on fd 1, through whatever sys.__stdout__ is now."""
    out = sys.__stdout__
    try:
        assert out is not None
        out.write(json.dumps(chunk) + "\n")
        out.flush()
    except Exception as exc:  # the daemon's worker logs this on its stderr and carries on
        _say("could not send a chunk: %r\n" % (exc,))


def _say(text):
    """A line on the worker's own stderr (the daemon's log)."""
    if sys.__stderr__ is not None:
        sys.__stderr__.write(text)


class Emitter(io.TextIOBase):
    """sys.stdout/sys.stderr during a request: a chunk per newline or 1024 characters."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self._parts = []
        self._size = 0

    def writable(self):
        return True

    def isatty(self):
        return False

    @property
    def encoding(self):  # type: ignore[override]  # read-only here
        return "utf-8"

    def write(self, data):
        if not data:
            return 0
        if not isinstance(data, str):
            data = str(data)
        self._parts.append(data)
        self._size += len(data)
        if "\n" in data or self._size >= EMIT_CHARS:
            self.flush()
        return len(data)

    def flush(self):
        if self._parts:
            text = "".join(self._parts)
            self._parts = []
            self._size = 0
            emit({"type": self.kind, "text": text})


def user_traceback(exc):
    """Only the frames of the code string, as ``File "<stdin>", line N`` (no source lines)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == "<string>"]
    head = "%s: %s\n" % (type(exc).__name__, exc)
    if not frames:
        return head
    return (
        "Traceback (most recent call last):\n" + "".join('  File "<stdin>", line %d\n' % (f.lineno or 0) for f in frames) + head
    )


class Worker(object):
    def __init__(self):
        self.globals = {"__name__": "__main__", "__doc__": None, "__package__": None, "__builtins__": __builtins__}
        self.stopping = False

    def on_sigint(self, signum, frame):
        raise KeyboardInterrupt("Execution interrupted")

    def on_sigterm(self, signum, frame):
        self.stopping = True
        raise KeyboardInterrupt("Shutting down")

    def execute(self, code, envs):
        out, err = Emitter("stdout"), Emitter("stderr")
        ending, error = "completed", None
        saved = {}
        for key, value in (envs or {}).items():
            key = str(key)
            saved[key] = os.environ.get(key)
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = str(value)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                exec(compile(code, "<string>", "exec"), self.globals)
        except KeyboardInterrupt:
            ending = "interrupted"
        except SystemExit:
            pass  # a normal completion
        except Exception as exc:
            error = {"type": "error", "name": type(exc).__name__, "value": str(exc), "traceback": user_traceback(exc)}
        finally:
            out.flush()
            err.flush()
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            if error is not None:
                emit(error)
            emit({"type": "control", "text": ending})

    def handle(self, line):
        try:
            request = json.loads(line)
            envs = request.get("envs")
            if envs is not None and not isinstance(envs, dict):
                raise ValueError("envs must be an object")
            self.execute(request.get("code", ""), envs)
        except Exception as exc:
            emit({"type": "error", "name": type(exc).__name__, "value": str(exc), "traceback": ""})

    def run(self):
        signal.signal(signal.SIGINT, self.on_sigint)
        signal.signal(signal.SIGTERM, self.on_sigterm)
        while not self.stopping:
            try:
                line = sys.stdin.readline()
                if not line:
                    return
                line = line.strip()
                if line:
                    self.handle(line)
            except KeyboardInterrupt:
                continue  # an interrupt between requests
            except Exception as exc:
                _say("worker loop failed: %r\n" % (exc,))
                return


def die_with_parent():
    """Exit when the process that started us exits, even if it was SIGKILLed."""
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
                if os.getppid() != parent:  # the parent died before prctl took effect
                    os._exit(1)
                return
            _say("prctl(PR_SET_PDEATHSIG) failed (errno %d); watching the parent instead\n" % ctypes.get_errno())
        except (OSError, AttributeError) as exc:
            _say("prctl unavailable (%r); watching the parent instead\n" % (exc,))

    def watch():
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


if __name__ == "__main__":
    die_with_parent()
    Worker().run()
