"""A restart's handoff: what the old kernel process tells the next one so that its first cell runs before the
daytona SDK has loaded (docs/reattach.md, "The first cell after a restart").

Jupyter replaces the kernel process at a restart, and the SDK's import and client take about 1 s of CPU in
the new one. The old process has just left the next context running in the sandbox
(``DaytonaSandbox.leave_next_context``); it writes here where that context's interpreter websocket is: the
sandbox id, the toolbox URL its SDK used for that sandbox, the context's id, where the volume is mounted in
it, when, and a keyed fingerprint of the settings that choose the sandbox. No credential: the new process builds the request's headers from its own
environment, as the SDK builds them (``interpreter_headers``).

The record is one file per Jupyter kernel id in this user's private folder (0700, the file 0600), written
atomically, deleted by whoever reads it, and ignored when older than ``HANDOFF_MAX_AGE_S``, when the settings
changed, or when its URL is not one the configured API would send the key to (``acceptable_url``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import re
import secrets
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from jupyter_core.paths import jupyter_data_dir

from ...config import DaytonaSettings
from ...errors import ConfigError
from ...identity import journal_key

log = logging.getLogger("daytona_kernel.daytona")

HANDOFF_MAX_AGE_S = 60.0  # Jupyter starts the next process within seconds of the old one's exit
HANDOFF_MAX_BYTES = 4096
CLOCK_SKEW_S = 5.0  # a record "from the future" by more than this is not this restart's
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")  # kernel, sandbox and context ids: no path separators
SDK_SOURCE = "sdk-python-async"  # AsyncDaytona.__init__: X-Daytona-Source, and the User-Agent's prefix


@dataclass(frozen=True)
class Handoff:
    """Where the next context's interpreter is. ``toolbox_url`` is the sandbox's toolbox proxy URL as the old
    process's SDK had it (``AsyncSandbox.toolbox_proxy_url``)."""

    kernel_id: str
    sandbox_id: str
    toolbox_url: str
    context_id: str
    fingerprint: str
    written_at: float
    volume_dir: str = ""  # where the volume is mounted in that sandbox ("" when it is not where the runtime can use it)

    @property
    def sandbox_url(self) -> str:
        """The sandbox's toolbox through the proxy, as the SDK addresses it: the toolbox proxy URL, then the
        sandbox id (``ToolboxApiClientProxy.param_serialize`` in the SDK)."""
        return f"{self.toolbox_url.rstrip('/')}/{self.sandbox_id}"

    @property
    def interpreter_url(self) -> str:
        """The interpreter websocket's URL, made as the SDK makes it: the toolbox proxy URL, the sandbox id, then
        the daemon's route (``ToolboxApiClientProxy.param_serialize`` in the SDK; ``/process/interpreter/execute``
        in apps/daemon/pkg/toolbox/server.go, line 239), with ``ws`` for ``http``."""
        return re.sub(r"^http", "ws", f"{self.sandbox_url}/process/interpreter/execute")


def handoff_path(kernel_id: str) -> Path | None:
    """The kernel's handoff file (None for an id that cannot name a file)."""
    if not _ID.match(kernel_id):
        return None
    return Path(jupyter_data_dir()) / "daytona-kernel" / "restarts" / f"{kernel_id}.json"


def settings_fingerprint(config: DaytonaSettings, workspace_key: str, api_url: str, target: str) -> str:
    """A keyed hash of everything that chooses the sandbox: a restart with other settings (another image,
    snapshot, API, target, policy, env ...) does not use the old sandbox's context. Keyed (HMAC-SHA256) with
    this machine's private random key (``identity.journal_key``, 0600, never sent anywhere), because the
    settings include the env passed into the sandbox: a guessed value cannot be confirmed from the file.
    "" (no handoff, the normal start) when the key cannot be read or made."""
    try:
        key = journal_key()
    except ConfigError as exc:
        log.info("no restart handoff: %s", exc)
        return ""
    chosen = {"settings": dataclasses.asdict(config), "workspace": workspace_key, "api_url": api_url, "target": target}
    message = b"daytona-kernel restart handoff\0" + json.dumps(chosen, sort_keys=True, default=str).encode()
    return hmac.new(key.encode(), message, hashlib.sha256).hexdigest()


