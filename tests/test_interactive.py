"""IPython-grade interactivity through a real kernel: magics, shell escapes, input(),
completion, inspection, history, VS Code's startup sequence and comms."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from kernels import Kernel, result_text

ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Kernel:
    folder = tmp_path_factory.mktemp("interactive")
    with Kernel("daytona-local", cwd=str(folder)) as k:
        k.execute("pass")
        yield k


# -- shell escapes ---------------------------------------------------------


def test_shell_escape_streams_output(kernel: Kernel) -> None:
    run = kernel.execute("!echo hi")
    assert [m["msg_type"] for m in run.outputs] == ["stream"]
    assert run.outputs[0]["content"] == {"name": "stdout", "text": "hi\r\n"}  # ipykernel: pexpect runs the command on a pty


def test_shell_escape_output_arrives_while_the_command_runs(kernel: Kernel) -> None:
    run = kernel.execute("!echo first; sleep 2; echo second")
    streams = [t for t, m in zip(run.arrivals, run.messages) if m["msg_type"] == "stream"]
    assert run.text() == "first\r\nsecond\r\n"
    assert run.arrivals[-1] - streams[0] > 1.5


def test_shell_escape_stderr_and_exit_code(kernel: Kernel) -> None:
    run = kernel.execute("!echo bad >&2; exit 3")
    assert run.text() == "bad\r\n"  # as with ipykernel: the command's stderr shares its pty with stdout
    assert result_text(kernel.execute("_exit_code")) == "3"


def test_capture_and_interpolation(kernel: Kernel) -> None:
    kernel.execute("word = 'sandbox'\nnums = [1, 2]")
    run = kernel.execute("lines = !echo $word; echo {len(nums) * 10}\nlines")
    assert result_text(run) == "['sandbox', '20']"
    assert result_text(kernel.execute("lines.s")) == "'sandbox 20'"


def test_writefile_then_cat_round_trips(kernel: Kernel) -> None:
    run = kernel.execute("%%writefile notes.txt\nline one\nline two\n")
    assert run.text() == "Writing notes.txt\n"
    assert kernel.execute("!cat notes.txt").text() == "line one\r\nline two\r\n"
    assert kernel.execute("%%writefile -a notes.txt\nline three\n").text() == "Appending to notes.txt\n"
    assert kernel.execute("%%writefile notes.txt\nnew\n").text() == "Overwriting notes.txt\n"


# -- line magics -------------------------------------------------------------


def test_cd_and_pwd(kernel: Kernel, tmp_path: Path) -> None:
    start = result_text(kernel.execute("%pwd"))
    run = kernel.execute(f"%cd {tmp_path}")
    assert run.text() == f"{tmp_path}\n"
    assert result_text(kernel.execute("%pwd")) == repr(str(tmp_path))
    kernel.execute("%cd -")
    assert result_text(kernel.execute("%pwd")) == start


def test_env_sets_reads_and_hides_secrets(kernel: Kernel) -> None:
    assert kernel.execute("%env GREETING=hello").text() == "env: GREETING=hello\n"
    assert result_text(kernel.execute("%env GREETING")) == "'hello'"
    kernel.execute("import os\nos.environ['MY_API_KEY'] = 'do-not-show'")
    run = kernel.execute("%env")
    text = result_text(run)
    assert "GREETING" in text and "MY_API_KEY" in text and "do-not-show" not in text


def test_time_and_timeit(kernel: Kernel) -> None:
    run = kernel.execute("%time sum(range(1000))")
    assert re.match(r"CPU times: user .+, sys: .+, total: .+\nWall time: .+\n", run.text())
    assert result_text(run) == "499500"
    run = kernel.execute("%timeit -n 5 -r 3 sum(range(100))")
    # IPython first warns "The slowest run took N times longer ..." when one run was slow (a loaded machine)
    assert re.fullmatch(
        r"(The slowest run took .+\n)?.+ ± .+ per loop \(mean ± std. dev. of 3 runs, 5 loops each\)\n", run.text()
    )
    run = kernel.execute("%%time\nt = 1\nt + 1")
    assert "Wall time" in run.text() and result_text(run) == "2"
    run = kernel.execute("%%timeit -n 2 -r 2\nsum(range(10))")
    assert "2 runs, 2 loops each" in run.text()


def test_who_whos_and_reset() -> None:
    with Kernel("daytona-local") as k:
        assert k.execute("%who").text() == "Interactive namespace is empty.\n"
        k.execute("alpha = 1\nbeta = 'two'")
        assert k.execute("%who").text() == "alpha\t beta\t \n"
        whos = k.execute("%whos").text().splitlines()
        assert whos[0].split() == ["Variable", "Type", "Data/Info"]
        assert whos[2].split() == ["alpha", "int", "1"]
        k.execute("%reset -f")
        assert k.execute("alpha").errors[0]["ename"] == "NameError"


def test_run_a_script_into_the_namespace(kernel: Kernel) -> None:
    kernel.execute("%%writefile script.py\nimport sys\nanswer = 42\nprint('args', sys.argv[1:], __name__)\n")
    assert kernel.execute("%run script.py one two").text() == "args ['one', 'two'] __main__\n"
    assert result_text(kernel.execute("answer")) == "42"


def test_ls_and_pip(kernel: Kernel) -> None:
    kernel.execute("%%writefile listed.txt\nx\n")
    assert "listed.txt" in kernel.execute("%ls").text()
    run = kernel.execute("%pip --version")
    assert run.text().startswith("pip ") and "restart the kernel" in run.text()


def test_accepted_configuration_magics_are_quiet(kernel: Kernel) -> None:
    for code in ("%matplotlib inline", "%config Completer.use_jedi = False", "%config InlineBackend.figure_format = 'png'"):
        run = kernel.execute(code)
        assert run.status == "ok" and run.outputs == [], code
    kernel.execute("%config Completer.use_jedi = True")


def test_load_ext_autoreload_loads_it(kernel: Kernel) -> None:
    run = kernel.execute("%load_ext autoreload")
    assert run.status == "ok" and run.outputs == []
    assert kernel.execute("%autoreload 2").status == "ok"
    assert result_text(kernel.execute("'IPython.extensions.autoreload' in get_ipython().extension_manager.loaded")) == "True"


def test_unknown_magics_name_themselves(kernel: Kernel) -> None:
    run = kernel.execute("%nosuchmagic")
    err = run.reply["content"]
    assert (run.status, err["ename"]) == ("error", "UsageError") and not run.errors  # on stderr, as ipykernel
    assert err["evalue"] == "Line magic function `%nosuchmagic` not found."
    assert run.text("stderr") == "UsageError: Line magic function `%nosuchmagic` not found.\n"
    err = kernel.execute("%%nosuchcell\nbody").reply["content"]
    assert err["evalue"] == "Cell magic `%%nosuchcell` not found."


# -- cell magics -------------------------------------------------------------


def test_bash_and_sh_cells(kernel: Kernel) -> None:
    run = kernel.execute("%%bash\necho out\necho err >&2")
    assert run.text() == "out\n" and run.text("stderr") == "err\n"
    assert kernel.execute("%%sh\necho from sh").text() == "from sh\n"
    assert kernel.execute("%%bash\nexit 4").errors[0]["ename"] == "CalledProcessError"


def test_capture_collects_output(kernel: Kernel) -> None:
    run = kernel.execute("%%capture cap\nprint('hidden')\ndisplay({'a': 1}, raw=True)")
    assert run.outputs == []
    assert result_text(kernel.execute("cap.stdout")) == "'hidden\\n'"
    shown = kernel.execute("cap.show()")
    assert shown.text() == "hidden\n" and shown.of_type("display_data")[0]["data"] == {"a": 1}


@pytest.mark.parametrize(
    ("magic", "mime"),
    [("html", "text/html"), ("markdown", "text/markdown"), ("javascript", "application/javascript"), ("latex", "text/latex")],
)
def test_display_cell_magics(kernel: Kernel, magic: str, mime: str) -> None:
    run = kernel.execute(f"%%{magic}\nBODY")
    data = run.of_type("display_data")[0]["data"]
    assert data[mime].strip() == "BODY"


# -- help --------------------------------------------------------------------


def test_question_mark_returns_a_pager_payload(kernel: Kernel) -> None:
    kernel.execute("def area(w, h=2):\n    'Area of a rectangle.'\n    return w * h")
    run = kernel.execute("area?")
    assert run.outputs == []
    payload = run.reply["content"]["payload"]
    assert [p["source"] for p in payload] == ["page"]
    text = ANSI.sub("", payload[0]["data"]["text/plain"])
    assert "Signature: area(w, h=2)" in text and "Docstring: Area of a rectangle." in text
    source = ANSI.sub("", kernel.execute("area??").reply["content"]["payload"][0]["data"]["text/plain"])
    assert "def area(w, h=2):" in source and "return w * h" in source
    assert kernel.execute("missing_thing?").text() == "Object `missing_thing` not found.\n"


# -- input() -------------------------------------------------------------------


def test_input_is_bridged_to_the_frontend(kernel: Kernel) -> None:
    run = kernel.execute("name = input('Name: ')\nprint('hello', name)", stdin_answer=lambda c: "Ada")
    assert run.stdin_requests == [{"prompt": "Name: ", "password": False}]
    assert run.text() == "hello Ada\n"


def test_getpass_asks_for_a_password(kernel: Kernel) -> None:
    run = kernel.execute("import getpass\nsecret = getpass.getpass('Token: ')\nlen(secret)", stdin_answer=lambda c: "s3cret")
    assert run.stdin_requests == [{"prompt": "Token: ", "password": True}]
    assert result_text(run) == "6"


def test_input_without_stdin_fails_at_once(kernel: Kernel) -> None:
    started = time.monotonic()
    run = kernel.execute("input('x')", allow_stdin=False)
    assert time.monotonic() - started < 10
    err = run.errors[0]
    assert err["ename"] == "StdinNotImplementedError"
    assert "does not support input requests" in err["evalue"]


def test_interrupt_while_input_waits_ends_the_cell(kernel: Kernel) -> None:
    kernel.execute("kept = 'yes'")
    msg_id = kernel.kc.execute("input('waiting: ')", allow_stdin=True, stop_on_error=False)
    request = kernel.kc.get_stdin_msg(timeout=30)
    assert request["content"]["prompt"] == "waiting: "
    kernel.interrupt()
    reply = None
    while reply is None:
        msg = kernel.kc.get_shell_msg(timeout=30)
        if msg["parent_header"].get("msg_id") == msg_id:
            reply = msg
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "KeyboardInterrupt"
    assert result_text(kernel.execute("kept")) == "'yes'"


# -- completion and inspection -------------------------------------------------


CLASS_A = "class A:\n    x = 1\n    def method(self): pass\na = A()"  # each test defines it: tests may run in other workers


def test_completion_uses_the_live_namespace(kernel: Kernel) -> None:
    kernel.execute(CLASS_A)
    code = "a."
    kernel.request(
        "complete", code, len(code)
    )  # a cold jedi can pass IPython's 400 ms type budget ('<unknown>'), as under ipykernel
    reply = kernel.request("complete", code, len(code))
    completed = {code[: reply["cursor_start"]] + m for m in reply["matches"]}
    assert {"a.x", "a.method"} <= completed
    assert reply["cursor_end"] == len(code)
    types = {t["text"]: t["type"] for t in reply["metadata"]["_jupyter_types_experimental"]}
    assert types["x"] == "instance" or types["x"] == "statement"
    assert types["method"] == "function"


def test_completion_of_dict_keys_and_paths(kernel: Kernel) -> None:
    kernel.execute("config = {'alpha_key': 1}\nopen('data_file.csv', 'w').close()")
    for code, wanted in (("config['alp", "alpha_key"), ("open('data_f", "data_file.csv")):
        reply = kernel.request("complete", code, len(code))
        assert any(wanted in code[: reply["cursor_start"]] + m for m in reply["matches"]), (code, reply)


def test_completion_of_magics(kernel: Kernel) -> None:
    reply = kernel.request("complete", "%tim", 4)
    assert reply["matches"] == ["%time", "%%time", "%timeit", "%%timeit"] and reply["cursor_start"] == 0


def test_completion_without_jedi(kernel: Kernel) -> None:
    kernel.execute(CLASS_A)
    kernel.execute("%config Completer.use_jedi = False")
    try:
        reply = kernel.request("complete", "a.meth", 6)
        completed = ["a.meth"[: reply["cursor_start"]] + m for m in reply["matches"]]
        assert [c for c in completed if c.startswith("a.method")], completed
    finally:
        kernel.execute("%config Completer.use_jedi = True")


def test_completion_never_changes_user_state(kernel: Kernel) -> None:
    before = kernel.execute("'marker'")
    count = before.reply["content"]["execution_count"]
    kernel.request("complete", "ma", 2)
    kernel.request("inspect", "len", 3, 0)
    after = kernel.execute("_")
    assert result_text(after) == "'marker'"
    assert after.reply["content"]["execution_count"] == count + 1


def test_inspection_levels(kernel: Kernel) -> None:
    kernel.execute(CLASS_A)
    kernel.execute("def scale(v, by=3):\n    'Scale v.'\n    return v * by")
    reply = kernel.request("inspect", "scale(1, ", 9, 0)
    assert reply["found"] is True
    text = ANSI.sub("", reply["data"]["text/plain"])
    assert "Signature: scale(v, by=3)" in text and "Docstring: Scale v." in text and "Type:" in text
    assert "return v * by" not in text
    detailed = ANSI.sub("", kernel.request("inspect", "scale", 5, 1)["data"]["text/plain"])
    assert "return v * by" in detailed
    value = ANSI.sub("", kernel.request("inspect", "a.x", 3, 0)["data"]["text/plain"])
    assert "String form: 1" in value and "Type:" in value and "int" in value
    assert kernel.request("inspect", "nothing_here", 12, 0)["found"] is False


def test_is_complete_is_answered_locally(kernel: Kernel) -> None:
    assert kernel.request("is_complete", "for i in range(3):") == {"status": "incomplete", "indent": "    "}
    assert kernel.request("is_complete", "x = 1") == {"status": "complete"}
    assert kernel.request("is_complete", "x = (")["status"] == "incomplete"
    assert kernel.request("is_complete", "import = 7q")["status"] == "invalid"
    assert kernel.request("is_complete", "%time x")["status"] == "complete"


# -- history -------------------------------------------------------------------


def test_history_shapes() -> None:
    with Kernel("daytona-local") as k:
        for code in ("a1 = 1", "a1 + 1", "a1 + 1", "print('x')"):
            k.execute(code)
        tail = k.request("history", hist_access_type="tail", n=2, output=False, raw=True)["history"]
        assert tail == [[1, 3, "a1 + 1"], [1, 4, "print('x')"]]
        with_output = k.request("history", hist_access_type="tail", n=1, output=True, raw=True)["history"]
        assert with_output == [[1, 4, ["print('x')", None]]]
        ranged = k.request("history", hist_access_type="range", session=0, start=2, stop=4, output=True, raw=True)["history"]
        assert ranged == [[1, 2, ["a1 + 1", "2"]], [1, 3, ["a1 + 1", "2"]]]
        found = k.request("history", hist_access_type="search", pattern="a1*", output=False, raw=True)["history"]
        assert [h[1] for h in found] == [1, 2, 3]
        unique = k.request("history", hist_access_type="search", pattern="a1*", unique=True, output=False, raw=True)["history"]
        assert [h[1] for h in unique] == [1, 3]
        last = k.request("history", hist_access_type="search", pattern="*", n=1, output=False, raw=True)["history"]
        assert [h[1] for h in last] == [4]


# -- VS Code and widgets -----------------------------------------------------------

VSCODE_VARIABLES = """
def _VSCODE_getVariable(what_to_get, is_debugging, *args):
    import json as _VSCODE_json
    import builtins as _VSCODE_builtins
    result = []
    for name, value in list(globals().items()):
        if name.startswith("_") or name in ("In", "Out", "exit", "quit", "get_ipython"):
            continue
        if isinstance(value, type(_VSCODE_json)) or callable(value):
            continue
        result.append({"name": name, "type": type(value).__name__, "value": repr(value)[:100]})
    return _VSCODE_json.dumps(result)

