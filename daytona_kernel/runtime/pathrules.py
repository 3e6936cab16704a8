"""Which files the workdir mirror moves, and a fast scan of a folder.

Pure and standard-library only (Python 3.9+): the kernel uses it on the user's
folder, and the same source runs in the sandbox to find what a cell changed.

Patterns follow git's .gitignore rules exactly (checked against
``git check-ignore`` in the tests): ``#`` comments, ``!`` negation (the last
matching pattern wins), a trailing ``/`` for folders only, a ``/`` at the start
or in the middle anchors a pattern to its file's folder, ``*`` and ``?`` never
cross ``/``, ``**`` spans folders, ``[...]`` classes, ``\\`` escapes, trailing
spaces dropped. Every folder's own ``.gitignore`` applies below it, a deeper
file beats a shallower one, and nothing inside an excluded folder comes back.

``MirrorRules`` adds three lists on top of the .gitignore files:
- ``NEVER``: version-control and kernel metadata (``.git`` ...), and Jupyter's
  connection files (``kernel-*.json``, which hold the kernel's HMAC key). Never
  mirrored, in either direction, whatever any setting says.
- ``SECRET_PATTERNS``: files that usually hold credentials, matched whatever their
  case. Skipped unless the user lists them in ``sync_include``.
- ``DEFAULT_EXCLUDES``: caches, virtualenvs and tools' own state, above every
  .gitignore (a ``!pattern`` there never brings one back: a .gitignore may come
  from the sandbox). ``sync_exclude`` patterns are above them.
Names are compared by their ``name_key`` (trailing dots and spaces dropped, ignorable
code points dropped, NFC, case-folded), as a Windows or macOS disk would open them.
Python environments (a folder holding a ``pyvenv.cfg`` or a ``conda-meta/``) are always skipped.

Examples:
    >>> rules = PathRules(["*.log", "build/", "!keep.log"])
    >>> rules.excluded("a/b.log", False), rules.excluded("keep.log", False), rules.excluded("build", True)
    (True, False, True)
"""

import errno
import os
import re
import time
import unicodedata

NEVER = (".git", ".hg", ".svn", ".bzr", "_darcs", ".daytona-kernel")
# jupyter_client's connection files, kernel-*.json (the pattern its ``find_connection_file`` looks for), hold the HMAC key
CONNECTION_FILE = ("kernel-", ".json")

# Unicode's Default_Ignorable_Code_Point (DerivedCoreProperties.txt): invisible, and HFS+ drops several of them
# (U+200C ... U+200F, U+202A ... U+202E, U+206A ... U+206F, U+FEFF), so ".g\u200cit" is ".git" there.
IGNORABLE = re.compile(
    "[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e\u2060-\u206f"
    "\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufff8\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e0fff]"
)


def name_key(name):
    """A name as a disk that ignores case, trailing dots and spaces, or invisible characters opens it:
    ``".Git. "``, ``".g\u200cit"`` and ``".git::$INDEX_ALLOCATION"`` are ``".git"``. Windows drops trailing
    dots and spaces, and NTFS reads what follows a ":" as a stream of the file before it; HFS+ drops ignorable
    code points and compares Unicode forms; macOS and Windows ignore case."""
    name = name.split(":", 1)[0]
    if name.isascii():
        return name.rstrip(". ").lower()  # casefold is lower() for ASCII
    name = IGNORABLE.sub("", name)
    return unicodedata.normalize("NFC", unicodedata.normalize("NFC", name).casefold()).rstrip(". ")


def path_key(rel):
    """``rel`` with each of its names through ``name_key``."""
    return "/".join(name_key(part) for part in rel.split("/"))


