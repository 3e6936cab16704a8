"""The debugger inside the sandbox: ipykernel's ``Debugger`` on debugpy, across the sandbox boundary.

Standard library only, Python 3.9+; debugpy is imported when the frontend first asks for the debugger.
debugpy's pydevd speaks the Debug Adapter Protocol (DAP) itself. Here it is connected to one end of a
``socket.socketpair()`` in this process (its ``start_client`` replaced for that one call), so no port is
opened anywhere, in the sandbox or on the user's machine; this module holds the other end.

Kernel to sandbox: a ``debug_request``'s DAP message arrives in a ``Debug`` call while no cell runs,
or while a cell runs (stopped at a breakpoint, most often) as a ``debug-<n>.json`` file the kernel uploads
to the cell's inbox (the comm bridge's folder), which a thread here polls. Sandbox to kernel: every DAP
response and event is one ``debug`` frame; while neither a cell nor a ``Debug`` call reads the output,
frames wait in a bounded outbox for the next call.

What ipykernel's ``Debugger`` does in its kernel process happens here, in the process that runs the cells:
cells are compiled under ipykernel's file names (``ipyshell.cell_file_name``), ``dumpCell`` writes them,
``source`` reads a file of this sandbox, and ``inspectVariables``, ``richInspectVariables`` and
``copyToGlobals`` answer as ipykernel's do. Composite requests are made of internal DAP requests with
sequence numbers of their own, so they never collide with the frontend's.
"""

import ast
import json
import os
import queue
import re
import socket
import sys
import tempfile
import threading
from typing import Any  # noqa: F401  (in type comments: the runtime runs on Python 3.9)

try:  # inside the sandbox the bootstrap installed these modules under these names
    import _daytona_kernel_framing as _framing
    import _daytona_kernel_streams as _streams
except ImportError:  # imported from the package (tests)
    from daytona_kernel.runtime import framing as _framing
    from daytona_kernel.runtime import streams as _streams

Kind = _framing.Kind
POLL_S = 0.02  # how often a running cell's inbox is looked at for the kernel's debug requests
REPLY_TIMEOUT_S = 20.0  # an internal request pydevd does not answer fails after this
OUTBOX_MAX = 1000  # DAP messages held while no request reads the output, before the newest are dropped
BATCH_PREFIX = "debug-"
HASH_SEED = 0xC70F6907  # ipykernel's compiler.get_tmp_hash_seed()
# ipykernel's Debugger.accept_variable: names the variables panel never lists
HIDDEN_VARIABLES = frozenset(
    (
        "__name__",
        "__doc__",
        "__package__",
        "__loader__",
        "__spec__",
        "__annotations__",
        "__builtins__",
        "__builtin__",
        "__display__",
        "get_ipython",
        "debugpy",
        "exit",
        "quit",
        "In",
        "Out",
        "_oh",
        "_dh",
        "_",
        "__",
        "___",
    )
)
STARTED_ONLY = frozenset(("dumpCell", "setBreakpoints", "source", "stackTrace", "variables", "attach", "configurationDone"))


def accept_variable(name):
    return name not in HIDDEN_VARIABLES and not re.search(r"^_\d", name) and name[0:2] != "_i"


def tmp_directory():
    """ipykernel's ``get_tmp_directory``: where cells' files are (``ipyshell.cell_file_name``)."""
    return tempfile.gettempdir() + os.sep + "ipykernel_" + str(os.getpid())


def shipped_folder(version):
    """Where the kernel ships its debugpy ``version`` for this Python (as ``ipython_cache`` for IPython); "" for none."""
    if not version:
        return ""
    name = "debugpy-%s-py%d.%d" % ((version,) + tuple(sys.version_info[:2]))
    return os.path.join(os.path.expanduser("~"), ".cache", "daytona-kernel", name)


def find_debugpy(version):
    """ "" when debugpy is importable: the sandbox's own, else the one the kernel shipped (put on ``sys.path``, after
    site-packages), else the folder the kernel should ship it to (``shipDebugpy``), or None if it cannot."""
    import importlib.util

    try:
        if importlib.util.find_spec("debugpy") is not None:
            return ""
    except (ImportError, ValueError):
        pass  # a broken debugpy: the shipped one may do
    folder = shipped_folder(version)
    if folder and os.path.isdir(folder):
        if folder not in sys.path:
            sys.path.append(folder)
            importlib.invalidate_caches()
        return ""
    return folder or None