print(_VSCODE_getVariable("AllVariableDescriptions", False))
del _VSCODE_getVariable
"""


def test_vscode_startup_sequence_runs_cleanly() -> None:
    hidden = [
        "%config Completer.use_jedi = False",
        "%matplotlib inline",
        "__vsc_ipynb_file__ = '/home/user/project/analysis.ipynb'",
        "import ipywidgets as _VSCODE_ipywidgets\nprint(_VSCODE_ipywidgets.__version__)\ndel _VSCODE_ipywidgets",
    ]
    with Kernel("daytona-local") as k:
        for code in hidden:
            run = k.execute(code, silent=False, store_history=False, allow_stdin=True)
            assert run.status == "ok", (code, run.errors)
        widgets = k.execute("import ipywidgets\nimport ipywidgets", silent=False, store_history=False, allow_stdin=True)
        assert widgets.text("stderr") == ""
        first = k.execute("total = 10")
        assert first.reply["content"]["execution_count"] == 1
        listing = k.execute(VSCODE_VARIABLES, silent=False, store_history=False, allow_stdin=True)
        assert listing.status == "ok"
        assert '"name": "total", "type": "int", "value": "10"' in listing.text()
        second = k.execute("__vsc_ipynb_file__")
        assert result_text(second) == "'/home/user/project/analysis.ipynb'"
        assert second.reply["content"]["execution_count"] == 2


def test_a_comm_to_a_target_nobody_registered_is_closed(kernel: Kernel) -> None:
    info = kernel.request("comm_info")
    assert info == {"status": "ok", "comms": {}}
    msg = kernel.kc.session.msg("comm_open", {"comm_id": "c1", "target_name": "jupyter.widget", "data": {}})
    kernel.kc.shell_channel.send(msg)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        iopub = kernel.kc.get_iopub_msg(timeout=10)
        if iopub["msg_type"] == "comm_close":
            assert iopub["content"]["comm_id"] == "c1"
            break
    else:
        pytest.fail("no comm_close for a comm target nobody registered")
    assert kernel.execute("1 + 1").status == "ok"