SECRET_PATTERNS = (  # matched case-insensitively: .ENV and ID_RSA too
    # environment files
    ".env",
    ".env.*",
    "!.env.example",
    "!.env.sample",
    "!.env.template",
    "!.env.dist",
    ".envrc",
    # tool credentials (git, http, databases, package registries)
    ".git-credentials",
    ".netrc",
    "_netrc",
    ".pgpass",
    ".my.cnf",
    ".npmrc",
    ".pypirc",
    ".htpasswd",
    ".dockercfg",
    ".vault-token",
    ".databrickscfg",
    ".terraformrc",
    "terraform.rc",
    "credentials.tfrc.json",
    "*.tfstate",
    "*.tfstate.backup",
    "terraform.tfvars",
    "*.auto.tfvars",
    # cloud credentials (AWS/boto, S3 tools, Google, Kaggle, Hugging Face)
    ".boto",
    ".s3cfg",
    ".passwd-s3fs",
    "credentials.json",
    "credentials.csv",
    "client_secret*.json",
    "*service[-_]account*.json",
    "application_default_credentials.json",
    "adc.json",
    "kaggle.json",
    ".huggingface/",
    # keys and certificates
    "id_rsa*",
    "id_dsa*",
    "id_ecdsa*",
    "id_ed25519*",
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "*.pkcs12",
    "*.keystore",
    "*.jks",
    "*.ppk",
    "*.ovpn",
    "*.kdbx",
    # cluster and app secrets
    "kubeconfig",
    "*.kubeconfig",
    "secrets.toml",
    "secrets.yml",
    "secrets.yaml",
    # shell histories hold what was typed, tokens included
    ".*_history",
    # folders of credentials
    ".ssh/",
    ".aws/",
    ".azure/",
    ".gnupg/",
    ".kube/",
    ".docker/",
    ".kaggle/",
    ".oci/",
    ".terraform.d/",
    # home-folder settings that often hold tokens (gh, gcloud, keyrings, Jupyter)
    ".config/",
    ".local/",
    ".ipython/",
)

DEFAULT_EXCLUDES = (
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
    # caches that live in home folders
    ".cache/",
    ".npm/",
    # Jupyter's settings and workspaces (no secret: no notice), JupyterLab's collaboration store and its journal
    ".jupyter/",
    ".jupyter_ystore.db*",
)

_UNKNOWN = object()  # a path the last scan did not decide

# Why a path is not mirrored (``None``: it is).
NEVER_REASON = "never"
SECRET_REASON = "secret"
IGNORED_REASON = "ignored"

_CLASSES = {
    "alnum": "a-zA-Z0-9",
    "alpha": "a-zA-Z",
    "blank": " \\t",
    "cntrl": "\\x00-\\x1f\\x7f",
    "digit": "0-9",
    "graph": "\\x21-\\x7e",
    "lower": "a-z",
    "print": "\\x20-\\x7e",
    "punct": "!-/:-@\\[-`{-~",
    "space": " \\t\\n\\r\\f\\v",
    "upper": "A-Z",
    "xdigit": "0-9a-fA-F",
}


def _class_char(c):
    return "\\" + c if c in "\\]^-[" else c


def _bracket(pat, i):
    """Translate the ``[...]`` at pat[i] like git's wildmatch: (regex, next index), or None if it never matches."""
    n = len(pat)
    i += 1
    negated = i < n and pat[i] in "!^"
    if negated:
        i += 1
    items = []
    prev = None  # the previous literal, which may start a range
    first = True
    while True:
        if i >= n:
            return None  # unterminated: git aborts, the pattern matches nothing
        c = pat[i]
        if c == "]" and not first:
            break
        first = False
        if c == "\\":
            i += 1
            if i >= n:
                return None
            items.append(_class_char(pat[i]))
            prev = pat[i]
        elif c == "-" and prev is not None and i + 1 < n and pat[i + 1] != "]":
            i += 1
            hi = pat[i]
            if hi == "\\":
                i += 1
                if i >= n:
                    return None
                hi = pat[i]
            items.pop()
            if prev <= hi:
                items.append(_class_char(prev) + "-" + _class_char(hi))
            prev = None
        elif c == "[" and i + 1 < n and pat[i + 1] == ":":
            end = pat.find("]", i + 2)
            if end < 0:
                return None
            name = pat[i + 2 : end]
            if not name.endswith(":"):  # no ":]": a plain "["
                items.append(_class_char("["))
                prev = "["
            else:
                if name[:-1] not in _CLASSES:
                    return None  # git aborts on an unknown class
                items.append(_CLASSES[name[:-1]])
                prev = None
                i = end
        else:
            items.append(_class_char(c))
            prev = c
        i += 1
    body = "".join(items)
    if negated:
        return "[^/" + body + "]", i + 1
    return ("(?!/)[" + body + "]" if body else "(?!)"), i + 1


