"""The boundary with the Daytona SDK: every SDK call goes through ``call_api``, every SDK error becomes
one of the project's own exceptions in ``translate_error``, and the names Daytona uses (sandbox
states, the labels this kernel puts on its sandboxes, timeouts) are declared here once.

Transient failures (429, 5xx, connection errors) are retried with jittered backoff for a bounded
time, with the status line showing progress; 401/403, a refused connection and an unknown host fail
at once. ``call_api`` is the one retry loop: creating a sandbox uses it too, with a hook that looks
the sandbox up before trying again (a create that failed may have created it all the same).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import re
import socket
import sys
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any, Awaitable, Callable, TypeVar
from urllib.parse import urlparse

from daytona.common.errors import (
    DaytonaAuthenticationError,
    DaytonaConnectionError,
    DaytonaError,
    DaytonaForbiddenError,
    DaytonaNotFoundError,
    DaytonaRateLimitError,
    DaytonaTimeoutError,
)

from ...config import DaytonaSettings
from ...errors import AuthError, BackendError, QuotaExceeded
from ..base import ProgressCallback

if TYPE_CHECKING:
    from daytona import DaytonaConfig

log = logging.getLogger("daytona_kernel.daytona")
T = TypeVar("T")

RETRY_BUDGET_S = 30.0
RETRY_FIRST_DELAY_S = 0.5
RETRY_MAX_DELAY_S = 8.0
RATE_LIMIT_BUDGET_S = 300.0  # how long a call keeps coming back while Daytona's 429s say when
SANDBOX_START_TIMEOUT_S = 300
API_REQUEST_TIMEOUT_S = 60
STATE_POLL_S = 0.25  # how often a transition (stopping, starting ...) is checked
DEFAULT_API_URL = "https://app.daytona.io/api"

LABEL_APP = "daytona-kernel"
LABEL_WORKSPACE = "daytona-kernel-workspace"
LABEL_OWNER = "daytona-kernel-owner"
LABEL_KERNEL = "daytona-kernel-kernel-id"
LABEL_POLICY = "daytona-kernel-policy"
LABEL_NEXT = "daytona-kernel-next-context"  # "<kernel id>.<context id>": left by a restarting kernel process
LABEL_WORKER = "daytona-kernel-worker"  # a %%daytona map engine: its number in this kernel's pool (the label keeps its old name)
FAILED_AUTH_REMAINING = "x-ratelimit-remaining-failed-auth"  # common/utils/rate-limit-headers.util.ts, lowercased
# sandbox.service.ts (about lines 250-305): a create past the organisation's totals is a 400 with this message
QUOTA_REFUSAL = re.compile(r"Total (CPU|memory|disk|GPU) limit exceeded")

STARTABLE_STATES = ("stopped", "archived", "archiving", "paused")  # start() accepts these (and resumes a paused one)
PAUSED_STATES = ("pausing", "paused", "resuming")  # the processes are frozen, not gone
GONE_STATES = ("destroying", "destroyed")
FAILED_STATES = ("error", "build_failed")


def parse_time(value: Any) -> float | None:
    """An API timestamp (ISO 8601) as epoch seconds, or None."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def status_of(exc: BaseException | None) -> int | None:
    """The HTTP status of an SDK error (None for a connection problem)."""
    return getattr(exc, "status_code", None)


def is_refused(exc: BackendError) -> bool:
    """Daytona refused the request itself (400/422: this sandbox cannot do that), as opposed to failing."""
    return status_of(exc.__cause__) in (400, 422)


def _is_retryable(exc: DaytonaError) -> bool:
    """Worth another try: a connection problem (checked first: the SDK's connection timeout is also a
    DaytonaTimeoutError), a 429 or a 5xx. Any other timeout means we already waited long enough."""
    if isinstance(exc, (DaytonaRateLimitError, DaytonaConnectionError)):
        return True
    if isinstance(exc, DaytonaTimeoutError):
        return False
    status = status_of(exc)
    if status is None:  # no answer, or an answer the SDK could not read: only the first is worth another try
        return _from_the_network(exc)
    return status >= 500


