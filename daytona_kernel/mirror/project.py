"""The project root: the folder a notebook's kernel mirrors, as a user means "my project".

Cells start in the notebook's folder, and ``../data/x.csv`` must work as it does under
ipykernel, so the mirror takes the folder that holds the whole project:

1. ``sync_root``, when set (absolute, ``~``, or relative to the notebook's folder);
2. else the enclosing git repository's root;
3. else the nearest folder, from the notebook's up, that holds a project marker
   (``PROJECT_MARKERS``: what Python packaging, pip, conda, pipenv, pyrootutils and R's
   ``here`` leave at a project's top);
4. else the notebook's folder.

The automatic choices never reach the home folder or a folder that contains it (a
repository or a ``requirements.txt`` in ``~`` would mirror everything the user has).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..errors import ConfigError

PROJECT_MARKERS = (
    "pyproject.toml",
    "setup.py",
    "setup.cfg",
    "requirements.txt",
    "environment.yml",
    "environment.yaml",
    "Pipfile",
    ".project-root",
    ".here",
)
"""Files that mark a project's top folder (git's ``.git`` comes first)."""


def _automatic(start: Path) -> Path:
    home = Path(os.path.abspath(Path.home()))
    climb = []
    for candidate in (start, *start.parents):
        if candidate == home or candidate in home.parents:
            break  # the home folder, or a folder that holds it: never a project
        climb.append(candidate)
    for candidate in climb:
        if (candidate / ".git").exists():
            return candidate
    for candidate in climb:
        if any((candidate / marker).is_file() for marker in PROJECT_MARKERS):
            return candidate
    return start


def project_root(folder: str, sync_root: str = "") -> tuple[str, str]:
    """(the folder to mirror, the notebook's sub-folder of it, "" for the root itself). See the module docstring.

    Examples:
        >>> project_root("/work/proj/notebooks")  # doctest: +SKIP  (/work/proj has a requirements.txt)
        ('/work/proj', 'notebooks')
    """
    start = Path(os.path.abspath(folder))
    if sync_root:
        root = Path(os.path.normpath(start / os.path.expanduser(sync_root)))
        if not root.is_dir():
            raise ConfigError(f"sync_root {sync_root!r} is not a folder. Set DaytonaKernel.sync_root to the project's folder.")
        if root != start and root not in start.parents:
            raise ConfigError(
                f"sync_root {str(root)!r} does not contain the notebook's folder {str(start)!r}; "
                "set DaytonaKernel.sync_root to a folder that contains it (or leave it empty)."
            )
    else:
        root = _automatic(start)
    sub = start.relative_to(root).as_posix()
    return str(root), "" if sub == "." else sub


HOME_FILES_MAX = 100  # a notebook in the home folder mirrors the files directly in it when there are at most this many
HOME_BYTES_MAX = 100 * 1024 * 1024  # ... and they hold at most this much
HOME_TOP_ONLY = ["*/", ".*"]  # the mirror's excludes then: no folder, no hidden file


def home_mirror(root: Path) -> tuple[list[str] | None, str]:
    """A notebook folder that is the home folder or holds it: (the excludes that keep the mirror to the visible
    files directly in the home folder, or None when the mirror is off; the one notice that says which).

    The home folder itself, holding at most HOME_FILES_MAX such files (HOME_BYTES_MAX in all), mirrors just them,
    so a beginner's first notebook beside a data file works; anything broader is not mirrored at all."""
    home = Path.home().resolve()
    files = _top_files(home) if root == home else None
    if files is not None and len(files) <= HOME_FILES_MAX and sum(files) <= HOME_BYTES_MAX:
        return HOME_TOP_ONLY, (
            f"Your notebook is in your home folder ({home}): only the {len(files)} file(s) directly in it are mirrored into "
            "the sandbox, not its folders or hidden files, and what a cell writes into a sub-folder stays there (fetch it "
            "with %download). For a whole project, open notebooks from a project folder below your home. "
            "DaytonaKernel.sync = 'off' turns the mirror off.\n"
        )
    many = f", with more than {HOME_FILES_MAX} files or {HOME_BYTES_MAX // 2**20} MB directly in it" if files is not None else ""
    return None, (
        f"The automatic mirror is off because the notebook folder {root} holds your home folder{many}, which is too broad "
        "to copy into a sandbox: cells start in an empty folder. Open the notebook from a project folder below your home "
        "(its files are mirrored then), or move files by hand with %upload / %download.\n"
    )


def _top_files(folder: Path) -> list[int] | None:
    """The sizes of the visible regular files directly in ``folder`` (None if it cannot be listed)."""
    sizes = []
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.name.startswith("."):
                    continue
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISREG(st.st_mode):
                    sizes.append(st.st_size)
                if len(sizes) > HOME_FILES_MAX:
                    break
    except OSError:
        return None
    return sizes
