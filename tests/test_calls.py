"""Calls from the kernel into the runtime: what the runtime's method receives, by name."""

from __future__ import annotations

import dataclasses
import inspect
import logging
import re
import sys
import types
from typing import Any

import pytest
from fakes import FakeSandbox, Run

from daytona_kernel.cell import Cell, Recorder
from daytona_kernel.config import SessionSettings
from daytona_kernel.runtime import RUNTIME_MODULE
from daytona_kernel.runtime.calls import (
    CALLS,
    CallError,
    CommOptions,
    RunCell,
    Synced,
    decode,
    encode,
    limit_text,
    output_limit_chars,
)
from daytona_kernel.runtime.runtime import Runtime
from daytona_kernel.session import SandboxSession


class Receiver:
    """Stands in for the sandbox's ``Runtime``: its own ``call`` decodes, and each method it calls is
    recorded, bound to the real method's signature."""

    call = Runtime.call
    journal = None

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        real = getattr(Runtime, name)

        def record(*args: Any, **kwargs: Any) -> None:
            bound = inspect.signature(real).bind(self, *args, **kwargs)
            bound.apply_defaults()
            self.calls.append((name, {k: v for k, v in bound.arguments.items() if k != "self"}))

        return record


def received(code: str, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    """Run a call's code string against a recording runtime: the methods called, with their arguments by name."""
    import daytona_kernel.runtime.runtime as real_module

    receiver = Receiver()
    fake = types.ModuleType(RUNTIME_MODULE)
    fake.__dict__.update({k: v for k, v in vars(real_module).items() if not k.startswith("__")})
    fake.current = receiver  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, RUNTIME_MODULE, fake)
    exec(code, {})
    return receiver.calls


async def test_a_cells_flags_reach_the_runtime_under_their_own_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """Swapping two booleans on either side (silent and store_history) must not pass unnoticed."""
    sandbox = FakeSandbox([Run([])])
    session = SandboxSession(sandbox, SessionSettings(), logging.getLogger("test-calls"))
    cell = Cell("x = 1", 7, silent=True, store_history=False, allow_stdin=False, user_expressions={"e": "x"})
    await session.execute(cell, Recorder())
    [(method, args)] = received(sandbox.codes[-1], monkeypatch)
    assert method == "run_cell"
    assert args["code"] == "x = 1" and args["count"] == 7
    assert args["silent"] is True and args["store_history"] is False and args["allow_stdin"] is False
    assert args["user_expressions"] == {"e": "x"}


def test_a_call_travels_as_keyword_json_and_is_decoded_by_name() -> None:
    call = RunCell(code="x", count=2, silent=True, synced=Synced(up={"a.sh": 0o755}), comms=CommOptions(parent="m1"))
    back = decode(encode(call))
    assert back == call and isinstance(back.synced, Synced) and isinstance(back.comms, CommOptions)


@pytest.mark.parametrize(
    ("wire", "says"),
    [
        ('{"method": "run_cel", "args": {}}', "no runtime method 'run_cel'"),
        ('{"method": "run_cell", "args": {"code": "x"}}', "count"),
        ('{"method": "run_cell", "args": {"code": "x", "count": 1, "silnet": true}}', "no argument silnet"),
        ('{"method": "run_cell", "args": {"code": "x", "count": true}}', "run_cell.count is bool, not int"),
        ('{"method": "run_cell", "args": {"code": "x", "count": 1, "synced": {"up": {"a": "rwx"}}}}', "is str, not int"),
        ("[1, 2]", "not {method, args} JSON"),
    ],
)
def test_a_call_that_does_not_fit_its_declaration_is_refused(wire: str, says: str) -> None:
    with pytest.raises(CallError, match=re.escape(says)):
        decode(wire)


def test_every_call_matches_its_runtime_method_by_name() -> None:
    from daytona_kernel.runtime import fanout, journal

    targets = {"runtime": Runtime, "journal": journal.Journal, "fanout": fanout}
    for name, cls in CALLS.items():
        method = inspect.signature(getattr(targets[cls.TARGET], name))
        declared = [f.name for f in dataclasses.fields(cls)]
        params = [p for p in method.parameters if p not in ("self", "rt")]
        assert params == declared, (name, params, declared)


