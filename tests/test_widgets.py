"""Widgets across the sandbox boundary (issue 24), on both backends, with real ipywidgets.

A test plays the frontend with jupyter_client: it sends comm messages as JupyterLab's widget
manager does and reads the iopub messages the kernel publishes. What it checks is what stock
ipykernel does (docs/widgets.md): the timing of callbacks in an awaiting and a blocking cell,
the parents of callback output and of the Output widget's capture.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from kernels import Kernel, Run, result_text

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def model_id(run: Run) -> str:
    return str(run.of_type("execute_result")[0]["data"][WIDGET_VIEW]["model_id"])


def update(k: Kernel, comm_id: str, **state: Any) -> str:
    return k.comm("comm_msg", {"comm_id": comm_id, "data": {"method": "update", "state": state, "buffer_paths": []}})


def click(k: Kernel, comm_id: str) -> str:
    return k.comm("comm_msg", {"comm_id": comm_id, "data": {"method": "custom", "content": {"event": "click"}}})


def under(msg_id: str, msg_type: str) -> Any:
    return lambda m: m["msg_type"] == msg_type and m["parent_header"].get("msg_id") == msg_id


def finish(k: Kernel, msg_id: str, timeout: float = 60) -> list[dict[str, Any]]:
    """The iopub messages of a request sent with ``kc.execute``, up to its idle."""
    messages = []
    while True:
        msg = k.wait_for(lambda m: m["parent_header"].get("msg_id") == msg_id, timeout)
        messages.append(msg)
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return messages


def test_a_slider_shows_and_its_value_round_trips(kernel_name: str, workdir: Any) -> None:
    with Kernel(kernel_name) as k:
        run = k.execute(
            "import ipywidgets as w\nseen = []\ns = w.IntSlider(value=3)\n"
            "s.observe(lambda change: (seen.append(change['new']), print('saw', change['new'])), 'value')\ns"
        )
        assert run.status == "ok", run.errors
        opens = run.of_type("comm_open")
        slider = model_id(run)
        assert slider in [o["comm_id"] for o in opens]
        state = next(o for o in opens if o["comm_id"] == slider)["data"]["state"]
        assert (state["_model_name"], state["value"]) == ("IntSliderModel", 3)

        sent = update(k, slider, value=7)
        handling = finish(
            k, sent
        )  # as ipykernel: busy, the handler's messages, then idle (JupyterLab's Output widget needs that)
        assert [m["msg_type"] for m in handling] == ["status", "comm_msg", "stream", "status"]
        echo, printed = handling[1]["content"], handling[2]["content"]
        assert echo["data"]["method"] == "echo_update" and echo["data"]["state"] == {"value": 7}
        assert printed["text"] == "saw 7\n"  # the observer's output goes under the message that caused it
        assert result_text(k.execute("seen, s.value")) == "([7], 7)"

        changed = k.execute("s.value = 11")  # a change in the kernel reaches the frontend under the cell
        assert {"value": 11} in [c["data"].get("state") for c in changed.of_type("comm_msg")]

        info = k.request("comm_info", target_name="jupyter.widget")
        assert slider in info["comms"] and info["comms"][slider] == {"target_name": "jupyter.widget"}
        closed = k.execute("s.close()")
        assert [c["comm_id"] for c in closed.of_type("comm_close")] == [slider]
        assert slider not in k.request("comm_info")["comms"]


def test_a_stop_button_ends_an_awaiting_loop_at_once_and_a_blocking_one_when_it_ends(kernel_name: str, workdir: Any) -> None:
    with Kernel(kernel_name) as k:
        run = k.execute(
            "import asyncio, time, ipywidgets as w\nclicks = []\nb = w.Button(description='Stop')\nb.on_click(clicks.append)\nb"
        )
        button = model_id(run)

        awaiting = k.kc.execute(
            "n = 0\nprint('started', flush=True)\nwhile not clicks and n < 600:\n    await asyncio.sleep(0.05)\n    n += 1\nprint('stopped after', n)"
        )
        k.wait_for(lambda m: under(awaiting, "stream")(m) and "started" in m["content"]["text"])
        click(k, button)
        messages = finish(k, awaiting)
        text = "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream")
        assert "stopped after" in text and int(text.split("stopped after")[1]) < 300, text  # not the whole 30 s

        blocking = k.kc.execute(
            "clicks.clear()\nprint('started', flush=True)\nfor i in range(40):\n    time.sleep(0.05)\nprint('clicks during the loop:', len(clicks))"
        )
        k.wait_for(lambda m: under(blocking, "stream")(m) and "started" in m["content"]["text"])
        click(k, button)
        messages = finish(k, blocking)
        text = "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream")
        assert "clicks during the loop: 0" in text  # deferred, as under ipykernel
        assert result_text(k.execute("len(clicks)")) == "1"  # never lost: handled when the cell ended


def test_interact_output_is_captured_under_the_request_it_brackets(kernel_name: str, workdir: Any) -> None:
    with Kernel(kernel_name) as k:
        run = k.execute("from ipywidgets import interact\n@interact(x=5)\ndef f(x):\n    print('twice', 2 * x)")
        assert run.status == "ok", run.errors
        assert run.text() == "twice 10\n"  # under the cell's request: the Output widget captures it in the browser
        opens = {o["data"]["state"]["_model_name"]: o["comm_id"] for o in run.of_type("comm_open")}
        output_widget, slider = opens["OutputModel"], opens["IntSliderModel"]
        msg_ids = [c["data"]["state"].get("msg_id") for c in run.of_type("comm_msg") if c["comm_id"] == output_widget]
        assert run.reply["parent_header"]["msg_id"] in msg_ids

        sent = update(k, slider, value=7)
        capture = k.wait_for(
            lambda m: (
                under(sent, "comm_msg")(m)
                and m["content"]["comm_id"] == output_widget
                and m["content"]["data"]["state"].get("msg_id")
            )
        )
        assert capture["content"]["data"]["state"]["msg_id"] == sent  # the Output widget now captures the callback's output
        assert k.wait_for(under(sent, "stream"))["content"]["text"] == "twice 14\n"


def test_tqdm_notebook_draws_a_progress_widget(kernel_name: str, workdir: Any) -> None:
    with Kernel(kernel_name) as k:
        run = k.execute("from tqdm.notebook import tqdm\nfor i in tqdm(range(200)):\n    pass")
        assert run.status == "ok", run.errors
        models = [o["data"]["state"]["_model_name"] for o in run.of_type("comm_open")]
        assert "FloatProgressModel" in models and "HBoxModel" in models
        assert any(WIDGET_VIEW in d["data"] for d in run.of_type("display_data"))
        assert "200/200" not in run.text("stderr")  # no text bar beside the widget
        states = [c["data"].get("state", {}) for c in run.of_type("comm_msg")]
        assert any(s.get("value") == 200 for s in states)


def test_a_restart_closes_the_widgets(kernel_name: str, workdir: Any) -> None:
    with Kernel(kernel_name) as k:
        model_id(k.execute("import ipywidgets as w\nw.IntSlider()"))
        assert k.request("comm_info")["comms"]
        k.restart()
        assert k.request("comm_info")["comms"] == {}
        assert k.execute("1 + 1").status == "ok"


def test_the_frontend_gets_every_widget_back_after_a_reload(kernel_name: str, workdir: Any) -> None:
    """A page reload: JupyterLab's widget manager opens the control comm and asks for every widget's state."""
    with Kernel(kernel_name) as k:
        slider = model_id(k.execute("import ipywidgets as w\ns = w.IntSlider(value=4)\ns"))
        k.comm(
            "comm_open",
            {"comm_id": "control-1", "target_name": "jupyter.widget.control", "data": {}},
            metadata={"version": "1.0.0"},
        )
        asked = k.comm("comm_msg", {"comm_id": "control-1", "data": {"method": "request_states"}})
        reply = k.wait_for(under(asked, "comm_msg"))
        states = reply["content"]["data"]["states"]
        assert states[slider]["state"]["value"] == 4 and states[slider]["model_name"] == "IntSliderModel"


def test_a_progress_bar_a_thread_moves_updates_without_a_cell_running(kernel_name: str, workdir: Any) -> None:
    with Kernel(kernel_name) as k:
        run = k.execute(
            "import threading, time, ipywidgets as w\nbar = w.IntProgress(max=20)\ndisplay(bar)\n"
            "def work():\n    time.sleep(0.5)\n    for i in range(1, 21):\n        time.sleep(0.05)\n        bar.value = i\n"
            "threading.Thread(target=work).start()"
        )
        bar = run.of_type("display_data")[-1]["data"][WIDGET_VIEW]["model_id"]
        last = k.wait_for(
            lambda m: (
                m["msg_type"] == "comm_msg"
                and m["content"]["comm_id"] == bar
                and m["content"]["data"]["state"].get("value") == 20
            ),
            30,
        )
        assert last["parent_header"]["msg_id"] == run.reply["parent_header"]["msg_id"]  # under the cell that started the thread


def test_a_kernel_that_attaches_to_a_session_gets_its_widgets_back(daytona_env: Any, tmp_path: Any) -> None:
    env = {"JPY_SESSION_NAME": "widgets.ipynb", "DAYTONA_KERNEL_SYNC": "off"}
    first = Kernel("daytona", env=env, cwd=str(tmp_path))
    slider = model_id(first.execute("import ipywidgets as w\ns = w.IntSlider(value=5)\ns"))
    process = first.km.provisioner.process  # type: ignore[union-attr]
    os.kill(process.pid, signal.SIGKILL)  # a crash: no shutdown, the session stays in the sandbox
    process.wait(10)
    first.kc.stop_channels()
    with Kernel("daytona", env={**env, "DAYTONA_KERNEL_ATTACH": "auto"}, cwd=str(tmp_path)) as second:
        run = second.execute("s.value")  # attaches first, replaying the last cell's output (the slider's text)
        assert run.of_type("execute_result")[-1]["data"]["text/plain"] == "5" and "3 widget(s)" in run.text(
            "stderr"
        )  # with its layout and style
        assert slider in second.request("comm_info", target_name="jupyter.widget")["comms"]
        second.comm(
            "comm_open",
            {"comm_id": "control-2", "target_name": "jupyter.widget.control", "data": {}},
            metadata={"version": "1.0.0"},
        )
        asked = second.comm("comm_msg", {"comm_id": "control-2", "data": {"method": "request_states"}})
        assert second.wait_for(under(asked, "comm_msg"))["content"]["data"]["states"][slider]["state"]["value"] == 5
        update(second, slider, value=9)
        second.wait_for(lambda m: m["msg_type"] == "comm_msg" and m["content"]["data"].get("method") == "echo_update")
        assert result_text(second.execute("s.value")) == "9"


IPYMPL = "%matplotlib widget\nimport matplotlib.pyplot as plt\nfig = plt.figure()\nplt.plot([1, 2, 3])\nfig.canvas"


def mpl_opens(run: Run) -> list[dict[str, Any]]:
    return [o for o in run.of_type("comm_open") if o["data"]["state"].get("_model_module") == "jupyter-matplotlib"]


def test_ipympl_a_third_party_widget_module_is_shown_where_trusted_or_allowed(kernel_name: str, workdir: Any) -> None:
    """%matplotlib widget (ipympl, module jupyter-matplotlib): the local backend trusts its sandbox; on
    daytona the safe policy refuses it with a notice until widget_modules allows it."""
    with Kernel(kernel_name) as k:
        run = k.execute(IPYMPL)
        assert run.status == "ok", run.errors
        if kernel_name == "daytona-local":
            assert mpl_opens(run) and WIDGET_VIEW in run.of_type("execute_result")[0]["data"]
        else:
            assert not mpl_opens(run) and WIDGET_VIEW not in run.of_type("execute_result")[0]["data"]  # its static forms show
            assert "'jupyter-matplotlib'" in run.text("stderr") and "widget_modules" in run.text("stderr")
    if kernel_name == "daytona":
        with Kernel(kernel_name, env={"DAYTONA_KERNEL_WIDGET_MODULES": "jupyter-matplotlib"}) as k:
            run = k.execute(IPYMPL)
            assert mpl_opens(run) and WIDGET_VIEW in run.of_type("execute_result")[0]["data"]


def test_jupyter_ui_poll_handles_clicks_in_a_blocking_loop(kernel_name: str, workdir: Any) -> None:
    """Beyond ipykernel's own timing: jupyter-ui-poll's ui_events() lets a blocking loop take UI events."""
    with Kernel(kernel_name) as k:
        button = model_id(
            k.execute(
                "import time, ipywidgets as w\nfrom jupyter_ui_poll import ui_events\nclicks = []\nb = w.Button()\nb.on_click(clicks.append)\nb"
            )
        )
        loop = k.kc.execute(
            "n = 0\nprint('started', flush=True)\nwith ui_events() as poll:\n    while not clicks and n < 400:\n"
            "        poll(10)\n        time.sleep(0.05)\n        n += 1\nprint('stopped after', n)"
        )
        k.wait_for(lambda m: under(loop, "stream")(m) and "started" in m["content"]["text"])
        click(k, button)
        messages = finish(k, loop)
        text = "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream")
        assert "stopped after" in text and int(text.split("stopped after")[1]) < 200, text


SIDE_BY_SIDE = (
    "import ipywidgets as w\nfrom ipywidgets import interact\nseen = []\ns = w.IntSlider(value=3)\n"
    "s.observe(lambda change: print('saw', change['new']), 'value')\ndisplay(s)\n"
    "@interact(x=2)\ndef f(x):\n    print('twice', 2 * x)"
)


def side_by_side(k: Kernel) -> list[Any]:
    """What a frontend sees of a slider and an interact, as types and texts (ids differ by nature)."""
    k.execute("pass")  # the sandbox's start shows in the first cell
    run = k.execute(SIDE_BY_SIDE)
    models = {o["comm_id"]: o["data"]["state"]["_model_name"] for o in run.of_type("comm_open")}
    signature: list[Any] = [
        sorted(models.values()),
        [m["msg_type"] for m in run.outputs if m["msg_type"] != "comm_msg"],
        run.text(),
    ]
    slider = next(c for c, name in models.items() if name == "IntSliderModel")
    sent = update(k, slider, value=7)
    handling = finish(k, sent)
    signature.append([(m["msg_type"], m["content"].get("text") or m["content"].get("data", {}).get("method")) for m in handling])
    sliders = [c for c, name in models.items() if name == "IntSliderModel" and c != slider]
    sent = update(k, sliders[0], value=5)
    handling = finish(k, sent)
    signature.append(
        sorted((m["msg_type"], m["content"].get("text") or m["content"].get("data", {}).get("method")) for m in handling)
    )
    signature.append(k.request("comm_info", target_name="jupyter.widget")["comms"].keys() >= models.keys())
    return signature


def test_widgets_behave_as_under_stock_ipykernel_side_by_side(kernel_name: str, workdir: Any) -> None:
    with Kernel("python3") as stock:
        expected = side_by_side(stock)
    with Kernel(kernel_name) as k:
        assert side_by_side(k) == expected


def test_widgets_of_an_interpreter_that_died_are_closed(kernel_name: str, workdir: Any) -> None:
    with Kernel(kernel_name) as k:
        slider = model_id(k.execute("import ipywidgets as w\ns = w.IntSlider()\ns"))
        died = k.execute("import os\nos._exit(1)")
        run = k.execute("1 + 1")  # runs in a fresh interpreter
        closed = [c["comm_id"] for c in died.of_type("comm_close") + run.of_type("comm_close")]
        assert closed.count(slider) == 1  # the frontend is told once, as the table forgets
        assert k.request("comm_info")["comms"] == {} and result_text(run) == "2"


def test_widgets_of_an_interpreter_replaced_between_cells_are_closed(kernel_name: str, workdir: Any) -> None:
    """The daemon replaces a worker that died between cells silently; the kernel notices the new runtime."""
    with Kernel(kernel_name) as k:
        slider = model_id(k.execute("import ipywidgets as w\ns = w.IntSlider()\ns"))
        k.execute("import os, threading\nthreading.Timer(0.3, os._exit, (1,)).start()")
        time.sleep(1)
        runs = [k.execute("1 + 1"), k.execute("2 + 2")]
        assert result_text(runs[-1]) == "4"
        # told once, under whichever request found the new interpreter (a drain of the thread's updates may)
        closes = [c for run in runs for c in run.of_type("comm_close") if c["comm_id"] == slider]
        if not closes:
            closes.append(k.wait_for(lambda m: m["msg_type"] == "comm_close" and m["content"]["comm_id"] == slider, 10))
        assert len(closes) == 1 and not [
            m for m in k.stray if m["msg_type"] == "comm_close" and m["content"]["comm_id"] == slider
        ]
        assert k.request("comm_info")["comms"] == {}