def translate(pat):
    """A .gitignore glob as a regex source (git's wildmatch with WM_PATHNAME), or None if it matches nothing."""
    out = []
    i, n = 0, len(pat)
    while i < n:
        c = pat[i]
        if c == "*":
            j = i
            while j < n and pat[j] == "*":
                j += 1
            whole_component = j - i >= 2 and (i == 0 or pat[i - 1] == "/") and (j == n or pat[j] == "/")
            if whole_component and j == n:
                out.append(".*")
                i = j
            elif whole_component:
                out.append("(?:.*/)?")  # "**/": zero or more folders
                i = j + 1
            else:
                out.append("[^/]*")
                i = j
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            parsed = _bracket(pat, i)
            if parsed is None:
                return None
            source, i = parsed
            out.append(source)
        elif c == "\\":
            if i + 1 >= n:
                return None  # a trailing backslash never matches in git
            out.append(re.escape(pat[i + 1]))
            i += 2
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out) + r"\Z"


def _trim_trailing_spaces(line):
    """git's trim_trailing_spaces: unescaped trailing spaces go."""
    last_space = None
    i = 0
    while i < len(line):
        c = line[i]
        if c == " ":
            if last_space is None:
                last_space = i
        elif c == "\\":
            i += 1
            if i >= len(line):
                return line
            last_space = None
        else:
            last_space = None
        i += 1
    return line if last_space is None else line[:last_space]


class PathRules:
    """One ordered list of .gitignore patterns, relative to one folder.

    ``verdict(rel, is_dir)`` is True (excluded), False (re-included by a ``!``
    pattern) or None (no pattern matches). Patterns are compiled once; one
    folded regex answers "does any pattern match?" first, so the usual miss
    costs one or two regex calls whatever the number of patterns.
    """

    def __init__(self, patterns, ignorecase=False):
        flags = re.DOTALL | (re.IGNORECASE if ignorecase else 0)
        self._rules = []
        for raw in patterns:
            line = _trim_trailing_spaces(raw.removesuffix("\r"))
            if not line or line.startswith("#"):
                continue
            negate = line.startswith("!")
            if negate:
                line = line[1:]
            dir_only = line.endswith("/")
            if dir_only:
                line = line[:-1]
            anchored = "/" in line
            if anchored and line.startswith("/"):
                line = line[1:]
            source = translate(line) if line else None
            if source is None:
                continue
            self._rules.append((re.compile(source, flags), negate, dir_only, anchored))
        self.has_negation = any(negate for _, negate, _, _ in self._rules)
        self._any = {}
        for is_dir in (False, True):
            for anchored in (False, True):
                parts = [f"(?:{r.pattern})" for r, _, d, a in self._rules if a == anchored and (is_dir or not d)]
                self._any[(is_dir, anchored)] = re.compile("|".join(parts), flags) if parts else None

    def __bool__(self):
        return bool(self._rules)

    def verdict(self, rel, is_dir):
        is_dir = bool(is_dir)
        by_name, by_path = self._any[(is_dir, False)], self._any[(is_dir, True)]
        name = rel.rsplit("/", 1)[-1]
        if not ((by_name is not None and by_name.match(name)) or (by_path is not None and by_path.match(rel))):
            return None
        if not self.has_negation:
            return True
        for regex, negate, dir_only, anchored in reversed(self._rules):
            if dir_only and not is_dir:
                continue
            if regex.match(rel if anchored else name):
                return not negate
        return None

    def excluded(self, rel, is_dir):
        return self.verdict(rel.replace(os.sep, "/"), is_dir) is True


def read_gitignore(path, follow=False):
    """The lines of a .gitignore, or [] when there is none (a symlink is not followed, as in git; ``follow``:
    it is, as git does for a repository's info/exclude and the user's global excludes file)."""
    nofollow = 0 if follow else getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, os.O_RDONLY | nofollow | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return []
    try:
        if not _is_regular(os.fstat(fd).st_mode):
            os.close(fd)
            return []
        with os.fdopen(fd, "rb") as f:
            data = f.read(1024 * 1024)
    except OSError:
        return []  # unreadable: git would not honour it either
    return data.decode("utf-8", "replace").split("\n")


