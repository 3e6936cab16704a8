"""Who owns a sandbox: a random id per installation, never ``user@host``.

Two people whose notebooks sit at the same path (``/home/jovyan/work``, ``/content``, a CI
checkout) would otherwise find each other's sandbox and overwrite each other's files. Every
Daytona sandbox carries this id as a label and keeps its files in a volume sub-folder named
after it; ``find`` and ``gc`` only ever look at sandboxes with this installation's id.

The id lives in the Jupyter data directory (``daytona-kernel/owner-id``, mode 0600), beside
the local backend's sandboxes. Copy that file to another machine to share sandboxes with it.
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

from jupyter_core.paths import jupyter_data_dir

from .errors import ConfigError

OWNER_ID_BYTES = 12
_VALID = re.compile(r"^[0-9a-f]{16,64}$")


def owner_id_path() -> Path:
    return Path(jupyter_data_dir()) / "daytona-kernel" / "owner-id"


def journal_key_path() -> Path:
    return Path(jupyter_data_dir()) / "daytona-kernel" / "journal-key"


def journal_key() -> str:
    """A private key (mode 0600, beside the owner id) for what the session journal keeps in the sandbox
    about this machine: keyed hashes of the host name and the notebook's path, and the kernel's pid sealed
    with it, so a cell can match them but not read them; and the keyed fingerprint of the settings in a
    restart's handoff (``backends/daytona/restart_handoff.py``). Unlike the owner id, it is never sent anywhere."""
    return _read_or_create(journal_key_path(), "the key", "")


def owner_id() -> str:
    """This installation's owner id, created on first use (safe when two kernels race)."""
    return _read_or_create(
        owner_id_path(),
        "the owner id",
        " (the sandboxes of the old id are then no longer found or cleaned up by this installation)",
    )


def _read_or_create(path: Path, what: str, after_delete: str) -> str:
    """The random hex id in ``path``, made on first use; a ConfigError that says what to do otherwise."""
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        text = _create(path)
    except OSError as exc:
        raise ConfigError(f"Could not read {what} {path}: {exc}. Check the file's permissions.") from exc
    if not _VALID.match(text):
        raise ConfigError(f"{what.capitalize()} in {path} is not valid. Delete the file to get a new one{after_delete}.")
    return text


def _create(path: Path) -> str:
    """Write a new id with a private mode; if another process won the race, use its id."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(OWNER_ID_BYTES) + "\n")
        try:
            os.link(tmp, path)  # atomic: fails if another process created it first
        except FileExistsError:
            pass  # that process's id is the one to use; ours is discarded below
        finally:
            tmp.unlink()
        return path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"Could not create {path}: {exc}. Set JUPYTER_DATA_DIR to a writable folder.") from exc
