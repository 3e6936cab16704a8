"""IPython itself runs the cells in the sandbox (issue 15): what libraries and users expect
of ``get_ipython()``, on both backends, compared with what stock ipykernel does."""

from __future__ import annotations

import base64
import re

import pytest
from kernels import Kernel, result_text

ANSI = re.compile(r"\x1b\[[0-9;]*m")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_get_ipython_is_ipython_with_its_magics(kernel_name: str) -> None:
    with Kernel(kernel_name) as k:
        assert result_text(k.execute("type(get_ipython()).__mro__[1].__name__")) == "'InteractiveShell'"
        k.execute("alpha = 1\nbeta = 'two'")
        assert result_text(k.execute("%who_ls")) == "['alpha', 'beta']"
        assert "Available line magics" in k.execute("%lsmagic").outputs[0]["content"]["data"]["text/plain"]
        assert "alpha = 1" in k.execute("%history").text()
        run = k.execute("%load_ext autoreload\n%autoreload 2")
        assert run.status == "ok" and run.outputs == []


def test_tracebacks_are_ipythons_with_xmode_and_last_traceback(kernel_name: str) -> None:
    with Kernel(kernel_name) as k:
        err = k.execute("def f():\n    return 1 / 0\nf()").errors[0]
        plain = ANSI.sub("", "\n".join(err["traceback"]))
        assert "Cell In[1], line 3" in plain and "----> 2     return 1 / 0" in plain
        assert result_text(k.execute("import sys\nsys.last_type.__name__")) == "'ZeroDivisionError'"
        k.execute("%xmode Minimal")
        err = k.execute("f()").errors[0]
        assert [ANSI.sub("", line) for line in err["traceback"]] == ["ZeroDivisionError: division by zero\n"]


def test_the_reply_says_error_even_when_the_traceback_cannot_be_shown(kernel_name: str) -> None:
    """As ipykernel: the reply's status comes from IPython's result, not from whether an error output was
    shown. IPython prints its fallback when a traceback cannot be rendered (here an exception whose
    ``_render_traceback_`` fails; a second Ctrl-C while a traceback is built does the same) and sends none."""
    with Kernel(kernel_name) as k:
        run = k.execute(
            "class Unshowable(Exception):\n    def _render_traceback_(self):\n        raise ValueError('cannot render')\n"
            "raise Unshowable('x')"
        )
        assert (run.reply["content"]["status"], run.reply["content"].get("ename"), run.reply["content"].get("evalue")) == (
            "error",
            "Unshowable",
            "x",
        )
        assert run.errors == [] and "ValueError: cannot render" in run.text("stderr")
        assert "Unexpected exception formatting exception" in run.text()
        assert k.execute("1 + 1").status == "ok"


def test_a_traceback_through_the_runtime_shows_the_cells_frames_only(kernel_name: str) -> None:
    with Kernel(kernel_name) as k:
        err = k.execute("import sys\nsys.stdout.write(1)").errors[0]
        plain = ANSI.sub("", "\n".join(err["traceback"]))
        assert "----> 2 sys.stdout.write(1)" in plain and plain.endswith("TypeError: write() argument must be str, not int")
        assert "daytona-kernel" not in plain and "Could not get source" not in plain, plain


def test_an_interrupts_traceback_ends_where_the_cell_called_into_the_runtime() -> None:
    """A Ctrl-C that lands in the runtime's stream code under a cell's print: the cell's frames are shown,
    not the kernel's (one stopped between two lines has no line number, and IPython could not format it)."""
    from daytona_kernel.runtime.ipyshell import cut_runtime_frames

    namespace: dict[str, object] = {}
    exec(compile("def write(text):\n    raise KeyboardInterrupt\n", "<daytona-kernel-streams>", "exec"), namespace)
    exec(compile("def cell():\n    write('x')\n", "/tmp/ipykernel_1/2.py", "exec"), namespace)
    with pytest.raises(KeyboardInterrupt) as caught:
        namespace["cell"]()  # type: ignore[operator]
    tb = caught.value.__traceback__
    cut_runtime_frames(tb)
    files = []
    while tb is not None:
        files.append(tb.tb_frame.f_code.co_filename)
        tb = tb.tb_next
    assert files == [__file__, "/tmp/ipykernel_1/2.py"]


