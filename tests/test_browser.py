"""JupyterLab in a real headless Chromium, driven by Playwright, as a user would click.

Needs Debian's ``chromium`` (``apt-get install chromium``); .ci/run installs it. Without it
these tests are skipped with that reason.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
DOCS = Path(__file__).resolve().parent.parent / "docs"
# docs/jupyterlab.png is rewritten only when asked (UPDATE_DOCS_SCREENSHOT=1); otherwise the same shot
# goes to test-artifacts/, so a test run leaves the tree as it was.
UPDATE_DOCS_SCREENSHOT = os.environ.get("UPDATE_DOCS_SCREENSHOT") == "1"
TOKEN = "browser-test-token"
TIMEOUT_MS = 60_000

if CHROMIUM is None and os.environ.get("CI") == "true":
    pytest.fail("CI must run the browser tests, but chromium is not installed: .ci/run installs it with apt-get", pytrace=False)
if CHROMIUM is None:
    pytest.skip("Debian's chromium is not installed (apt-get install chromium); browser tests need it", allow_module_level=True)
playwright_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def browser():  # type: ignore[no-untyped-def]
    with playwright_api.sync_playwright() as p:
        chromium = p.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        yield chromium
        chromium.close()


class Lab:
    """A JupyterLab server on 127.0.0.1 with a temporary root."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root = root
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(root.parent / f"lab-{self.port}.log", "w")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jupyter",
                "lab",
                "--no-browser",
                f"--port={self.port}",
                "--ip=127.0.0.1",
                f"--IdentityProvider.token={TOKEN}",
                f"--ServerApp.root_dir={root}",
                "--ServerApp.disable_check_xsrf=True",
                "--allow-root",
                "--LabApp.news_url=",
                "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            ],
            env={**os.environ, "JUPYTERLAB_WORKSPACES_DIR": str(root.parent / "workspaces"), **env},
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{self.url}/api/status?token={TOKEN}", timeout=2)
                return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError("JupyterLab did not start; see " + self.log.name)

    def create_notebook(self, name: str, kernel: str, sources: tuple[str, ...] = ("",)) -> None:
        nb = {
            "cells": [
                {"cell_type": "code", "source": s, "metadata": {}, "outputs": [], "execution_count": None} for s in sources
            ],
            "metadata": {"kernelspec": {"name": kernel, "display_name": kernel, "language": "python"}},
            "nbformat": 4,
            "nbformat_minor": 5,
        }
        request = urllib.request.Request(
            f"{self.url}/api/contents/{name}?token={TOKEN}",
            method="PUT",
            data=json.dumps({"type": "notebook", "content": nb}).encode(),
            headers={"Content-Type": "application/json"},
        )
        urllib.request.urlopen(request, timeout=10)

    def shut_down_kernels(self) -> None:
        """Every kernel session ended, as closing the notebook and shutting its kernel down does."""
        sessions = json.load(urllib.request.urlopen(f"{self.url}/api/sessions?token={TOKEN}", timeout=10))
        for session in sessions:
            request = urllib.request.Request(f"{self.url}/api/sessions/{session['id']}?token={TOKEN}", method="DELETE")
            urllib.request.urlopen(request, timeout=60)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


class NotebookPage:
    """Typing and running cells in the open notebook."""

    def __init__(self, page) -> None:  # type: ignore[no-untyped-def]
        self.page = page

    def wait_idle(self) -> None:
        """Until the status bar says the kernel is connected and idle."""
        self.page.locator("#jp-main-statusbar").get_by_text(re.compile(r"\| Idle")).wait_for(timeout=TIMEOUT_MS)

    def cells(self):  # type: ignore[no-untyped-def]
        return self.page.locator(".jp-NotebookPanel .jp-Cell")

    def run(self, code: str, wait: bool = True):  # type: ignore[no-untyped-def]
        """Type code into the last cell and press Shift+Enter; return that cell."""
        cell = self.cells().nth(self.cells().count() - 1)  # pinned: Shift+Enter appends a new last cell
        cell.locator(".cm-content").click()
        self.page.keyboard.insert_text(code)  # as pasted: no auto-indent on the way
        self.page.keyboard.press("Shift+Enter")
        if wait:
            self.wait_for_prompt(cell)
        return cell

    def wait_for_prompt(self, cell) -> None:  # type: ignore[no-untyped-def]
        """Until the cell shows its execution count ([n]), i.e. it finished."""
        cell.locator(".jp-InputPrompt").filter(has_text=re.compile(r"\[\d+\]")).wait_for(timeout=TIMEOUT_MS)

    def output_text(self, cell) -> str:  # type: ignore[no-untyped-def]
        return cell.locator(".jp-OutputArea").inner_text()


