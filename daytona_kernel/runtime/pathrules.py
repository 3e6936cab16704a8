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
import re

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
    """Ordered include/exclude patterns; ``excluded(rel_path, is_dir)`` decides.

    Patterns are compiled once. Without negations, which is the usual case, every
    pattern of a kind is folded into one regular expression, so a scan of many
    files costs a few regex matches per file rather than one per pattern.
    """

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
            regex = re.compile(fnmatch.translate(line.lstrip("/")))
            self._rules.append((regex, negate, dir_only, anchored))
        self._folded = None
        if not any(negate for _, negate, _, _ in self._rules):
            self._folded = {}
            for dir_only in (False, True):
                for anchored in (False, True):
                    parts = [r.pattern for r, _, d, a in self._rules if a == anchored and (d == dir_only or not d)]
                    self._folded[(dir_only, anchored)] = re.compile("|".join(parts)) if parts else None

    def excluded(self, rel, is_dir):
        rel = rel.replace(os.sep, "/")
        name = rel.rsplit("/", 1)[-1]
        if self._folded is not None:
            by_name, by_path = self._folded[(bool(is_dir), False)], self._folded[(bool(is_dir), True)]
            return bool((by_name and by_name.match(name)) or (by_path and by_path.match(rel)))
        result = False
        for regex, negate, dir_only, anchored in self._rules:
            if dir_only and not is_dir:
                continue
            if regex.match(rel if anchored else name):
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
