"""Which files the workdir mirror moves, and a fast scan of a folder.

Pure and standard-library only: the kernel uses it on the user's folder, and
the same source runs in the sandbox to find what a cell changed.

Rules follow .gitignore's common subset: ``#`` comments, ``!`` negation (the
last matching rule wins), a trailing ``/`` for folders only, a ``/`` inside a
pattern anchors it to the root; other patterns match a file or folder name at
any depth. Folders holding a ``pyvenv.cfg`` (virtualenvs) are always skipped.

Examples:
    >>> rules = PathRules(["*.log", "build/", "!keep.log"])
    >>> rules.excluded("a/b.log", False), rules.excluded("keep.log", False), rules.excluded("build", True)
    (True, False, True)
"""

import fnmatch
import os

DEFAULT_EXCLUDES = (
    ".git/",
    ".daytona-kernel/",
    ".hg/",
    ".svn/",
    ".ipynb_checkpoints/",
    "__pycache__/",
    "node_modules/",
    ".venv/",
    "venv/",
    ".mypy_cache/",
    ".pytest_cache/",
    ".ruff_cache/",
    ".DS_Store",
    "*.pyc",
    "*.sandbox-conflict*",
    ".~*",
    # credentials and caches that live in home folders: never copied into a sandbox
    ".ssh/",
    ".aws/",
    ".gnupg/",
    ".kube/",
    ".docker/",
    ".netrc",
    ".pgpass",
    ".cache/",
    ".local/",
    ".config/",
    ".npm/",
    ".ipython/",
    ".jupyter/",
)


class PathRules(object):
    """Ordered include/exclude patterns; ``excluded(rel_path, is_dir)`` decides."""

    def __init__(self, patterns):
        self._rules = []
        for raw in patterns:
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            negate = line.startswith("!")
            if negate:
                line = line[1:]
            dir_only = line.endswith("/")
            line = line.rstrip("/")
            anchored = "/" in line
            self._rules.append((line.lstrip("/"), negate, dir_only, anchored))

    def excluded(self, rel, is_dir):
        rel = rel.replace(os.sep, "/")
        name = rel.rsplit("/", 1)[-1]
        result = False
        for pattern, negate, dir_only, anchored in self._rules:
            if dir_only and not is_dir:
                continue
            if fnmatch.fnmatchcase(rel if anchored else name, pattern):
                result = not negate
        return result


def load_rules(root, extra=()):
    """Default excludes, then the root's .gitignore, then ``extra`` (the sync_exclude list)."""
    patterns = list(DEFAULT_EXCLUDES)
    try:
        with open(os.path.join(root, ".gitignore"), encoding="utf-8") as f:
            patterns.extend(f.read().splitlines())
    except OSError:
        pass  # no .gitignore: nothing more to honour
    patterns.extend(extra)
    return PathRules(patterns)


def scan(root, rules, max_files=50000):
    """{relative path: (size, mtime_ns)} of the files under root that the rules keep.

    Returns (files, complete); complete is False when max_files was reached.
    """
    files = {}
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        try:
            entries = os.scandir(os.path.join(root, rel_dir) if rel_dir else root)
        except OSError:
            continue  # vanished or unreadable: nothing to mirror there
        with entries:
            for entry in entries:
                rel = rel_dir + "/" + entry.name if rel_dir else entry.name
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                    if is_dir:
                        if not rules.excluded(rel, True) and not os.path.exists(os.path.join(entry.path, "pyvenv.cfg")):
                            stack.append(rel)
                        continue
                    if not entry.is_file(follow_symlinks=False) or rules.excluded(rel, False):
                        continue
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue  # removed while we looked
                files[rel] = (st.st_size, st.st_mtime_ns)
                if len(files) >= max_files:
                    return files, False
    return files, True
