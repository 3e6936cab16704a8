"""Threat list: comm frames from a hostile sandbox (issue 24, safety).

Code in a cell can read the frame token and send any frame, so widget traffic is held
to the same rules as every other frame: the default output policy lets only the standard
widget modules reach the browser, cleans what their views would put in ``innerHTML``, and
contains floods, huge buffers, unknown targets and forged parents. Each test is one attack,
played against a ``Request`` with the kernel's real comm bridge.
"""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

import ipywidgets
from traitlets import Unicode

from daytona_kernel.comms import CONTROL_TARGET, CommBridge, WidgetPolicy
from daytona_kernel.outputs import OutputBudget, OutputPolicy
from daytona_kernel.protocol import MAX_COMM_BUFFER_BYTES, OpenComms, SessionComm
from daytona_kernel.request import Request
from daytona_kernel.runtime.framing import Kind, encode_frame

TOKEN = "t0k"
LOG = logging.getLogger("test-hostile-comms")
VIEW = "application/vnd.jupyter.widget-view+json"


class Browser:
    """The kernel's publisher: what would reach the browser on iopub."""

    def __init__(self) -> None:
        self.comms: list[tuple[str, dict[str, Any], list[bytes], dict[str, Any]]] = []
        self.outputs: list[tuple[str, dict[str, Any], dict[str, Any]]] = []

    def publish_comm(
        self, msg_type: str, content: dict[str, Any], metadata: dict[str, Any], buffers: Any, parent: dict[str, Any]
    ) -> None:
        self.comms.append((msg_type, content, list(buffers), parent))

    def publish_output(self, kind: str, content: dict[str, Any], parent: dict[str, Any]) -> None:
        self.outputs.append((kind, content, parent))


def bridge(trusted: bool = False, extra: frozenset[str] = frozenset()) -> tuple[CommBridge, Browser]:
    browser = Browser()
    comms = CommBridge(browser, WidgetPolicy(OutputPolicy(trusted), extra), LOG)
    comms.note_request({"header": {"msg_id": "cell-1", "msg_type": "execute_request"}})
    return comms, browser


def run(comms: CommBridge, *frames: tuple[str, Any], budget: OutputBudget | None = None) -> tuple[Request, list[tuple[str, Any]]]:
    shown: list[tuple[str, Any]] = []
    request = Request(TOKEN, lambda kind, content: shown.append((kind, content)), None, comms.policy.output, budget, comms)
    for kind, payload in frames:
        request.on_stdout("".join(encode_frame(TOKEN, kind, payload)))
    request.finish()
    return request, shown


def widget(comm_id: str, model: str, module: str = "@jupyter-widgets/controls", **state: Any) -> tuple[str, Any]:
    """A widget's comm_open as ipywidgets 8 sends it: its model, drawn by the view of the same name."""
    version = "1.0.0" if module == "@jupyter-widgets/output" else "2.0.0"
    names = {"_model_module": module, "_model_module_version": version, "_model_name": model}
    names |= {"_view_module": module, "_view_module_version": version, "_view_name": model.replace("Model", "View")}
    return opening(comm_id, {**names, **state})


def opening(comm_id: str, state: dict[str, Any]) -> tuple[str, Any]:
    content = {"comm_id": comm_id, "target_name": "jupyter.widget", "data": {"state": state, "buffer_paths": []}}
    return Kind.COMM_OPEN, {"content": content, "metadata": {"version": "2.1.0"}, "buffers": []}


def shown(*widgets: Any) -> list[tuple[str, Any]]:
    """The comm_open frames real ipywidgets objects send (made here, as a cell in the sandbox would)."""
    return [opening(w.model_id, json.loads(json.dumps(plain(w)))) for w in widgets]


def plain(widget: Any) -> dict[str, Any]:
    """A widget's state without its binary values (ipywidgets sends those as buffers)."""
    return {k: v for k, v in widget.get_state().items() if not isinstance(v, (bytes, memoryview))}


