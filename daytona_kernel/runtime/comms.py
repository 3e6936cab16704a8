"""The comm bridge inside the sandbox: ipywidgets, tqdm.notebook, ipympl ... across the boundary.

Standard library only, Python 3.9+. This is not a widget layer: it replaces the
``comm`` package's ``create_comm`` and ``get_comm_manager`` hooks (documented as
replaceable, and replaced the same way by ipykernel) as soon as ``comm`` is
imported, so every comm target works unchanged.

Sandbox to kernel: a comm's ``publish_msg`` becomes a ``comm_open``, ``comm_msg``
or ``comm_close`` frame (buffers base64-encoded) on the runtime's output stream.
While no request runs (a background thread moves a progress bar), frames wait in
a bounded outbox, value updates merged per comm, until the kernel drains them.

Kernel to sandbox: frontend messages arrive in batches, either in the call that
delivers them (``Runtime.comms``, while idle) or, while a cell runs, as files the
kernel uploads to the inbox folder, which a thread here polls. A cell that awaits
(top-level ``await``) handles them at once, on its event loop; a cell that blocks
gets them when it ends, as under ipykernel. A ``parent`` frame before each
message's handling tells the kernel whose output follows (the message's id), so
callback output goes under the message that caused it, and the Output widget
(``get_ipython().kernel.get_parent()``) captures it.
"""

import base64
import collections
import json
import os
import sys
import threading
import time

try:  # inside the sandbox the bootstrap installed these modules under these names
    import _daytona_kernel_display as _display
    import _daytona_kernel_framing as _framing
    import _daytona_kernel_streams as _streams
except ImportError:  # imported from the package (tests)
    from daytona_kernel.runtime import display as _display
    from daytona_kernel.runtime import framing as _framing
    from daytona_kernel.runtime import streams as _streams

Kind = _framing.Kind
POLL_S = 0.02  # how often a running cell's inbox is looked at
OUTBOX_MAX = 1000  # messages published while no request runs, before the newest are dropped
THREAD_QUIET_S = 3.0  # a background thread that published this recently may publish more: keep draining
SEEN_MAX = 1000  # ids of handled frontend messages, so a batch uploaded twice is handled once
BATCH_PREFIX = "comms-"
# What the kernel's table keeps of each widget's state for a kernel that attaches later: the names that
# pick its model and view, a link's ends and the description's kind (widgetrules.py judges them).
TABLE_KEYS = (
    "_model_module",
    "_model_module_version",
    "_model_name",
    "_view_module",
    "_view_module_version",
    "_view_name",
    "source",
    "target",
    "description",
    "description_allow_html",
)


def encode_buffers(buffers):
    return [base64.b64encode(bytes(b)).decode("ascii") for b in buffers or ()]


def decode_buffers(items):
    return [memoryview(base64.b64decode(item)) for item in items or ()]


def plain_update(kind, payload):
    """The state of a ``comm_msg`` that only sets values (no buffers), else None: such updates may be merged."""
    if kind != Kind.COMM_MSG or payload.get("buffers"):
        return None
    data = payload.get("content", {}).get("data")
    if not isinstance(data, dict) or data.get("method") != "update" or data.get("buffer_paths"):
        return None
    state = data.get("state")
    return state if isinstance(state, dict) else None


def batch_seq(name):
    """The sequence number of an inbox batch file, or None for any other name."""
    if not (name.startswith(BATCH_PREFIX) and name.endswith(".json")):
        return None
    digits = name[len(BATCH_PREFIX) : -len(".json")]
    return int(digits) if digits.isdigit() else None


