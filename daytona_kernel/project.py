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
from pathlib import Path

from .errors import ConfigError

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