def _pydevd_module(name):
    """A module of debugpy's pydevd, importable once ``debugpy.server`` is (as ipykernel imports them)."""
    import importlib

    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # else pydevd warns of frozen modules on the cell's stderr
    importlib.import_module("debugpy.server.api")
    return importlib.import_module(name)


def _hide_from_pydevd(thread):
    """pydevd neither traces nor lists the runtime's own threads."""
    thread.pydev_do_not_trace = True
    thread.is_pydev_daemon_thread = True


def response(request, success=True, body=None, message=None):
    reply = {
        "type": "response",
        "seq": request.get("seq", 0),
        "request_seq": request.get("seq", 0),
        "success": success,
        "command": request.get("command", ""),
    }
    if body is not None:
        reply["body"] = body
    if message is not None:
        reply["message"] = message
    return reply


class DapSocket(object):
    """Our end of the socket pair: DAP messages with a ``Content-Length`` header each, as pydevd writes them."""

    def __init__(self, sock):
        self.sock = sock
        self._buf = b""
        self._write_lock = threading.Lock()

    def write(self, message):
        body = json.dumps(message).encode("utf-8")
        with self._write_lock:
            self.sock.sendall(b"Content-Length: %d\r\n\r\n" % len(body) + body)

    def read(self):
        """The next message, or None once pydevd closed its end."""
        while True:
            head, sep, rest = self._buf.partition(b"\r\n\r\n")
            if sep:
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                if len(rest) >= length:
                    self._buf = rest[length:]
                    return json.loads(rest[:length].decode("utf-8"))
            data = self.sock.recv(65536)
            if not data:
                return None
            self._buf += data