def _from_the_network(exc: BaseException) -> bool:
    """Did the connection fail (an OSError, a timeout or aiohttp's error anywhere in the causes)? A reply the SDK
    could not parse (a multipart it cannot read, a file name it cannot match) fails the same way every time."""
    client_error = getattr(sys.modules.get("aiohttp"), "ClientError", None)  # None while another thread imports it
    network: tuple[type[BaseException], ...] = (OSError, asyncio.TimeoutError) + (
        (client_error,) if client_error is not None else ()
    )
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, network):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def is_failed_auth(exc: BaseException) -> bool:
    """A 429 from Daytona's failed-auth throttler (auth/failed-auth-tracker.service.ts): after repeated 401s from
    this address every request is refused for the throttler's whole ttl. It means "the key is wrong", not "slow down",
    and its ``X-RateLimit-*-failed-auth`` headers say which throttler it is."""
    if not isinstance(exc, DaytonaRateLimitError):
        return False
    return any(key.lower() == FAILED_AUTH_REMAINING for key in (exc.headers or {}))


def retry_after_s(exc: DaytonaError) -> float | None:
    """The seconds a 429 asks to wait: ``Retry-After``, or ``Retry-After-<throttler>`` as @nestjs/throttler
    names it for Daytona's named throttlers (``Retry-After-sandbox-create`` on ``POST /sandbox``)."""
    if not isinstance(exc, DaytonaRateLimitError):
        return None
    for key, value in exc.headers.items():
        if key.lower() == "retry-after" or key.lower().startswith("retry-after-"):
            try:
                return max(float(value), 0.0)
            except (TypeError, ValueError):
                continue
    return None


def _unreachable_cause(exc: BaseException) -> str | None:
    """ "connection refused" or "unknown host" when that is why the request failed: retrying will not help."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, ConnectionRefusedError):
            return "connection refused"
        dns = getattr(sys.modules.get("aiohttp"), "ClientConnectorDNSError", None)  # once loaded (with the SDK), and whole
        if isinstance(current, socket.gaierror) or (isinstance(dns, type) and isinstance(current, dns)):
            return "unknown host"
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def is_daytona_cloud(api_url: str) -> bool:
    host = urlparse(api_url).hostname or ""
    return host == "daytona.io" or host.endswith(".daytona.io")


def _where_to_look(api_url: str) -> str:
    if is_daytona_cloud(api_url):
        return "Check your network and https://status.daytona.io"
    return f"Check that the Daytona server at {api_url} is running and reachable (DaytonaKernel.api_url or DAYTONA_API_URL)"


class RetriesExhausted(BackendError):
    """Daytona kept failing for the whole retry budget (or is still failing after that)."""


def _unreachable(api_url: str, cause: str) -> BackendError:
    fix = _where_to_look(api_url)
    if cause == "unknown host" and not is_daytona_cloud(api_url):
        fix = f"Check the host name in DaytonaKernel.api_url or DAYTONA_API_URL ({api_url})"
    return BackendError(f"Cannot reach the Daytona API at {api_url} ({cause}). {fix}, then run the cell again.")


def state_name(resource: Any) -> str:
    """The state of an SDK sandbox or volume as plain text (the SDK gives an enum, or a str for unknown states)."""
    state = resource.state
    return str(getattr(state, "value", state))


def client_config(config: DaytonaSettings) -> DaytonaConfig:
    """The SDK's config: the kernel's api_url/target, else DAYTONA_API_URL/DAYTONA_TARGET. (The SDK's models
    are imported with its client, in a thread: not while the kernel starts.)"""
    from daytona import DaytonaConfig

    return DaytonaConfig(
        api_key=os.environ.get("DAYTONA_API_KEY") or None,
        api_url=(config.api_url or os.environ.get("DAYTONA_API_URL") or "").rstrip("/") or None,
        target=config.target or os.environ.get("DAYTONA_TARGET") or None,
    )


def api_url_of(config: DaytonaSettings) -> str:
    """The API URL the SDK talks to, for messages: the configured one, else DAYTONA_API_URL, else Daytona's cloud."""
    return (config.api_url or os.environ.get("DAYTONA_API_URL") or DEFAULT_API_URL).rstrip("/")


