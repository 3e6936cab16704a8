"""Hostile widgets in JupyterLab in a real headless Chromium (issue 31): no script runs under `safe`.

Each payload sets a flag on ``window`` when its script runs. Under stock ipykernel (kernel
``python3``) every flag is set, so the test can fail; under the safe output policy, on the local
backend and on the Daytona backend against the emulator, none is, and the page still shows the
widgets it may show.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from test_browser import ARTIFACTS, Lab, _open, browser  # noqa: F401 (the fixture: one Chromium for the module)

pytestmark = pytest.mark.browser

HOSTILE_WIDGETS = (
    "import ipywidgets as w\n"
    "from traitlets import Unicode\n"
    "class T(w.Text):\n"
    "    _view_name = Unicode('HTMLView').tag(sync=True)\n"
    "class M(w.Textarea):\n"
    "    _view_name = Unicode('HTMLMathView').tag(sync=True)\n"
    "def bad(flag):\n"
    "    return f'<img src=x onerror=\"window.__dk_{flag} = 1\">'\n"
    "later = w.Text(value=bad('update'))\n"
    "later._view_name = 'HTMLView'\n"
    "hidden, shown = w.Text(value=bad('dlink')), w.HTML(value='<b>html widget</b>')\n"
    "w.jsdlink((hidden, 'value'), (shown, 'value'))\n"
    "hidden2, shown2 = w.Text(value=bad('link')), w.HTMLMath(value='math widget')\n"
    "w.jslink((hidden2, 'value'), (shown2, 'value'))\n"
    "display(T(value=bad('swap')), M(value=bad('math')), later, shown, shown2, w.Label('done'))"
)
FLAGS = ("swap", "math", "update", "dlink", "link")
RAN = "() => [" + ", ".join(f"window.__dk_{flag}" for flag in FLAGS) + "]"


def _run_hostile_widgets(browser, lab: Lab, kernel: str, scripts_run: bool) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    lab.create_notebook("hostile.ipynb", kernel)
    context, page, nb = _open(browser, lab, "hostile.ipynb")
    try:
        cell = nb.run(HOSTILE_WIDGETS)
        cell.locator(".widget-label", has_text="done").wait_for()
        if scripts_run:
            page.wait_for_function(f"() => ({RAN})().every(v => v === 1)")
            return
        time.sleep(3)  # time for a script to run, had it reached the page
        assert page.evaluate(RAN) == [None] * len(FLAGS)
        cell.locator(".widget-html-content", has_text="html widget").wait_for()  # shown, and not overwritten
        text = nb.output_text(cell)
        assert "HTMLView" in text and "HTMLMathView" in text and "a link in the browser writing" in text
    except Exception:
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"failed-hostile-widgets-{kernel}.png"), full_page=True)
        raise
    finally:
        context.close()


def test_hostile_widgets_run_their_scripts_under_stock_ipykernel(browser, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    root = tmp_path / "root"
    root.mkdir()
    lab = Lab(root, {})
    try:
        _run_hostile_widgets(browser, lab, "python3", scripts_run=True)
    finally:
        lab.close()


def test_hostile_widgets_run_no_script_under_the_safe_policy_on_the_local_backend(browser, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    root = tmp_path / "root"
    root.mkdir()
    lab = Lab(root, {"DAYTONA_KERNEL_OUTPUT_POLICY": "safe"})
    try:
        _run_hostile_widgets(browser, lab, "daytona-local", scripts_run=False)
    finally:
        lab.close()


def test_hostile_widgets_run_no_script_with_daytona_on_the_emulator(browser, emulator, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    root = tmp_path / "root"
    root.mkdir()
    lab = Lab(root, emulator.env())
    try:
        _run_hostile_widgets(browser, lab, "daytona", scripts_run=False)
    finally:
        lab.close()