class KernelFacade(object):
    """``get_ipython().kernel`` for libraries that ask it for the current request (the Output widget),
    and the part of ipykernel's kernel that ``jupyter-ui-poll`` uses to handle UI events while a
    cell blocks: ``do_one_iteration``. The sandbox never receives execute requests, so the
    ``execute_request`` handler it swaps out is never called, and there is nothing to replay."""

    _parent_ident = None
    _aborting = False
    shell_stream = None

    def __init__(self, bridge):
        self._bridge = bridge
        self.shell_handlers = {"execute_request": self._execute_request}

    def get_parent(self, channel="shell"):
        return self._bridge.get_parent()

    def set_parent(self, ident, parent, channel="shell"):
        """Output goes back to the request after each handled message anyway."""

    def do_one_iteration(self):
        self._bridge.poll_now()

    def _publish_status(self, status, channel="shell", parent=None):
        pass

    async def _execute_request(self, stream, ident, parent):
        pass


class Inbox(object):
    """The folder the kernel uploads frontend messages to while a cell runs, one numbered batch file each."""

    def __init__(self):
        self.path = None
        self.taken = 0  # the highest batch taken
        self._lock = threading.Lock()  # the poller and the end of a cell both read it

    def use(self, path):
        if path and path != self.path:
            self.path, self.taken = path, 0

    def take(self):
        """The frontend messages in the complete batch files, in order; the files are removed. A half-written
        last file waits; a broken earlier one is a failed upload the kernel sent again under a later number."""
        with self._lock:
            try:
                names = os.listdir(self.path) if self.path else []
            except OSError:
                return []
            batches = sorted((seq, n) for seq, n in ((batch_seq(n), n) for n in names) if seq is not None and seq > self.taken)
            messages = []  # type: list
            for i, (seq, name) in enumerate(batches):
                path = os.path.join(self.path or "", name)
                try:
                    with open(path, encoding="utf-8") as f:
                        batch = json.loads(f.read())
                except (OSError, ValueError):
                    if i == len(batches) - 1:
                        break
                    batch = []
                self.taken = seq
                try:
                    os.remove(path)
                except OSError:
                    pass  # already gone: the batch is read, and self.taken keeps it from being read twice
                if isinstance(batch, list):
                    messages.extend(m for m in batch if isinstance(m, dict))
            return messages