def _wait_for_a_kernel(page) -> None:  # type: ignore[no-untyped-def]
    """Only until the notebook has its kernel (else Run asks which kernel to start)."""
    page.locator("#jp-main-statusbar").get_by_text(re.compile(r"\| (Starting|Connecting|Idle|Busy)")).wait_for(timeout=TIMEOUT_MS)


def _open(browser, lab: Lab, name: str, wait_idle: bool = True):  # type: ignore[no-untyped-def]
    context = browser.new_context(viewport={"width": 1300, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(f"{lab.url}/lab/tree/{name}?reset&token={TOKEN}")
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell .cm-content")
    nb = NotebookPage(page)
    if not wait_idle:
        _wait_for_a_kernel(page)
        return context, page, nb
    nb.wait_idle()
    news = page.locator(".jp-Notification-Toast-Close, .jp-toast-button", has_text="No")
    if news.count():
        news.first.click()  # JupyterLab's "get notified about news?" toast
    return context, page, nb


ACTIVE_CONTENT = (
    "from IPython.display import HTML, Javascript, display\n"
    "display(Javascript('window.__dk_javascript = 1'))\n"
    'display(HTML(\'<img src="nope" onerror="window.__dk_onerror = 1">\'))\n'
    "display(HTML('<b>after</b><script>window.__dk_script = 1</script>'))"
)
RAN = "() => [window.__dk_javascript, window.__dk_onerror, window.__dk_script]"


def _user_journey(  # type: ignore[no-untyped-def]
    browser, lab: Lab, name: str, screenshot_name: str, docs_screenshot: bool, scripts_run: bool
) -> None:
    context, page, nb = _open(browser, lab, name)
    try:
        # 1. print
        cell = nb.run("print('hello from the sandbox')")
        assert "hello from the sandbox" in nb.output_text(cell)
        # 2. a plot
        cell = nb.run("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('sandbox plot');")
        cell.locator(".jp-OutputArea-output img").wait_for()
        plot_cell = cell
        # 3. a DataFrame
        cell = nb.run("import pandas as pd\npd.DataFrame({'n': [1, 2, 3], 'square': [1, 4, 9]})")
        cell.locator(".jp-OutputArea-output table").wait_for()
        # 4. an error showing the user's line
        cell = nb.run("def broken():\n    return 1 / 0\nbroken()")
        text = nb.output_text(cell)
        assert "ZeroDivisionError" in text and "return 1 / 0" in text
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / screenshot_name), full_page=True)
        if docs_screenshot:
            plot_cell.scroll_into_view_if_needed()
            shot = DOCS / "jupyterlab.png" if UPDATE_DOCS_SCREENSHOT else ARTIFACTS / "jupyterlab.png"
            page.locator(".jp-NotebookPanel").screenshot(path=str(shot))
        # 4b. scripts in outputs: they run for the local backend (trusted by default), never for daytona
        cell = nb.run(ACTIVE_CONTENT)
        cell.locator(".jp-OutputArea-output", has_text="after").wait_for()
        if scripts_run:
            page.wait_for_function(f"() => ({RAN})().every(v => v === 1)")
        else:
            time.sleep(2)  # time for a script to run, had it reached the page
            assert page.evaluate(RAN) == [None, None, None]
            assert "output_policy" in nb.output_text(cell)
        # 5. interrupt from the toolbar keeps variables
        nb.run("survivor = 'still here'")
        cell = nb.run("import time\ntime.sleep(60)", wait=False)
        cell.locator(".jp-InputPrompt").filter(has_text="*").wait_for()
        time.sleep(1)
        page.locator(".jp-NotebookPanel-toolbar [data-command='notebook:interrupt-kernel']").click()
        nb.wait_for_prompt(cell)
        assert "KeyboardInterrupt" in nb.output_text(cell)
        cell = nb.run("print(survivor)")
        assert "still here" in nb.output_text(cell)
        # 6. input() answered in the page
        cell = nb.run("name = input('Your name: ')\nprint('hi', name)", wait=False)
        box = page.locator(".jp-Stdin-input")
        box.wait_for()
        box.fill("Ada")
        box.press("Enter")
        nb.wait_for_prompt(cell)
        assert "hi Ada" in nb.output_text(cell)
        # 7. Tab completion of a remote attribute
        nb.run("class Remote:\n    attribute_name = 1\nremote = Remote()")
        cell = nb.cells().nth(nb.cells().count() - 1)
        cell.locator(".cm-content").click()
        page.keyboard.type("remote.attri")
        # JupyterLab inserts a sole match at once, or lists the matches: either way the
        # remote attribute must be offered. JupyterLab drops a provider's answer after 1 s
        # (providerTimeout), and a fresh interpreter's first completion loads jedi, which can take
        # longer on a loaded machine (under ipykernel too): then a user presses Tab again.
        offered = (
            "() => [...document.querySelectorAll('.jp-NotebookPanel .jp-Cell')].pop().innerText.includes('remote.attribute_name')"
            " || [...document.querySelectorAll('.jp-Completer-item')].some(e => e.offsetParent && e.innerText.includes('attribute_name'))"
        )
        for attempt in range(3):
            page.keyboard.press("Tab")
            try:
                page.wait_for_function(offered, timeout=10_000 if attempt < 2 else TIMEOUT_MS)
                break
            except playwright_api.TimeoutError:
                if attempt == 2:
                    raise
        page.keyboard.press("Escape")
        cell.locator(".cm-content").click()
        page.keyboard.press("Control+a")
        page.keyboard.press("Backspace")  # an empty cell again, for the next step
        # 8. restart clears the namespace
        page.locator(".jp-NotebookPanel-toolbar [data-command='notebook:restart-kernel']").click()
        page.locator(".jp-Dialog .jp-mod-accept").click()
        nb.wait_idle()
        time.sleep(1)
        cell = nb.run("survivor")
        assert "NameError: name 'survivor' is not defined" in nb.output_text(cell)
        # 9. a console on the same kernel: Enter on an incomplete line continues it
        page.locator(".jp-NotebookPanel .jp-Cell").first.click(button="right")
        page.locator(".lm-Menu-item", has_text="New Console for Notebook").click()
        prompt = page.locator(".jp-CodeConsole-promptCell .cm-content")
        prompt.wait_for()
        prompt.click()
        page.keyboard.type("for i in range(3):")
        page.keyboard.press("Enter")
        time.sleep(1)
        assert page.locator(".jp-CodeConsole-content .jp-CodeCell").count() == 0  # nothing ran
        assert page.locator(".jp-CodeConsole-promptCell .cm-line").count() == 2
        page.keyboard.type("print('console', i)")
        page.keyboard.press("Shift+Enter")
        page.locator(".jp-CodeConsole-content .jp-CodeCell .jp-OutputArea").filter(has_text="console 2").wait_for()
    except Exception:
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"failed-{screenshot_name}"), full_page=True)
        raise
    finally:
        context.close()


