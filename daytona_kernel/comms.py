"""The comm bridge, kernel side: widgets (ipywidgets, tqdm.notebook ...) across the sandbox boundary.

The runtime replaces the ``comm`` package's hooks in the sandbox (``runtime/comms.py``),
so its comms travel as ``comm_open``/``comm_msg``/``comm_close`` frames. Here the kernel

- keeps the table of open comms and answers ``comm_info_request`` from it;
- publishes the sandbox's comm messages on iopub under the right parent: the request
  that runs, or the frontend message whose handling produced them (``parent`` frames
  name it; only ids of messages this kernel forwarded are accepted);
- lets through, under the safe output policy, only the widgets ``widgetrules.WidgetPolicy``
  allows (ipywidgets' own combinations of model and view, names fixed once open, markup
  cleaned, links only into plain text) and the ``jupyter.widget`` target; other modules and
  targets need the trusted policy or ``widget_modules``;
- forwards the frontend's comm messages into the sandbox in batches (``FrontendQueue``):
  in order, a value update superseding a queued one of the same comm, events (a button
  click) never merged. While a cell runs they are uploaded to the runtime's inbox (one
  file upload, not queued behind the cell); while idle they go in a short call of their own.
  After a cell, updates a background thread left behind are drained at a bounded rate.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol

from .errors import DaytonaKernelError, ProtocolError
from .outputs import OutputBudget
from .protocol import CommAck, CommMessage, OpenComms, size_of
from .widgetrules import CONTROL_TARGET, WIDGET_TARGET, Shadow, WidgetPolicy, shadow_of

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
BATCH_S = 0.05  # frontend messages go into the sandbox at most this often
DRAIN_INTERVAL_S = 0.25  # how often a background thread's updates are fetched while no cell runs
MAX_OPEN_COMMS = 10_000
MAX_QUEUED = 10_000  # frontend messages waiting for the sandbox
MAX_PARENTS = 2_000  # frontend messages whose id the sandbox may name as the parent of its output


class Publisher(Protocol):
    """Where the bridge's messages go (the kernel's iopub socket)."""

    def publish_comm(
        self, msg_type: str, content: dict[str, Any], metadata: dict[str, Any], buffers: list[bytes], parent: dict[str, Any]
    ) -> None: ...

    def publish_output(self, msg_type: str, content: dict[str, Any], parent: dict[str, Any]) -> None: ...


class Transport(Protocol):
    """How frontend messages reach the sandbox (``delivery.CommDelivery``)."""

    @property
    def in_cell(self) -> bool: ...

    async def deliver_comms(self, batch: list[dict[str, Any]], bridge: CommBridge) -> None: ...


@dataclass
class OpenComm:
    target_name: str
    shadow: Shadow
    from_frontend: bool = False


# -- frontend to sandbox: the queue ------------------------------------------------------------


def value_update(msg: dict[str, Any]) -> dict[str, Any] | None:
    """The state of a frontend ``comm_msg`` that only sets values (no buffers), else None."""
    if msg["header"].get("msg_type") != "comm_msg" or msg.get("buffers"):
        return None
    data = msg["content"].get("data")
    if not isinstance(data, dict) or data.get("method") != "update" or data.get("buffer_paths"):
        return None
    state = data.get("state")
    return state if isinstance(state, dict) else None


class FrontendQueue:
    """Frontend messages waiting for the sandbox, in order. A value update supersedes a queued
    update of the same comm that sets no other attribute, unless an event (any other message)
    lies between them; the newer message's id is kept, so ipywidgets' echo matches it."""

    def __init__(self, limit: int = MAX_QUEUED) -> None:
        self._items: list[dict[str, Any]] = []
        self._limit = limit
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._items)

    def add(self, msg: dict[str, Any]) -> str | None:
        """Queue a message; returns the id of a message that will not be sent (superseded, or this one
        when the queue is full), else None."""
        state = value_update(msg)
        gone = None
        if state is not None:
            for i in range(len(self._items) - 1, -1, -1):
                older = value_update(self._items[i])
                if older is None:
                    break  # an event: nothing merges across it
                if self._items[i]["content"].get("comm_id") == msg["content"].get("comm_id"):
                    if set(older) <= set(state):
                        gone = self._items.pop(i)["header"]["msg_id"]
                    break
        if len(self._items) >= self._limit:
            self.dropped += 1
            return str(msg["header"]["msg_id"])
        self._items.append(msg)
        return gone

    def take(self) -> list[dict[str, Any]]:
        items, self._items = self._items, []
        return items


def wire_message(msg: dict[str, Any]) -> dict[str, Any]:
    """A frontend message as the runtime takes it: JSON, buffers in base64."""
    header = {k: msg["header"][k] for k in ("msg_id", "msg_type", "session", "username", "version") if k in msg["header"]}
    return {
        "header": header,
        "content": msg.get("content") or {},
        "metadata": msg.get("metadata") or {},
        "buffers": [base64.b64encode(bytes(b)).decode("ascii") for b in msg.get("buffers") or ()],
    }


# -- the bridge ------------------------------------------------------------------------------


class CommBridge:
    """See the module docstring. The kernel sets ``request_parent`` for each request and hands
    frontend messages to ``from_frontend``; requests hand the sandbox's comm events to ``from_sandbox``."""

    def __init__(
        self, publisher: Publisher, policy: WidgetPolicy, log: logging.Logger, transport: Transport | None = None
    ) -> None:
        self._publisher = publisher
        self.policy = policy
        self._log = log
        self.comms: dict[str, OpenComm] = {}
        self._parents: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._frontend_ids: OrderedDict[str, None] = OrderedDict()  # comm ids the frontend opened, newest kept
        self.request_parent: dict[str, Any] = {}
        self.queue = FrontendQueue()
        self.transport = transport
        self.seq = 0  # the last inbox batch uploaded
        self._acked = 0
        self._drain = False  # fetch what the sandbox holds (a background thread's updates, an unread batch)
        self._handled: dict[str, asyncio.Future[None] | None] = {}  # frontend messages the sandbox has not handled yet
        self._uploads: list[tuple[int, list[str]]] = []  # inbox batches not acknowledged: (seq, message ids)
        self._sender: asyncio.Future[None] | None = None
        self._runtime_token = ""

    # -- requests ------------------------------------------------------------------

    def note_request(self, parent: dict[str, Any]) -> str:
        """A request starts: its output, and comm messages without another parent, go under it."""
        self.request_parent = parent
        msg_id = str(parent.get("header", {}).get("msg_id", ""))
        self._remember(msg_id, parent)
        return msg_id

    def _remember(self, msg_id: str, parent: dict[str, Any]) -> None:
        if not msg_id:
            return
        self._parents[msg_id] = parent
        self._parents.move_to_end(msg_id)
        while len(self._parents) > MAX_PARENTS:
            self._parents.popitem(last=False)

    def parent_for(self, msg_id: str) -> dict[str, Any]:
        """The message the sandbox names as the parent of what follows; only ids this kernel sent in."""
        parent = self._parents.get(msg_id)
        if parent is None:
            raise ProtocolError(f"a parent frame names {msg_id!r:.80}, a message the kernel never sent to the sandbox")
        return parent

    def info(self, target_name: str | None) -> dict[str, dict[str, str]]:
        """``comm_info_reply``'s comms."""
        return {
            comm_id: {"target_name": c.target_name}
            for comm_id, c in self.comms.items()
            if target_name is None or c.target_name == target_name
        }

    def shows(self, view: Any) -> bool:
        """Does a widget view refer to a widget the frontend has (an open, allowed comm)?"""
        return isinstance(view, dict) and isinstance(view.get("model_id"), str) and view["model_id"] in self.comms

    def take_notices(self) -> list[str]:
        notices = self.policy.take_notices()
        if self.queue.dropped:
            notices.append(f"daytona-kernel: {self.queue.dropped} widget event(s) were dropped while the sandbox was busy.\n")
            self.queue.dropped = 0
        return notices

    # -- sandbox to frontend ---------------------------------------------------------

    def from_sandbox(self, event: CommMessage, parent: dict[str, Any] | None, budget: OutputBudget) -> None:
        """Publish a comm message from the sandbox, if the policy lets it through and it fits the cell's
        output budget. A close that does not fit goes without its data: the frontend must learn of it."""
        comm_id = event.content["comm_id"]
        opened = self._opening(comm_id, event.content) if event.msg_type == "comm_open" else self.comms.get(comm_id)
        if opened is None:
            self._log.debug("dropped a %s for comm %s, which is not open or was refused", event.msg_type, comm_id)
            return
        content, buffers = self._cleaned(opened, event.content, list(event.buffers))
        fits = budget.fits_size(size_of(content) + sum(len(b) for b in buffers))
        if event.msg_type == "comm_close":
            del self.comms[comm_id]
            if not fits:
                content, buffers = {"comm_id": comm_id, "data": {}}, []
        elif not fits:
            return
        elif event.msg_type == "comm_open":
            self.comms[comm_id] = opened
        self._publisher.publish_comm(event.msg_type, content, event.metadata, buffers, parent or self.request_parent)

    def _opening(self, comm_id: str, content: dict[str, Any]) -> OpenComm | None:
        """The comm the sandbox opens, if the policy lets it: never one whose id is open already, nor one
        the frontend ever opened (such as the control comm), nor past the table's limit."""
        data = content["data"]
        state = data.get("state") if isinstance(data.get("state"), dict) else {}
        what = self.policy.refusal(content["target_name"], data) or self.policy.link_refusal(state, self._shadow)
        if what is None and (comm_id in self.comms or comm_id in self._frontend_ids):
            what = "a comm opened again under the id of an open one, or of one the frontend opened"
        if what is None and len(self.comms) >= MAX_OPEN_COMMS:
            what = f"more than {MAX_OPEN_COMMS} widgets"
        if what is not None:
            self.policy.refuse(what)
            return None
        policed = not self.policy.trusted and content["target_name"] == WIDGET_TARGET
        return OpenComm(content["target_name"], shadow_of(state, policed))

    def _shadow(self, model_id: str) -> Shadow | None:
        opened = self.comms.get(model_id)
        return opened.shadow if opened is not None else None

    def _cleaned(self, opened: OpenComm, content: dict[str, Any], buffers: list[bytes]) -> tuple[dict[str, Any], list[bytes]]:
        data = content["data"]
        if self.policy.trusted:
            return content, buffers
        if opened.target_name == CONTROL_TARGET and data.get("method") == "update_states":
            return self._states(content, buffers)
        if not isinstance(data.get("state"), dict):
            return content, buffers
        state = self.policy.state(opened.shadow, data["state"])
        paths = data.get("buffer_paths") if isinstance(data.get("buffer_paths"), list) else []
        keep = [
            i
            for i, path in enumerate(paths)
            if i < len(buffers) and isinstance(path, list) and path and self.policy.shown_key(opened.shadow, path[0])
        ]
        data = dict(data, state=state, buffer_paths=[paths[i] for i in keep])
        return dict(content, data=data), [buffers[i] for i in keep]

    def _states(self, content: dict[str, Any], buffers: list[bytes]) -> tuple[dict[str, Any], list[bytes]]:
        """The control comm's reply with every widget's state: only open, allowed widgets, under the names
        they opened with (the frontend makes the models from these), cleaned."""
        data = content["data"]
        states = data.get("states") if isinstance(data.get("states"), dict) else {}
        kept: dict[str, dict[str, Any]] = {}
        for model_id, entry in states.items():
            opened = self.comms.get(model_id)
            if opened is None or not isinstance(entry, dict) or not isinstance(entry.get("state"), dict):
                continue
            names = opened.shadow.identity
            if (
                names is None
                or (entry.get("model_module"), entry.get("model_module_version"), entry.get("model_name")) != names[:3]
            ):
                continue  # the frontend makes the model from these names, not from the state's
            kept[model_id] = dict(entry, state=self.policy.state(opened.shadow, entry["state"], whole=True))
        paths = data.get("buffer_paths") if isinstance(data.get("buffer_paths"), list) else []
        keep = [i for i, path in enumerate(paths) if i < len(buffers) and self._shown_buffer(path, kept)]
        data = dict(data, states=kept, buffer_paths=[paths[i] for i in keep])
        return dict(content, data=data), [buffers[i] for i in keep]

    def _shown_buffer(self, path: Any, kept: dict[str, dict[str, Any]]) -> bool:
        """A reload buffer goes to [model id, "state", key, ...] of a kept widget, and a key a buffer may set."""
        if not (isinstance(path, list) and len(path) >= 3 and path[0] in kept and path[1] == "state"):
            return False
        return self.policy.shown_key(self.comms[path[0]].shadow, path[2])

    def output(self, msg_type: str, content: dict[str, Any], parent: dict[str, Any]) -> None:
        """Output produced while the sandbox handled a frontend message: under that message."""
        self._publisher.publish_output(msg_type, content, parent)

    def cell_ended(self) -> None:
        """A cell's run is over: a batch uploaded too late for it (the runtime said nothing of it) is fetched."""
        if self._acked < self.seq:
            self._drain = True
            self._wake()

    def ack(self, event: CommAck) -> None:
        self._acked = max(self._acked, event.seq)
        for seq, ids in [u for u in self._uploads if u[0] <= self._acked]:
            self._uploads.remove((seq, ids))
            self.handled(ids)
        if event.more or self._acked < self.seq:
            self._drain = True
            self._wake()

    # -- frontend to sandbox ---------------------------------------------------------

    def from_frontend(self, msg: dict[str, Any]) -> asyncio.Future[None] | None:
        """A comm_open, comm_msg or comm_close from the frontend: queued for the sandbox. Returns what
        resolves once the sandbox handled it (or will not), as ipykernel's idle follows a handler's output:
        JupyterLab's Output widget captures only while the message's request is not done."""
        msg_type = msg["header"]["msg_type"]
        content = msg.get("content") or {}
        comm_id = content.get("comm_id")
        if not isinstance(comm_id, str):
            return None
        if msg_type == "comm_open":
            target = str(content.get("target_name", ""))
            if not self.policy.frontend_target(target):
                self._publisher.publish_comm("comm_close", {"comm_id": comm_id, "data": {}}, {}, [], msg)
                return None
            state = (content.get("data") or {}).get("state")
            policed = not self.policy.trusted and target == WIDGET_TARGET
            self.comms[comm_id] = OpenComm(
                target, shadow_of(state if isinstance(state, dict) else {}, policed), from_frontend=True
            )
            self._frontend_ids[comm_id] = None
            while len(self._frontend_ids) > MAX_OPEN_COMMS:
                self._frontend_ids.popitem(last=False)
        elif comm_id not in self.comms:
            self._log.debug("dropped a %s for comm %s, which is not open", msg_type, comm_id)
            return None
        elif msg_type == "comm_close":
            del self.comms[comm_id]
        else:
            msg = self._frontend_update(msg, self.comms[comm_id])
        msg_id = str(msg["header"]["msg_id"])
        self._remember(msg_id, msg)
        handled = self._handled[msg_id] = asyncio.get_running_loop().create_future() if self.transport else None
        gone = self.queue.add(wire_message(msg))
        if gone is not None:
            self.handled([gone])
        self._wake()
        return handled

    def _frontend_update(self, msg: dict[str, Any], opened: OpenComm) -> dict[str, Any]:
        """A frontend update passes the same rules on its way in, so the sandbox's copy (and its echo) is clean."""
        data = msg["content"].get("data")
        if self.policy.trusted or not isinstance(data, dict) or not isinstance(data.get("state"), dict):
            return msg
        state = self.policy.state(opened.shadow, data["state"])
        return dict(msg, content=dict(msg["content"], data=dict(data, state=state)))

    def unreachable(self, batch: list[dict[str, Any]]) -> None:
        """The sandbox has no interpreter for these messages (it is still starting): a fresh one has no
        comm target registered, so a comm_open is closed, as ipykernel closes one for an unknown target."""
        for msg in batch:
            comm_id = msg["content"].get("comm_id")
            if msg["header"].get("msg_type") == "comm_open" and self.comms.pop(comm_id, None) is not None:
                parent = self._parents.get(msg["header"]["msg_id"], self.request_parent)
                self._publisher.publish_comm("comm_close", {"comm_id": comm_id, "data": {}}, {}, [], parent)
        self.handled([m["header"]["msg_id"] for m in batch])

    def handled(self, msg_ids: list[str]) -> None:
        """The sandbox handled these frontend messages (or never will)."""
        for msg_id in msg_ids:
            future = self._handled.pop(msg_id, None)
            if future is not None and not future.done():
                future.set_result(None)

    def uploaded(self, seq: int, batch: list[dict[str, Any]]) -> None:
        """A batch went to the running cell's inbox as number ``seq``; the cell's acknowledgement settles it."""
        self._uploads.append((seq, [m["header"]["msg_id"] for m in batch]))

    def _wake(self) -> None:
        if self.transport is not None and (self._sender is None or self._sender.done()):
            self._sender = asyncio.ensure_future(self._send_loop())

    async def _send_loop(self) -> None:
        loop = asyncio.get_running_loop()
        assert self.transport is not None
        while len(self.queue) or self._drain:
            started = loop.time()
            drain = self._drain and not self.transport.in_cell  # a running cell's end fetches it anyway
            self._drain = self._drain and not drain
            batch = self.queue.take()
            if not batch and not drain:
                await asyncio.sleep(BATCH_S)
                continue
            try:
                await self.transport.deliver_comms(batch, self)
            except DaytonaKernelError as exc:
                self._log.warning("could not pass %d widget message(s) to the sandbox: %s", len(batch), exc)
                self.handled([m["header"]["msg_id"] for m in batch])
            pause = DRAIN_INTERVAL_S if drain and not batch else BATCH_S
            await asyncio.sleep(max(0.0, pause - (loop.time() - started)))

    def adopt(self, table: OpenComms | None) -> int:
        """Take over the comms of a session this kernel attached to (``Runtime.comm_table``), as far as
        the policy lets them through; returns how many. The frontend then gets them back on its next
        widget state request (a page reload, or the new kernel connection)."""
        entries = sorted(table.comms.items() if table is not None else (), key=lambda item: "source" in item[1].state)
        for comm_id, entry in entries:  # links last: they are judged by the widgets they write to
            if len(self.comms) >= MAX_OPEN_COMMS:
                continue
            refusal = self.policy.refusal(entry.target_name, {"state": entry.state})
            if (refusal or self.policy.link_refusal(entry.state, self._shadow)) is None:
                policed = not self.policy.trusted and entry.target_name == WIDGET_TARGET
                self.comms[comm_id] = OpenComm(entry.target_name, shadow_of(entry.state, policed))
        return len(self.comms)

    def runtime_is(self, token: str) -> None:
        """The runtime the next call goes to (its frame token). A new one (the interpreter died, the sandbox
        was recovered) has none of the old one's comms: the frontend is told they were closed."""
        if self._runtime_token and token != self._runtime_token:
            self.closed_all()
        self._runtime_token = token

    def closed_all(self) -> None:
        """The sandbox's interpreter is gone (restart, a new context): its comms with it."""
        for comm_id, opened in list(self.comms.items()):
            if not opened.from_frontend:
                self._publisher.publish_comm("comm_close", {"comm_id": comm_id, "data": {}}, {}, [], self.request_parent)
        self.comms.clear()
        self.seq = self._acked = 0
        self._uploads.clear()
        self.handled(list(self._handled))
