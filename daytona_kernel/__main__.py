"""Launch the kernel (``python -I -m daytona_kernel -f CONNECTION_FILE`` by hand; ``-I`` keeps the current
folder off ``sys.path``).

Kernelspecs start it through ``launch()`` from a ``-c`` one-liner that first drops the working
directory from ``sys.path`` (see ``kernelspec.LAUNCH_CODE``): the notebook's folder holds files the
sandbox wrote, and none of them may ever be imported by the kernel on this machine.
"""

from __future__ import annotations

import atexit
import os
import sys

_ended_cleanly = False


def end_quickly_after_a_clean_end() -> None:
    """Registered before anything else, so it runs after every other atexit handler: once the kernel has
    ended cleanly (``ended_cleanly``), flush the standard streams and end the process without Python's
    finalization. Tearing down the modules of the daytona SDK (its pydantic models) kept a kernel process
    alive about 0.4 s after its shutdown, and Jupyter starts a restart's new process only when the old
    one is gone. Threads were joined and atexit's handlers ran before this; any other end (an exception,
    ``SystemExit``) is Python's own, with its exit status."""
    atexit.register(_end_now)


def ended_cleanly() -> None:
    global _ended_cleanly
    _ended_cleanly = True


def _end_now() -> None:
    if not _ended_cleanly:
        return
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass  # a closed stream has nothing left to flush
    os._exit(0)


def launch() -> None:
    """Start the kernel application, without ever putting the working directory on sys.path."""
    end_quickly_after_a_clean_end()
    from daytona_kernel.app import DaytonaKernelApp

    # ipykernel adds '' back to sys.path after the kernel starts (IPKernelApp.init_path) unless told not to.
    DaytonaKernelApp.launch_instance(ignore_cwd=True)
    ended_cleanly()


if __name__ == "__main__":
    launch()
