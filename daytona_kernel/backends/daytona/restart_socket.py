"""The sandbox's toolbox after a restart, while the daytona SDK loads (docs/reattach.md, "The first cell after a
restart"): the interpreter websocket, and creating and deleting a context, through tornado's client.

Tornado, not aiohttp (the SDK's): ipykernel has already imported tornado, and its websocket and HTTP clients
load in a few milliseconds, where aiohttp took 0.15 s of the new process's start before it could answer Jupyter
(0.08 s of it the TLS contexts it makes at import). aiohttp now loads with the SDK, in its thread.

What the SDK's own sessions would do, this does too, or the restart has the normal start instead: TLS verified
against the system's certificates (the SDK's ``ssl.create_default_context()``; tornado's client default), no
redirect followed (the key stays with the toolbox's host), no ``~/.netrc`` (tornado never reads it; the SDK's
requests carry their own Authorization, which aiohttp does not mix with one). A proxy in the environment, which
the SDK's sessions honour and tornado's client cannot, means no quick start (``restart_handoff.proxied``).
"""

from __future__ import annotations

import asyncio
import json
import shlex
from dataclasses import dataclass
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.simple_httpclient import HTTPTimeoutError
from tornado.websocket import WebSocketClientConnection, WebSocketClosedError, websocket_connect

from ...errors import BackendError
from .api import API_REQUEST_TIMEOUT_S
from .toolbox import WS_BINARY, WS_CLOSE, WS_TEXT, HandshakeRefused

WS_ABNORMAL = 1006  # RFC 6455: the connection ended without a close frame
NO_RESPONSE = 599  # tornado's code for a request that got no answer (a timeout, the connection closed)


@dataclass(frozen=True)
class Message:
    """One message of the socket, numbered as aiohttp's ``WSMessage`` (``toolbox.WS_TEXT`` ...)."""

    type: int
    data: Any
    extra: Any = None


class HandedOverSocket:
    """Tornado's websocket client with the calls of aiohttp's that ``DaytonaContext`` uses: ``send_str``,
    ``receive``, ``close``, ``closed`` and ``close_code``. Its failures are OSErrors (a lost connection is
    ``ConnectionResetError``); a connection that ends without a close frame closes with ``WS_ABNORMAL``."""

    def __init__(self, connection: WebSocketClientConnection) -> None:
        self._connection = connection
        # as aiohttp's connector (tcp_nodelay): else a frame sent right after another (a close after the request)
        # waits for the daemon's delayed acknowledgement, 40 ms on Linux
        assert connection.protocol is not None  # set once the handshake is done
        connection.protocol.set_nodelay(True)
        self.closed = False
        self.close_code: int | None = None

    async def send_str(self, data: str) -> None:
        try:
            await self._connection.write_message(data)
        except WebSocketClosedError as exc:
            raise ConnectionResetError(f"the interpreter's websocket closed: {exc}") from exc

    async def receive(self) -> Message:
        if self.closed:
            return Message(WS_CLOSE, self.close_code)
        data = await self._connection.read_message()
        if data is None:
            self.closed = True
            self.close_code = self._connection.close_code or WS_ABNORMAL
            return Message(WS_CLOSE, self.close_code, self._connection.close_reason)
        return Message(WS_BINARY if isinstance(data, bytes) else WS_TEXT, data)

    async def close(self) -> None:
        """Close, and wait for the daemon's answer (the caller bounds the wait)."""
        self._connection.close()
        while not self.closed:
            await self.receive()