class Bridge(object):
    """One per runtime. See the module docstring."""

    def __init__(self, runtime):
        self.rt = runtime
        self.manager = None  # the comm package's CommManager, once ``comm`` is imported
        self.request_parent = ""  # the msg_id of the request that runs (a cell's execute_request)
        self.current = ""  # whose output is being produced: "" for the request's own
        self.inbox = Inbox()
        self.pending = []  # frontend messages for a cell that blocks, handled when it ends
        self.scheduled = []  # batches handed to a running event loop, not yet handled
        self.outbox = []  # [parent, kind, payload] published while no request ran
        self.opened = {}  # comm_id -> what the kernel's table needs (``table``)
        self.dropped = 0
        self.seen = collections.OrderedDict()
        self.thread_published = 0.0  # when a background thread last published
        self.threads = set()  # the threads that published outside the main thread
        self.in_cell = False
        self._threads_before = set()
        self.cell_threads = []  # threads the last cell started
        self.cell_ended = 0.0
        self.kernel_side = False
        self._taken_before = 0
        self.lock = threading.RLock()
        self._poller = None
        self.facade = KernelFacade(self)

    # -- installing the hooks --------------------------------------------------

    def install(self, module):
        """Replace the ``comm`` package's hooks (run when ``comm`` is imported)."""
        from comm.base_comm import BaseComm, CommManager

        bridge = self

        class SandboxComm(BaseComm):
            """A comm whose messages travel as frames to the kernel."""

            def publish_msg(self, msg_type, data=None, metadata=None, buffers=None, **keys):
                content = dict(data={} if data is None else data, comm_id=self.comm_id, **keys)
                bridge.publish(msg_type, content, metadata or {}, buffers)

        self.manager = CommManager()
        module.create_comm = SandboxComm
        module.get_comm_manager = lambda: self.manager

    def available(self):
        """True when comms work here (``comm`` imports); imports it, installing the hooks."""
        if self.manager is None and self.rt.ipython is not None:
            try:
                import comm  # noqa: F401  (the runtime's module hook installs the bridge)
            except ImportError:
                return False
        return self.manager is not None

    def get_parent(self):
        msg_id = self.current or self.request_parent
        return {"header": {"msg_id": msg_id}} if msg_id else {}

    # -- sandbox to kernel -------------------------------------------------------

    def publish(self, kind, content, metadata, buffers):
        self._note(kind, content)
        payload = {"content": _display.clean(content), "metadata": _display.clean(metadata), "buffers": encode_buffers(buffers)}
        thread = threading.current_thread()
        with self.lock:
            if thread is not threading.main_thread():
                self.thread_published = time.monotonic()
                self.threads.add(thread)
            if self.rt.active:
                self.rt.send(kind, payload)
            else:
                self._hold(kind, payload)

    def _note(self, kind, content):
        """Keep what the kernel's table holds of each comm opened here, for a kernel that attaches later."""
        comm_id = content.get("comm_id")
        if kind == Kind.COMM_CLOSE:
            self.opened.pop(comm_id, None)
        elif kind == Kind.COMM_OPEN:
            data = content.get("data")
            found = data.get("state") if isinstance(data, dict) else None
            state = found if isinstance(found, dict) else {}
            kept = {k: state.get(k) for k in TABLE_KEYS if k in state}
            self.opened[comm_id] = {"target_name": content.get("target_name"), "state": kept}

    def table(self):
        """The comms opened here that are still open: ``{comm_id: {target_name, state}}``."""
        live = self.manager.comms if self.manager is not None else {}
        return {comm_id: entry for comm_id, entry in self.opened.items() if comm_id in live}

    def _hold(self, kind, payload):
        """Keep a message published while no request runs; a value update merges into the comm's last one."""
        state = plain_update(kind, payload)
        comm_id = payload["content"].get("comm_id")
        if state is not None:
            for held in reversed(self.outbox):
                if held[2]["content"].get("comm_id") != comm_id:
                    continue
                older = plain_update(held[1], held[2])
                if older is not None:
                    older.update(state)
                    return
                break
        if len(self.outbox) >= OUTBOX_MAX:
            self.dropped += 1
            return
        self.outbox.append([self.current or self.request_parent, kind, payload])

    def _flush_outbox(self):
        with self.lock:
            held, self.outbox = self.outbox, []
            dropped, self.dropped = self.dropped, 0
        for parent, kind, payload in held:
            self._switch(parent)
            self.rt.send(kind, payload)
        self._switch("")
        if dropped:
            self.rt.err.write(
                "daytona-kernel: %d widget update(s) from a background thread were dropped (too many while idle).\n" % dropped
            )

    def busy_threads(self):
        """Updates are held, or a thread may publish soon (one published lately and runs, or the last cell
        started one and ended lately): the kernel should keep draining. Bounded, so a sandbox can go idle."""
        now = time.monotonic()
        with self.lock:
            self.threads = {t for t in self.threads if t.is_alive()}
            published = bool(self.threads) and now - self.thread_published < THREAD_QUIET_S
            started = bool(self.manager is not None and self.manager.comms) and now - self.cell_ended < THREAD_QUIET_S
            started = started and any(t.is_alive() for t in self.cell_threads)
            return bool(self.outbox) or published or started

    def _switch(self, msg_id):
        """Say whose output follows (a frontend message's id; "" for the request's own)."""
        if msg_id == self.current:
            return
        self.current = msg_id
        self.rt.send(Kind.PARENT, {"msg_id": msg_id})

    # -- kernel to sandbox -------------------------------------------------------

    def begin_request(self, options):
        """Start of a call from the kernel: the request's parent and the inbox (``calls.CommOptions``, or None
        when the kernel has no comm bridge); older messages first."""
        self.kernel_side = options is not None  # the kernel has the bridge: it takes comm frames
        self.request_parent = options.parent if options is not None else ""
        self.current = ""
        self.inbox.use(options.inbox if options is not None else "")
        self._taken_before = self.inbox.taken
        self._flush_outbox()
        self.handle(self.inbox.take())

    def end_request(self):
        """End of a call: handle what a blocking cell deferred, then tell the kernel how far the inbox was read."""
        with self.lock:
            if self.in_cell:
                self.cell_threads = [
                    t for t in threading.enumerate() if t not in self._threads_before and not t.name.startswith("daytona-kernel")
                ]
                self.cell_ended = time.monotonic()
            self.in_cell = False
            scheduled, self.scheduled = self.scheduled, []
        for batch in scheduled:
            self.handle(batch)
        self.handle(self.inbox.take())
        pending, self.pending = self.pending, []
        self.handle(pending)
        self._flush_outbox()
        more = self.busy_threads()
        if self.kernel_side and (more or self.inbox.taken != self._taken_before):  # only news: a plain cell sends none
            self.rt.send(Kind.COMM_ACK, {"seq": self.inbox.taken, "more": more})

    def start_cell(self):
        """The cell's code starts: from now on the poller hands it frontend messages."""
        self.in_cell = True
        self._threads_before = set(threading.enumerate())
        if self.inbox.path and (self._poller is None or not self._poller.is_alive()):
            self._poller = threading.Thread(target=self._poll, name="daytona-kernel-comms", daemon=True)
            self._poller.start()

    def _poll(self):
        _streams.block_signals()
        while True:
            time.sleep(POLL_S)
            if not self.in_cell:
                continue
            messages = self.inbox.take()
            if not messages:
                continue
            loop = _running_loop()
            with self.lock:
                if not self.in_cell:
                    self.pending.extend(messages)
                elif loop is not None:
                    self.scheduled.append(messages)
                    loop.call_soon_threadsafe(self._run_scheduled, messages)
                else:
                    self.pending.extend(messages)

    def poll_now(self):
        """Handle the frontend messages that arrived so far, now (a cell that blocks asked for them)."""
        if not self.in_cell:
            return
        with self.lock:
            pending, self.pending = self.pending, []
            scheduled, self.scheduled = self.scheduled, []
        for batch in scheduled:
            pending.extend(batch)
        self.handle(pending + self.inbox.take())

    def _run_scheduled(self, batch):
        with self.lock:
            if not any(b is batch for b in self.scheduled):
                return  # the cell ended first and handled it
            self.scheduled = [b for b in self.scheduled if b is not batch]
        self.handle(batch)

    def handle(self, messages):
        """Handle frontend messages in order, each with its output under its own id."""
        if not messages:
            return
        try:
            for msg in messages:
                header = msg.get("header") or {}
                msg_id = str(header.get("msg_id") or "")
                if msg_id in self.seen:
                    continue
                self.seen[msg_id] = True
                while len(self.seen) > SEEN_MAX:
                    self.seen.popitem(last=False)
                self._switch(msg_id)
                self._dispatch(str(header.get("msg_type") or ""), msg)
                sys.stdout.flush()
                sys.stderr.flush()
        finally:
            self._switch("")

    def _dispatch(self, msg_type, msg):
        msg["buffers"] = decode_buffers(msg.get("buffers"))
        if not self.available():
            if msg_type == "comm_open":  # as ipykernel does for a target nobody registered
                comm_id = (msg.get("content") or {}).get("comm_id")
                self.rt.send(Kind.COMM_CLOSE, {"content": {"comm_id": comm_id, "data": {}}, "metadata": {}, "buffers": []})
            return
        handler = getattr(self.manager, msg_type, None) if msg_type in ("comm_open", "comm_msg", "comm_close") else None
        if handler is not None:
            handler(None, None, msg)


def _running_loop():
    """IPython's asyncio loop when it is running a cell (top-level ``await``), else None."""
    try:
        from IPython.core.async_helpers import get_asyncio_loop
    except ImportError:
        return None
    loop = get_asyncio_loop()
    return loop if loop.is_running() else None
