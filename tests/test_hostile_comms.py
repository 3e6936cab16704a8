"""Threat list: comm frames from a hostile sandbox (issue 24, safety).

Code in a cell can read the frame token and send any frame, so widget traffic is held
to the same rules as every other frame: the default output policy lets only the standard
widget modules reach the browser, cleans what their views would put in ``innerHTML``, and
contains floods, huge buffers, unknown targets and forged parents. Each test is one attack,
played against a ``Request`` with the kernel's real comm bridge.
"""

from __future__ import annotations

import base64
import logging
from typing import Any

from daytona_kernel.comms import CONTROL_TARGET, CommBridge, WidgetPolicy
from daytona_kernel.outputs import OutputBudget, OutputPolicy
from daytona_kernel.protocol import MAX_COMM_BUFFER_BYTES
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

    def publish_comm(self, msg_type: str, content: dict[str, Any], metadata: dict[str, Any], buffers: Any, parent: dict[str, Any]) -> None:
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
    request = Request(TOKEN, lambda kind, content: shown.append((kind, content)), None, OutputPolicy(comms.policy.trusted), budget, comms)
    for kind, payload in frames:
        request.on_stdout("".join(encode_frame(TOKEN, kind, payload)))
    request.finish()
    return request, shown


def widget(comm_id: str, model: str, module: str = "@jupyter-widgets/controls", **state: Any) -> tuple[str, Any]:
    state = {"_model_name": model, "_model_module": module, "_view_module": module, **state}
    content = {"comm_id": comm_id, "target_name": "jupyter.widget", "data": {"state": state, "buffer_paths": []}}
    return Kind.COMM_OPEN, {"content": content, "metadata": {"version": "2.1.0"}, "buffers": []}


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
    control = {"comm_id": "c1", "target_name": CONTROL_TARGET, "data": {}}
    comms.from_frontend({"header": {"msg_id": "f1", "msg_type": "comm_open"}, "content": control, "metadata": {}})
    states = {"h1": {"model_name": "HTMLModel", "model_module": "@jupyter-widgets/controls", "state": {"value": bad}}}
    run(comms, message("c1", {"method": "update_states", "states": states, "buffer_paths": []}))
    values = [browser.comms[0][1]["data"]["state"]["value"], browser.comms[1][1]["data"]["state"]["value"]]
    values.append(browser.comms[2][1]["data"]["states"]["h1"]["state"]["value"])
    for value in values:
        assert "<b>ok</b>" in value and "onerror" not in value and "<script" not in value


def test_the_reload_reply_holds_only_open_allowed_widgets_and_their_buffers() -> None:
    comms, browser = bridge()
    run(comms, widget("ok1", "ImageModel"), widget("bad1", "AnyModel", module="anywidget"))
    comms.from_frontend({"header": {"msg_id": "f1", "msg_type": "comm_open"}, "content": {"comm_id": "c1", "target_name": CONTROL_TARGET}})
    states = {m: {"model_name": "X", "model_module": "@jupyter-widgets/controls", "state": {}} for m in ("ok1", "bad1", "never-opened")}
    paths = [["bad1", "value"], ["ok1", "value"], ["never-opened", "value"]]
    buffers = [base64.b64encode(b).decode() for b in (b"evil", b"png", b"other")]
    run(comms, message("c1", {"method": "update_states", "states": states, "buffer_paths": paths}, buffers))
    _, content, sent_buffers, _ = browser.comms[-1]
    assert set(content["data"]["states"]) == {"ok1"}
    assert content["data"]["buffer_paths"] == [["ok1", "value"]] and sent_buffers == [b"png"]


def test_output_widget_outputs_go_through_the_output_policy() -> None:
    comms, browser = bridge()
    outputs = [{"output_type": "display_data", "data": {"text/html": "<script>x()</script><i>hi</i>", "application/javascript": "x()"}, "metadata": {}}]
    run(comms, widget("o1", "OutputModel", module="@jupyter-widgets/output", outputs=outputs))
    shown = browser.comms[0][1]["data"]["state"]["outputs"][0]["data"]
    assert "application/javascript" not in shown and "<script" not in shown["text/html"] and "<i>hi</i>" in shown["text/html"]


def test_a_forged_parent_is_a_protocol_error_and_output_stays_with_the_cell() -> None:
    comms, browser = bridge()
    request, shown = run(comms, (Kind.PARENT, {"msg_id": "some-other-users-request"}), (Kind.DISPLAY, {"data": {"text/plain": "x"}}))
    assert request.error is not None and "never sent to the sandbox" in request.error["evalue"]
    assert browser.outputs == [] and [k for k, _ in shown if k == "display_data"] == ["display_data"]


def test_output_under_a_forwarded_message_goes_under_it_and_its_error_is_not_the_cells() -> None:
    comms, browser = bridge()
    comms.from_frontend({"header": {"msg_id": "f9", "msg_type": "comm_open"}, "content": {"comm_id": "w1", "target_name": "jupyter.widget"}})
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
    assert "_view_module" not in first and first["value"] == 4
    assert "onerror" not in second["value"]
    control = {"comm_id": "c1", "target_name": CONTROL_TARGET, "data": {}}
    comms.from_frontend({"header": {"msg_id": "f1", "msg_type": "comm_open"}, "content": control, "metadata": {}})
    states = {
        "s1": {"model_name": "HTMLModel", "model_module": "@jupyter-widgets/controls", "state": {"value": bad}},
    }
    run(comms, message("c1", {"method": "update_states", "states": states, "buffer_paths": []}))
    assert "onerror" not in browser.comms[-1][1]["data"]["states"]["s1"]["state"]["value"]
    states["s1"]["model_module"] = "anywidget"
    run(comms, message("c1", {"method": "update_states", "states": states, "buffer_paths": []}))
    assert browser.comms[-1][1]["data"]["states"] == {}
