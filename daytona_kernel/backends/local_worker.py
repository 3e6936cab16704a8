"""Local interpreter worker: one process per context, like Daytona's.

It behaves as the Daytona daemon's python worker does, so that the kernel
cannot tell the two apart:
- requests arrive as JSON lines ``{"code": ..., "envs": {...}}`` on stdin;
- ``exec(compile(code, "<string>", "exec"))`` runs in persistent globals;
- only Python-level writes to sys.stdout/sys.stderr are captured (with
  contextlib.redirect_*); output written to fd 1 by C code or subprocesses is
  discarded, just as it never reaches the client on Daytona;
- each write becomes one JSON line ``{"type": "stdout"|"stderr", "text": ...}``;
- an uncaught exception becomes ``{"type": "error", "name", "value", "traceback"}``;
- ``{"type": "control", "text": "completed"}`` ends every request.

Standard library only; runs on Python 3.9+.
"""

import contextlib
import io
import json
import os
import signal
import sys
import threading
import traceback

_channel = os.fdopen(os.dup(1), "w", encoding="utf-8", errors="replace", newline="\n")
_lock = threading.Lock()
_devnull = os.open(os.devnull, os.O_WRONLY)
os.dup2(_devnull, 1)
sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", line_buffering=True)


def send(obj):
    line = json.dumps(obj) + "\n"
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        with _lock:
            _channel.write(line)
            _channel.flush()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class Capture(io.TextIOBase):
    def __init__(self, name):
        super().__init__()
        self.name = name

    def writable(self):
        return True

    def write(self, s):
        if s:
            send({"type": self.name, "text": s})
        return len(s)


def run(code, globals_ns):
    with contextlib.redirect_stdout(Capture("stdout")), contextlib.redirect_stderr(Capture("stderr")):
        try:
            exec(compile(code, "<string>", "exec"), globals_ns)
        except BaseException as exc:  # reported to the client, like the daemon does
            send(
                {
                    "type": "error",
                    "name": type(exc).__name__,
                    "value": str(exc),
                    "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
                }
            )


def main():
    # The kernel process ignores SIGINT and children inherit that; interrupts must work here.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    globals_ns = {"__name__": "__main__", "__builtins__": __builtins__}
    stdin = sys.stdin
    while True:
        try:
            line = stdin.readline()
        except KeyboardInterrupt:  # an interrupt that arrived between requests
            continue
        if not line:
            return
        try:
            request = json.loads(line)
            os.environ.update(request.get("envs") or {})
            run(request["code"], globals_ns)
        except KeyboardInterrupt:
            send({"type": "error", "name": "KeyboardInterrupt", "value": "", "traceback": ""})
        send({"type": "control", "text": "completed"})


if __name__ == "__main__":
    main()
