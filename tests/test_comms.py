"""The comm bridge's rules, in process: batching, ordering and merging of frontend messages
(kernel side), and the runtime's outbox, inbox and parents (sandbox side)."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from pathlib import Path
from typing import Any

from daytona_kernel.comms import CommBridge, FrontendQueue, WidgetPolicy
from daytona_kernel.outputs import OutputPolicy
from daytona_kernel.protocol import CommAck
from daytona_kernel.runtime import comms as runtime_comms
from daytona_kernel.runtime.calls import CommOptions
from daytona_kernel.runtime.framing import Kind

LOG = logging.getLogger("test-comms")


def frontend(
    msg_id: str, comm_id: str, data: dict[str, Any], msg_type: str = "comm_msg", buffers: list[str] | None = None
) -> dict[str, Any]:
    return {
        "header": {"msg_id": msg_id, "msg_type": msg_type},
        "content": {"comm_id": comm_id, "data": data},
        "buffers": buffers or [],
    }


def value(msg_id: str, comm_id: str, **state: Any) -> dict[str, Any]:
    return frontend(msg_id, comm_id, {"method": "update", "state": state, "buffer_paths": []})


def click(msg_id: str, comm_id: str) -> dict[str, Any]:
    return frontend(msg_id, comm_id, {"method": "custom", "content": {"event": "click"}})


def ids(messages: list[dict[str, Any]]) -> list[str]:
    return [m["header"]["msg_id"] for m in messages]


# -- frontend to sandbox: the kernel's queue ------------------------------------------------


def test_value_updates_of_one_comm_merge_keeping_the_newest_message() -> None:
    queue = FrontendQueue()
    for i in range(5):
        queue.add(value(f"m{i}", "slider", value=i))
    batch = queue.take()
    assert ids(batch) == ["m4"] and batch[0]["content"]["data"]["state"] == {"value": 4}


def test_updates_merge_per_comm_and_keep_the_order_of_different_comms() -> None:
    queue = FrontendQueue()
    for msg in (value("a1", "a", value=1), value("b1", "b", value=1), value("a2", "a", value=2), value("b2", "b", value=2)):
        queue.add(msg)
    assert ids(queue.take()) == ["a2", "b2"]


def test_events_are_never_merged_and_nothing_merges_across_them() -> None:
    queue = FrontendQueue()
    for msg in (value("v1", "s", value=1), click("c1", "b"), click("c2", "b"), value("v2", "s", value=2)):
        queue.add(msg)
    assert ids(queue.take()) == ["v1", "c1", "c2", "v2"]


def test_an_update_that_sets_fewer_attributes_or_carries_buffers_does_not_merge() -> None:
    queue = FrontendQueue()
    queue.add(value("v1", "s", value=1, description="x"))
    queue.add(value("v2", "s", value=2))  # v1's description would be lost
    queue.add(frontend("v3", "s", {"method": "update", "state": {}, "buffer_paths": [["value"]]}, buffers=["AA=="]))
    queue.add(value("v4", "s", value=4))
    assert ids(queue.take()) == ["v1", "v2", "v3", "v4"]


def test_the_queue_is_bounded() -> None:
    queue = FrontendQueue(limit=3)
    for i in range(5):
        queue.add(click(f"c{i}", "b"))
    assert ids(queue.take()) == ["c0", "c1", "c2"] and queue.dropped == 2


class Publisher:
    def __init__(self) -> None:
        self.comms: list[tuple[str, dict[str, Any]]] = []

    def publish_comm(self, msg_type: str, content: dict[str, Any], metadata: Any, buffers: Any, parent: Any) -> None:
        self.comms.append((msg_type, content))

    def publish_output(self, kind: str, content: dict[str, Any], parent: Any) -> None:
        pass


class SlowTransport:
    """Holds each delivery until released, as a round trip to the sandbox does."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.release = asyncio.Event()
        self.in_cell = False

    async def deliver_comms(self, batch: list[dict[str, Any]], bridge: CommBridge) -> None:
        self.batches.append(ids(batch))
        await self.release.wait()
        self.release.clear()