class Channel(object):
    """One per runtime: the debugger's way to and from the kernel (calls, the cell's inbox, frames) and to pydevd
    (its socket, internal requests). See the module docstring."""

    def __init__(self, runtime):
        self.rt = runtime
        self.debugger = Debugger(runtime, self)
        self.dap = None  # type: Any  # our end of pydevd's socket, once started
        self.lock = threading.Lock()
        self._seq = 1 << 30  # internal requests' numbers, far from the frontend's
        self._waiters = {}  # internal seq -> [threading.Event, the response]
        self.outbox = []
        self.dropped = 0
        self.reading = False  # a cell or a Debug call reads the output now
        self.in_cell = False
        self._inbox_taken = 0
        self.tasks = queue.Queue()  # type: queue.Queue
        self._worker = None

    # -- the kernel's side: calls, the inbox, frames out ------------------------

    def call(self, requests):
        """The ``Debug`` call (no cell runs): the held messages, the inbox's leftovers, then ``requests``."""
        self._note_stack()
        with self.rt.lock:
            self.reading = True
            held, self.outbox = self.outbox, []
            for payload in held:
                self.rt.send(Kind.DEBUG, payload)
        try:
            for item in self._take_inbox() + list(requests):
                self.answer(item)
        finally:
            with self.rt.lock:
                self.reading = False

    def start_cell(self):
        self._note_stack()
        with self.rt.lock:
            self.reading = self.in_cell = True
            held, self.outbox = self.outbox, []
            for payload in held:
                self.rt.send(Kind.DEBUG, payload)

    def end_cell(self):
        with self.rt.lock:
            self.reading = self.in_cell = False
        for item in self._take_inbox():  # uploaded as the cell ended: answered by the worker, sent with the next call
            self.tasks.put(("request", item))

    def answer(self, item):
        """A request from the kernel (``{"id": n, "message": dap}``): its reply goes out naming ``n``."""
        message = item.get("message")
        if not isinstance(message, dict):
            return
        if isinstance(item.get("debugpy"), str):
            self.debugger.shippable = item["debugpy"]
        try:
            reply = self.debugger.handle(message)
        except Exception as exc:  # the kernel waits for this reply: it says what failed, and the debugger stays usable
            reply = response(message, False, message="the debugger failed in the sandbox: %s: %s" % (type(exc).__name__, exc))
        self.emit(reply, answers=item.get("id"))

    def emit(self, message, answers=None):
        """One DAP message to the kernel: a frame now, or held (bounded) until a request reads the output.
        ``answers`` is the kernel's id of the request it replies to (None for an event)."""
        payload = {"message": message}
        if answers is not None:
            payload["answers"] = answers
        with self.rt.lock:
            if self.reading:
                self.rt.send(Kind.DEBUG, payload)
            elif len(self.outbox) < OUTBOX_MAX:
                self.outbox.append(payload)
            else:
                self.dropped += 1

    def _inbox_path(self):
        return getattr(self.rt.comms.inbox, "path", None) or ""

    def _take_inbox(self):
        """The kernel's requests in the inbox's complete ``debug-<n>.json`` files, in order; the files are removed."""
        folder = self._inbox_path()
        try:
            names = os.listdir(folder) if folder else []
        except OSError:
            return []
        batches = []
        for name in names:
            match = re.match(r"^debug-(\d+)\.json$", name)
            if match and int(match.group(1)) > self._inbox_taken:
                batches.append((int(match.group(1)), name))
        items = []  # type: list
        for seq, name in sorted(batches):
            path = os.path.join(folder, name)
            try:
                with open(path, encoding="utf-8") as f:
                    batch = json.loads(f.read())
            except (OSError, ValueError):
                break  # still being written: taken at the next look
            self._inbox_taken = seq
            try:
                os.remove(path)
            except OSError:
                pass  # _inbox_taken keeps it from being read twice
            items.extend(m for m in (batch if isinstance(batch, list) else []) if isinstance(m, dict))
        return items

    def ensure_worker(self):
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._work, name="daytona-kernel-debug", daemon=True)
            _hide_from_pydevd(self._worker)
            self._worker.start()

    def _work(self):
        """The requests uploaded while a cell runs, and pydevd's stopped events (which need a request of their own)."""
        _streams.block_signals()
        while True:
            try:
                kind, message = self.tasks.get(timeout=POLL_S)
            except queue.Empty:
                if self.in_cell:
                    for item in self._take_inbox():
                        self.tasks.put(("request", item))
                continue
            if kind == "request":
                self.answer(message)
                continue
            try:
                self.debugger.stopped(message)
            except Exception as exc:  # the event still goes out, without the list of stopped threads
                self.debugger.stopped_threads.add((message.get("body") or {}).get("threadId"))
                self.emit(message)
                problem = "daytona-kernel debugger: the stopped threads are unknown: %r\n" % (exc,)
                sys.__stderr__.write(problem)  # type: ignore[union-attr]

    # -- pydevd ------------------------------------------------------------

    def _note_stack(self):
        """The runtime's and the worker's frames under a cell are the kernel's, as ipykernel's modules are."""
        frame = sys._getframe(1)  # type: Any
        while frame is not None:
            self.debugger.internal_paths.add(frame.f_code.co_filename)
            frame = frame.f_back

    def connect(self):
        """Start pydevd in this process, talking DAP over a socket pair (no port anywhere)."""
        debugpy = _pydevd_module("debugpy")
        pydevd = _pydevd_module("pydevd")

        ours, theirs = socket.socketpair()
        original = pydevd.start_client
        pydevd.start_client = lambda host, port: theirs
        try:
            pydevd.settrace(
                host="sandbox",
                port=0,
                suspend=False,
                patch_multiprocessing=False,
                notify_stdin=False,
                block_until_connected=True,
                wait_for_ready_to_run=False,
                protocol="dap",
                dont_trace_start_patterns=(os.path.dirname(debugpy.__file__),),
                dont_trace_end_patterns=("debugpy_launcher.py",),
            )
        finally:
            pydevd.start_client = original
        self.dap = DapSocket(ours)
        for thread in threading.enumerate():  # the runtime's own threads are neither traced nor listed
            if thread.name.startswith("daytona-kernel"):
                _hide_from_pydevd(thread)
        reader = threading.Thread(target=self._read, name="daytona-kernel-debug-reader", daemon=True)
        _hide_from_pydevd(reader)
        reader.start()

    def _read(self):
        _streams.block_signals()
        while True:
            message = self.dap.read()
            if message is None:
                return
            message.pop("pydevd_cmd_id", None)  # pydevd's own, which debugpy's adapter removes too
            if message.get("type") == "response":
                with self.lock:
                    waiter = self._waiters.pop(message.get("request_seq"), None)
                if waiter is not None:
                    waiter[1] = message
                    waiter[0].set()
                    continue
                self.emit(message)
            elif message.get("type") == "event":
                self.debugger.event(message)

    def forward(self, request):
        """Send one request to pydevd under an internal number and wait for its response, under the request's."""
        with self.lock:
            self._seq += 1
            seq = self._seq
            waiter = self._waiters[seq] = [threading.Event(), None]
        self.dap.write(dict(request, seq=seq))
        if not waiter[0].wait(REPLY_TIMEOUT_S):
            with self.lock:
                self._waiters.pop(seq, None)
            return response(request, False, message="the debugger did not answer in %d s" % REPLY_TIMEOUT_S)
        reply = waiter[1]
        reply["request_seq"] = request.get("seq", 0)
        reply["seq"] = request.get("seq", 0)
        return reply

    # -- the requests: ipykernel's Debugger.process_request ------------------


