"""The emulator's organisation limits, driven through the unmodified SDK: creates run concurrently,
the ``sandbox-create`` throttler answers 429 with the seconds to wait in ``Retry-After-sandbox-create``
(``apps/api/src/sandbox/controllers/sandbox.controller.ts`` about line 233, @nestjs/throttler), and the
quota refuses with 400 "Total CPU limit exceeded" (``sandbox.service.ts`` about lines 250-305)."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Iterator

import pytest
from daytona import AsyncDaytona, CreateSandboxFromImageParams, CreateSandboxFromSnapshotParams, DaytonaConfig, Resources
from daytona.common.errors import DaytonaError, DaytonaRateLimitError
from daytona_emulator import DaytonaEmulator

pytestmark = pytest.mark.slow  # the emulator serves from a thread and runs worker processes


@pytest.fixture
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaytonaEmulator]:
    emulator = DaytonaEmulator(tmp_path_factory.mktemp("limits")).start()
    emulator.transition_s = dict.fromkeys(emulator.transition_s, 0.0)
    yield emulator
    emulator.close()


def run(emu: DaytonaEmulator, body: Callable[[AsyncDaytona], Awaitable[Any]]) -> Any:
    async def go() -> Any:
        client = AsyncDaytona(DaytonaConfig(api_key=emu.api_key, api_url=emu.api_url, target="us"))
        try:
            return await body(client)
        finally:
            await client.close()

    return asyncio.run(go())


def params() -> CreateSandboxFromSnapshotParams:
    return CreateSandboxFromSnapshotParams(labels={"test": "limits"}, ephemeral=True)


def test_creates_over_the_rate_get_a_429_that_says_when_to_come_back(emu: DaytonaEmulator) -> None:
    emu.create_rate = (2, 30.0)

    async def body(client: AsyncDaytona) -> DaytonaRateLimitError:
        await asyncio.gather(client.create(params()), client.create(params()))
        with pytest.raises(DaytonaRateLimitError) as refused:
            await client.create(params())
        return refused.value

    refused = run(emu, body)
    assert refused.status_code == 429 and "Too Many Requests" in refused.message
    wait = {k.lower(): v for k, v in refused.headers.items()}["retry-after-sandbox-create"]
    assert 1 <= int(wait) <= 30
    assert emu.throttled == 1 and len(emu.live_sandboxes()) == 2  # the refused create made nothing


def test_creates_past_the_quota_are_refused_and_counted_as_daytona_counts_them(emu: DaytonaEmulator) -> None:
    emu.quota = {"cpu": 3, "disk": 9}

    async def body(client: AsyncDaytona) -> list[Any]:
        made = await asyncio.gather(*(client.create(params()) for _ in range(4)), return_exceptions=True)
        refused = [r for r in made if isinstance(r, BaseException)]
        assert len(refused) == 1 and isinstance(refused[0], DaytonaError) and refused[0].status_code == 400
        assert "Total CPU limit exceeded. Maximum allowed: 3." in str(refused[0])
        started = [r for r in made if not isinstance(r, BaseException)]
        with pytest.raises(DaytonaError, match="Total CPU limit exceeded"):
            await client.create(CreateSandboxFromImageParams(image="python:3.12", resources=Resources(cpu=1)))
        return started

    started = run(emu, body)
    emu.stop_sandbox(started[0].id)  # ephemeral: stopped is deleted, so its CPU and disk are free again
    emu.wait_for_state(started[0].id, "destroyed")
    again = run(emu, lambda client: client.create(params()))
    assert again.id in {s.id for s in emu.live_sandboxes()}


def test_a_stopped_sandbox_keeps_counting_against_the_disk_quota(emu: DaytonaEmulator) -> None:
    emu.quota = {"disk": 6}

    async def body(client: AsyncDaytona) -> None:
        kept = CreateSandboxFromSnapshotParams(labels={"test": "limits"})
        first = await client.create(kept)
        await client.create(kept)
        await first.stop()
        with pytest.raises(DaytonaError, match="Total disk limit exceeded. Maximum allowed: 6GiB"):
            await client.create(kept)

    run(emu, body)
