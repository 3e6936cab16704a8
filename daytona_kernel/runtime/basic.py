"""The basic shell: cells as plain Python, for a sandbox whose Python cannot run IPython.

Standard library only, Python 3.9+. The runtime uses it only when IPython is
missing and the kernel's own cannot run on this Python (see ipyshell.py for the
shell every other sandbox gets). It shares the runtime's streams, frames and
``input()``; it runs plain Python (top-level ``await`` included), shows the last
expression through the same ``result`` frame, formats tracebacks with the
``traceback`` module and completes with ``rlcompleter``. IPython syntax
(``%magic``, ``!cmd``, ``obj?``) is an error that says what it needs.
"""

import ast
import builtins
import inspect
import linecache
import pprint
import re
import sys
import traceback

try:  # inside the sandbox the bootstrap installed these modules under these names
    from _daytona_kernel_display import clean
    from _daytona_kernel_framing import Kind
except ImportError:  # imported from the package (tests)
    from daytona_kernel.runtime.display import clean
    from daytona_kernel.runtime.framing import Kind

CELL_FILE_PREFIX = "<cell-"
IPYTHON_SYNTAX = re.compile(r"^\s*[%!]|\?\s*$", re.M)
REPR_METHODS = (
    ("text/html", "_repr_html_"),
    ("text/markdown", "_repr_markdown_"),
    ("image/svg+xml", "_repr_svg_"),
    ("image/png", "_repr_png_"),
    ("image/jpeg", "_repr_jpeg_"),
    ("text/latex", "_repr_latex_"),
    ("application/json", "_repr_json_"),
)
INLINE_BACKEND = "_daytona_kernel_inline"
INLINE_BACKEND_SOURCE = """
from matplotlib.backends.backend_agg import FigureCanvasAgg as FigureCanvas, new_figure_manager  # noqa: F401
from matplotlib.backend_bases import FigureManagerBase as FigureManager  # noqa: F401

def show(close=None, block=None):
    import sys
    sys.modules['_daytona_kernel_runtime'].current.shell.flush_figures()

def draw_if_interactive():
    pass
"""


class UsageError(Exception):
    """IPython syntax in a cell the basic shell runs."""


def error_content(etype, evalue, tb):
    """ename, evalue and the traceback module's lines, from the first frame of a cell on."""
    while tb is not None and not tb.tb_frame.f_code.co_filename.startswith(CELL_FILE_PREFIX):
        tb = tb.tb_next
    lines = [line.rstrip("\n") for line in traceback.format_exception(etype, evalue, tb)]
    return {"ename": etype.__name__, "evalue": str(evalue), "traceback": lines}