def translate_error(exc: DaytonaError, what: str, then: str = "then restart the kernel") -> BackendError:
    """The one place where SDK errors become ours. ``then`` is the last step of the fix."""
    if is_failed_auth(exc):
        wait = retry_after_s(exc)
        return AuthError(
            f"Daytona refused to {what}: too many failed authentications from this address, so it refuses every "
            f"request for {f'{wait:.0f} s' if wait is not None else 'a while'} (429 from its failed-auth throttler). "
            "The API key is wrong or expired: check DAYTONA_API_KEY and DAYTONA_TARGET (and DAYTONA_API_URL for a "
            f"self-hosted Daytona), {then}."
        )
    if isinstance(exc, (DaytonaAuthenticationError, DaytonaForbiddenError)):
        return AuthError(
            f"Daytona refused to {what} ({status_of(exc) or 'auth'}): check DAYTONA_API_KEY and DAYTONA_TARGET "
            f"(and DAYTONA_API_URL for a self-hosted Daytona), {then}."
        )
    if isinstance(exc, DaytonaNotFoundError):
        return BackendError(f"Could not {what}: not found ({exc}).")
    if status_of(exc) == 400 and QUOTA_REFUSAL.search(str(exc)):
        return QuotaExceeded(f"Daytona refused to {what}: {exc}")
    return BackendError(f"Could not {what}: {exc}")


def quiet(text: str) -> None:
    """A progress callback for when nobody is waiting on a status line: the log has it."""
    log.info("%s", text)


async def call_api(
    what: str,
    fn: Callable[[], Awaitable[T]],
    *,
    retry: bool = True,
    api_url: str = DEFAULT_API_URL,
    progress: ProgressCallback = quiet,
    budget_s: float = RETRY_BUDGET_S,
    done_anyway: Callable[[], Awaitable[T | None]] | None = None,
) -> T:
    """Call the SDK; retry transient failures with jittered backoff within ``budget_s``; translate errors.

    A refused connection or an unknown host fails at once with the URL and the fix. A 429 that says
    how long to wait (``retry_after_s``) is waited out as told, for up to ``RATE_LIMIT_BUDGET_S``.
    ``done_anyway`` is for a call that is not idempotent: after a transient failure it is asked
    whether the call took effect all the same, and what it returns (if not None) is the result.
    """
    started = time.monotonic()
    delay = RETRY_FIRST_DELAY_S
    while True:
        try:
            return await fn()
        except DaytonaError as exc:
            cause = _unreachable_cause(exc)
            if cause is not None:
                raise _unreachable(api_url, cause) from exc
            if not (retry and _is_retryable(exc)) or is_failed_auth(exc):
                raise translate_error(exc, what) from exc
            failure = exc
        told = retry_after_s(failure)
        if done_anyway is not None and told is None:  # a 429 refused the call: it did not happen
            done = await done_anyway()
            if done is not None:
                log.warning("%s failed (%s) but took effect all the same", what, failure)
                return done
        wait = delay * random.uniform(0.5, 1.5)
        elapsed = time.monotonic() - started
        if told is not None:  # as told, spread a little so that calls told alike do not all come back at once
            wait = told + random.uniform(0.0, RETRY_FIRST_DELAY_S)
            if elapsed + wait < RATE_LIMIT_BUDGET_S:
                progress(f"Daytona asks to wait {told:.0f} s before it takes more requests (rate limit); waiting…")
                log.warning("%s: rate limited (%s); waiting %.1fs as told", what, failure, wait)
                await asyncio.sleep(wait)
                continue
        if elapsed + wait >= budget_s:
            kept = f"kept failing for {budget_s:g} s" if budget_s else "still fails"
            raise RetriesExhausted(
                f"Could not {what}: Daytona at {api_url} {kept} ({failure}). {_where_to_look(api_url)}, then run the cell again."
            ) from failure
        host = urlparse(api_url).netloc or api_url
        trouble = (
            f"can't reach {host}"
            if isinstance(failure, DaytonaConnectionError)
            else f"Daytona answered {status_of(failure) or failure}"
        )
        progress(f"{trouble}, retrying {elapsed + wait:.0f}/{budget_s:g} s…")
        log.warning("%s failed (%s); retrying in %.1fs", what, failure, wait)
        await asyncio.sleep(wait)
        delay = min(delay * 2, RETRY_MAX_DELAY_S)
