"""The calls from the kernel into the runtime, declared once for both ends.

One frozen dataclass per runtime method, as the daemon declares ``ExecuteRequest`` and
``WorkerCommand`` once in ``apps/daemon/pkg/toolbox/process/interpreter/types.go``. The kernel
builds one (by keyword) and sends it as keyword JSON (``encode``); the runtime decodes it by name
(``decode``: unknown or missing names and values of the wrong type are refused) and calls the
method with keyword arguments, so the order of a signature can never swap two values.
``RuntimeOptions`` is the one options object a new runtime gets.

Standard library only, Python 3.9 compatible: it runs in the sandbox too.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, ClassVar, Dict, List, Optional, Tuple, Type, TypeVar

RUNTIME_MISSING = "DaytonaKernelRuntimeMissing"
"""The error a call raises in a worker without the runtime: the daemon replaced a dead
worker with a fresh one (silently), so the runtime must be bootstrapped again."""
C = TypeVar("C")  # a call or options class that ``build`` makes
MB_CHARS = 1024 * 1024
"""Characters per megabyte of output, where ``output_limit_mb`` is turned into a count (``output_limit_chars``)."""


class CallError(Exception):
    """A call the runtime cannot decode: the kernel and the runtime disagree on a method."""


def output_limit_chars(output_limit_mb: float) -> int:
    """The one conversion of ``output_limit_mb``: the characters a cell may print (0: no limit)."""
    return int(output_limit_mb * MB_CHARS)


def limit_text(chars: int) -> str:
    """An output limit in characters, as the setting's unit says it: ``20 MB``."""
    return "%g MB" % (chars / float(MB_CHARS))


@dataclasses.dataclass(frozen=True)
class JournalOptions:
    """The session journal of a new context (``attach.SessionJournal.options``; ``journal.Journal``)."""

    root: str  # the journal root, relative to the working directory
    session: str  # the context's id: the session's folder
    instance: str  # this kernel process's instance id, the owner it checks before each cell
    owner: Dict[str, Any] = dataclasses.field(default_factory=dict)  # written to owner.json (kernel, host, pid ...)
    notebook: str = ""  # a keyed hash of the notebook's path
    name: str = ""  # the notebook's file name, for messages


@dataclasses.dataclass(frozen=True)
class RuntimeOptions:
    """What a new runtime is told (the bootstrap adds ``ipython_cache`` and ``ipython_error`` in the sandbox)."""

    output_limit_chars: int = 0  # 0: no limit
    blob_chars: int = 0  # output strings at least this long travel as files (0: never)
    sync_down: bool = False  # report the cells' file changes for the kernel's mirror
    sync_excludes: List[str] = dataclasses.field(default_factory=list)
    sync_includes: List[str] = dataclasses.field(default_factory=list)
    volume_dir: str = ""  # where the volume keeps its copy, relative to the working directory ("" for none)
    volume_excludes: List[str] = dataclasses.field(default_factory=list)
    volume_link: bool = False  # the volume is a folder on the same disk: its copy is made of hard links
    start_in: str = ""  # the notebook's sub-folder of the working directory, where cells start
    local_root: str = ""  # the user's project folder that the working directory mirrors ("" when it is not mirrored both ways)
    ship_ipython: str = ""  # the IPython version the kernel can ship ("" if it cannot)
    journal: Optional[JournalOptions] = None  # the session journal, if the backend keeps one
    ipython: bool = True  # False: run on the basic shell even where IPython could run
    ipython_cache: str = ""
    ipython_error: str = ""


@dataclasses.dataclass(frozen=True)
class Synced:
    """What the kernel's mirror did since the runtime last heard from it (``WorkdirWatch.note``)."""

    up: Dict[str, int] = dataclasses.field(default_factory=dict)  # uploaded: path -> permission bits
    acked: Dict[str, List[int]] = dataclasses.field(default_factory=dict)  # reported changes handled: path -> stat
    gone: List[str] = dataclasses.field(default_factory=list)  # reported deletions handled


@dataclasses.dataclass(frozen=True)
class CommOptions:
    """What the runtime's comm bridge needs for one call: the request's message id and the comm inbox."""

    parent: str = ""
    inbox: str = ""


class Call(object):
    """A call into the sandbox. ``METHOD`` names the runtime's method; ``TARGET`` where it lives:
    the ``Runtime`` itself, its session journal, or the ``fanout`` module (called with the runtime)."""

    METHOD: ClassVar[str] = ""
    TARGET: ClassVar[str] = "runtime"