class BasicShell(object):
    """Runs cells for the runtime (``execute``) and answers completion and inspection."""

    def __init__(self, runtime, user_module, reason):
        self.runtime = runtime
        self.user_ns = user_module.__dict__
        self.user_ns.update({"__name__": "__main__", "__builtins__": builtins, "In": [""], "Out": {}, "_": ""})
        self.user_ns_hidden = dict(self.user_ns)
        self.reason = reason
        self._loop = None
        self._seq = 0
        builtins.display = self.display  # type: ignore[attr-defined]  # as IPython puts it there

    def execute(self, code, count, store_history=True, silent=False):
        self._seq += 1
        filename = "%s%d-%d>" % (CELL_FILE_PREFIX, count, self._seq)
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        if store_history:
            self.user_ns["In"].append(code)
        try:
            result = self._run(code, filename)
            if result is not None and not silent:
                if store_history:
                    self.user_ns["_"] = self.user_ns["Out"][count] = self.user_ns["_%d" % count] = result
                self.runtime.send(Kind.RESULT, {"data": self.format(result), "metadata": {}, "execution_count": count})
        except BaseException:
            self.show_error(*sys.exc_info())
        finally:
            try:
                self.flush_figures()
            except Exception:
                self.show_error(*sys.exc_info())

    def _run(self, code, filename):
        flags = getattr(ast, "PyCF_ALLOW_TOP_LEVEL_AWAIT", 0)
        try:
            tree = compile(code, filename, "exec", ast.PyCF_ONLY_AST | flags, dont_inherit=True)
        except SyntaxError:
            if IPYTHON_SYNTAX.search(code):
                raise UsageError(
                    "IPython syntax (%%magic, !command, object?) needs IPython; cells run as plain Python here (%s)."
                    % self.reason
                )
            raise
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr) and not code.rstrip().endswith(";"):
            last = ast.Expression(tree.body.pop().value)
        if tree.body:
            self._eval(compile(tree, filename, "exec", flags, dont_inherit=True))
        return self._eval(compile(last, filename, "eval", flags, dont_inherit=True)) if last is not None else None

    def _eval(self, code_obj):
        result = eval(code_obj, self.user_ns)
        if code_obj.co_flags & inspect.CO_COROUTINE:  # the cell used top-level await
            if self._loop is None:
                import asyncio

                self._loop = asyncio.new_event_loop()
            result = self._loop.run_until_complete(result)
        return result

    def show_error(self, etype, evalue, tb):
        sys.last_type, sys.last_value, sys.last_traceback = etype, evalue, tb  # pdb.pm() works
        self.runtime.explain(evalue)
        if issubclass(etype, UsageError):  # as IPython shows it: one line on stderr, the reply says error
            sys.stderr.write("UsageError: %s\n" % evalue)
            sys.stderr.flush()
            self.runtime.send(Kind.ERROR, {"ename": etype.__name__, "evalue": str(evalue), "traceback": [], "reply_only": True})
            return
        content = error_content(etype, evalue, tb)
        content["traceback"] = [self.runtime.paths.in_text(line) for line in content["traceback"]]  # the user's files
        self.runtime.send(Kind.ERROR, content)

    def send_payloads(self):
        """The basic shell has no pager or exit payloads."""

    # -- display ---------------------------------------------------------

    def format(self, obj):
        """The MIME bundle: ``_repr_mimebundle_``, the ``_repr_*_`` methods, a PNG for a figure, the text."""
        data = {"text/plain": pprint.pformat(obj)}
        if isinstance(obj, type):
            return data
        if type(obj).__module__ == "matplotlib.figure":
            return clean(dict(data, **self.figure_png(obj)))
        bundle = getattr(obj, "_repr_mimebundle_", None)
        bundle = bundle() if callable(bundle) else None
        data.update((bundle[0] if isinstance(bundle, tuple) else bundle) or {})
        for mime, name in REPR_METHODS:
            method = getattr(obj, name, None)
            value = method() if callable(method) and mime not in data else None
            if value is not None:
                data[mime] = value[0] if isinstance(value, tuple) else value
        return clean(data)

    def display(self, *objs, **kwargs):
        """``display()`` as a builtin (IPython.display needs IPython)."""
        for obj in objs:
            self.runtime.send(Kind.DISPLAY, {"data": self.format(obj), "metadata": kwargs.get("metadata") or {}, "transient": {}})

    def figure_png(self, fig):
        import io

        buf = io.BytesIO()
        fig.canvas.print_figure(buf, format="png", bbox_inches="tight")
        return {"image/png": buf.getvalue()} if fig.axes else {}

    def flush_figures(self):
        """Show every open pyplot figure, then close it, as matplotlib-inline does after a cell."""
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is None or INLINE_BACKEND not in str(sys.modules["matplotlib"].get_backend()):
            return
        try:
            for manager in plt._pylab_helpers.Gcf.get_all_fig_managers():
                self.display(manager.canvas.figure)
        finally:
            plt.close("all")

    # -- completion, inspection, user expressions ------------------------

    def complete_reply(self, code, cursor):
        import rlcompleter

        token = _name_before(code, cursor)
        completer, matches = rlcompleter.Completer(self.user_ns), []  # type: rlcompleter.Completer, list
        while token:
            match = completer.complete(token, len(matches))
            if match is None:
                break
            matches.append(match)
        return {
            "matches": list(dict.fromkeys(matches)),
            "cursor_start": cursor - len(token),
            "cursor_end": cursor,
            "metadata": {},
        }

    def inspect_reply(self, code, cursor, detail_level=0):
        name = _name_before(code, cursor) + re.match(r"\w*", code[cursor:]).group()  # type: ignore[union-attr]  # \w* always matches
        if not name.strip("."):  # inside a call's parentheses: the function
            call = re.search(r"([\w.]+)\([^()]*$", code[:cursor])
            name = call.group(1) if call else ""
        found, obj = self._lookup(name.strip("."))
        if not found:
            return {"found": False, "data": {}, "metadata": {}}
        fields = ["Type: %s" % type(obj).__name__]
        try:
            fields.append("Signature: %s%s" % (name.strip(".").split(".")[-1], inspect.signature(obj)))
        except (TypeError, ValueError):
            pass  # no signature (builtins, instances): IPython shows none either
        fields.append("Docstring:\n%s" % (inspect.getdoc(obj) or "<no docstring>"))
        if detail_level:
            try:
                fields.append("Source:\n%s" % inspect.getsource(obj))
            except (TypeError, OSError):
                pass  # no source (builtins, C code): the docstring is what there is
        return {"found": True, "data": {"text/plain": "\n".join(fields)}, "metadata": {}}

    def _lookup(self, name):
        parts = name.split(".")
        if not parts[0] or (parts[0] not in self.user_ns and not hasattr(builtins, parts[0])):
            return False, None
        obj = self.user_ns[parts[0]] if parts[0] in self.user_ns else getattr(builtins, parts[0])
        for part in parts[1:]:
            try:
                obj = getattr(obj, part)
            except Exception:
                return False, None
        return True, obj

    def expressions_reply(self, expressions):
        results = {}
        for name, expr in expressions.items():
            try:
                results[name] = {"status": "ok", "data": self.format(eval(expr, self.user_ns)), "metadata": {}}
            except Exception:
                results[name] = dict(error_content(*sys.exc_info()), status="error")
        return results


def _name_before(code, cursor):
    """The dotted name that ends at the cursor ("" for none)."""
    found = re.search(r"[\w.]*$", code[:cursor])
    return found.group() if found else ""