def reload(
    comms: CommBridge, states: dict[str, Any], paths: list[Any] | None = None, buffers: list[str] | None = None
) -> dict[str, Any]:
    """A page reload: the frontend opens the control comm, the sandbox answers with every widget's state."""
    control = {"comm_id": "c1", "target_name": CONTROL_TARGET, "data": {}}
    comms.from_frontend({"header": {"msg_id": "f-reload", "msg_type": "comm_open"}, "content": control, "metadata": {}})
    run(comms, message("c1", {"method": "update_states", "states": states, "buffer_paths": paths or []}, buffers))
    return states


def entry(model: str, state: dict[str, Any], module: str = "@jupyter-widgets/controls") -> dict[str, Any]:
    return {"model_name": model, "model_module": module, "model_module_version": "2.0.0", "state": state}


def message(comm_id: str, data: dict[str, Any], buffers: list[str] | None = None) -> tuple[str, Any]:
    return Kind.COMM_MSG, {"content": {"comm_id": comm_id, "data": data}, "metadata": {}, "buffers": buffers or []}


def test_a_standard_widget_is_shown() -> None:
    comms, browser = bridge()
    run(comms, widget("s1", "IntSliderModel", value=3))
    assert [(t, c["comm_id"]) for t, c, _, _ in browser.comms] == [("comm_open", "s1")]
    assert browser.comms[0][3]["header"]["msg_id"] == "cell-1"


def test_a_third_party_widget_module_is_refused_with_a_notice_and_shows_its_text() -> None:
    comms, browser = bridge()
    view = {"model_id": "a1", "version_major": 2, "version_minor": 1}
    request, shown = run(
        comms,
        widget("a1", "AnyModel", module="anywidget", _esm="fetch('/api/contents')"),
        (Kind.RESULT, {"data": {"text/plain": "AnyWidget()", VIEW: view}, "metadata": {}, "execution_count": 1}),
        message("a1", {"method": "update", "state": {"_esm": "x"}}),
    )
    assert browser.comms == []
    assert [c["data"] for k, c in shown if k == "execute_result"] == [{"text/plain": "AnyWidget()"}]
    notices = comms.take_notices()
    assert len(notices) == 1 and "'anywidget'" in notices[0] and "widget_modules" in notices[0]


def test_a_third_party_module_passes_when_allowed_or_trusted() -> None:
    for comms, browser in (bridge(extra=frozenset({"jupyter-matplotlib"})), bridge(trusted=True)):
        run(comms, widget("m1", "MPLCanvasModel", module="jupyter-matplotlib"))
        assert [c["comm_id"] for _, c, _, _ in browser.comms] == ["m1"]


def test_an_unknown_comm_target_is_refused() -> None:
    comms, browser = bridge()
    payload = {"content": {"comm_id": "n1", "target_name": "matplotlib", "data": {}}, "metadata": {}, "buffers": []}
    run(comms, (Kind.COMM_OPEN, payload), message("n1", {"draw": "<script>"}))
    assert browser.comms == [] and "'matplotlib'" in comms.take_notices()[0]


def test_the_frontend_may_not_open_a_third_party_target_in_the_sandbox() -> None:
    comms, browser = bridge()
    msg = {"header": {"msg_id": "f1", "msg_type": "comm_open"}, "content": {"comm_id": "x1", "target_name": "evil", "data": {}}}
    comms.from_frontend(msg)
    assert len(comms.queue) == 0 and [(t, c["comm_id"]) for t, c, _, _ in browser.comms] == [("comm_close", "x1")]


def test_html_widget_markup_is_cleaned_on_open_update_and_reload() -> None:
    comms, browser = bridge()
    bad = '<b>ok</b><img src=x onerror="fetch(`/api/terminals`,{method:`POST`})"><script>alert(1)</script>'
    run(comms, widget("h1", "HTMLModel", value=bad), message("h1", {"method": "update", "state": {"value": bad}}))
    reload(comms, {"h1": entry("HTMLModel", {"value": bad})})
    values = [browser.comms[0][1]["data"]["state"]["value"], browser.comms[1][1]["data"]["state"]["value"]]
    values.append(browser.comms[2][1]["data"]["states"]["h1"]["state"]["value"])
    for value in values:
        assert "<b>ok</b>" in value and "onerror" not in value and "<script" not in value