def test_messages_that_arrive_during_a_delivery_go_in_order_in_the_next_batch() -> None:
    async def go() -> list[list[str]]:
        transport = SlowTransport()
        bridge = CommBridge(Publisher(), WidgetPolicy(OutputPolicy(False)), LOG, transport)
        for comm_id in ("s", "b"):
            bridge.from_frontend(
                {
                    "header": {"msg_id": "open-" + comm_id, "msg_type": "comm_open"},
                    "content": {"comm_id": comm_id, "target_name": "jupyter.widget"},
                }
            )
        await asyncio.sleep(0)
        for msg in (value("v1", "s", value=1), click("c1", "b"), value("v2", "s", value=2), value("v3", "s", value=3)):
            bridge.from_frontend(msg)
        while len(transport.batches) < 2:
            transport.release.set()
            await asyncio.sleep(0.01)
        transport.release.set()
        return transport.batches

    assert asyncio.run(go()) == [["open-s", "open-b"], ["v1", "c1", "v3"]]


def test_a_background_threads_updates_are_fetched_after_the_cell_ends_not_during_it() -> None:
    async def go() -> tuple[list[list[str]], list[list[str]]]:
        transport = SlowTransport()
        bridge = CommBridge(Publisher(), WidgetPolicy(OutputPolicy(False)), LOG, transport)
        transport.release.set()
        transport.in_cell = True
        bridge.ack(CommAck(seq=0, more=True))  # the cell's last frame: a thread may still publish
        await asyncio.sleep(0.2)
        during = list(transport.batches)
        transport.in_cell = False
        transport.release.set()
        await asyncio.sleep(0.2)
        return during, transport.batches

    during, after = asyncio.run(go())
    assert during == [] and after == [[]]  # one fetch of its own once the cell is over


def test_frontend_messages_for_comms_that_are_not_open_are_dropped() -> None:
    bridge = CommBridge(Publisher(), WidgetPolicy(OutputPolicy(False)), LOG)
    bridge.from_frontend(value("v1", "nope", value=1))
    assert len(bridge.queue) == 0


# -- the runtime's side -------------------------------------------------------------------


class FakeRuntime:
    """What the runtime's bridge uses of the runtime: frames out, the active flag, stderr."""

    def __init__(self) -> None:
        self.frames: list[tuple[str, Any]] = []
        self.active = False
        self.lock = threading.RLock()
        self.ipython = object()
        self.errors: list[str] = []
        self.err = self

    def send(self, kind: str, payload: Any) -> None:
        self.frames.append((kind, payload))

    def write(self, text: str) -> None:
        self.errors.append(text)


def published(rt: FakeRuntime) -> list[tuple[str, Any]]:
    return [(k, p["content"]["data"].get("state") or p["content"]["data"]) for k, p in rt.frames if k.startswith("comm")]


def test_updates_published_while_idle_wait_merged_and_go_out_with_the_next_request() -> None:
    rt = FakeRuntime()
    bridge = runtime_comms.Bridge(rt)
    for i in range(100):
        bridge.publish(Kind.COMM_MSG, {"comm_id": "bar", "data": {"method": "update", "state": {"value": i}}}, {}, None)
        bridge.publish(Kind.COMM_MSG, {"comm_id": "label", "data": {"method": "update", "state": {"value": f"{i}%"}}}, {}, None)
    bridge.publish(Kind.COMM_MSG, {"comm_id": "bar", "data": {"method": "custom", "content": {}}}, {}, None)
    bridge.publish(Kind.COMM_MSG, {"comm_id": "bar", "data": {"method": "update", "state": {"value": 100}}}, {}, None)
    assert rt.frames == []
    rt.active = True
    bridge.begin_request(CommOptions(parent="cell-2"))
    assert published(rt) == [
        ("comm_msg", {"value": 99}),
        ("comm_msg", {"value": "99%"}),
        ("comm_msg", {"method": "custom", "content": {}}),
        ("comm_msg", {"value": 100}),
    ]


