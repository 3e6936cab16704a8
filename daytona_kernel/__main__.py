"""Launch the kernel (``python -I -m daytona_kernel -f CONNECTION_FILE`` by hand; ``-I`` keeps the current
folder off ``sys.path``).

Kernelspecs start it through ``launch()`` from a ``-c`` one-liner that first drops the working
directory from ``sys.path`` (see ``kernelspec.LAUNCH_CODE``): the notebook's folder holds files the
sandbox wrote, and none of them may ever be imported by the kernel on this machine.
"""

from __future__ import annotations


def launch() -> None:
    """Start the kernel application, without ever putting the working directory on sys.path."""
    from daytona_kernel.app import DaytonaKernelApp

    # ipykernel adds '' back to sys.path after the kernel starts (IPKernelApp.init_path) unless told not to.
    DaytonaKernelApp.launch_instance(ignore_cwd=True)


if __name__ == "__main__":
    launch()
