"""The kernel object in-process (no Jupyter client, no sandbox): what do_execute does when something
below it fails in a way nobody planned for."""

from __future__ import annotations

import json
import logging
from typing import Any

from jupyter_client.session import Session

from daytona_kernel.kernel import DaytonaKernel


class Wire:
    """Stands in for the iopub socket: keeps every message sent."""

    def __init__(self) -> None:
        self.sent: list[list[bytes]] = []

    def send_multipart(self, parts: list[bytes], *args: Any, **kwargs: Any) -> None:
        self.sent.append(list(parts))


class NoAttach:
    async def auto_attach(self, frontend: Any) -> None:
        return None

    def take_adopted(self) -> None:
        return None


class BrokenSession:
    """A runtime session with a bug: running a cell raises something no layer expects."""

    attacher = NoAttach()

    async def execute(self, cell: Any, frontend: Any) -> Any:
        raise RuntimeError("an unexpected failure")


def kernel_with(runtime: Any) -> tuple[DaytonaKernel, Wire, Session]:
    session, wire = Session(key=b""), Wire()
    kernel = DaytonaKernel(backend="local", session=session, iopub_socket=wire, log=logging.getLogger("test-kernel"))
    kernel._session = runtime
    return kernel, wire, session


async def test_an_unexpected_exception_still_gets_an_error_reply_and_shows_the_error() -> None:
    kernel, wire, session = kernel_with(BrokenSession())
    reply = await kernel.do_execute("x = 1", silent=False)
    assert reply["status"] == "error" and reply["ename"] == "RuntimeError"
    assert "an unexpected failure" in reply["evalue"] and "kernel log" in reply["evalue"]
    shown = [session.deserialize(parts[parts.index(b"<IDS|MSG>") + 1 :]) for parts in wire.sent]
    errors = [m["content"] for m in shown if m["header"]["msg_type"] == "error"]
    assert [e["ename"] for e in errors] == ["RuntimeError"]
    assert reply["execution_count"] == 1 and kernel.execution_count == 2  # the count moves as for any failed cell


def test_messages_are_packed_by_orjson() -> None:
    """jupyter_client (8.8 and later) packs messages with orjson when it is installed, and the package
    depends on it: the JSON encoding of a 2 MB PNG's display went from about 13-20 ms to under 1 ms
    (docs/benchmarks.md). The message a client decodes is the same."""
    session = Session(key=b"key")
    assert session.packer == "orjson", "orjson is not installed here: `pip install -e '.[test]'` (it is a dependency)"
    content = {"data": {"image/png": "iVBORw0KGgo" * 1000, "text/plain": "é ✓"}, "metadata": {}, "transient": {}}
    assert json.loads(session.pack(content)) == content
    assert session.unpack(session.pack(session.msg("display_data", content)))["header"]["date"].endswith("Z")


def test_the_daytona_backend_has_pydantic_build_models_on_first_use(monkeypatch: Any) -> None:
    """The daytona SDK defines about 300 pydantic models at import, most of which a kernel never uses; the
    Daytona backend has pydantic build each one when it is first used (a tenth of the SDK's import, on every
    start and restart)."""
    import pydantic

    from daytona_kernel.backends.daytona.workspace import defer_model_builds

    monkeypatch.setattr(pydantic.BaseModel, "model_config", dict(pydantic.BaseModel.model_config))
    defer_model_builds()

    class Probe(pydantic.BaseModel):
        x: int

    assert not Probe.__pydantic_complete__
    assert Probe(x=1).x == 1 and Probe.__pydantic_complete__
