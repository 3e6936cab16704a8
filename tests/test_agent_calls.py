"""agent_calls.Call against a scripted kernel client: late notices, timeouts and a dead kernel, in process."""

from __future__ import annotations

import asyncio
from typing import Any, Callable

import pytest

from daytona_kernel import agent_calls
from daytona_kernel.agent_calls import KERNEL_DIED, Call

NOTICE = {"daytona_kernel_notice": True}


def message(msg_type: str, parent: str, content: dict[str, Any], metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"msg_type": msg_type, "parent_header": {"msg_id": parent}, "content": content, "metadata": metadata or {}}


class ScriptedClient:
    """The part of AsyncKernelClient that Call uses; ``on_execute(msg_id, code)`` plays the kernel."""

    def __init__(self, on_execute: Callable[[ScriptedClient, str, str], None]) -> None:
        self.iopub: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.shell: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self._on_execute = on_execute

    def execute(self, code: str, **options: Any) -> str:
        msg_id = f"request-{len(self.requests)}"
        self.requests.append((code, options))
        self._on_execute(self, msg_id, code)
        return msg_id

    async def get_iopub_msg(self, timeout: float | None = None) -> dict[str, Any]:
        return await self.iopub.get()

    async def get_shell_msg(self, timeout: float | None = None) -> dict[str, Any]:
        return await asyncio.wait_for(self.shell.get(), timeout)

    def finish(self, msg_id: str, status: str = "ok", count: int = 1, **reply: Any) -> None:
        self.iopub.put_nowait(message("status", msg_id, {"execution_state": "idle"}))
        self.shell.put_nowait(message("execute_reply", msg_id, {"status": status, "execution_count": count, **reply}))


def prints(text: str) -> Callable[[ScriptedClient, str, str], None]:
    def play(client: ScriptedClient, msg_id: str, code: str) -> None:
        client.iopub.put_nowait(message("stream", msg_id, {"name": "stdout", "text": text}))
        client.finish(msg_id)

    return play


async def test_a_notice_that_comes_after_its_request_goes_with_the_next_result() -> None:
    client = ScriptedClient(prints("out\n"))
    call = Call(client, interrupt=lambda: asyncio.sleep(0), alive=lambda: asyncio.sleep(0, True))  # type: ignore[arg-type]
    await call.execute("first")
    client.iopub.put_nowait(message("stream", "request-0", {"name": "stderr", "text": "late notice\n"}, NOTICE))
    client.iopub.put_nowait(message("stream", "request-0", {"name": "stderr", "text": "late stderr\n"}))
    await asyncio.sleep(0.05)
    second = (await call.execute("second")).result(10_000, str)
    assert second.notices == ["late notice\n"] and second.text == "out\n"
    assert client.requests[0][1] == {"silent": False, "store_history": True, "allow_stdin": False, "stop_on_error": False}
    await call.close()


async def test_a_timeout_interrupts_again_until_the_run_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent_calls, "INTERRUPT_RETRY_S", 0.05)
    interrupts: list[float] = []

    def sleeps(client: ScriptedClient, msg_id: str, code: str) -> None:
        client.iopub.put_nowait(message("status", msg_id, {"execution_state": "busy"}))
        client.current = msg_id  # type: ignore[attr-defined]

    client = ScriptedClient(sleeps)

    async def interrupt() -> None:  # the first interrupt reaches the kernel before the cell started: nothing happens
        interrupts.append(asyncio.get_running_loop().time())
        if len(interrupts) == 2:
            msg_id = client.current  # type: ignore[attr-defined]
            client.iopub.put_nowait(
                message("error", msg_id, {"ename": "KeyboardInterrupt", "evalue": "", "traceback": ["KeyboardInterrupt"]})
            )
            client.finish(msg_id, "error", ename="KeyboardInterrupt", evalue="")

    call = Call(client, interrupt=interrupt, alive=lambda: asyncio.sleep(0, True))  # type: ignore[arg-type]
    result = (await call.execute("import time; time.sleep(60)", timeout=0.05)).result(10_000, str)
    assert len(interrupts) == 2
    assert result.timed_out and result.interrupted and result.error is not None
    assert result.notices == ["The run passed its timeout of 0.05 s and was interrupted; the variables are kept.\n"]
    await call.close()


async def test_a_dead_kernel_ends_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent_calls, "ALIVE_CHECK_S", 0.05)
    client = ScriptedClient(
        lambda client, msg_id, code: client.iopub.put_nowait(message("status", msg_id, {"execution_state": "busy"}))
    )
    call = Call(client, interrupt=lambda: asyncio.sleep(0), alive=lambda: asyncio.sleep(0, False))  # type: ignore[arg-type]
    result = (await call.execute("anything")).result(10_000, str)
    assert result.error is not None and (result.error.name, result.error.value) == ("KernelDied", KERNEL_DIED)
    await call.close()


def test_the_local_backend_is_known_by_its_kernelspec_not_its_name() -> None:
    from daytona_kernel import kernelspec
    from daytona_kernel.agent import AsyncAgentKernel

    kernelspec.install("laptop-python", env={"DAYTONA_KERNEL_BACKEND": "local"}, user=True)
    kernelspec.install("gpu-local", env={"DAYTONA_KERNEL_BACKEND": "daytona"}, user=True)
    assert AsyncAgentKernel("laptop-python").is_local and AsyncAgentKernel("daytona-local").is_local
    assert not AsyncAgentKernel("gpu-local").is_local and not AsyncAgentKernel("daytona").is_local
