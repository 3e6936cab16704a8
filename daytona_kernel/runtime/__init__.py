"""The in-sandbox runtime, and the short code strings that call into it.

Every request to a context is one code string: the bootstrap (once per
context), then one call per cell, completion or inspection: a typed call (``calls.py``)
sent as keyword JSON, which the runtime decodes by name.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shlex
from importlib import resources

from .calls import RUNTIME_MISSING, Call, JournalCall, RuntimeOptions, encode

MODULE_PREFIX = "_daytona_kernel_"
MODULES = (
    "calls",
    "framing",
    "pathmap",
    "pathrules",
    "durable",
    "journal",
    "files",
    "streams",
    "display",
    "comms",
    "debug",
    "basic",
    "ipyshell",
    "runtime",
    "fanout",
)
"""The runtime's modules, in import order; each is installed as ``_daytona_kernel_<name>``."""
IPYSHELL_MODULE = MODULE_PREFIX + "ipyshell"
RUNTIME_MODULE = MODULE_PREFIX + "runtime"
HANDLE = "__dk__"


IPYTHON_CACHE_SOURCE = (
    "def ipython_cache(options):\n"
    "    import os, sys\n"
    "    if not options.get('ship_ipython'):\n"
    "        return ''\n"
    "    name = 'ipython-%s-py%d.%d' % ((options['ship_ipython'],) + tuple(sys.version_info[:2]))\n"
    "    return os.path.join(os.path.expanduser('~'), '.cache', 'daytona-kernel', name)\n"
)
"""The sandbox's folder for the IPython the kernel ships (``ship_ipython`` is its version), per Python version."""


COMPILED_RUNTIME_SOURCE = (
    "def compiled_runtime(modules, digest):\n"
    "    import marshal, os, sys, types\n"
    "    folder = os.path.join(os.path.expanduser('~'), '.cache', 'daytona-kernel-runtime')  # not the shipped IPython's\n"
    "    path = os.path.join(folder, 'runtime-%s.%s.marshal' % (digest, sys.implementation.cache_tag))\n"
    "    try:\n"
    "        with open(path, 'rb') as f:\n"
    "            codes = marshal.load(f)\n"
    "        if isinstance(codes, dict) and all(isinstance(codes.get(m[0]), types.CodeType) for m in modules):\n"
    "            return codes\n"
    "    except Exception:\n"
    "        pass\n"
    "    codes = dict((name, compile(src, filename, 'exec')) for name, filename, src in modules)\n"
    "    part = '%s.%d' % (path, os.getpid())\n"
    "    try:\n"
    "        os.makedirs(folder, exist_ok=True)\n"
    "        with open(part, 'wb') as f:\n"
    "            marshal.dump(codes, f)\n"
    "        os.replace(part, path)\n"
    "    except (OSError, ValueError):  # a full or read-only disk: the next context compiles again\n"
    "        try:\n"
    "            os.remove(part)\n"
    "        except OSError:\n"
    "            pass\n"
    "    return codes\n"
)
"""The runtime's modules compiled once per sandbox, source digest and Python, then loaded with ``marshal``
(compiling their 150 KB took 20% of a bootstrap, about 0.1 s). A cache the sandbox's own code could
alter gives that code nothing: it already runs in the runtime's interpreter."""


STALE_SHIPPING_S = 600  # a shipping folder or archive untouched this long was left by a kernel that failed or died