def test_the_output_limit_is_converted_once_and_said_in_its_own_unit() -> None:
    assert SessionSettings(output_limit_mb=1.5).output_limit_chars == output_limit_chars(1.5) == 1572864
    assert limit_text(output_limit_chars(20)) == "20 MB"


# -- replies: each parsed in protocol.py into a typed value ------------------------------------------


def test_a_forged_adopt_reply_becomes_numbers_and_clean_inputs() -> None:
    """The journal is the cell's to write: the attach message once showed whatever ``variables`` held."""
    from daytona_kernel.protocol import Adopted, adopted

    reply = {"count": -3, "variables": "all of them", "inputs": [[1, "a = 1"], [True, "x"], ["2", "y"], [3, 4], [5, "b"]]}
    assert adopted(reply) == Adopted(count=0, inputs=[(1, "a = 1"), (5, "b")], variables=0)
    assert adopted({"count": 7, "variables": 2, "inputs": []}) == Adopted(7, [], 2)


def test_a_comm_table_reply_keeps_only_well_formed_entries() -> None:
    from daytona_kernel.protocol import OpenComms, SessionComm, open_comms

    table = {
        "comms": {
            "c1": {"target_name": "jupyter.widget", "state": {"_model_name": "IntSliderModel"}},
            "c2": {"target_name": 3},
            "c3": "nope",
            "c4": {"target_name": "t", "state": [1]},
        }
    }
    assert open_comms(table) == OpenComms(
        {
            "c1": SessionComm("jupyter.widget", {"_model_name": "IntSliderModel"}),
            "c4": SessionComm("t", {}),
        }
    )
    assert open_comms({"comms": []}) == OpenComms({})


def test_complete_and_inspect_replies_keep_only_their_fields() -> None:
    from daytona_kernel.protocol import Completion, Inspection, completion, inspection

    assert completion({"matches": ["a", 1], "cursor_start": True, "cursor_end": 2, "status": "abort"}) == Completion(
        ["a"], None, 2, None
    )
    assert inspection({"found": "yes", "data": {"text/plain": "x"}, "metadata": None}) == Inspection(
        False, {"text/plain": "x"}, {}
    )


async def test_a_call_returns_its_reply_typed_and_a_reply_that_does_not_fit_is_an_error() -> None:
    from fakes import frame

    from daytona_kernel.errors import ProtocolError
    from daytona_kernel.protocol import Checkpointed, checkpointed
    from daytona_kernel.runtime.calls import Checkpoint

    sandbox = FakeSandbox(
        [
            Run([]),
            Run([frame("reply", {"saved": ["x"], "skipped": [], "pickler": "pickle", "bytes": 12})]),
            Run([frame("reply", {"saved": "x"})]),
        ]
    )
    session = SandboxSession(sandbox, SessionSettings(), logging.getLogger("test-calls"))
    await session.execute(Cell("x = 1", 1), Recorder())
    assert await session.supervisor.call(Checkpoint(path="c"), checkpointed) == Checkpointed(["x"], [], "pickle", 12)
    with pytest.raises(ProtocolError, match="saved"):
        await session.supervisor.call(Checkpoint(path="c"), checkpointed)


def test_the_journal_options_are_typed_like_a_call() -> None:
    """They were a dict read by key in the sandbox: a missing or misspelt key surfaced as a KeyError there."""
    from daytona_kernel.runtime.calls import JournalOptions, options_from

    good = {"root": "../j", "session": "ctx", "instance": "me", "owner": {"kernel": "k"}}
    assert options_from({"journal": good}).journal == JournalOptions("../j", "ctx", "me", {"kernel": "k"})
    with pytest.raises(CallError, match="instance"):
        options_from({"journal": {"root": "../j", "session": "ctx"}})
    with pytest.raises(CallError, match="no argument sesion"):
        options_from({"journal": dict(good, sesion="x")})
