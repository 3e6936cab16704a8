"""The user's own paths for the sandbox's copies of their files: the one map, sandbox path to user path and back.

The working directory in the sandbox mirrors the user's project folder (``RuntimeOptions.local_root``, set
when the mirror runs both ways), so a file under it is the copy of the user's file of the same relative
path. What the user reads (tracebacks, inspection, a module's repr) names the user's file, which a
traceback link in JupyterLab or VS Code then opens; what the code sees (``__file__``, ``os.getcwd()``)
stays the sandbox's, where the files are. The debugger's source map uses the same map (``to_user`` for
the frames it shows, ``to_sandbox`` for a breakpoint the user sets in their own file).

Standard library only, Python 3.9+; shared by both sides (the kernel imports it from the package).
"""

import posixpath


class PathMap(object):
    """``sandbox_root`` (the working directory, an absolute path in the sandbox) is the copy of ``user_root``
    (the project folder on the user's machine, in its own convention: ``C:\\...`` on Windows). Empty
    either way: no map, every path is itself."""

    def __init__(self, sandbox_root, user_root):
        self.sandbox_root = posixpath.normpath(sandbox_root) if sandbox_root and user_root else ""
        self.user_root = user_root.rstrip("/\\") or user_root if self.sandbox_root else ""
        self._user_sep = "\\" if "\\" in self.user_root and "/" not in self.user_root else "/"

    def __bool__(self):
        return bool(self.sandbox_root)

    def to_user(self, path):
        """The user's path for a path in the sandbox; any path outside the working directory is itself."""
        root = self.sandbox_root
        if not root or not isinstance(path, str):
            return path
        if path == root:
            return self.user_root
        if not path.startswith(root + "/"):
            return path
        return self.user_root + self._user_sep + path[len(root) + 1 :].replace("/", self._user_sep)

    def to_sandbox(self, path):
        """The sandbox's path for the user's path of a mirrored file; any other path is itself."""
        user = self.user_root
        if not user or not isinstance(path, str):
            return path
        if path == user:
            return self.sandbox_root
        if not path.startswith(user + self._user_sep):
            return path
        return self.sandbox_root + "/" + path[len(user) + 1 :].replace(self._user_sep, "/")

    def in_text(self, text):
        """Text that names files (a traceback, an inspection) with the user's paths for the sandbox's."""
        root = self.sandbox_root
        if not root or not isinstance(text, str) or root not in text:
            return text
        parts = text.split(root)
        out = [parts[0]]
        for part in parts[1:]:
            if part[:1] == "/":  # a path under the working directory: to the end of its name
                end = 1
                while end < len(part) and part[end] not in PATH_ENDS:
                    end += 1
                out.append(self.to_user(root + part[:end]) + part[end:])
            elif not part or (not part[0].isalnum() and part[0] not in "._-"):  # the working directory itself
                out.append(self.user_root + part)
            else:  # a longer name that only starts the same (/work/project2)
                out.append(root + part)
        return "".join(out)


PATH_ENDS = frozenset(" \t\n\r\"'`:,;()[]<>\x1b")  # what ends a path in a traceback line or a repr
