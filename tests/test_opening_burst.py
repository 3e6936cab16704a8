"""JupyterLab's opening burst (issue 36): every shell message gets one busy and one idle under its own parent.

JupyterLab, as a notebook with ipywidgets opens and Run All follows, sends at once: a history_request,
a comm_open of ``jupyter.widget.control``, a comm_msg ``request_states``, the cells' execute_requests and
a comm_info_request. Stock ipykernel handles them one after the other: busy, the handler's output, idle,
each under its own message. The test sends that burst through jupyter_client (stock ipykernel is the
reference) twice: right after the kernel starts, and again once ipywidgets is imported, so the control
comm has a target and answers ``request_states``.
"""

from __future__ import annotations

import time
from queue import Empty
from typing import Any

import pytest
from kernels import TIMEOUT_S, Kernel

CELLS = ["import time\nprint('one')\ntime.sleep(0.2)\nprint('one b')\n1", "print('two')", "print('three')\n3"]


def burst(k: Kernel, control_id: str) -> list[dict[str, Any]]:
    """JupyterLab's opening burst, as JupyterLab 4 sends it; returns the messages sent."""
    session = k.kc.session
    execute = {"silent": False, "store_history": True, "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}
    msgs = [
        session.msg("history_request", {"output": False, "raw": True, "hist_access_type": "tail", "n": 10}),
        session.msg(
            "comm_open",
            {"comm_id": control_id, "target_name": "jupyter.widget.control", "data": {}},
            metadata={"version": "1.0.0"},
        ),
        session.msg("comm_msg", {"comm_id": control_id, "data": {"method": "request_states"}}),
        *(session.msg("execute_request", dict(execute, code=code)) for code in CELLS),
        session.msg("comm_info_request", {"target_name": "jupyter.widget"}),
    ]
    for msg in msgs:
        k.kc.shell_channel.send(msg)
    return msgs


def collect(k: Kernel, sent: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """The iopub messages until every sent message has an idle and the kernel says nothing for a moment,
    and the shell replies by parent."""
    ids = {m["header"]["msg_id"] for m in sent}
    replying = ids - {m["header"]["msg_id"] for m in sent if m["header"]["msg_type"] in ("comm_open", "comm_msg")}
    iopub: list[dict[str, Any]] = []
    replies: dict[str, dict[str, Any]] = {}
    idle: set[str] = set()
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            msg = k.kc.get_iopub_msg(timeout=1.0)
        except Empty:
            if ids <= idle:
                break  # a second with nothing more after the last idle: a late second idle would have come
            continue
        iopub.append(msg)
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            idle.add(msg["parent_header"].get("msg_id"))
    while replying - set(replies) and time.monotonic() < deadline:
        reply = k.kc.get_shell_msg(timeout=TIMEOUT_S)
        replies[reply["parent_header"].get("msg_id")] = reply
    return iopub, replies


def check_burst(sent: list[dict[str, Any]], iopub: list[dict[str, Any]], replies: dict[str, Any], first_count: int) -> None:
    """ipykernel's shape: one busy and one idle per message, in the order sent, never interleaved; each
    message's output between its own busy and idle; the cells counted in order."""
    names = {m["header"]["msg_id"]: f"{i}:{m['header']['msg_type']}" for i, m in enumerate(sent)}
    trace = [
        (names.get(m["parent_header"].get("msg_id"), "other"), m["msg_type"], m["content"].get("execution_state", ""))
        for m in iopub
    ]
    statuses = [(who, state) for who, kind, state in trace if kind == "status" and who != "other"]
    expected = [(names[m["header"]["msg_id"]], state) for m in sent for state in ("busy", "idle")]
    assert statuses == expected, trace
    open_request = None
    for who, kind, state in trace:
        if kind == "status":
            open_request = who if state == "busy" else None
        elif who != "other":
            assert who == open_request, (f"{kind} of {who} published while {open_request} was the request", trace)
    executes = [m for m in sent if m["header"]["msg_type"] == "execute_request"]
    counts = [replies[m["header"]["msg_id"]]["content"]["execution_count"] for m in executes]
    assert counts == list(range(first_count, first_count + len(executes))), trace
    assert all(replies[m["header"]["msg_id"]]["content"]["status"] == "ok" for m in executes), trace
    texts = [
        "".join(
            m["content"]["text"]
            for m in iopub
            if m["msg_type"] == "stream" and m["parent_header"].get("msg_id") == e["header"]["msg_id"]
        )
        for e in executes
    ]
    assert texts == ["one\none b\n", "two\n", "three\n"], trace


@pytest.mark.parametrize("reference", [False, True], ids=["ours", "ipykernel"])
def test_the_opening_burst_gets_one_busy_and_one_idle_per_message(kernel_name: str, reference: bool, workdir: Any) -> None:
    if reference and kernel_name != "daytona-local":
        pytest.skip("stock ipykernel runs once, as the reference")
    with Kernel("python3" if reference else kernel_name) as k:
        sent = burst(k, "control-1")  # right after the start: the sandbox may still be starting
        check_burst(sent, *collect(k, sent), first_count=1)
        k.execute("import ipywidgets as w\nslider = w.IntSlider(value=7)\nslider")
        sent = burst(k, "control-2")  # the control comm has a target now: request_states is answered
        iopub, replies = collect(k, sent)
        check_burst(sent, iopub, replies, first_count=5)
        asked = sent[2]["header"]["msg_id"]
        states = [m for m in iopub if m["msg_type"] == "comm_msg" and m["parent_header"].get("msg_id") == asked]
        assert [m["content"]["data"]["method"] for m in states] == ["update_states"]