def _is_regular(mode):
    return (mode & 0o170000) == 0o100000


def _git_dir(top):
    """The folder that holds a work tree's info/exclude: its ``.git`` folder, or for a linked work tree or a
    submodule (a ``.git`` file saying ``gitdir: ...``) the repository's common folder. None if unreadable."""
    dotgit = os.path.join(top, ".git")
    if os.path.isdir(dotgit):
        return dotgit
    lines = read_gitignore(dotgit)  # a small text file, not followed if a symlink
    if not lines or not lines[0].startswith("gitdir:"):
        return None
    gitdir = os.path.join(top, lines[0][len("gitdir:") :].strip())
    common = read_gitignore(os.path.join(gitdir, "commondir"))
    return os.path.normpath(os.path.join(gitdir, common[0].strip())) if common and common[0].strip() else gitdir


def repository_excludes(root, global_excludes=None):
    """The git ignore files that apply to ``root`` from outside it, most precise first, as
    [(lead, path, follow)]: ``lead`` is root's path from that file's folder ("" or ending in "/"). They are
    the .gitignore files of the folders above root up to its repository's top (deepest first), then the
    repository's info/exclude, then the user's global excludes file (core.excludesFile), as git reads them.
    [] when root is in no git repository, or in one whose top is the home folder or holds it (a dotfiles
    repository, often with ``*`` in its .gitignore, is not the project's: the project root never is either)."""
    root = os.path.abspath(root)
    home = os.path.abspath(os.path.expanduser("~"))
    top = root
    while not os.path.lexists(os.path.join(top, ".git")):
        parent = os.path.dirname(top)
        if parent == top:
            return []
        top = parent
    if top == home or home.startswith(top.rstrip(os.sep) + os.sep):
        return []
    found = []
    folder = os.path.dirname(root) if top != root else None
    while folder is not None and (folder == top or folder.startswith(top.rstrip(os.sep) + os.sep)):
        found.append((os.path.relpath(root, folder).replace(os.sep, "/") + "/", os.path.join(folder, ".gitignore"), False))
        folder = None if folder == top else os.path.dirname(folder)
    lead = "" if top == root else os.path.relpath(root, top).replace(os.sep, "/") + "/"
    git_dir = _git_dir(top)
    if git_dir is not None:
        found.append((lead, os.path.join(git_dir, "info", "exclude"), True))
    if global_excludes:
        found.append((lead, global_excludes, True))
    return found