def write_handoff(handoff: Handoff) -> None:
    """Write the record where only this user can read it; a failure only costs the next process its head start."""
    path = handoff_path(handoff.kernel_id)
    if path is None:
        return
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(dataclasses.asdict(handoff)))
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        log.info("could not write the restart's handoff %s: %s", path, exc)


def take_handoff(
    kernel_id: str, fingerprint: str, api_url: str, now: float | None = None, refused: list[Handoff] | None = None
) -> Handoff | None:
    """The handoff the previous process of this kernel left, deleted as it is read; None (with a debug line
    saying why) when there is none or it does not fit: another kernel's, too old, other settings, a file
    others could write, or a URL that ``acceptable_url`` refuses. A private record of this kernel refused only
    for its age, settings or toolbox URL goes to ``refused``: its context is one this kernel left and no process took
    (deleted through the SDK, at the toolbox URL the API gives)."""
    path = handoff_path(kernel_id)
    if path is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None  # none (the usual case), or a link: ignored
    try:
        os.unlink(path)  # one use, whatever it holds
        st = os.fstat(fd)
        if st.st_uid != os.getuid() or st.st_mode & 0o077:
            log.debug("restart handoff ignored: %s is not private to this user", path)
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(HANDOFF_MAX_BYTES + 1)
    except OSError as exc:
        log.debug("restart handoff ignored: %s", exc)
        return None
    finally:
        os.close(fd)
    handoff = parse_handoff(raw)
    why = why_not(handoff, kernel_id, fingerprint, api_url, time.time() if now is None else now)
    if why:
        log.debug("restart handoff ignored: %s", why)
        # its context is deleted through the SDK, at the toolbox URL the API gives (never at the record's): a record
        # refused for its URL counts too (a first process restarts before its SDK has loaded: no label names it)
        if (
            refused is not None
            and handoff is not None
            and not why_not(handoff, kernel_id, handoff.fingerprint, api_url, handoff.written_at, url=False)
        ):
            refused.append(handoff)
        return None
    return handoff


def parse_handoff(raw: bytes) -> Handoff | None:
    """The record in ``raw``, or None when it is not one."""
    if len(raw) > HANDOFF_MAX_BYTES:
        return None
    try:
        data = json.loads(raw)
        fields = {f.name: data[f.name] for f in dataclasses.fields(Handoff)}
    except (ValueError, TypeError, KeyError):
        return None
    if not all(isinstance(v, str) for k, v in fields.items() if k != "written_at") or not isinstance(
        fields["written_at"], (int, float)
    ):
        return None
    return Handoff(**fields)


def why_not(handoff: Handoff | None, kernel_id: str, fingerprint: str, api_url: str, now: float, url: bool = True) -> str:
    """Why ``handoff`` must not be used ("" when it may); ``url=False`` leaves its toolbox URL unjudged."""
    if handoff is None:
        return "not a handoff record"
    if handoff.kernel_id != kernel_id:
        return "another kernel's"
    age = now - handoff.written_at
    if not -CLOCK_SKEW_S <= age <= HANDOFF_MAX_AGE_S:
        return f"written {age:.0f} s ago"
    if not secrets.compare_digest(handoff.fingerprint, fingerprint):
        return "the settings that choose the sandbox changed"
    if not (_ID.match(handoff.sandbox_id) and _ID.match(handoff.context_id)):
        return "not a sandbox or context id"
    if handoff.volume_dir and not (handoff.volume_dir.startswith("/") and handoff.volume_dir.isprintable()):
        return "not a volume folder"
    return acceptable_url(handoff.toolbox_url, api_url) if url else ""


