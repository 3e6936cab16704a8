"""Launch the kernel (``python -I -m daytona_kernel -f CONNECTION_FILE`` by hand; ``-I`` keeps the current
folder off ``sys.path``).

Kernelspecs start it through ``launch()`` from a ``-c`` one-liner that first drops the working
directory from ``sys.path`` (see ``kernelspec.LAUNCH_CODE``): the notebook's folder holds files the
sandbox wrote, and none of them may ever be imported by the kernel on this machine.
"""

from __future__ import annotations


def defer_model_builds() -> None:
    """Have pydantic build a model's validators when it is first used, not when its class is defined.

    The daytona SDK defines about 300 models at import (its API clients'), and a kernel uses a few of
    them: building them all was about a fifth of the SDK's import, paid by every start and restart. Only
    the SDK uses pydantic in a kernel process (cells run in the sandbox)."""
    import pydantic

    pydantic.BaseModel.model_config["defer_build"] = True


def launch() -> None:
    """Start the kernel application, without ever putting the working directory on sys.path."""
    defer_model_builds()
    from daytona_kernel.app import DaytonaKernelApp

    # ipykernel adds '' back to sys.path after the kernel starts (IPKernelApp.init_path) unless told not to.
    DaytonaKernelApp.launch_instance(ignore_cwd=True)


if __name__ == "__main__":
    launch()