class MirrorRules:
    """Everything that decides whether a path is mirrored. See the module docstring.

    ``check(rel, is_dir)`` judges one path and each folder above it, reading the
    .gitignore files on the way (cached). ``scan`` uses ``classify`` with the
    .gitignore levels it has already read.
    """

    def __init__(
        self,
        root,
        extra=(),
        include=(),
        defaults=DEFAULT_EXCLUDES,
        secrets=SECRET_PATTERNS,
        gitignore=True,
        repository=False,
        global_excludes=None,
    ):
        self.root = root
        self._never = frozenset(NEVER)
        self._include = PathRules(include)
        self._secrets = PathRules(secrets, ignorecase=True)  # case-insensitive file systems are common
        self._extra = PathRules(extra)
        self._defaults = PathRules(defaults)
        self._read_gitignore = gitignore
        self._gitignores = {}  # {folder: (PathRules or None, the lines they were made from)}
        # ``repository``: also git's ignore files from outside root (``repository_excludes``), read again with the
        # .gitignore files: [(lead, PathRules)], and the lines they were made from (part of ``last_scan``'s key).
        # ``global_excludes``: the path, or a function that gives it (called once, at the first read).
        self._repository = repository and gitignore
        self._global_excludes = global_excludes
        self._outer = []  # type: list
        self.outer_lines = None  # type: tuple | None
        # What the last ``scan`` decided: {path: reason} (a folder's path ends with "/"), and the lines of
        # the .gitignore in each folder it looked into (None: no .gitignore), which those verdicts rest on.
        self.last_scan = ({}, {})  # type: tuple[dict, dict]

    def gitignore(self, rel_dir):
        """The rules of the .gitignore in one folder (relative to the root), read once."""
        return self.gitignore_file(rel_dir)[0]

    def gitignore_file(self, rel_dir):
        """(the rules of the .gitignore in one folder, or None; the lines they were made from, or None)."""
        if not self._read_gitignore:
            return None, None
        entry = self._gitignores.get(rel_dir)
        if entry is None:  # (one lookup and one store: forget_gitignores() in another thread may replace the dict)
            folder = os.path.join(self.root, rel_dir) if rel_dir else self.root
            lines = read_gitignore(os.path.join(folder, ".gitignore"))
            rules = PathRules(lines)
            entry = self._gitignores[rel_dir] = (rules if rules else None, tuple(lines) if lines else None)
        return entry

    def forget_gitignores(self):
        """Read the .gitignore files again on the next check (they may have changed)."""
        self._gitignores = {}
        self._read_outer()

    def _read_outer(self):
        if not self._repository:
            return
        if callable(self._global_excludes):
            self._global_excludes = self._global_excludes()
        outer, lines = [], []
        for lead, path, follow in repository_excludes(self.root, self._global_excludes):
            text = read_gitignore(path, follow)
            lines.append((path, tuple(text)))
            rules = PathRules(text)
            if rules:
                outer.append((lead, rules))
        self._outer, self.outer_lines = outer, tuple(lines)

    def classify(self, rel, is_dir, levels=()):
        """Why ``rel`` is not mirrored (NEVER_REASON, SECRET_REASON, IGNORED_REASON), or None.

        ``levels`` are (folder, PathRules) of the .gitignore files above ``rel``,
        deepest first. The folders above ``rel`` are not checked here.
        """
        key = name_key(rel.rsplit("/", 1)[-1])
        if key in self._never or (not is_dir and key.startswith(CONNECTION_FILE[0]) and key.endswith(CONNECTION_FILE[1])):
            return NEVER_REASON  # also .GIT and .git. (name_key)
        if self._include and self._include.verdict(rel, is_dir):
            return None
        if self._secret(rel, is_dir):
            return SECRET_REASON
        verdict = self._extra.verdict(rel, is_dir) if self._extra else None
        if verdict is None and self._defaults.verdict(rel, is_dir):
            return IGNORED_REASON  # a .gitignore narrows the defaults, never re-includes one (sync_include does)
        if verdict is None:
            for base, rules in levels:
                verdict = rules.verdict(rel[len(base) + 1 :] if base else rel, is_dir)
                if verdict is not None:
                    break
        if verdict is None:
            for lead, rules in self._outer:  # git's ignore files from outside root (``repository``)
                verdict = rules.verdict(lead + rel, is_dir)
                if verdict is not None:
                    break
        return IGNORED_REASON if verdict else None

    def _secret(self, rel, is_dir):
        """A secret's name, also as a disk would open it (``.ENV.`` is ``.env`` on Windows)."""
        if self._secrets.verdict(rel, is_dir):
            return True
        plain = rel.isascii() and not rel.endswith((".", " "))  # the folders above were classified on their own
        return not plain and bool(self._secrets.verdict(path_key(rel), is_dir))

    def levels_for(self, rel_dir):
        """The .gitignore levels that apply inside ``rel_dir``, deepest first."""
        levels = []
        parts = rel_dir.split("/") if rel_dir else []
        for depth in range(len(parts), -1, -1):
            base = "/".join(parts[:depth])
            rules = self.gitignore(base)
            if rules is not None:
                levels.append((base, rules))
        return levels

    def check(self, rel, is_dir):
        """Like ``classify``, for a path and every folder above it: the first reason found, or None."""
        if self._repository and self.outer_lines is None:
            self._read_outer()
        parts = rel.split("/")
        for depth in range(1, len(parts) + 1):
            sub = "/".join(parts[:depth])
            last = depth == len(parts)
            reason = self.classify(sub, is_dir if last else True, self.levels_for("/".join(parts[: depth - 1])))
            if reason is not None:
                return reason
        return None

    def excluded(self, rel, is_dir):
        return self.check(rel.replace(os.sep, "/"), is_dir) is not None


