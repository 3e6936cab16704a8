"""What ``%daytona status`` says about a Daytona sandbox: pure functions of the SDK's sandbox record."""

from __future__ import annotations

import time
from typing import Any

from ...config import DaytonaSettings
from ..base import IdleMode, SandboxPolicy, Toolbox
from .api import API_REQUEST_TIMEOUT_S, PAUSED_STATES, parse_time

# What the sandbox holds and is billed for in each state (usage.service.ts: a paused sandbox's usage periods record
# its disk only; its memory and processes are kept but not billed).
HELD = {
    "started": "all of it",
    "paused": "disk only; its memory and processes are kept, not billed",
    "stopped": "disk only",
    "archived": "none (in object storage)",
}


def duration(seconds: float) -> str:
    minutes, sec = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes}m" if hours else f"{minutes}m {sec}s"


def status_lines(
    sb: Any, state: str, cfg: DaytonaSettings, policy: SandboxPolicy, idle_mode: IdleMode, why_stops: str
) -> dict[str, str]:
    """The sandbox, its state, resources, uptime, idle mode and last activity. ``why_stops``: why it
    stops rather than pauses, when this kernel knows ("" otherwise)."""
    info = {
        "sandbox": f"{sb.id} ({cfg.image or sb.snapshot or 'default snapshot'}, target {sb.target})",
        "state": state,
        "policy": policy.value,
        "resources": f"{sb.cpu} CPU, {sb.memory} GiB RAM, {sb.disk} GiB disk"
        + (f", {sb.gpu} GPU" if sb.gpu else "")
        + f" (held now: {HELD.get(state, 'see the Daytona dashboard')})",
    }
    created = parse_time(sb.created_at)
    if created is not None:
        info["uptime"] = duration(time.time() - created)
    info["idle mode"] = idle_text(sb, cfg, idle_mode, why_stops)
    info["last activity"] = activity_text(sb, state, idle_mode)
    return info


def idle_text(sb: Any, cfg: DaytonaSettings, idle_mode: IdleMode, why_stops: str) -> str:
    """The idle mode in effect and why."""
    if idle_mode is IdleMode.PAUSE:
        text = (
            f"pause after {sb.auto_pause_interval} min idle and at shutdown: variables survive; only the disk is billed "
            "while paused, and Daytona never archives a paused sandbox (`daytona-kernel gc` stops old ones)"
        )
        if cfg.idle_action != IdleMode.PAUSE.value:
            text += " (configured: idle_action 'stop'; `%daytona recreate` applies it)"
        return text
    minutes = sb.auto_stop_interval or 0
    text = (
        f"stop after {minutes} min idle" if minutes else "never stops by itself"
    ) + ": only the disk is kept, variables are lost"
    text += " (checkpoint_on_idle saves them first)" if cfg.checkpoint_on_idle else " (checkpoint_on_idle is off)"
    why = why_stops
    if not why:  # this kernel would pause, but found a sandbox made to stop
        why = "the sandbox was created to stop (by an earlier kernel, or where it cannot pause); `%daytona recreate` asks for pausing again"
    return f"{text}; not paused because {why}"


def activity_text(sb: Any, state: str, idle_mode: IdleMode) -> str:
    """Time since the last activity, and when auto-pause or auto-stop will act."""
    last = parse_time(sb.last_activity_at) or parse_time(sb.updated_at)
    idle_s = max(time.time() - last, 0.0) if last is not None else None
    text = f"{duration(idle_s)} ago" if idle_s is not None else "unknown"
    if state != "started":
        return f"{text}; {state} now" + ("; the next cell resumes it" if state in PAUSED_STATES else "")
    action, minutes = (
        ("auto-pause", sb.auto_pause_interval) if idle_mode is IdleMode.PAUSE else ("auto-stop", sb.auto_stop_interval)
    )
    if not minutes or idle_s is None:
        return f"{text}; {action} off"
    return f"{text}; {action} in about {duration(max(minutes * 60 - idle_s, 0))} if idle from now"


async def disk_use(toolbox: Toolbox) -> str:
    """Use of the sandbox's own disk; stopped sandboxes keep counting against the organisation's quota."""
    result = await toolbox.exec("df -Pk /", timeout=API_REQUEST_TIMEOUT_S)
    fields = result.output.strip().splitlines()[-1].split() if result.exit_code == 0 else []
    if len(fields) < 4 or not (fields[1].isdigit() and fields[2].isdigit()):
        return f"unknown ({result.output.strip()[:80]})"
    used_gib, size_gib = int(fields[2]) / 2**20, int(fields[1]) / 2**20
    return (
        f"{used_gib:.1f} of {size_gib:.1f} GiB used; stopped sandboxes count against your quota too "
        "(`daytona-kernel gc` lists them)"
    )