def acceptable_url(url: str, api_url: str) -> str:
    """Why the new process must not send its credentials to ``url`` ("" when it may): it must be http(s) with a
    host and no user info; https unless both it and the API are on this machine (loopback, as a local Daytona);
    and on the API's host or under the same parent domain (Daytona's toolbox proxy URL is per region,
    ``resolveToolboxProxyUrl`` in apps/api/src/sandbox/services/sandbox.service.ts, line 2726)."""
    try:
        parts, api = urlsplit(url), urlsplit(api_url)
        host, api_host = (parts.hostname or "").lower(), (api.hostname or "").lower()
        _ = parts.port  # a malformed port raises
    except ValueError:
        return "not a URL"
    if parts.scheme not in ("http", "https") or not host or parts.username is not None or parts.password is not None:
        return "not an http(s) URL with a host"
    local = _loopback(host)
    if local != _loopback(api_host):
        return "the toolbox and the API are not both on this machine"
    if parts.scheme == "http" and not local:
        return "plain http to another machine"
    if local or host == api_host or _parent(host) == _parent(api_host):
        return ""
    return f"{host} is not under the API's domain {_parent(api_host)}"


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _parent(host: str) -> str:
    """The last two labels of a host name (``daytona.io`` of ``proxy.app.daytona.io``); an IP address is itself."""
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        return ".".join(host.rstrip(".").split(".")[-2:])


def interpreter_headers(environ: Any = None) -> dict[str, str] | None:
    """The interpreter websocket's request headers, as the SDK's toolbox client sends them (``AsyncDaytona.__init__``
    sets Authorization, X-Daytona-Source, X-Daytona-SDK-Version, X-Daytona-Organization-ID for a JWT and the
    User-Agent; the generated ``_execute_interpreter_code_serialize`` adds Accept). The daytona proxy checks the
    bearer token against the sandbox (apps/proxy/pkg/proxy/auth.go, lines 20-28). None when the credentials are
    not in the process's environment (the SDK may find them in a .env file: the normal path then)."""
    env = os.environ if environ is None else environ
    from importlib.metadata import PackageNotFoundError, version

    try:
        sdk_version = version("daytona")
    except PackageNotFoundError:
        return None
    headers = {"Accept": "application/json", "User-Agent": f"{SDK_SOURCE}/{sdk_version}"}
    if env.get("DAYTONA_API_KEY"):
        headers["Authorization"] = f"Bearer {env['DAYTONA_API_KEY']}"
    elif env.get("DAYTONA_JWT_TOKEN") and env.get("DAYTONA_ORGANIZATION_ID"):
        headers["Authorization"] = f"Bearer {env['DAYTONA_JWT_TOKEN']}"
        headers["X-Daytona-Organization-ID"] = env["DAYTONA_ORGANIZATION_ID"]
    else:
        return None
    headers.update({"X-Daytona-Source": SDK_SOURCE, "X-Daytona-SDK-Version": sdk_version})
    return headers


def proxied(url: str) -> str:
    """Why a request to ``url`` would go through a proxy ("" when it would not): the SDK's sessions take the proxy
    from the environment (aiohttp with ``trust_env``: ``http``, ``https``, ``ws`` and ``wss`` proxies, minus
    ``NO_PROXY``, as ``urllib.request`` reads them; a scheme other than the request's counts too, to be safe), and tornado's client, which the quick start uses, cannot
    go through one; then the restart has the normal start, through the SDK."""
    if sys.platform not in ("darwin", "win32") and not any(name.lower().endswith("_proxy") for name in os.environ):
        return ""  # the usual case: no need to load urllib.request (on macOS and Windows it also reads the system's settings)
    from urllib.request import getproxies, proxy_bypass  # what aiohttp's trust_env reads (helpers.get_env_proxy_for_url)

    schemes = sorted(k for k in getproxies() if k in ("http", "https", "ws", "wss"))
    if not schemes or proxy_bypass(urlsplit(url).hostname or ""):
        return ""
    return f"the environment names a proxy ({', '.join(s.upper() + '_PROXY' for s in schemes)}), which only the SDK honours"
