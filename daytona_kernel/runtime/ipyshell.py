"""IPython's own ``InteractiveShell`` in the sandbox, publishing through frames.

This is ipykernel's ``ZMQInteractiveShell`` with frames instead of ZeroMQ: a
display publisher and a display hook that send ``display``/``update``/``clear``
and ``result`` frames, ``_showtraceback`` that sends the cell's ``error`` frame,
payloads (pager, exit, set_next_input) sent after the cell, and completion and
inspection answered as ipykernel's ``do_complete``/``do_inspect`` answer them.
Loaded only when the sandbox's Python has a compatible IPython (``MIN_IPYTHON``);
otherwise the runtime keeps its small standard-library shell.
"""

import gc
import importlib.util
import os
import sys
import tempfile
import types
import typing

from IPython.core import page, release
from IPython.core.autocall import ExitAutocall
from IPython.core.compilerop import CachingCompiler
from IPython.core.completer import provisionalcompleter, rectify_completions
from IPython.core.displayhook import DisplayHook
from IPython.core.displaypub import DisplayPublisher
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell, InteractiveShellABC
from IPython.utils.process import system
from IPython.utils.tokenutil import token_at_cursor
from traitlets import Any, Bool, Instance, Type
from traitlets.config import Config

try:  # inside the sandbox the bootstrap installed these modules under these names
    from _daytona_kernel_display import clean
    from _daytona_kernel_framing import KERNEL_MAGICS, Kind
except ImportError:  # imported from the package (tests)
    from daytona_kernel.runtime.display import clean
    from daytona_kernel.runtime.framing import KERNEL_MAGICS, Kind

MIN_IPYTHON = (8, 0)
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"
JUPYTER_TYPES_KEY = "_jupyter_types_experimental"


# Cell file names as ipykernel makes them: murmur2_x86 and get_file_name carried from ipykernel's
# ipykernel/compiler.py (ipykernel is not in the sandbox). Copyright (c) 2015, IPython Development Team;
# BSD 3-Clause License, whose notice and conditions are in LICENSE-ipykernel beside this file.
CELL_HASH_SEED = 0xC70F6907


