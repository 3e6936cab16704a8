"""The in-sandbox runtime, and the short code strings that call into it.

Every request to a context is one code string: the bootstrap (once per
context), then one call per cell, completion or inspection. Arguments are
embedded with ``repr``, which round-trips any str, int or bool.
"""

from __future__ import annotations

import json
from importlib import resources

FRAMING_MODULE = "_daytona_kernel_framing"
SHELL_MODULE = "_daytona_kernel_shell"
PATHRULES_MODULE = "_daytona_kernel_pathrules"
DURABLE_MODULE = "_daytona_kernel_durable"
RUNTIME_MODULE = "_daytona_kernel_runtime"
HANDLE = "__dk__"
RUNTIME_MISSING = "DaytonaKernelRuntimeMissing"
"""The error a call raises in a worker without the runtime: the daemon replaced a dead
worker with a fresh one (silently), so the runtime must be bootstrapped again."""


def _source(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def bootstrap_code(token: str, options: dict | None = None) -> str:
    """Code that installs the runtime into a fresh context and says hello."""
    modules = [
        (FRAMING_MODULE, "<daytona-kernel-framing>", _source("framing.py")),
        (PATHRULES_MODULE, "<daytona-kernel-pathrules>", _source("pathrules.py")),
        (DURABLE_MODULE, "<daytona-kernel-durable>", _source("durable.py")),
        (SHELL_MODULE, "<daytona-kernel-shell>", _source("shell.py")),
        (RUNTIME_MODULE, "<daytona-kernel-runtime>", _source("runtime.py")),
    ]
    return (
        "def __dk_boot():\n"
        "    import sys, types\n"
        f"    for name, filename, src in {modules!r}:\n"
        "        mod = types.ModuleType(name)\n"
        "        mod.__file__ = filename\n"
        "        sys.modules[name] = mod\n"
        "        exec(compile(src, filename, 'exec'), mod.__dict__)\n"
        f"    rt = sys.modules[{RUNTIME_MODULE!r}]\n"
        f"    rt.current = rt.Runtime({token!r}, __import__('json').loads({json.dumps(options or {})!r}))\n"
        "    return rt.current\n"
        f"{HANDLE} = __dk_boot()\n"
        "del __dk_boot\n"
        f"{HANDLE}.hello()\n"
    )


def call_source(method: str, *args: object) -> str:
    """Code that calls one runtime method, e.g. ``call_source("run_cell", code, 3)``.

    It goes through the runtime module, not the user's namespace, and a worker that has no
    runtime (a fresh one) raises ``RUNTIME_MISSING`` instead of a NameError: the same round trip.
    """
    runtime = f"__import__('sys').modules[{RUNTIME_MODULE!r}].current"
    return (
        f"if {RUNTIME_MODULE!r} in __import__('sys').modules: {runtime}.{method}({', '.join(repr(a) for a in args)})\n"
        f"else: raise type({RUNTIME_MISSING!r}, (Exception,), {{}})('the runtime is not installed in this worker')\n"
    )