def test_the_reload_reply_holds_only_open_allowed_widgets_and_their_buffers() -> None:
    comms, browser = bridge()
    run(comms, widget("ok1", "ImageModel"), widget("bad1", "AnyModel", module="anywidget"))
    states = {m: entry("ImageModel", {}) for m in ("ok1", "bad1", "never-opened")}
    paths = [["bad1", "state", "value"], ["ok1", "state", "value"], ["never-opened", "state", "value"]]
    reload(comms, states, paths, [base64.b64encode(b).decode() for b in (b"evil", b"png", b"other")])
    _, content, sent_buffers, _ = browser.comms[-1]
    assert set(content["data"]["states"]) == {"ok1"}
    assert content["data"]["buffer_paths"] == [["ok1", "state", "value"]] and sent_buffers == [b"png"]


def test_output_widget_outputs_go_through_the_output_policy() -> None:
    comms, browser = bridge()
    outputs = [
        {
            "output_type": "display_data",
            "data": {"text/html": "<script>x()</script><i>hi</i>", "application/javascript": "x()"},
            "metadata": {},
        }
    ]
    run(comms, widget("o1", "OutputModel", module="@jupyter-widgets/output", outputs=outputs))
    shown = browser.comms[0][1]["data"]["state"]["outputs"][0]["data"]
    assert "application/javascript" not in shown and "<script" not in shown["text/html"] and "<i>hi</i>" in shown["text/html"]


def test_a_forged_parent_is_a_protocol_error_and_output_stays_with_the_cell() -> None:
    comms, browser = bridge()
    request, shown = run(
        comms, (Kind.PARENT, {"msg_id": "some-other-users-request"}), (Kind.DISPLAY, {"data": {"text/plain": "x"}})
    )
    assert request.error is not None and "never sent to the sandbox" in request.error["evalue"]
    assert browser.outputs == [] and [k for k, _ in shown if k == "display_data"] == ["display_data"]


def test_output_under_a_forwarded_message_goes_under_it_and_its_error_is_not_the_cells() -> None:
    comms, browser = bridge()
    comms.from_frontend(
        {"header": {"msg_id": "f9", "msg_type": "comm_open"}, "content": {"comm_id": "w1", "target_name": "jupyter.widget"}}
    )
    error = {"ename": "ValueError", "evalue": "in a callback", "traceback": []}
    request, shown = run(comms, (Kind.PARENT, {"msg_id": "f9"}), (Kind.ERROR, error), (Kind.PARENT, {"msg_id": ""}))
    assert request.error is None and shown == []
    assert [(k, p["header"]["msg_id"]) for k, _, p in browser.outputs] == [("error", "f9")]