def test_jupyterlab_with_the_local_backend(browser, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    root = tmp_path / "root"
    root.mkdir()
    lab = Lab(root, {})
    try:
        lab.create_notebook("local.ipynb", "daytona-local")
        _user_journey(browser, lab, "local.ipynb", "jupyterlab-daytona-local.png", docs_screenshot=True, scripts_run=True)
    finally:
        lab.close()


def test_jupyterlab_with_daytona_on_the_emulator(browser, emulator, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    root = tmp_path / "root"
    root.mkdir()
    lab = Lab(root, emulator.env())
    try:
        lab.create_notebook("remote.ipynb", "daytona")
        _user_journey(browser, lab, "remote.ipynb", "jupyterlab-daytona.png", docs_screenshot=False, scripts_run=False)
    finally:
        lab.close()


WIDGETS = (
    "import asyncio, ipywidgets as w\n"
    "speed = w.IntSlider(value=3, max=10, description='speed')\n"
    "out = w.Output()\n"
    "def moved(change):\n"
    "    with out:\n"
    "        print('speed is now', change['new'])\n"
    "speed.observe(moved, 'value')\n"
    "stop = w.Button(description='Stop', button_style='danger')\n"
    "stopped = []\n"
    "stop.on_click(stopped.append)\n"
    "w.VBox([speed, stop, out])"
)


def test_widgets_in_jupyterlab_with_daytona_on_the_emulator(browser, emulator, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A slider moved with the keyboard reaches its observer in the sandbox, whose output the Output
    widget shows; a Stop button ends an awaiting loop; tqdm.notebook draws its bar."""
    root = tmp_path / "root"
    root.mkdir()
    lab = Lab(root, emulator.env())
    context = None
    try:
        lab.create_notebook("widgets.ipynb", "daytona")
        context, page, nb = _open(browser, lab, "widgets.ipynb")
        cell = nb.run(WIDGETS)
        handle = cell.locator(".widget-slider .noUi-handle, .widget-hslider .noUi-handle").first
        handle.wait_for()
        handle.focus()
        page.keyboard.press("ArrowRight")
        page.keyboard.press("ArrowRight")
        cell.locator(".widget-output", has_text="speed is now 5").wait_for()
        loop = nb.run(
            "n = 0\nwhile not stopped:\n    n += 1\n    await asyncio.sleep(0.05)\nprint('stopped after', n, 'steps')", wait=False
        )
        loop.locator(".jp-InputPrompt").filter(has_text="*").wait_for()
        time.sleep(1)
        cell.locator("button.jupyter-button", has_text="Stop").click()
        nb.wait_for_prompt(loop)
        assert "stopped after" in nb.output_text(loop)
        bar = nb.run(
            "import time\nfrom tqdm.notebook import tqdm\nfor i in tqdm(range(50), desc='training'):\n    time.sleep(0.01)"
        )
        bar.locator(".widget-hprogress, .widget-progress").first.wait_for()
        assert "50/50" in nb.output_text(bar)
        ARTIFACTS.mkdir(exist_ok=True)
        cell.scroll_into_view_if_needed()
        shot = DOCS / "widgets.png" if UPDATE_DOCS_SCREENSHOT else ARTIFACTS / "widgets.png"
        page.locator(".jp-NotebookPanel").screenshot(path=str(shot))
    except Exception:
        if context is not None:
            ARTIFACTS.mkdir(exist_ok=True)
            context.pages[0].screenshot(path=str(ARTIFACTS / "failed-widgets.png"), full_page=True)
        raise
    finally:
        if context is not None:
            context.close()
        lab.close()


@pytest.mark.timeout(400)  # every API request is slowed down, and two map cells start workers
def test_status_lines_show_while_a_cell_waits_and_leave_nothing(browser, emulator, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Issue 33's cells in JupyterLab (tests/test_once.py runs them through the other clients): the status
    line is on the page while the first cell waits for the sandbox and its sync, and while a map cell's
    workers start; once each cell is done, nothing of it is on the page or in the saved notebook."""
    from test_once import MAP_CELL, MAP_DISPLAY, MAX_FILE_MB, SKIP_NOTICE, SYNC_CELL, add_big_file, project

    root = project(tmp_path / "root")
    add_big_file(root)
    emulator.delay_s = 0.3  # each API request: the sandbox and the workers take seconds to come up
    lab = Lab(root, {**emulator.env(), "DAYTONA_KERNEL_SYNC_MAX_FILE_MB": MAX_FILE_MB})
    context = None
    try:
        lab.create_notebook("status.ipynb", "daytona")
        context, page, nb = _open(browser, lab, "status.ipynb")
        for code in (SYNC_CELL, MAP_CELL, MAP_DISPLAY):
            cell = nb.run(code, wait=False)
            if code != MAP_DISPLAY:  # (the pool exists then: its status line may be gone before a poll sees it)
                cell.locator(".jp-OutputArea-output", has_text="⏳").wait_for()
            nb.wait_for_prompt(cell)
            shown = [
                cell.locator(".jp-OutputArea-output").nth(i).inner_text()
                for i in range(cell.locator(".jp-OutputArea-output").count())
            ]
            assert shown and all(text.strip() and "⏳" not in text for text in shown), shown  # no blank output either
        emulator.delay_s = 0.0
        page.keyboard.press("Control+s")
        deadline = time.monotonic() + 30
        while True:
            saved = json.loads((root / "status.ipynb").read_text())
            if sum(bool(c.get("outputs")) for c in saved["cells"]) >= 3 or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        outputs = [c["outputs"] for c in saved["cells"] if c["cell_type"] == "code" and c.get("outputs")]
        assert len(outputs) == 3, saved["cells"]
        for cell_outputs in outputs:
            for output in cell_outputs:
                assert "⏳" not in json.dumps(output), output
                if output["output_type"] == "display_data":
                    assert "".join(output["data"].get("text/plain", "")).startswith("'shown by "), output
        texts = ["".join("".join(o.get("text", "")) for o in cell_outputs).splitlines() for cell_outputs in outputs]
        assert sum(SKIP_NOTICE in line for line in texts[0]) == 1 and texts[0][-1] == "after the sync", texts[0]
        assert texts[1].count("[stdout:0] hi 0 2") == 1 and texts[1].count("[stdout:1] hi 1 2") == 1, texts[1]
        assert texts[2].count("[stdout:1] again 1") == 1, texts[2]
    except Exception:
        if context is not None:
            ARTIFACTS.mkdir(exist_ok=True)
            context.pages[0].screenshot(path=str(ARTIFACTS / "failed-status.png"), full_page=True)
        raise
    finally:
        emulator.delay_s = 0.0
        if context is not None:
            context.close()
        lab.close()


RUN_ALL_CELLS = (
    "import time\nprint('one')\ntime.sleep(0.2)\nprint('one b')",
    "print('two')",
    "import ipywidgets as w\nw.IntSlider(value=3)",
)
RUN_ALL_TIMES = 10


def _reopen(page, lab: Lab, name: str) -> None:  # type: ignore[no-untyped-def]
    """Close the notebook's tab (its outputs discarded), end its kernel, and open it again from the file
    browser, as a user does: the page stays loaded, the notebook gets a new kernel."""
    page.locator("#jp-main-dock-panel .lm-TabBar-tab.jp-mod-current .lm-TabBar-tabCloseIcon").click()
    page.locator(".jp-Dialog button", has_text=re.compile(r"^(Discard|Don't Save)$")).click()
    page.locator(".jp-NotebookPanel").wait_for(state="detached")
    lab.shut_down_kernels()
    page.locator(".jp-DirListing-item", has_text=name).dblclick()
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell .cm-content")
    _wait_for_a_kernel(page)


def _run_all_right_after_opening(browser, lab: Lab, name: str) -> None:  # type: ignore[no-untyped-def]
    """Issue 36: Run All as soon as a freshly opened notebook shows, so that JupyterLab sends the cells with
    its widget manager's opening messages (the control comm, request_states) once the kernel is ready; each
    time every cell gets its execution count (none stays at [*]). JupyterLab is loaded once; each attempt
    closes the notebook and opens it again with a new kernel."""
    lab.create_notebook(name, "daytona" if "remote" in name else "daytona-local", RUN_ALL_CELLS)
    context, page, nb = _open(browser, lab, name, wait_idle=False)  # JupyterLab sends them once the kernel is ready
    try:
        for attempt in range(RUN_ALL_TIMES):
            if attempt:
                _reopen(page, lab, name)
            try:
                page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
                page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
                cells = nb.cells()
                for i in range(len(RUN_ALL_CELLS)):
                    nb.wait_for_prompt(cells.nth(i))
                prompts = [cells.nth(i).locator(".jp-InputPrompt").inner_text() for i in range(len(RUN_ALL_CELLS))]
                assert prompts == ["[1]:", "[2]:", "[3]:"], (attempt, prompts)
                assert nb.output_text(cells.nth(0)).split() == ["one", "one", "b"], attempt
                cells.nth(2).locator(".widget-slider, .widget-hslider").first.wait_for()
                nb.wait_idle()
            except Exception:
                ARTIFACTS.mkdir(exist_ok=True)
                page.screenshot(path=str(ARTIFACTS / f"failed-run-all-{name}-{attempt}.png"), full_page=True)
                raise
    finally:
        context.close()


@pytest.mark.timeout(900)  # one notebook opened ten times, each with a new kernel
def test_run_all_right_after_opening_with_the_local_backend(browser, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    root = tmp_path / "root"
    root.mkdir()
    lab = Lab(root, {})
    try:
        _run_all_right_after_opening(browser, lab, "run-all-local.ipynb")
    finally:
        lab.close()


@pytest.mark.timeout(900)
def test_run_all_right_after_opening_with_daytona_on_the_emulator(browser, emulator, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    root = tmp_path / "root"
    root.mkdir()
    lab = Lab(root, emulator.env())
    try:
        _run_all_right_after_opening(browser, lab, "run-all-remote.ipynb")
    finally:
        lab.close()


DEBUGGED_CELL = "def f(a, b):\n    c = a + b\n    return c\n\nresult = f(2, 3)\nprint('result', result)"


def _debugger_journey(browser, lab: Lab, name: str) -> None:  # type: ignore[no-untyped-def]
    """The debugger panel: enable it, set a breakpoint in a cell, run it, see it stop with the function's
    variables, step over a line, see the new variable, continue to the cell's end (docs/debugger.png)."""
    context, page, nb = _open(browser, lab, name)
    try:
        bug = page.locator(".jp-NotebookPanel-toolbar .jp-DebuggerBugButton:not(.disabled)")
        bug.wait_for()  # enabled only for a kernel whose kernelspec says debugger: true
        bug.click()
        panel = page.locator(".jp-DebuggerVariables")
        panel.get_by_text("special variables").wait_for()  # inspectVariables answered: the session started
        cell = nb.cells().nth(0)
        cell.locator(".cm-content").click()
        page.keyboard.insert_text(DEBUGGED_CELL)
        gutter = cell.locator(".cm-breakpoint-gutter .cm-gutterElement")
        gutter.nth(2).wait_for()  # element 0 is CodeMirror's spacer: element n is line n
        gutter.nth(2).click()
        page.locator(".jp-DebuggerBreakpoints-body").get_by_text("2").wait_for()
        page.keyboard.press("Shift+Enter")
        callstack = page.locator(".jp-DebuggerCallstack")
        callstack.get_by_text("f", exact=True).wait_for()  # stopped in f
        panel.get_by_text("a", exact=True).wait_for()
        page.wait_for_function("() => document.querySelector('.jp-DebuggerVariables').innerText.includes('3')")
        assert "c" not in [line.split(":")[0].strip() for line in panel.inner_text().splitlines()]
        page.locator("[data-command='debugger:next']").click()
        panel.get_by_text("c", exact=True).wait_for()  # the stepped line made c
        page.wait_for_function("() => document.querySelector('.jp-DebuggerVariables').innerText.includes('5')")
        ARTIFACTS.mkdir(exist_ok=True)
        docs = UPDATE_DOCS_SCREENSHOT and name == "daytona.ipynb"
        page.screenshot(path=str(DOCS / "debugger.png" if docs else ARTIFACTS / f"debugger-{name}.png"))
        page.locator("[data-command='debugger:continue']").click()
        nb.wait_for_prompt(cell)
        assert "result 5" in nb.output_text(cell)
    except Exception:
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"failed-debugger-{name}.png"), full_page=True)
        raise
    finally:
        context.close()


@pytest.mark.parametrize("kernel", ["daytona-local", "daytona"])
def test_the_debugger_panel_stops_at_a_breakpoint(browser, emulator, tmp_path: Path, kernel: str) -> None:  # type: ignore[no-untyped-def]
    root = tmp_path / "root"
    root.mkdir()
    lab = Lab(root, emulator.env() if kernel == "daytona" else {})
    try:
        lab.create_notebook(f"{kernel}.ipynb", kernel)
        _debugger_journey(browser, lab, f"{kernel}.ipynb")
    finally:
        lab.close()