class Debugger(object):
    """ipykernel's ``Debugger.process_request`` and its handlers, in the sandbox (see the module docstring)."""

    def __init__(self, runtime, channel):
        self.rt = runtime
        self.channel = channel
        self.started = False  # the frontend's debug session (initialize .. disconnect)
        self.breakpoints = {}  # source path -> the breakpoints pydevd set there
        self.stopped_threads = set()
        self.internal_paths = {getattr(m, "__file__", None) or "" for m in list(sys.modules.values())} - {""}
        self._removed_cleanup = {}
        self.shippable = ""  # the debugpy version the kernel can ship (each request says it)

    def handle(self, message):
        command = message.get("command")
        if command == "initialize" and not self.started:
            problem = self._start(message)
            if problem:
                return problem if isinstance(problem, dict) else response(message, False, message=problem)
        handler = getattr(self, "on_" + str(command), None)  # type: Any
        if command in ("debugInfo", "inspectVariables", "richInspectVariables", "modules", "copyToGlobals"):
            reply = handler(message)
        elif not self.started:
            reply = {}  # as ipykernel: an empty reply before initialize
        elif command in STARTED_ONLY:
            reply = handler(message)
        else:
            reply = self.channel.forward(message)
        if command == "disconnect":
            self._stop()
        return reply

    def _start(self, message=None):
        if self.rt.ipython is None:
            return "the debugger needs IPython, which this sandbox's Python cannot run"
        folder = find_debugpy(self.shippable)
        if folder is None:
            return "debugpy is not installed in the sandbox, and the kernel has none to ship (pip install debugpy there)"
        if folder:  # the kernel ships it, then asks again
            return response(message or {}, False, body={"shipDebugpy": folder}, message="debugpy is not installed in the sandbox")
        if self.channel.dap is None:
            try:
                self.channel.connect()
            except Exception as exc:  # the reply says why: the debugger stays off, the kernel runs on
                return "debugpy could not start in the sandbox: %s: %s" % (type(exc).__name__, exc)
        folder = tmp_directory()
        if not os.path.isdir(folder):
            os.makedirs(folder, mode=0o700)
        self.channel.ensure_worker()
        cleanup = self.rt.ipython.input_transformer_manager.cleanup_transforms
        from IPython.core.inputtransformer2 import leading_empty_lines  # breakpoints stay on their lines

        if leading_empty_lines in cleanup:
            index = cleanup.index(leading_empty_lines)
            self._removed_cleanup[index] = cleanup.pop(index)
        self.started = True
        return ""

    def _stop(self):
        cleanup = self.rt.ipython.input_transformer_manager.cleanup_transforms
        for index in sorted(self._removed_cleanup):
            cleanup.insert(index, self._removed_cleanup.pop(index))
        self.breakpoints = {}
        self.stopped_threads = set()
        self.started = False

    def on_dumpCell(self, message):
        code = message.get("arguments", {}).get("code", "")
        path = self._cell_file_name(code)
        with open(path, "w", encoding="utf-8") as f:
            f.write(code)
        return response(message, body={"sourcePath": path})

    def _cell_file_name(self, code):
        return sys.modules[type(self.rt.ipython.compile).__module__].cell_file_name(code)

    def on_setBreakpoints(self, message):
        """A breakpoint in the user's own file (a mirrored one) is set in its copy here (``Runtime.paths``)."""
        source = message["arguments"]["source"]["path"]
        self.breakpoints[source] = message["arguments"].get("breakpoints", [])
        arguments = dict(message["arguments"], source=dict(message["arguments"]["source"], path=self.rt.paths.to_sandbox(source)))
        reply = self.channel.forward(dict(message, arguments=arguments))
        if reply.get("success"):  # pydevd may move a breakpoint: keep where it put them
            self.breakpoints[source] = [{"line": b["line"]} for b in reply.get("body", {}).get("breakpoints", []) if "line" in b]
            for b in reply.get("body", {}).get("breakpoints", []):
                if isinstance(b.get("source"), dict):
                    b["source"]["path"] = self.rt.paths.to_user(b["source"].get("path"))
        return reply

    def on_source(self, message):
        """A file of the sandbox (a cell's, or a module's), read here: never one of the user's machine."""
        path = self.rt.paths.to_sandbox(message.get("arguments", {}).get("source", {}).get("path", ""))
        try:
            with open(path, encoding="utf-8") as f:
                return response(message, body={"content": f.read()})
        except (OSError, TypeError, ValueError):
            return response(message, False, body={}, message="source unavailable")

    def on_stackTrace(self, message):
        """The frames of a mirrored file name the user's own file, as tracebacks do (``Runtime.paths``)."""
        reply = self.channel.forward(message)
        for frame in (reply.get("body") or {}).get("stackFrames", []):
            if isinstance(frame.get("source"), dict):
                frame["source"]["path"] = self.rt.paths.to_user(frame["source"].get("path"))
        return reply

    def on_variables(self, message):
        if not self.stopped_threads:
            return self._variables_reply(message, self._explorer_children(message["arguments"].get("variablesReference")))
        reply = self.channel.forward(message)
        if reply.get("success"):
            reply["body"]["variables"] = [v for v in reply["body"].get("variables", []) if accept_variable(v.get("name", ""))]
        return reply

    def on_attach(self, message):
        """pydevd is the adapter: it sends ``initialized`` and answers; ``configurationDone`` follows, as debugpy's adapter does."""
        arguments = dict(message.get("arguments") or {})
        arguments.pop("connect", None)
        arguments["debugOptions"] = ["DebugStdLib"]  # ipykernel's default: debug_just_my_code False
        arguments["rules"] = [{"path": path, "include": False} for path in sorted(self.internal_paths)]
        reply = self.channel.forward(dict(message, arguments=arguments))
        self.channel.forward({"type": "request", "command": "configurationDone"})
        return reply

    def on_configurationDone(self, message):
        return response(message)

    def on_debugInfo(self, message):
        return response(
            message,
            body={
                "isStarted": self.started,
                "hashMethod": "Murmur2",
                "hashSeed": HASH_SEED,
                "tmpFilePrefix": tmp_directory() + os.sep,
                "tmpFileSuffix": ".py",
                "breakpoints": [{"source": key, "breakpoints": value} for key, value in self.breakpoints.items()],
                "stoppedThreads": sorted(self.stopped_threads),
                "richRendering": True,
                "exceptionPaths": ["Python Exceptions"],
                "copyToGlobals": True,
            },
        )

    def on_inspectVariables(self, message):
        return self._variables_reply(message, self._explorer_children(None))

    def _explorer_children(self, reference):
        """ipykernel's ``VariableExplorer``: the user's namespace through pydevd's variable model."""
        frame_utils = _pydevd_module("_pydevd_bundle.pydevd_frame_utils")
        PyDevdAPI = _pydevd_module("_pydevd_bundle.pydevd_api").PyDevdAPI
        suspended = _pydevd_module("_pydevd_bundle.pydevd_suspended_frames")

        if reference is None or not hasattr(self, "_explorer"):
            manager = suspended.SuspendedFramesManager()
            py_db = type("DummyPyDB", (), {})()
            py_db.variable_presentation = PyDevdAPI.VariablePresentation()
            tracker = suspended._FramesTracker(manager, py_db)
            ns = self.rt.user_ns
            code = type("Code", (), {"co_filename": "<module>", "co_name": self._cell_file_name("sys._getframe()")})()
            frame = type("Frame", (), {"f_code": code, "f_globals": ns, "f_locals": ns, "f_back": None})()
            tracker.track("thread1", frame_utils.create_frames_list_from_frame(frame))
            self._explorer = (manager, tracker, frame)
        manager, tracker, frame = self._explorer
        variables = manager.get_variable(reference or id(frame))
        return [v.get_var_data() for v in variables.get_children_variables()]

    def _variables_reply(self, message, variables):
        return response(message, body={"variables": [v for v in variables if accept_variable(v["name"])]})

    def on_richInspectVariables(self, message):
        reply = {"type": "response", "sequence_seq": message.get("seq", 0), "success": False, "command": message.get("command")}
        name = message.get("arguments", {}).get("variableName", "")
        if not str.isidentifier(name):
            reply["body"] = {"data": {}, "metadata": {}}
            reply["success"] = name in ("special variables", "function variables")
            return reply
        data, metadata = {}, {}
        if not self.stopped_threads:
            result = self.rt.ipython.user_expressions({name: name})[name]
            if result.get("status", "error") == "ok":
                data, metadata = result.get("data", {}), result.get("metadata", {})
        else:
            code = "get_ipython().display_formatter.format(%s)" % name
            frame_id = message.get("arguments", {}).get("frameId")
            reply = self.channel.forward(
                {
                    "type": "request",
                    "command": "evaluate",
                    "seq": message.get("seq", 0) + 1,
                    "arguments": {"expression": code, "frameId": frame_id, "context": "clipboard"},
                }
            )
            if reply.get("success"):
                try:
                    data, metadata = ast.literal_eval(reply["body"]["result"])
                except (ValueError, SyntaxError, TypeError):
                    data, metadata = {"text/plain": reply["body"]["result"]}, {}
        reply["body"] = {"data": data, "metadata": {k: v for k, v in metadata.items() if k in data}}
        reply["success"] = True
        return reply

    def on_copyToGlobals(self, message):
        arguments = message.get("arguments", {})
        return self.channel.forward(
            {
                "type": "request",
                "command": "setExpression",
                "seq": message.get("seq", 0) + 1,
                "arguments": {
                    "expression": "globals()['%s']" % arguments.get("dstVariableName"),
                    "value": arguments.get("srcVariableName"),
                    "frameId": arguments.get("srcFrameId"),
                },
            }
        )

    def on_modules(self, message):
        modules = list(sys.modules.copy().values())
        start = message.get("startModule", 0)
        count = message.get("moduleCount", len(modules))
        found = []
        for i in range(start, min(count, len(modules))):
            filename = getattr(getattr(modules[i], "__spec__", None), "origin", None)
            if filename and filename.endswith(".py"):
                found.append({"id": i, "name": modules[i].__name__, "path": filename})
        return {"body": {"modules": found, "totalModules": len(modules)}}

    def event(self, event):
        """ipykernel's ``_handle_event``: the stopped threads are tracked, for ``debugInfo`` and variables."""
        body = event.get("body") or {}
        if event.get("event") == "stopped":
            if body.get("allThreadsStopped"):
                self.channel.tasks.put(("stopped", event))  # the threads request needs this reader free
                return
            self.stopped_threads.add(body.get("threadId"))
        elif event.get("event") == "continued":
            if body.get("allThreadsContinued"):
                self.stopped_threads = set()
            else:
                self.stopped_threads.discard(body.get("threadId"))
        self.channel.emit(event)

    def stopped(self, event):
        reply = self.channel.forward({"type": "request", "command": "threads"})
        for thread in (reply.get("body") or {}).get("threads", []):
            if not str(thread.get("name", "")).startswith("daytona-kernel"):
                self.stopped_threads.add(thread.get("id"))
        self.channel.emit(event)