def unpack_ipython_code(archive: str, folder: str) -> str:
    """Code that unpacks a shipped IPython archive into its cache folder, whole or not at all, and
    removes the archive, its partial folder if the unpacking fails (a full disk), and what earlier
    attempts left behind (``STALE_SHIPPING_S``): nothing accumulates on the sandbox's disk."""
    return (
        "def __dk_untar(archive, part):  # the system's tar unpacks the 1,800 files about twice as fast as tarfile\n"
        "    import os, shutil, subprocess\n"
        "    tar = shutil.which('tar')\n"
        "    if tar is None:\n"
        "        return False\n"
        "    os.makedirs(part)\n"
        "    args = [tar, '-xzf', archive, '-C', part, '--no-same-owner']\n"
        "    if subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0:\n"
        "        return True\n"
        "    shutil.rmtree(part, ignore_errors=True)  # tarfile tries again, and says why if it fails too\n"
        "    return False\n"
        "def __dk_unpack(archive, folder):\n"
        "    import glob, os, shutil, tarfile, time\n"
        "    for stale in glob.glob(glob.escape(folder) + '.part-*') + glob.glob(glob.escape(folder) + '.*tar.gz'):\n"
        "        try:\n"
        f"            if stale != archive and time.time() - os.path.getmtime(stale) > {STALE_SHIPPING_S}:\n"
        "                shutil.rmtree(stale) if os.path.isdir(stale) else os.remove(stale)\n"
        "        except OSError:\n"
        "            pass\n"
        "    part = folder + '.part-' + os.urandom(4).hex()\n"
        "    try:\n"
        "        if not __dk_untar(archive, part):\n"
        "            with tarfile.open(archive) as tar:\n"
        "                tar.extractall(part, **({'filter': 'data'} if hasattr(tarfile, 'data_filter') else {}))\n"
        "        try:\n"
        "            os.rename(part, folder)\n"
        "        except OSError:  # another kernel unpacked it first\n"
        "            shutil.rmtree(part, ignore_errors=True)\n"
        "    except BaseException:\n"
        "        shutil.rmtree(part, ignore_errors=True)\n"
        "        raise\n"
        "    finally:\n"
        "        try:\n"
        "            os.remove(archive)\n"
        "        except OSError:\n"
        "            pass\n"
        f"__dk_unpack({archive!r}, {folder!r})\n"
        "del __dk_unpack, __dk_untar\n"
    )


def discard_file_code(path: str) -> str:
    """Code that removes a file if it is there (an upload that failed half-way left it truncated)."""
    return f"try:\n    __import__('os').remove({path!r})\nexcept OSError:\n    pass\n"