def test_debug_reads_its_commands_from_stdin(kernel_name: str) -> None:
    with Kernel(kernel_name) as k:
        k.execute("def f(x):\n    return x / 0\nf(21)")
        answers = iter(["p x * 2", "q"])
        run = k.execute("%debug", stdin_answer=lambda content: next(answers))
        assert [r["prompt"] for r in run.stdin_requests] == ["ipdb> ", "ipdb> "]
        assert "42" in run.text()


def test_display_formatter_for_type_and_png_bytes(kernel_name: str) -> None:
    with Kernel(kernel_name) as k:
        k.execute(
            "class Frac:\n    pass\n"
            "get_ipython().display_formatter.formatters['text/latex'].for_type(Frac, lambda o: '$\\\\frac{1}{2}$')"
        )
        data = k.execute("Frac()").of_type("execute_result")[0]["data"]
        assert data["text/latex"] == "$\\frac{1}{2}$"
        run = k.execute("from PIL import Image\nImage.new('RGB', (3, 2), 'red')")
        png = base64.b64decode(run.of_type("execute_result")[0]["data"]["image/png"])
        assert png.startswith(PNG_SIGNATURE)


def test_figures_come_after_the_error_and_capture_takes_them(kernel_name: str) -> None:
    with Kernel(kernel_name) as k:
        k.execute("import matplotlib.pyplot as plt")  # the first cell may show the sandbox's start
        run = k.execute("plt.plot([1, 2])\n1 / 0")
        assert [m["msg_type"] for m in run.outputs] == ["error", "display_data"]
        assert "image/png" in run.outputs[1]["content"]["data"]
        run = k.execute("%%capture captured\nplt.plot([3, 4])\nplt.show()")
        assert run.outputs == []
        assert result_text(k.execute("len(captured.outputs)")) == "1"


def test_exit_without_parentheses_asks_the_frontend(kernel_name: str) -> None:
    with Kernel(kernel_name) as k:
        run = k.execute("exit")
        assert run.reply["content"]["payload"] == [{"source": "ask_exit", "keepkernel": False}]


# VS Code's variable listing (vscode-jupyter's variableScriptGenerator): its helper script, then
# ``_VSCODE_rwho_ls = %who_ls``, the helper called with the names, and the cleanup, in one silent
# execute. The helper below is a short stand-in for vscodeGetVariableInfo.py with the same entry point.
VSCODE_TYPES_HELPER = """
def _VSCODE_getVariable(what_to_get, is_debugging, *args):
    import json as _VSCODE_json
    import builtins as _VSCODE_builtins
    result = {}
    for name in args[0]:
        result[name] = _VSCODE_builtins.type(globals()[name]).__name__
    return _VSCODE_builtins.print(_VSCODE_json.dumps(result))
"""
VSCODE_TYPES_FLOW = (
    VSCODE_TYPES_HELPER
    + "\n\n_VSCODE_rwho_ls = %who_ls\n"
    + '_VSCODE_getVariable("types", False, _VSCODE_rwho_ls)\n\n'
    + "del _VSCODE_getVariable\n"
    + "try:\n    del _VSCODE_rwho_ls\nexcept:\n    pass\n"
)


def test_vscode_variable_listing_flow_returns_names_and_types(kernel_name: str) -> None:
    with Kernel(kernel_name) as k:
        k.execute("import math\ntotal = 10\nnames = ['a']\ndef helper():\n    pass")
        run = k.execute(VSCODE_TYPES_FLOW, silent=False, store_history=False, allow_stdin=True)
        assert run.status == "ok", run.errors
        assert run.text() == '{"helper": "function", "math": "module", "names": "list", "total": "int"}\n'
        assert result_text(k.execute("'_VSCODE_rwho_ls' in dir()")) == "False"