def murmur2_x86(data, seed):
    """ipykernel's murmur2 hash of a cell's text."""
    m = 0x5BD1E995
    data = bytearray(data.encode("utf8"))
    length = len(data)
    h = seed ^ length
    rounded_end = length & 0xFFFFFFFC
    for i in range(0, rounded_end, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> 24
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    tail = length & 0x03
    k = 0
    if tail == 3:
        k = data[rounded_end + 2] << 16
    if tail in (2, 3):
        k |= data[rounded_end + 1] << 8
    if tail in (1, 2, 3):
        k |= data[rounded_end]
        h ^= k
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


def cut_runtime_frames(tb):
    """End a traceback before its first frame of the runtime's own code (``<daytona-kernel-…>``).

    The user sees the cell's frames and the call into the runtime that failed (``sys.stdout.write(1)``),
    not the runtime's source, which IPython cannot show (it is not on disk). A Ctrl-C lands wherever
    the main thread is, often inside the runtime's stream code under a cell's ``print``; IPython cannot
    format such a frame at all when it stopped between two lines (no line number: IPython asserts)."""
    while tb is not None and tb.tb_next is not None:
        if tb.tb_next.tb_frame.f_code.co_filename.startswith("<daytona-kernel-"):
            tb.tb_next = None
            return
        tb = tb.tb_next


def cell_file_name(code):
    """``<tmp>/ipykernel_<pid>/<murmur2 of the cell>.py``, or ``$IPYKERNEL_CELL_NAME``, as ipykernel names a cell."""
    name = os.environ.get("IPYKERNEL_CELL_NAME")
    if name is None:
        folder = tempfile.gettempdir() + os.sep + "ipykernel_" + str(os.getpid())
        name = folder + os.sep + str(murmur2_x86(code, CELL_HASH_SEED)) + ".py"
    return name


class CellCompiler(CachingCompiler):
    """ipykernel's XCachingCompiler: each cell compiled under its file name (%debug, inspect, tracebacks)."""

    def get_code_name(self, raw_code, code, number):
        return cell_file_name(raw_code)


class FramePublisher(DisplayPublisher):
    """``display()``, ``update_display()`` and ``clear_output()`` as frames."""

    def publish(self, data, metadata=None, source=None, *, transient=None, update=False, **kwargs):
        sys.stdout.flush()
        sys.stderr.flush()
        content = {"data": clean(data), "metadata": clean(metadata or {}), "transient": clean(transient or {})}
        self.shell.runtime.send(Kind.UPDATE if update else Kind.DISPLAY, content)

    def clear_output(self, wait=False):
        self.shell.runtime.send(Kind.CLEAR, {"wait": bool(wait)})


class FrameDisplayHook(DisplayHook):
    """A cell's result (``Out[n]``) as one ``result`` frame: ipykernel's ZMQShellDisplayHook."""

    msg: typing.Any = None

    def start_displayhook(self):
        self.msg = {"data": {}, "metadata": {}, "execution_count": None}

    def write_output_prompt(self):
        self.msg["execution_count"] = self.prompt_count

    def write_format_data(self, format_dict, md_dict=None):
        self.msg["data"] = clean(format_dict)
        self.msg["metadata"] = clean(md_dict or {})

    def finish_displayhook(self):
        sys.stdout.flush()
        sys.stderr.flush()
        if self.msg and self.msg["data"]:
            shell: typing.Any = self.shell
            shell.runtime.send(Kind.RESULT, self.msg)
        self.msg = None


class FrameExitAutocall(ExitAutocall):
    """``exit``/``quit``: ask the frontend to close the kernel (ipykernel's ZMQExitAutocall)."""

    def __call__(self, keep_kernel=False):
        ip: typing.Any = self._ip
        ip.keepkernel_on_exit = keep_kernel
        ip.ask_exit()


class SandboxShell(InteractiveShell):
    """The ``get_ipython()`` of a sandbox: IPython itself, with frames for I/O."""

    displayhook_class = Type(FrameDisplayHook)
    display_pub_class = Type(FramePublisher)
    readline_use = Bool(False)
    autoindent = Bool(False)
    runtime = Any()
    exiter = Instance(ExitAutocall)
    keepkernel_on_exit = None
    error_shown = None  # the exception whose error frame went out last (``execute`` sends one if IPython showed none)

    def _exiter_default(self):
        return FrameExitAutocall(self)

    def init_virtualenv(self):
        """A kernel runs in the interpreter it was given (as ipykernel does)."""

    def init_environment(self):
        """ipykernel's environment: colours on, pagers off."""
        env = os.environ
        env["TERM"] = "xterm-color"
        env["CLICOLOR"] = "1"
        env["FORCE_COLOR"] = "1"
        env["CLICOLOR_FORCE"] = "1"
        env["PAGER"] = "cat"
        env["GIT_PAGER"] = "cat"

    def init_hooks(self):
        super().init_hooks()
        self.set_hook("show_in_pager", page.as_hook(self._page), 99)

    def _page(self, strg, start=0, screen_lines=0, pager_cmd=None):
        data = strg if isinstance(strg, dict) else {"text/plain": strg}
        self._payloads.write_payload({"source": "page", "data": self._users_paths(data), "start": max(0, start)})

    def _users_paths(self, bundle):
        """A bundle's text naming the user's files where the sandbox's are copies of them (``pathmap``)."""
        paths = self.runtime.paths
        return {k: paths.in_text(v) for k, v in bundle.items()} if paths else bundle

    @property
    def _payloads(self) -> typing.Any:
        """IPython's payload manager (always there once the shell is made)."""
        return self.payload_manager

    def enable_gui(self, gui=None):
        """No windows from a sandbox: figures stay inline."""
        if gui not in (None, "inline"):
            sys.stderr.write("daytona-kernel: the %r GUI cannot show windows from a sandbox; figures stay inline.\n" % gui)

    def ask_exit(self):
        self.exit_now = not self.keepkernel_on_exit
        self._payloads.write_payload({"source": "ask_exit", "keepkernel": bool(self.keepkernel_on_exit)})

    def set_next_input(self, text, replace=False):
        self._payloads.write_payload({"source": "set_next_input", "text": text, "replace": replace})

    def showtraceback(self, exc_tuple=None, *args, **kwargs):
        """IPython's, after the runtime's note on a path outside the mirrored folder. The traceback ends
        where the cell's code called into the runtime (``cut_runtime_frames``)."""
        try:
            _, evalue, tb = self._get_exc_info(exc_tuple)
        except ValueError:
            pass  # no exception to show: IPython says so
        else:
            self.runtime.explain(evalue)
            cut_runtime_frames(tb)
        super().showtraceback(exc_tuple, *args, **kwargs)

    def _showtraceback(self, etype, evalue, stb):
        sys.stdout.flush()
        sys.stderr.flush()
        paths = self.runtime.paths  # the user's files, for a link in JupyterLab or VS Code
        content = {"traceback": [paths.in_text(str(line)) for line in stb], "ename": str(etype.__name__), "evalue": str(evalue)}
        self.runtime.send(Kind.ERROR, content)
        self.error_shown = evalue
        self._last_traceback = stb

    def show_usage_error(self, exc):
        """As ipykernel: one ``UsageError: ...`` line on stderr, no error output; the reply still says error."""
        sys.stderr.write("UsageError: %s\n" % exc)  # IPython's line, in one write
        sys.stderr.flush()
        self.runtime.send(Kind.ERROR, {"ename": type(exc).__name__, "evalue": str(exc), "traceback": [], "reply_only": True})
        self.error_shown = exc

    def system_piped(self, cmd):
        """``!cmd``: output streamed as it comes, the exit code in ``_exit_code`` (ipykernel's system_piped)."""
        if cmd.rstrip().endswith("&"):
            raise OSError("Background processes not supported.")
        self.user_ns["_exit_code"] = system(self.var_expand(cmd, depth=1))

    system = system_piped

    def execute(self, code, count, store_history=True, silent=False):
        """Run one cell for the runtime, as ipykernel's do_execute does: the reply's status is IPython's
        result's. When IPython could not show the error (it printed its fallback instead: a traceback
        that fails to render, a second Ctrl-C while one is built), the reply still names it."""
        self.execution_count = count
        self.error_shown = None
        result = self.run_cell(code, store_history=store_history, silent=silent)
        err = result.error_before_exec if result.error_before_exec is not None else result.error_in_exec
        if result.success or err is self.error_shown:  # a widget callback's error shown meanwhile is not this one
            return
        try:
            evalue = str(err)
        except Exception:  # an exception whose str() fails: its name still says what went wrong
            evalue = "<unprintable %s object>" % type(err).__name__
        self.runtime.send(Kind.ERROR, {"ename": type(err).__name__, "evalue": evalue, "traceback": [], "reply_only": True})

    def expressions_reply(self, expressions):
        return clean(self.user_expressions(expressions))

    def send_payloads(self):
        for payload in self._payloads.read_payload():
            self.runtime.send(Kind.PAYLOAD, clean(payload))
        self._payloads.clear_payload()

    # -- completion and inspection: ipykernel's do_complete / do_inspect --------

    def complete_reply(self, code, cursor):
        with provisionalcompleter():
            completions = list(rectify_completions(code, self.Completer.completions(code, cursor)))
        types = [{"start": c.start, "end": c.end, "text": c.text, "type": c.type, "signature": c.signature} for c in completions]
        start, end = (completions[0].start, completions[0].end) if completions else (cursor, cursor)
        return {
            "matches": [c.text for c in completions],
            "cursor_start": start,
            "cursor_end": end,
            "metadata": {JUPYTER_TYPES_KEY: types},
        }

    def inspect_reply(self, code, cursor, detail_level=0):
        name = token_at_cursor(code, cursor)
        reply = {"data": {}, "metadata": {}, "found": False}
        try:
            bundle = self.object_inspect_mime(name, detail_level=detail_level)
        except KeyError:
            return reply
        if not self.enable_html_pager:
            bundle.pop("text/html", None)
        reply["data"] = clean(self._users_paths(bundle))
        reply["found"] = True
        return reply


InteractiveShellABC.register(SandboxShell)


def _kernel_magic(name):
    def magic(line):
        raise UsageError("%%%s runs in the kernel, next to your files, not in the sandbox: put it in a cell of its own." % name)

    return magic


def compatible():
    """True when this IPython can run the sandbox's cells."""
    return tuple(release.version_info[:2]) >= MIN_IPYTHON


def make_shell(runtime, user_module):
    """The sandbox's shell for ``runtime``, with the cells' namespace in ``user_module``."""
    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    config.InteractiveShell.display_page = False
    config.IPKernelApp = Config()  # libraries (tqdm.auto, plotly ...) look for it to know they are in a notebook
    if "MPLBACKEND" not in os.environ and importlib.util.find_spec("matplotlib_inline") is not None:
        os.environ["MPLBACKEND"] = INLINE_BACKEND  # ipykernel's default; without it matplotlib picks its own
    shell = SandboxShell.instance(config=config, runtime=runtime, user_module=user_module, compiler_class=CellCompiler)
    for name in KERNEL_MAGICS:
        shell.register_magic_function(_kernel_magic(name), "line", name)
    formatter = shell.display_formatter
    if runtime.paths and formatter is not None:  # a module's repr names the user's file it was imported from
        formatter.formatters["text/plain"].for_type(
            types.ModuleType, lambda module, p, cycle: p.text(runtime.paths.in_text(repr(module)))
        )
    shell.run_cell("pass", store_history=False, silent=True)  # IPython's first run sets up what later ones reuse
    # IPython's objects, most of the heap, made once: no collection looks at them again, the interpreter's teardown
    # included (a restart waits for the old worker's exit: with them it took 40-140 ms). The user's objects stay
    # collectable, so the teardown still finalizes what a module holds in a reference cycle (a file's buffer).
    gc.freeze()
    return shell