def test_huge_or_malformed_buffers_are_dropped_as_protocol_errors() -> None:
    comms, browser = bridge()
    huge = "A" * (MAX_COMM_BUFFER_BYTES * 4 // 3 + 8)
    for buffers in ([huge], ["not base64 !"], [3]):
        request, _ = run(comms, widget("s1", "IntSliderModel"), message("s1", {"method": "update", "state": {}}, buffers))  # type: ignore[list-item]
        assert request.error is not None and request.error["ename"] == "SandboxProtocolError"
    assert all(t == "comm_open" for t, _, _, _ in browser.comms)


def test_bad_comm_ids_and_messages_for_comms_never_opened_are_dropped() -> None:
    comms, browser = bridge()
    request, _ = run(comms, message("../../etc", {"x": 1}))
    assert request.error is not None and "not a comm id" in request.error["evalue"]
    request, _ = run(comms, message("never-opened", {"method": "update"}), (Kind.COMM_CLOSE, {"content": {"comm_id": "nope"}}))
    assert request.error is None and browser.comms == []


def test_a_flood_of_comm_messages_stops_at_the_cells_output_budget() -> None:
    comms, browser = bridge()
    flood = [message("s1", {"method": "update", "state": {"description": "x" * 1000}}) for _ in range(300)]
    request, _ = run(comms, widget("s1", "IntSliderModel"), *flood, budget=OutputBudget(100_000))
    sent = [t for t, _, _, _ in browser.comms if t == "comm_msg"]
    assert 50 < len(sent) < 150
    assert request.error is None


def test_a_flood_of_opens_stops_at_the_table_limit(monkeypatch: Any) -> None:
    monkeypatch.setattr("daytona_kernel.comms.MAX_OPEN_COMMS", 5)
    comms, browser = bridge()
    run(comms, *[widget(f"s{i}", "IntSliderModel") for i in range(20)])
    assert len(comms.comms) == 5 and len(browser.comms) == 5
    assert "more than 5 widgets" in comms.take_notices()[0]


def test_an_update_may_not_swap_in_another_modules_view_or_pose_as_another_model() -> None:
    comms, browser = bridge()
    bad = "<img src=x onerror=alert(1)>"
    run(
        comms,
        widget("s1", "IntSliderModel"),
        message("s1", {"method": "update", "state": {"_view_module": "anywidget", "_view_name": "AnyView", "value": 4}}),
        message("s1", {"method": "update", "state": {"_model_name": "HTMLModel", "value": bad}}),
    )
    first, second = browser.comms[1][1]["data"]["state"], browser.comms[2][1]["data"]["state"]
    assert "_view_module" not in first and "_view_name" not in first and first["value"] == 4
    assert "_model_name" not in second  # the frontend's model stays an IntSliderModel, which shows no markup
    states = reload(comms, {"s1": entry("HTMLModel", {"value": bad})})
    assert browser.comms[-1][1]["data"]["states"] == {}
    states["s1"] = entry("IntSliderModel", {"value": 3}, module="anywidget")
    reload(comms, states)
    assert browser.comms[-1][1]["data"]["states"] == {}


# -- issue 31: the view draws, so the (model, view) pair is what is allowed ------------------------

PAYLOAD = '<img src=x onerror="window.__dk_widget = 1"><b>kept</b>'


class HTMLDrawnText(ipywidgets.Text):
    _view_name = Unicode("HTMLView").tag(sync=True)


class MathDrawnTextarea(ipywidgets.Textarea):
    _view_name = Unicode("HTMLMathView").tag(sync=True)


def test_a_text_widget_drawn_by_the_html_view_is_refused_and_shows_its_text() -> None:
    comms, browser = bridge()
    for swapped in (HTMLDrawnText(value=PAYLOAD), MathDrawnTextarea(value=PAYLOAD)):
        view = {"model_id": swapped.model_id, "version_major": 2, "version_minor": 1}
        result = (Kind.RESULT, {"data": {"text/plain": "T()", VIEW: view}, "metadata": {}, "execution_count": 1})
        _, shown_outputs = run(comms, *shown(swapped), result)
        assert [c["data"] for k, c in shown_outputs if k == "execute_result"] == [{"text/plain": "T()"}]
    assert browser.comms == []
    notices = comms.take_notices()
    assert len(notices) == 2 and "'HTMLView'" in notices[0] and "'HTMLMathView'" in notices[1]


def test_names_or_versions_ipywidgets_never_ships_together_are_refused() -> None:
    comms, browser = bridge()
    good = json.loads(json.dumps(ipywidgets.Text(value=PAYLOAD).get_state()))
    for change in ({"_view_module_version": "*"}, {"_model_module_version": "1.5.0"}, {"_model_name": "HTMLModel"}):
        run(comms, opening(f"w{len(change)}{list(change)[0]}", {**good, **change}))
    assert browser.comms == []
    run(comms, opening("w-good", good))
    assert [c["comm_id"] for _, c, _, _ in browser.comms] == ["w-good"]


def test_an_update_may_not_give_an_open_widget_another_view() -> None:
    comms, browser = bridge()
    text = ipywidgets.Text(value="plain")
    run(comms, *shown(text), message(text.model_id, {"method": "update", "state": {"_view_name": "HTMLView", "value": PAYLOAD}}))
    update = browser.comms[1][1]["data"]["state"]
    assert "_view_name" not in update and update["value"] == PAYLOAD  # a Text view shows it as text
    state = json.loads(json.dumps(text.get_state())) | {"_view_name": "HTMLView"}
    reload(comms, {text.model_id: entry("TextModel", state)})
    assert browser.comms[-1][1]["data"]["states"][text.model_id]["state"]["_view_name"] == "TextView"


def test_links_made_in_the_browser_may_not_write_markup_or_a_widgets_names() -> None:
    comms, browser = bridge()
    hidden, html, math = ipywidgets.Text(value=PAYLOAD), ipywidgets.HTML(), ipywidgets.HTMLMath()
    slider, other = ipywidgets.IntSlider(), ipywidgets.IntSlider()
    run(comms, *shown(hidden, html, math, slider, other))
    refused = [
        ipywidgets.jsdlink((hidden, "value"), (html, "value")),
        ipywidgets.jslink((hidden, "value"), (math, "value")),
        ipywidgets.jslink((html, "value"), (hidden, "value")),  # a two-way link writes its source too
        ipywidgets.jsdlink((hidden, "value"), (slider, "description")),
        ipywidgets.jsdlink((hidden, "value"), (slider, "_view_name")),
        ipywidgets.jsdlink((hidden, "value"), (slider, "_model_name")),
    ]
    kept = ipywidgets.jslink((slider, "value"), (other, "value"))
    before = len(browser.comms)
    run(comms, *shown(*refused, kept))
    assert [c["comm_id"] for _, c, _, _ in browser.comms[before:]] == [kept.model_id]
    notices = " ".join(comms.take_notices())
    for written in ("HTMLModel.value", "HTMLMathModel.value", "description", "_view_name", "_model_name"):
        assert written in notices
    retarget = {"method": "update", "state": {"target": [f"IPY_MODEL_{html.model_id}", "value"]}}
    run(comms, message(kept.model_id, retarget))
    assert "target" not in browser.comms[-1][1]["data"]["state"]


def test_a_description_shown_as_html_is_cleaned_on_open_on_update_and_on_reload() -> None:
    comms, browser = bridge()
    box = ipywidgets.Checkbox(description=PAYLOAD, description_allow_html=True)
    slider = ipywidgets.IntSlider(description="a < b")
    run(comms, *shown(box, slider))
    assert "onerror" not in browser.comms[0][1]["data"]["state"]["description"]
    assert browser.comms[1][1]["data"]["state"]["description"] == "a < b"  # shown as text: untouched
    run(comms, message(slider.model_id, {"method": "update", "state": {"description": PAYLOAD}}))
    run(comms, message(slider.model_id, {"method": "update", "state": {"description_allow_html": [0]}}))  # true in JavaScript
    turned_on = browser.comms[-1][1]["data"]["state"]
    assert "<b>kept</b>" in turned_on["description"] and "onerror" not in turned_on["description"]
    state = json.loads(json.dumps(box.get_state()))
    reload(comms, {box.model_id: entry("CheckboxModel", state)})
    assert "onerror" not in browser.comms[-1][1]["data"]["states"][box.model_id]["state"]["description"]


def test_markup_in_a_list_or_a_buffer_never_reaches_the_html_view() -> None:
    comms, browser = bridge()
    html = ipywidgets.HTML(value="fine")
    as_list = {"method": "update", "state": {"value": [PAYLOAD]}}  # innerHTML = [..] joins it into markup
    as_buffer = {"method": "update", "state": {}, "buffer_paths": [["value"]]}
    run(
        comms,
        *shown(html),
        message(html.model_id, as_list),
        message(html.model_id, as_buffer, [base64.b64encode(PAYLOAD.encode()).decode()]),
    )
    assert browser.comms[1][1]["data"]["state"]["value"] == ""
    assert browser.comms[2][1]["data"]["buffer_paths"] == [] and browser.comms[2][2] == []


def test_a_frontend_update_reaches_the_sandbox_cleaned() -> None:
    comms, browser = bridge()
    html = ipywidgets.HTML(value="fine")
    run(comms, *shown(html))
    update = {"comm_id": html.model_id, "data": {"method": "update", "state": {"value": PAYLOAD, "_view_name": "X"}}}
    comms.from_frontend({"header": {"msg_id": "f2", "msg_type": "comm_msg"}, "content": update, "metadata": {}})
    sent = comms.queue.take()[0]["content"]["data"]["state"]
    assert "onerror" not in sent["value"] and "<b>kept</b>" in sent["value"] and "_view_name" not in sent


def test_the_trusted_policy_shows_every_widget_as_sent() -> None:
    comms, browser = bridge(trusted=True)
    swapped, hidden, html = HTMLDrawnText(value=PAYLOAD), ipywidgets.Text(value=PAYLOAD), ipywidgets.HTML()
    link = ipywidgets.jsdlink((hidden, "value"), (html, "value"))
    run(comms, *shown(swapped, hidden, html, link))
    assert [c["data"]["state"].get("value") for _, c, _, _ in browser.comms] == [PAYLOAD, PAYLOAD, "", None]


def test_a_session_attached_to_may_not_bring_back_a_swapped_view_or_a_link_into_markup() -> None:
    comms, browser = bridge()
    swapped, hidden, html = HTMLDrawnText(value=PAYLOAD), ipywidgets.Text(value=PAYLOAD), ipywidgets.HTML()
    link = ipywidgets.jsdlink((hidden, "value"), (html, "value"))
    table = {
        w.model_id: SessionComm("jupyter.widget", json.loads(json.dumps(w.get_state()))) for w in (link, swapped, hidden, html)
    }
    assert comms.adopt(OpenComms(table)) == 2
    assert set(comms.comms) == {hidden.model_id, html.model_id}


# -- issue 31: every message the sandbox publishes costs, and ids are not reused ------------------


def published(browser: Browser, shown_outputs: list[tuple[str, Any]], msg_type: str) -> int:
    return sum(1 for t, *_ in browser.comms if t == msg_type) + sum(1 for k, _ in shown_outputs if k == msg_type)


def test_comm_opens_and_closes_are_charged_to_the_cells_output_budget() -> None:
    comms, browser = bridge()
    big = "x" * 2000
    frames = [widget(f"s{i}", "IntSliderModel", description=big) for i in range(300)]
    frames += [(Kind.COMM_CLOSE, {"content": {"comm_id": f"s{i}", "data": {"pad": big}}}) for i in range(300)]
    request, _ = run(comms, *frames, budget=OutputBudget(100_000))
    opens = published(browser, [], "comm_open")
    closes = [c for t, c, _, _ in browser.comms if t == "comm_close"]
    assert 20 < opens < 80
    assert len(closes) == opens and sum(1 for c in closes if c["data"]) < 20  # past the budget: closed, without data
    assert request.error is None


def test_floods_of_tiny_messages_stop_at_a_floor_per_message() -> None:
    comms, browser = bridge()
    displays = [(Kind.DISPLAY, {"data": {"text/plain": "x"}, "metadata": {}, "transient": {"display_id": "d1"}})] * 3000
    updates = [message("s1", {"method": "update", "state": {}})] * 3000
    _, shown_outputs = run(comms, widget("s1", "IntSliderModel"), *displays, *updates, budget=OutputBudget(100_000))
    sent = published(browser, shown_outputs, "display_data") + published(browser, shown_outputs, "comm_msg")
    assert 100 < sent < 1000


def test_runs_of_clears_merge() -> None:
    comms, _ = bridge()
    clear, clear_now = (Kind.CLEAR, {"wait": True}), (Kind.CLEAR, {"wait": False})
    display = (Kind.DISPLAY, {"data": {"text/plain": "frame"}, "metadata": {}, "transient": {}})
    _, shown_outputs = run(comms, *[clear] * 1000, display, clear, clear_now, clear, clear_now, display)
    kinds = [(k, c.get("wait")) for k, c in shown_outputs]
    assert kinds == [
        ("clear_output", True),
        ("display_data", None),
        ("clear_output", True),
        ("clear_output", False),
        ("display_data", None),
    ]


def test_updates_for_display_ids_never_shown_are_dropped() -> None:
    comms, _ = bridge()

    def update(display_id: str) -> tuple[str, Any]:
        return Kind.UPDATE, {"data": {"text/plain": display_id}, "metadata": {}, "transient": {"display_id": display_id}}

    shown_display = (Kind.DISPLAY, {"data": {"text/plain": "d1"}, "metadata": {}, "transient": {"display_id": "d1"}})
    _, first = run(comms, *[update(f"never-{i}") for i in range(1000)], shown_display, update("d1"))
    _, later = run(comms, update("d1"), update("never-0"))  # a later cell updates the display of an earlier one
    assert [k for k, _ in first] == ["display_data", "update_display_data"]
    assert [c["data"]["text/plain"] for k, c in later] == ["d1"]


def test_the_sandbox_may_not_reopen_an_open_comm_or_one_the_frontend_opened() -> None:
    comms, browser = bridge()
    control = {"comm_id": "c1", "target_name": CONTROL_TARGET, "data": {}}
    comms.from_frontend({"header": {"msg_id": "f1", "msg_type": "comm_open"}, "content": control, "metadata": {}})
    run(comms, widget("s1", "IntSliderModel"), widget("s1", "IntSliderModel"), widget("c1", "IntSliderModel"))
    assert [c["comm_id"] for t, c, _, _ in browser.comms if t == "comm_open"] == ["s1"]
    assert comms.info(None) == {"c1": {"target_name": CONTROL_TARGET}, "s1": {"target_name": "jupyter.widget"}}
    states = {"s1": entry("HTMLModel", {"value": PAYLOAD})}
    run(comms, message("c1", {"method": "update_states", "states": states, "buffer_paths": []}))
    assert browser.comms[-1][1]["data"]["states"] == {}  # the control comm's reply is still filtered
    run(comms, (Kind.COMM_CLOSE, {"content": {"comm_id": "c1"}}), widget("c1", "IntSliderModel"))
    assert [c["comm_id"] for t, c, _, _ in browser.comms if t == "comm_open"] == ["s1"]  # closed first: still the frontend's id


def test_an_allowed_library_model_drawn_by_the_html_view_is_cleaned() -> None:
    comms, browser = bridge(extra=frozenset({"jupyter-matplotlib"}))
    names = {"_model_module": "jupyter-matplotlib", "_model_module_version": "^0.11", "_model_name": "MPLCanvasModel"}
    names |= {"_view_module": "@jupyter-widgets/controls", "_view_module_version": "2.0.0", "_view_name": "HTMLView"}
    run(comms, opening("m1", {**names, "value": PAYLOAD}), message("m1", {"method": "update", "state": {"value": PAYLOAD}}))
    values = [c["data"]["state"]["value"] for _, c, _, _ in browser.comms]
    assert len(values) == 2 and all("onerror" not in v and "<b>kept</b>" in v for v in values)


def test_an_image_widget_may_not_be_an_svg_that_runs_in_a_tab_of_its_own() -> None:
    comms, browser = bridge()
    svg = b'<svg xmlns="http://www.w3.org/2000/svg"><script>window.__dk_svg = 1</script></svg>'
    image, png, hidden = (
        ipywidgets.Image(value=svg, format="svg+xml"),
        ipywidgets.Image(format="png"),
        ipywidgets.Text(value="svg+xml"),
    )
    run(comms, *shown(image, png, hidden), message(png.model_id, {"method": "update", "state": {"format": "svg+xml"}}))
    assert [c["data"]["state"].get("format") for _, c, _, _ in browser.comms] == ["png", "png", None, "png"]
    state = json.loads(json.dumps(plain(png))) | {"format": "svg+xml"}
    reload(comms, {png.model_id: entry("ImageModel", state)})
    assert browser.comms[-1][1]["data"]["states"][png.model_id]["state"]["format"] == "png"
    before = len(browser.comms)
    run(comms, *shown(ipywidgets.jsdlink((hidden, "value"), (png, "format"))))
    assert len(browser.comms) == before