class HandedOverToolbox:
    """What the kernel process does in the sandbox before the SDK has loaded: the sandbox's toolbox URL from the
    old process's handoff (``restart_handoff``), the headers from this process's own credentials, as the SDK
    sends them. The interpreter websocket (the daemon takes the context's id in the request's first message:
    apps/daemon/pkg/toolbox/process/interpreter/controller.go, lines 104-150, as with the SDK's socket), and, for
    a restart that comes before the SDK has loaded, creating and deleting a context (the daemon's routes:
    apps/daemon/pkg/toolbox/server.go, lines 236-238)."""

    def __init__(self, sandbox_url: str, interpreter_url: str, headers: dict[str, str]) -> None:
        self._sandbox_url = sandbox_url
        self._interpreter_url = interpreter_url
        self._headers = headers
        self._client: AsyncHTTPClient | None = None

    def _request(self, url: str, **kwargs: Any) -> HTTPRequest:
        return HTTPRequest(
            url,
            headers=dict(self._headers, **kwargs.pop("headers", {})),
            connect_timeout=API_REQUEST_TIMEOUT_S,
            request_timeout=API_REQUEST_TIMEOUT_S,
            follow_redirects=False,
            **kwargs,
        )

    async def connect(self) -> HandedOverSocket:
        """The interpreter websocket. Raises OSError (``HandshakeRefused`` with the status when the toolbox
        answered otherwise; ``ConnectionResetError`` when the connection closed first) or asyncio.TimeoutError."""
        try:
            connection = await websocket_connect(self._request(self._interpreter_url))
        except HTTPTimeoutError as exc:
            raise asyncio.TimeoutError(f"opening the interpreter's websocket: {exc}") from exc
        except HTTPClientError as exc:
            if exc.code == NO_RESPONSE:
                raise ConnectionResetError(f"the toolbox closed the connection: {exc}") from exc
            raise HandshakeRefused(exc.code, str(exc.message)) from exc
        return HandedOverSocket(connection)

    async def _fetch(self, what: str, url: str, method: str, body: str | None = None) -> tuple[int, bytes]:
        if self._client is None:
            self._client = AsyncHTTPClient(force_instance=True)
        headers = {"Content-Type": "application/json"} if body is not None else {}
        try:
            response = await self._client.fetch(self._request(url, method=method, body=body, headers=headers), raise_error=False)
        except (HTTPClientError, OSError, asyncio.TimeoutError) as exc:
            raise BackendError(f"Could not {what}: {type(exc).__name__}: {exc}") from exc
        if response.code == NO_RESPONSE:
            raise BackendError(f"Could not {what}: {response.error}")
        return response.code, response.body or b""

    async def create_context(self, cwd: str) -> str:
        """A new interpreter context; its id. Raises BackendError."""
        url = f"{self._sandbox_url}/process/interpreter/context"
        status, raw = await self._fetch("create an interpreter context", url, "POST", json.dumps({"cwd": cwd}))
        try:
            body = json.loads(raw) if status == 200 else None
        except ValueError:
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("id"), str):
            raise BackendError(f"Could not create an interpreter context ({status}).")
        return str(body["id"])

    async def make_dir(self, path: str) -> None:
        """``mkdir -p path`` through the daemon's ``/process/execute`` (apps/daemon/pkg/toolbox/server.go; the SDK's
        ``process.exec``), for a new sandbox's working directory. Raises BackendError."""
        url = f"{self._sandbox_url}/process/execute"
        body = json.dumps({"command": f"mkdir -p {shlex.quote(path)}", "timeout": int(API_REQUEST_TIMEOUT_S)})
        status, raw = await self._fetch(f"make the working directory {path}", url, "POST", body)
        try:
            reply = json.loads(raw) if status == 200 else None
        except ValueError:
            reply = None
        if not isinstance(reply, dict) or reply.get("exitCode") != 0:
            raise BackendError(f"Could not make the working directory {path} ({status}).")

    async def delete_context(self, context_id: str) -> None:
        """Raises BackendError unless the daemon deleted it or no longer has it (404: apps/daemon/pkg/toolbox/
        process/interpreter/controller.go, lines 199-201)."""
        url = f"{self._sandbox_url}/process/interpreter/context/{context_id}"
        status, _ = await self._fetch(f"delete the interpreter context {context_id}", url, "DELETE")
        if status not in (200, 404):
            raise BackendError(f"Could not delete the interpreter context {context_id} ({status}).")

    async def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
