"""The comm bridge, kernel side: widgets (ipywidgets, tqdm.notebook ...) across the sandbox boundary.

The runtime replaces the ``comm`` package's hooks in the sandbox (``runtime/comms.py``),
so its comms travel as ``comm_open``/``comm_msg``/``comm_close`` frames. Here the kernel

- keeps the table of open comms and answers ``comm_info_request`` from it;
- publishes the sandbox's comm messages on iopub under the right parent: the request
  that runs, or the frontend message whose handling produced them (``parent`` frames
  name it; only ids of messages this kernel forwarded are accepted);
- lets through, under the default output policy, only the standard widget modules
  (``STANDARD_MODULES``) and the ``jupyter.widget`` target, with the HTML widget's
  markup cleaned as ``outputs`` cleans HTML and the Output widget's outputs under the
  output policy; other modules and targets need the trusted policy or ``widget_modules``;
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
from .outputs import OutputBudget, OutputPolicy, sanitize_html, size_of
from .protocol import CommAck, CommMessage, OpenComms

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_TARGET = "jupyter.widget"
CONTROL_TARGET = "jupyter.widget.control"  # the frontend asks it for every widget's state (a page reload)
STANDARD_MODULES = frozenset({"@jupyter-widgets/base", "@jupyter-widgets/controls", "@jupyter-widgets/output"})
MODULE_KEYS = frozenset({"_model_module", "_view_module"})
HTML_MODELS = frozenset({"HTMLModel", "HTMLMathModel"})  # their views set innerHTML from ``value`` unsanitised
BATCH_S = 0.05  # frontend messages go into the sandbox at most this often
DRAIN_INTERVAL_S = 0.25  # how often a background thread's updates are fetched while no cell runs
MAX_OPEN_COMMS = 10_000
MAX_QUEUED = 10_000  # frontend messages waiting for the sandbox
MAX_PARENTS = 2_000  # frontend messages whose id the sandbox may name as the parent of its output
BLOCKED_NOTICE = (
    "daytona-kernel: a widget from {what} was not shown: under the default output policy only the standard "
    "widgets (ipywidgets' own modules) reach your browser, since other widget modules run their own "
    "JavaScript. If you trust this sandbox, add the module to DaytonaKernel.widget_modules or set "
    "DaytonaKernel.output_policy = 'trusted'. This notice is shown once per module.\n"
)


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
    model_name: str = ""
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


# -- the safety rules ------------------------------------------------------------------------


class WidgetPolicy:
    """Which comms may reach the browser, and what of their state is cleaned (see the module docstring)."""

    def __init__(self, output: OutputPolicy, extra_modules: frozenset[str] = frozenset()) -> None:
        self.output = output
        self.trusted = output.trusted
        self.allowed = STANDARD_MODULES | extra_modules
        self._noticed: set[str] = set()
        self.notices: list[str] = []

    def refusal(self, target_name: str, data: dict[str, Any]) -> str | None:
        """Why a comm the sandbox opens may not reach the browser, or None if it may."""
        if self.trusted:
            return None
        if target_name != WIDGET_TARGET:
            return None if target_name in self.allowed else f"the comm target {target_name!r:.80}"
        state = data["state"] if isinstance(data.get("state"), dict) else {}
        for key in ("_model_module", "_view_module"):
            module = state.get(key)
            if module is not None and module not in self.allowed:
                return f"the module {str(module)[:80]!r}"
        return None

    def frontend_target(self, target_name: str) -> bool:
        """May the frontend open this target in the sandbox? (It answers on it.)"""
        return self.trusted or target_name in (WIDGET_TARGET, CONTROL_TARGET) or target_name in self.allowed

    def take_notices(self) -> list[str]:
        """The widgets refused since the last call, each said once."""
        notices, self.notices = self.notices, []
        return notices

    def refuse(self, what: str) -> None:
        if what not in self._noticed:
            self._noticed.add(what)
            self.notices.append(BLOCKED_NOTICE.format(what=what))

    def state(self, model_name: str, state: dict[str, Any]) -> dict[str, Any]:
        """A widget state fit to show: modules only from the allowed ones (a later update may not swap in
        another module's view), the HTML widgets' markup cleaned (whatever model the state claims to be),
        the Output widget's outputs under the policy."""
        if self.trusted:
            return state
        state = {k: v for k, v in state.items() if k not in MODULE_KEYS or v is None or v in self.allowed}
        if {model_name, state.get("_model_name")} & HTML_MODELS and isinstance(state.get("value"), str):
            state["value"] = sanitize_html(state["value"])
        if isinstance(state.get("outputs"), list):
            state["outputs"] = [self._output(o) for o in state["outputs"] if isinstance(o, dict)]
        return state

    def _output(self, output: dict[str, Any]) -> dict[str, Any]:
        if isinstance(output.get("data"), dict):
            return dict(output, data=self.output.content("display_data", {"data": output["data"]})["data"])
        return output


# -- the bridge ------------------------------------------------------------------------------


class CommBridge:
    """See the module docstring. The kernel sets ``request_parent`` for each request and hands
    frontend messages to ``from_frontend``; requests hand the sandbox's comm events to ``from_sandbox``."""

    def __init__(self, publisher: Publisher, policy: WidgetPolicy, log: logging.Logger, transport: Transport | None = None) -> None:
        self._publisher = publisher
        self.policy = policy
        self._log = log
        self.comms: dict[str, OpenComm] = {}
        self._parents: OrderedDict[str, dict[str, Any]] = OrderedDict()
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
        """Publish a comm message from the sandbox, if the policy lets it through."""
        comm_id = event.content["comm_id"]
        data = event.content["data"]
        if event.msg_type == "comm_open":
            what = self.policy.refusal(event.content["target_name"], data)
            if what is not None:
                self.policy.refuse(what)
                return
            if comm_id not in self.comms and len(self.comms) >= MAX_OPEN_COMMS:
                self.policy.refuse(f"more than {MAX_OPEN_COMMS} widgets")
                return
            state = data.get("state") if isinstance(data.get("state"), dict) else {}
            model = state.get("_model_name")
            self.comms[comm_id] = OpenComm(event.content["target_name"], model if isinstance(model, str) else "")
        opened = self.comms.get(comm_id)
        if opened is None:
            self._log.debug("dropped a %s for comm %s, which is not open", event.msg_type, comm_id)
            return
        if event.msg_type == "comm_close":
            del self.comms[comm_id]
        content, buffers = self._cleaned(opened, event.content, list(event.buffers))
        if event.msg_type == "comm_msg" and not budget.fits_size(size_of(content) + sum(len(b) for b in buffers)):
            return
        self._publisher.publish_comm(event.msg_type, content, event.metadata, buffers, parent or self.request_parent)

    def _cleaned(self, opened: OpenComm, content: dict[str, Any], buffers: list[bytes]) -> tuple[dict[str, Any], list[bytes]]:
        data = content["data"]
        if self.policy.trusted:
            return content, buffers
        if opened.target_name == CONTROL_TARGET and data.get("method") == "update_states":
            return self._states(content, buffers)
        if isinstance(data.get("state"), dict):
            content = dict(content, data=dict(data, state=self.policy.state(opened.model_name, data["state"])))
        return content, buffers

    def _states(self, content: dict[str, Any], buffers: list[bytes]) -> tuple[dict[str, Any], list[bytes]]:
        """The control comm's reply with every widget's state: only open, allowed widgets, cleaned."""
        data = content["data"]
        states = data.get("states") if isinstance(data.get("states"), dict) else {}
        kept = {}
        for model_id, entry in states.items():
            if model_id not in self.comms or not isinstance(entry, dict) or not isinstance(entry.get("state"), dict):
                continue
            if not self.policy.trusted and entry.get("model_module") not in self.policy.allowed:
                continue  # the frontend would load that module to make the model
            claimed = entry.get("model_name")
            model = claimed if claimed in HTML_MODELS else self.comms[model_id].model_name
            kept[model_id] = dict(entry, state=self.policy.state(model, entry["state"]))
        paths = data.get("buffer_paths") if isinstance(data.get("buffer_paths"), list) else []
        keep = [i for i, path in enumerate(paths) if i < len(buffers) and isinstance(path, list) and path and path[0] in kept]
        data = dict(data, states=kept, buffer_paths=[paths[i] for i in keep])
        return dict(content, data=data), [buffers[i] for i in keep]

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
            self.comms[comm_id] = OpenComm(target, from_frontend=True)
        elif comm_id not in self.comms:
            self._log.debug("dropped a %s for comm %s, which is not open", msg_type, comm_id)
            return None
        elif msg_type == "comm_close":
            del self.comms[comm_id]
        msg_id = str(msg["header"]["msg_id"])
        self._remember(msg_id, msg)
        handled = self._handled[msg_id] = asyncio.get_running_loop().create_future() if self.transport else None
        gone = self.queue.add(wire_message(msg))
        if gone is not None:
            self.handled([gone])
        self._wake()
        return handled

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
        for comm_id, entry in table.comms.items() if table is not None else ():
            if len(self.comms) >= MAX_OPEN_COMMS:
                continue
            if self.policy.refusal(entry.target_name, {"state": entry.state}) is None:
                model = entry.state.get("_model_name")
                self.comms[comm_id] = OpenComm(entry.target_name, model if isinstance(model, str) else "")
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