@dataclasses.dataclass(frozen=True)
class RunCell(Call):
    METHOD: ClassVar[str] = "run_cell"
    code: str
    count: int
    store_history: bool = True
    silent: bool = False
    allow_stdin: bool = False
    user_expressions: Dict[str, str] = dataclasses.field(default_factory=dict)
    synced: Optional[Synced] = None
    comms: Optional[CommOptions] = None


@dataclasses.dataclass(frozen=True)
class Deliver(Call):
    """Frontend comm messages while no cell runs."""

    METHOD: ClassVar[str] = "deliver"
    messages: List[Dict[str, Any]]
    comms: Optional[CommOptions] = None


@dataclasses.dataclass(frozen=True)
class Debug(Call):
    """The kernel's debug requests while no cell runs (``debug.Debugger.call``); each ``{"id": n, "message": dap,
    "debugpy": the version the kernel can ship if the sandbox has none}``.
    An empty list fetches what the debugger holds (replies and events made after a cell ended)."""

    METHOD: ClassVar[str] = "debug"
    requests: List[Dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class CommTable(Call):
    METHOD: ClassVar[str] = "comm_table"


@dataclasses.dataclass(frozen=True)
class Complete(Call):
    METHOD: ClassVar[str] = "complete"
    code: str
    cursor: int


@dataclasses.dataclass(frozen=True)
class Inspect(Call):
    METHOD: ClassVar[str] = "inspect"
    code: str
    cursor: int
    detail_level: int = 0


@dataclasses.dataclass(frozen=True)
class ListFileChanges(Call):
    """What changed in the working directory and is not yet acknowledged (for ``%sync``)."""

    METHOD: ClassVar[str] = "file_changes"
    synced: Optional[Synced] = None


@dataclasses.dataclass(frozen=True)
class Checkpoint(Call):
    METHOD: ClassVar[str] = "checkpoint"
    path: str


@dataclasses.dataclass(frozen=True)
class Restore(Call):
    METHOD: ClassVar[str] = "restore"
    path: str


@dataclasses.dataclass(frozen=True)
class SyncVolume(Call):
    METHOD: ClassVar[str] = "sync_volume"


@dataclasses.dataclass(frozen=True)
class Adopt(Call):
    """The attaching kernel takes the session over (``journal.Journal.adopt``)."""

    METHOD: ClassVar[str] = "adopt"
    TARGET: ClassVar[str] = "journal"
    instance: str


@dataclasses.dataclass(frozen=True)
class Scatter(Call):
    METHOD: ClassVar[str] = "scatter"
    TARGET: ClassVar[str] = "fanout"
    names: List[str]
    paths: List[str]


@dataclasses.dataclass(frozen=True)
class Prelude(Call):
    METHOD: ClassVar[str] = "prelude"
    TARGET: ClassVar[str] = "fanout"
    rank: int
    world: int
    path: str


@dataclasses.dataclass(frozen=True)
class Dump(Call):
    METHOD: ClassVar[str] = "dump"
    TARGET: ClassVar[str] = "fanout"
    names: List[str]
    path: str


@dataclasses.dataclass(frozen=True)
class Gather(Call):
    METHOD: ClassVar[str] = "gather"
    TARGET: ClassVar[str] = "fanout"
    names: List[str]
    paths: List[str]


class JournalCall(Call):
    """A verb of the session journal run as a process command beside the interpreter (``python3 -I -c
    <journal module> <call>``, see ``journal.main``): no runtime, so it works while a cell runs."""

    TARGET: ClassVar[str] = "process"


@dataclasses.dataclass(frozen=True)
class ScanJournals(JournalCall):
    """Every session journaled under ``root``."""

    METHOD: ClassVar[str] = "scan"
    root: str


@dataclasses.dataclass(frozen=True)
class ReadJournal(JournalCall):
    """What a session's cell wrote from file ``n``, byte ``offset`` on."""

    METHOD: ClassVar[str] = "read"
    folder: str
    n: int
    offset: int


@dataclasses.dataclass(frozen=True)
class ClaimSession(JournalCall):
    """Make ``owner`` the session's owner if the instance ``expected`` still is (compare-and-swap)."""

    METHOD: ClassVar[str] = "claim"
    folder: str
    expected: str
    owner: Dict[str, Any]


@dataclasses.dataclass(frozen=True)
class RemoveJournal(JournalCall):
    METHOD: ClassVar[str] = "remove"
    folder: str


CALLS: Dict[str, Type[Any]] = {
    cls.METHOD: cls
    for cls in (
        RunCell,
        Deliver,
        Debug,
        CommTable,
        Complete,
        Inspect,
        ListFileChanges,
        Checkpoint,
        Restore,
        SyncVolume,
        Adopt,
        Scatter,
        Prelude,
        Dump,
        Gather,
    )
}
JOURNAL_CALLS: Dict[str, Type[Any]] = {cls.METHOD: cls for cls in (ScanJournals, ReadJournal, ClaimSession, RemoveJournal)}
"""The journal's process verbs: a separate table, so the runtime never takes one for a call of its own."""
_NESTED: Dict[str, Type[Any]] = {"Synced": Synced, "CommOptions": CommOptions, "JournalOptions": JournalOptions}


def encode(call: Any) -> str:
    """A call as keyword JSON: ``{"method": ..., "args": {name: value}}``."""
    return json.dumps({"method": call.METHOD, "args": dataclasses.asdict(call)}, separators=(",", ":"))


def decode(text: str, table: Dict[str, Type[Any]] = CALLS) -> Any:
    """The call in ``encode``'s JSON, checked by name and type against ``table`` (the runtime's
    ``CALLS``, or the journal's ``JOURNAL_CALLS``). Raises CallError."""
    try:
        wire = json.loads(text)
        method, args = wire["method"], wire["args"]
    except (ValueError, TypeError, KeyError) as exc:
        raise CallError("a call that is not {method, args} JSON (%s)" % exc)
    cls = table.get(method) if isinstance(method, str) else None
    if cls is None:
        raise CallError("no %s method %r" % ("runtime" if table is CALLS else "journal", method))
    return build(cls, args, method)


def build(cls: Type[C], values: Any, what: str) -> C:
    """``cls`` from a JSON object, by field name; each value checked against its field's type."""
    if not isinstance(values, dict):
        raise CallError("%s: the arguments are not an object" % what)
    hints = _hints(cls)
    unknown = sorted(set(values) - set(hints))
    if unknown:
        raise CallError("%s has no argument %s" % (what, ", ".join(unknown)))
    kwargs = {name: _checked(value, hints[name], "%s.%s" % (what, name)) for name, value in values.items()}
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a required argument is missing
        raise CallError("%s: %s" % (what, exc))


def arguments(call: Any) -> Dict[str, Any]:
    """A decoded call's arguments by name, for a keyword call of its method."""
    return {f.name: getattr(call, f.name) for f in dataclasses.fields(call)}


def _hints(cls: Type[Any]) -> Dict[str, str]:
    return {f.name: str(f.type) for f in dataclasses.fields(cls)}


_SCALARS: Dict[str, Tuple[type, ...]] = {"str": (str,), "int": (int,), "bool": (bool,), "Any": (object,)}


def _checked(value: Any, hint: str, what: str) -> Any:
    """``value`` if it fits the annotation ``hint`` (as written in this module), nested dataclasses built."""
    if hint.startswith("Optional["):
        return None if value is None else _checked(value, hint[len("Optional[") : -1], what)
    if hint in _NESTED:
        return build(_NESTED[hint], value, what)
    if hint.startswith("List["):
        if not isinstance(value, list):
            raise CallError("%s is not a list" % what)
        inner = hint[len("List[") : -1]
        return [_checked(item, inner, what + "[]") for item in value]
    if hint.startswith("Dict[str, "):
        if not isinstance(value, dict):
            raise CallError("%s is not an object" % what)
        inner = hint[len("Dict[str, ") : -1]
        return {_checked(k, "str", what + " key"): _checked(v, inner, "%s[%r]" % (what, k)) for k, v in value.items()}
    kinds = _SCALARS.get(hint)
    if kinds is None:
        raise CallError("%s: no check for the type %s" % (what, hint))
    if not isinstance(value, kinds) or (hint == "int" and isinstance(value, bool)):
        raise CallError("%s is %s, not %s" % (what, type(value).__name__, hint))
    return value


def options_from(values: Dict[str, Any]) -> RuntimeOptions:
    """The runtime's options from the bootstrap's JSON (checked like a call)."""
    return build(RuntimeOptions, values, "options")


def missing_runtime(what: str) -> Exception:
    """The exception a call raises where the runtime (or the part it calls) is not installed."""
    missing: Type[Exception] = type(RUNTIME_MISSING, (Exception,), {})
    return missing("%s is not installed in this worker" % what)


assert all(isinstance(cls.METHOD, str) and cls.METHOD for cls in list(CALLS.values()) + list(JOURNAL_CALLS.values())), (
    "every call names its method"
)