def load_rules(root, extra=(), include=(), secrets=SECRET_PATTERNS, repository=False, global_excludes=None):
    """The mirror's rules for a folder: NEVER, secrets (minus ``include``), .gitignore files, ``extra``, defaults;
    with ``repository``, git's ignore files from outside the folder too (``repository_excludes``)."""
    return MirrorRules(root, extra, include, secrets=secrets, repository=repository, global_excludes=global_excludes)


def gone(root, rel):
    """True when ``rel`` is really not there, False when it exists or cannot be looked at (no permission)."""
    try:
        os.lstat(os.path.join(root, rel))
    except OSError as exc:
        return exc.errno in (errno.ENOENT, errno.ENOTDIR)
    return False


def file_stat(st):
    """What the mirror compares: (size, mtime in ns, permission bits)."""
    return (st.st_size, st.st_mtime_ns, st.st_mode & 0o777)


def is_environment(folder):
    """A Python environment (a virtualenv's pyvenv.cfg, or a conda environment's conda-meta/): never scanned,
    in either direction, whatever its name."""
    return os.path.exists(os.path.join(folder, "pyvenv.cfg")) or os.path.isdir(os.path.join(folder, "conda-meta"))


def scan(root, rules, max_files=50000, skipped=None, budget_s=None):
    """{relative path: (size, mtime_ns, mode)} of the regular files under root that the rules keep.

    Returns (files, complete); complete is False when max_files was reached or
    the scan took longer than ``budget_s`` seconds (checked once per folder).
    Symlinks, FIFOs and devices are never listed. Paths skipped as secrets are
    appended to ``skipped`` when it is a list.

    A path's verdict depends only on the path, whether it is a folder, the rules
    and the .gitignore files above it, so the scan reuses the last scan's verdict
    for a path it saw then (``rules.last_scan``), as long as every .gitignore on
    the way reads the same as then; one that changed, appeared or went away
    drops them all. Whether a folder is a Python environment is looked at every
    time, and nothing inside an excluded folder is looked at.
    """
    files = {}  # type: dict
    rules.forget_gitignores()
    known, ignores = rules.last_scan
    verdicts, seen = {}, {None: rules.outer_lines}  # type: dict, dict
    if known and ignores.get(None) != rules.outer_lines:
        known = {}  # git's ignore files from outside root changed: every verdict rests on them
    classify = rules.classify
    stack = [("", [])]  # type: list
    deadline = None if budget_s is None else time.monotonic() + budget_s
    complete = True
    while stack:
        if deadline is not None and time.monotonic() > deadline:
            complete = False
            break
        rel_dir, levels = stack.pop()
        try:
            with os.scandir(os.path.join(root, rel_dir) if rel_dir else root) as it:
                entries = list(it)
        except OSError:
            continue  # vanished or unreadable: nothing to mirror there
        lines = None
        if any(entry.name == ".gitignore" for entry in entries):  # no open() per folder without one
            inner, lines = rules.gitignore_file(rel_dir)  # one read: another scan may forget them meanwhile
            if inner is not None:
                levels = [(rel_dir, inner)] + levels
        seen[rel_dir] = lines
        if known and ignores.get(rel_dir, lines) != lines:
            known = {}  # the verdicts below this folder rest on what its .gitignore said then
        prefix = rel_dir + "/" if rel_dir else ""
        for entry in entries:
            rel = prefix + entry.name
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
                if not is_dir and not entry.is_file(follow_symlinks=False):
                    continue  # symlink, FIFO, socket, device
                key = rel + "/" if is_dir else rel
                reason = known.get(key, _UNKNOWN)
                if reason is _UNKNOWN:
                    reason = classify(rel, is_dir, levels)
                verdicts[key] = reason
                if reason is not None:
                    if reason == SECRET_REASON and skipped is not None:
                        skipped.append(key)
                    continue
                if is_dir:
                    if not is_environment(entry.path):
                        stack.append((rel, levels))
                    continue
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # removed while we looked
            files[rel] = (st.st_size, st.st_mtime_ns, st.st_mode & 0o777)
            if len(files) >= max_files:
                complete = False
                break
        if not complete:
            break
    rules.last_scan = (verdicts, seen)
    return files, complete