def _source(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


CELL_PATH_SOURCE = (
    "def worker_folder_off_path():\n"
    "    import os, sys\n"
    "    script = getattr(sys.modules.get('__main__'), '__file__', None)\n"
    "    if script and sys.path and sys.path[0] and os.path.isabs(script) and (\n"
    "            os.path.realpath(sys.path[0]) == os.path.dirname(os.path.realpath(script))):\n"
    "        del sys.path[0]\n"
    "def third_party_index(cache=''):\n"
    "    import os, sys\n"
    "    for index, path in enumerate(sys.path):\n"
    "        if (cache and path == cache) or os.path.basename(path) in ('site-packages', 'dist-packages'):\n"
    "            return index\n"
    "    return 0\n"
    "def cwd_on_path(cache):\n"
    "    import sys\n"
    "    if '' not in sys.path and not getattr(sys.flags, 'safe_path', False):\n"
    "        sys.path.insert(third_party_index(cache), '')\n"
)
"""The cell's sys.path, as ipykernel's: the worker script's folder (the daemon's ``/tmp``, the local
backend's ``backends/``) is taken off before anything is imported, and ``''`` (the cell's working
directory) is put in once the runtime is installed, where IPython's ``InteractiveShellApp.init_path``
puts it: after the standard library, before site-packages (IPython, BSD-3-Clause). The IPython the
kernel ships goes where site-packages starts, so ``''`` comes before it too, as before any
third-party package under ipykernel."""


def bootstrap_code(token: str, options: RuntimeOptions) -> str:
    """Code that installs the runtime into a fresh context and says hello.

    The IPython shell module needs IPython: when the sandbox's Python cannot
    import it, the module is left out and the runtime uses its basic shell
    (``basic.py``). The runtime's modules live in ``sys.modules`` under
    ``_daytona_kernel_<name>`` and are never looked up on ``sys.path``, so a
    user's ``framing.py`` neither shadows them nor is shadowed by them.
    """
    modules = [(MODULE_PREFIX + name, f"<daytona-kernel-{name}>", _source(name + ".py")) for name in MODULES]
    digest = hashlib.sha256(repr(modules).encode()).hexdigest()[:16]
    return (
        IPYTHON_CACHE_SOURCE + CELL_PATH_SOURCE + COMPILED_RUNTIME_SOURCE + "def __dk_boot():\n"
        "    import os, sys, types\n"
        "    worker_folder_off_path()\n"
        f"    options = __import__('json').loads({json.dumps(dataclasses.asdict(options))!r})\n"
        "    cache = ipython_cache(options)\n"
        "    if cache and os.path.isdir(cache) and cache not in sys.path:  # a shipped IPython: before site-packages\n"
        "        sys.path.insert(third_party_index(), cache)\n"
        "    options['ipython_cache'] = cache\n"
        f"    modules = {modules!r}\n"
        f"    codes = compiled_runtime(modules, {digest!r})\n"
        "    for name, filename, src in modules:\n"
        "        mod = types.ModuleType(name)\n"
        "        mod.__file__ = filename\n"
        "        sys.modules[name] = mod\n"
        "        try:\n"
        "            exec(codes[name], mod.__dict__)\n"
        "        except Exception as exc:\n"
        f"            if name != {IPYSHELL_MODULE!r}:\n"
        "                raise\n"
        "            del sys.modules[name]\n"
        "            options['ipython_error'] = '%s: %s' % (type(exc).__name__, exc)\n"
        f"    rt = sys.modules[{RUNTIME_MODULE!r}]\n"
        f"    rt.current = rt.Runtime({token!r}, options)\n"
        "    cwd_on_path(cache)\n"
        "    return rt.current\n"
        f"{HANDLE} = __dk_boot()\n"
        "del __dk_boot, ipython_cache, worker_folder_off_path, third_party_index, cwd_on_path, compiled_runtime\n"
        f"{HANDLE}.hello()\n"
    )


WARM_IMPORTS = "IPython.core.interactiveshell, IPython.core.completer, IPython.core.page, IPython.utils.process"
"""What the IPython shell module (``ipyshell.py``) imports: about half of a bootstrap's time."""


def warmup_code(options: RuntimeOptions) -> str:
    """Code that readies a fresh context for the next kernel process, left running at a restart: the worker's
    folder off ``sys.path``, the shipped IPython's folder on it, as the bootstrap puts them, and IPython
    imported, so that the next process's bootstrap finds it in ``sys.modules``. Nothing else: the runtime is
    installed by that bootstrap, as in any context."""
    return (
        IPYTHON_CACHE_SOURCE + CELL_PATH_SOURCE + "def __dk_warm():\n"
        "    import os, sys\n"
        "    worker_folder_off_path()\n"
        f"    cache = ipython_cache({{'ship_ipython': {options.ship_ipython!r}}})\n"
        "    if cache and os.path.isdir(cache) and cache not in sys.path:\n"
        "        sys.path.insert(third_party_index(), cache)\n"
        "    try:\n"
        f"        import {WARM_IMPORTS}  # noqa\n"
        "    except Exception:\n"
        "        pass  # the bootstrap says why, or ships IPython\n"
        "__dk_warm()\n"
        "del __dk_warm, ipython_cache, worker_folder_off_path, third_party_index, cwd_on_path\n"
    )


def call_source(call: Call) -> str:
    """Code that makes one call into the runtime, e.g. ``call_source(Complete(code="pri", cursor=3))``.

    The call travels as keyword JSON (``calls.encode``) and the runtime decodes it by name
    (``Runtime.call``). It goes through the runtime module, not the user's namespace, and a worker
    that has no runtime (a fresh one) raises ``RUNTIME_MISSING`` instead of a NameError: the same round trip.
    """
    runtime = f"__import__('sys').modules[{RUNTIME_MODULE!r}].current"
    return (
        f"if {RUNTIME_MODULE!r} in __import__('sys').modules: {runtime}.call({encode(call)!r})\n"
        f"else: raise type({RUNTIME_MISSING!r}, (Exception,), {{}})('the runtime is not installed in this worker')\n"
    )


def journal_command(call: JournalCall) -> str:
    """The shell command that makes one journal verb in the sandbox, e.g.
    ``journal_command(ScanJournals(root=...))``: ``python3 -I -c`` (isolated: a user's ``json.py`` in the
    working directory cannot shadow what it imports) with the calls module, then the journal module's
    source, which decodes the call (keyword JSON, its one argument) by name (``journal.main``)."""
    calls = MODULE_PREFIX + "calls"
    script = (
        "import sys, types\n"
        f"sys.modules[{calls!r}] = types.ModuleType({calls!r})\n"
        f"exec(compile({_source('calls.py')!r}, '<daytona-kernel-calls>', 'exec'), sys.modules[{calls!r}].__dict__)\n"
    ) + _source("journal.py")
    return " ".join(["python3", "-I", "-c", shlex.quote(script), shlex.quote(encode(call))])