def test_the_outbox_is_bounded_and_says_what_it_dropped(monkeypatch: Any) -> None:
    monkeypatch.setattr(runtime_comms, "OUTBOX_MAX", 3)
    rt = FakeRuntime()
    bridge = runtime_comms.Bridge(rt)
    for i in range(5):
        bridge.publish(Kind.COMM_MSG, {"comm_id": "b", "data": {"method": "custom", "n": i}}, {}, None)
    rt.active = True
    bridge.begin_request(CommOptions(parent="cell-2"))
    assert len(published(rt)) == 3 and "2 widget update(s)" in rt.errors[0]


def write_batch(inbox: Path, seq: int, messages: list[dict[str, Any]] | str) -> None:
    (inbox / f"comms-{seq}.json").write_text(messages if isinstance(messages, str) else json.dumps(messages))


def test_the_inbox_is_read_in_order_a_half_written_last_batch_waits_and_a_broken_one_is_skipped(tmp_path: Path) -> None:
    inbox = runtime_comms.Inbox()
    inbox.use(str(tmp_path))
    write_batch(tmp_path, 2, [click("c2", "b")])
    write_batch(tmp_path, 10, [click("c10", "b")])
    write_batch(tmp_path, 1, [click("c1", "b")])
    write_batch(tmp_path, 11, '[{"header": {"msg_id": "c1')  # still being uploaded
    assert ids(inbox.take()) == ["c1", "c2", "c10"] and inbox.taken == 10
    write_batch(tmp_path, 12, [click("c12", "b")])  # 11 stays broken: the kernel sent it again as 12
    assert ids(inbox.take()) == ["c12"] and sorted(p.name for p in tmp_path.iterdir()) == []


def test_each_message_is_handled_under_its_own_id_and_once(tmp_path: Path) -> None:
    rt = FakeRuntime()
    bridge = runtime_comms.Bridge(rt)
    handled: list[str] = []
    bridge.available = lambda: True  # type: ignore[method-assign]
    bridge.manager = type(
        "Manager", (), {"comm_msg": lambda self, s, i, msg: handled.append(bridge.get_parent()["header"]["msg_id"])}
    )()
    bridge.request_parent = "cell-3"
    bridge.handle([click("c1", "b"), click("c2", "b"), click("c1", "b")])
    assert handled == ["c1", "c2"]
    assert [p["msg_id"] for k, p in rt.frames if k == Kind.PARENT] == ["c1", "c2", ""]
    assert bridge.get_parent()["header"]["msg_id"] == "cell-3"


def test_a_comm_opened_before_the_sandbox_has_an_interpreter_is_closed() -> None:
    publisher = Publisher()
    bridge = CommBridge(publisher, WidgetPolicy(OutputPolicy(False)), LOG)
    msg = {
        "header": {"msg_id": "o1", "msg_type": "comm_open"},
        "content": {"comm_id": "control", "target_name": "jupyter.widget.control"},
    }
    bridge.from_frontend(msg)
    bridge.unreachable(bridge.queue.take())
    assert publisher.comms == [("comm_close", {"comm_id": "control", "data": {}})] and bridge.info(None) == {}


def test_a_request_with_no_widget_news_sends_no_acknowledgement(tmp_path: Path) -> None:
    from daytona_kernel.runtime.calls import CommOptions

    rt = FakeRuntime()
    rt.active = True
    bridge = runtime_comms.Bridge(rt)
    bridge.begin_request(CommOptions(parent="cell-1", inbox=str(tmp_path)))
    bridge.end_request()
    assert [k for k, _ in rt.frames] == []  # a plain cell costs no frame
    write_batch(tmp_path, 1, [click("c1", "b")])
    bridge.begin_request(CommOptions(parent="cell-2", inbox=str(tmp_path)))
    bridge.end_request()
    assert [p for k, p in rt.frames if k == Kind.COMM_ACK] == [{"seq": 1, "more": False}]


def test_a_batch_uploaded_after_the_cells_last_look_is_fetched_after_the_cell() -> None:
    async def go() -> list[list[str]]:
        transport = SlowTransport()
        bridge = CommBridge(Publisher(), WidgetPolicy(OutputPolicy(False)), LOG, transport)
        transport.release.set()
        bridge.seq = 1  # uploaded; the runtime said nothing of it
        bridge.cell_ended()
        await asyncio.sleep(0.2)
        transport.release.set()
        return transport.batches

    assert asyncio.run(go()) == [[]]
