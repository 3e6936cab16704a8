"""``get_ipython()`` inside the sandbox: shell escapes, magics, variable expansion.

The kernel transforms IPython syntax with IPython's own TransformerManager
(``!ls`` becomes ``get_ipython().system('ls')``, ``%time x`` becomes
``get_ipython().run_line_magic('time', 'x')``); this module runs those calls.
Standard library only, Python 3.9+; IPython is not needed in the sandbox.
"""

import codecs
import math
import os
import re
import shlex
import string
import subprocess
import sys
import threading
import time

try:  # inside the sandbox the bootstrap installed the framing module under this name
    from _daytona_kernel_framing import KERNEL_MAGICS, Kind
except ImportError:  # imported from the package (tests)
    from daytona_kernel.runtime.framing import KERNEL_MAGICS, Kind

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL", re.IGNORECASE)
NO_VAR_EXPAND = ("time", "timeit", "pinfo", "pinfo2", "config")
READ_CHUNK_BYTES = 4096


class UsageError(Exception):
    """A magic was used wrongly; the message says how to use it."""


class StdinNotImplementedError(NotImplementedError):
    """input() was called but the frontend cannot answer input requests."""


class SList(list):
    """What ``x = !cmd`` returns: a list of lines, with IPython's shortcuts."""

    @property
    def s(self):
        return " ".join(self)

    @property
    def n(self):
        return "\n".join(self)

    @property
    def l(self):  # noqa: E743 - IPython's name
        return list(self)


class CapturedIO(object):
    """What ``%%capture var`` stores: the captured stdout, stderr and rich outputs."""

    def __init__(self, stdout, stderr, outputs, runtime):
        self.stdout = stdout
        self.stderr = stderr
        self.outputs = outputs
        self._rt = runtime

    def __repr__(self):
        return "<CapturedIO: %d chars stdout, %d chars stderr, %d outputs>" % (
            len(self.stdout),
            len(self.stderr),
            len(self.outputs),
        )

    def show(self):
        sys.stdout.write(self.stdout)
        sys.stderr.write(self.stderr)
        for kind, payload in self.outputs:
            self._rt.send(kind, payload)

    __call__ = show


class _DollarFormatter(string.Formatter):
    """IPython's interpolation: ``{expr}`` is evaluated, ``$name`` substituted, ``$$`` is ``$``."""

    _dollar = re.compile(r"(.*?)\$(\$?[\w.]+)", re.S)

    def parse(self, fmt):
        for literal, field, spec, conversion in string.Formatter.parse(self, fmt):
            pending, end = "", 0
            for m in self._dollar.finditer(literal):
                before, name = m.group(1), m.group(2)
                if name.startswith("$"):
                    pending += before + name
                else:
                    yield pending + before, name, "", None
                    pending = ""
                end = m.end()
            yield pending + literal[end:], field, spec, conversion

    def vformat(self, fmt, args, kwargs):
        out = []
        for literal, field, spec, conversion in self.parse(fmt):
            out.append(literal)
            if field is not None:
                expr = field + (":" + spec if spec else "")
                out.append(self.format_field(self.convert_field(eval(expr, kwargs), conversion), ""))
        return "".join(out)


def format_time(seconds, precision=3):
    """IPython's human-readable durations: ``1.23 ms``, ``4.5 µs``."""
    if seconds >= 60.0:
        minutes, sec = divmod(seconds, 60)
        hours, minutes = divmod(minutes, 60)
        return "%dh %dmin %.2gs" % (hours, minutes, sec) if hours else "%dmin %.2gs" % (minutes, sec)
    units = ["s", "ms", "\xb5s", "ns"]
    order = min(-int(math.floor(math.log10(seconds)) // 3), 3) if seconds > 0 else 3
    return "%.*g %s" % (precision, seconds * 1000 ** order, units[order])


def _pump(stream, name):
    """Copy a child's pipe into sys.stdout/sys.stderr as text, as it arrives."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    while True:
        chunk = stream.read1(READ_CHUNK_BYTES)
        if not chunk:
            break
        text = decoder.decode(chunk)
        if text:
            getattr(sys, name).write(text)
    tail = decoder.decode(b"", final=True)
    if tail:
        getattr(sys, name).write(tail)


class Shell(object):
    """The object ``get_ipython()`` returns in a cell."""

    def __init__(self, runtime):
        self._rt = runtime
        self.user_ns = runtime.user_ns
        self.config = {"IPKernelApp": {}}
        self.figure_format = "png"
        self._oldpwd = None
        self.line_magics = {
            "cd": self.magic_cd,
            "config": self.magic_config,
            "env": self.magic_env,
            "load_ext": self.magic_load_ext,
            "ls": self.magic_ls,
            "matplotlib": self.magic_matplotlib,
            "pinfo": self.magic_pinfo,
            "pinfo2": self.magic_pinfo2,
            "pip": self.magic_pip,
            "pwd": self.magic_pwd,
            "reset": self.magic_reset,
            "run": self.magic_run,
            "time": self.magic_time,
            "timeit": self.magic_timeit,
            "who": self.magic_who,
            "whos": self.magic_whos,
        }
        self.cell_magics = {
            "bash": self.cell_bash,
            "capture": self.cell_capture,
            "html": lambda line, cell: self._display_mime("text/html", cell),
            "javascript": lambda line, cell: self._display_mime("application/javascript", cell),
            "js": lambda line, cell: self._display_mime("application/javascript", cell),
            "latex": lambda line, cell: self._display_mime("text/latex", cell),
            "markdown": lambda line, cell: self._display_mime("text/markdown", cell),
            "sh": self.cell_sh,
            "time": self.cell_time,
            "timeit": self.cell_timeit,
            "writefile": self.cell_writefile,
        }

    # -- variable expansion ------------------------------------------------

    def var_expand(self, cmd, depth=0):
        """Expand ``$name`` and ``{expr}`` in the caller's namespace; unchanged on failure."""
        frame = sys._getframe(depth + 1)
        ns = dict(self.user_ns)
        ns.update(frame.f_locals)
        try:
            return _DollarFormatter().vformat(cmd, (), ns)
        except Exception:
            return cmd  # as IPython does: text that does not expand is left alone

    # -- shell escapes -----------------------------------------------------

    def system(self, cmd):
        """``!cmd``: run it with pipes and stream its output into the cell as it comes."""
        cmd = self.var_expand(cmd, depth=1)
        self.user_ns["_exit_code"] = self._run_streaming(cmd, shell=True)

    def _run_streaming(self, cmd, shell=False, stdin_text=None):
        proc = subprocess.Popen(
            cmd,
            shell=shell,
            stdin=subprocess.PIPE if stdin_text is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        pumps = [
            threading.Thread(target=_pump, args=(proc.stdout, "stdout"), daemon=True),
            threading.Thread(target=_pump, args=(proc.stderr, "stderr"), daemon=True),
        ]
        for t in pumps:
            t.start()
        try:
            if stdin_text is not None:
                proc.stdin.write(stdin_text.encode("utf-8"))
                proc.stdin.close()
            while proc.poll() is None:
                time.sleep(0.01)
        except KeyboardInterrupt:
            os.killpg(proc.pid, 2)
            proc.wait()
            raise
        finally:
            for t in pumps:
                t.join()
        return proc.returncode

    def getoutput(self, cmd, split=True, depth=0):
        """``x = !cmd``: the output lines (stdout and stderr together)."""
        cmd = self.var_expand(cmd, depth=depth + 1)
        out = subprocess.run(cmd, shell=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        text = out.stdout.decode("utf-8", "replace")
        return SList(text.splitlines()) if split else text

    # -- magics ----------------------------------------------------------

    def run_line_magic(self, magic_name, line, _stack_depth=1):
        func = self.line_magics.get(magic_name)
        if func is None and magic_name in KERNEL_MAGICS:
            raise UsageError(
                "%%%s runs in the kernel, next to your files, not in the sandbox: put it in a cell of its own."
                % magic_name
            )
        if func is None:
            raise UsageError(
                "Line magic function `%%%s` not found. daytona-kernel supports: %s."
                % (magic_name, ", ".join("%" + n for n in sorted(self.line_magics) if not n.startswith("pinfo")))
            )
        if magic_name not in NO_VAR_EXPAND:
            line = self.var_expand(line, depth=_stack_depth)
        return func(line)

    def run_cell_magic(self, magic_name, line, cell):
        func = self.cell_magics.get(magic_name)
        if func is None:
            raise UsageError(
                "Cell magic `%%%%%s` not found. daytona-kernel supports: %s."
                % (magic_name, ", ".join("%%" + n for n in sorted(self.cell_magics)))
            )
        if magic_name not in NO_VAR_EXPAND:
            line = self.var_expand(line, depth=1)
        return func(line, cell)

    def magic_cd(self, line):
        target = line.strip() or os.path.expanduser("~")
        if target == "-":
            if self._oldpwd is None:
                raise UsageError("%cd -: no previous directory.")
            target = self._oldpwd
        old = os.getcwd()
        try:
            os.chdir(os.path.expanduser(target))
        except OSError as exc:
            raise UsageError("%%cd: %s" % (exc,))
        self._oldpwd = old
        print(os.getcwd())

    def magic_pwd(self, line):
        return os.getcwd()

    def magic_ls(self, line):
        self.user_ns["_exit_code"] = self._run_streaming("ls -F " + line, shell=True)

    def magic_pip(self, line):
        self._run_streaming([sys.executable, "-m", "pip"] + shlex.split(line))
        print("Note: you may need to restart the kernel to use updated packages.")

    def magic_env(self, line):
        line = line.strip()
        if not line:
            return {k: ("<hidden>" if SECRET_NAME.search(k) else v) for k, v in os.environ.items()}
        if "=" in line or " " in line:
            name, _, value = line.partition("=") if "=" in line else line.partition(" ")
            name, value = name.strip(), value.strip()
            os.environ[name] = value
            print("env: %s=%s" % (name, "<hidden>" if SECRET_NAME.search(name) else value))
            return None
        if line not in os.environ:
            raise UsageError("Environment does not have key: %s" % line)
        return os.environ[line]

    def magic_config(self, line):
        m = re.match(r"\s*([\w.]+)\s*=\s*(.+?)\s*$", line)
        if not m:
            return None  # listing config classes is IPython-specific; nothing to show here
        key, raw = m.group(1), m.group(2)
        try:
            value = eval(raw, {})
        except Exception:
            value = raw
        if key.endswith("Completer.use_jedi"):
            self._rt.options["use_jedi"] = bool(value)
        elif key == "InlineBackend.figure_format":
            self.figure_format = str(value)
        return None

    def magic_matplotlib(self, line):
        backend = line.strip() or "inline"
        if backend != "inline":
            sys.stderr.write(
                "daytona-kernel: the %r backend cannot show windows from a sandbox; using inline.\n" % backend
            )
        mpl = sys.modules.get("matplotlib")
        if mpl is not None:
            mpl.use("module://" + self._rt.inline_backend)

    def magic_load_ext(self, line):
        sys.stderr.write(
            "daytona-kernel: %%load_ext is not supported (IPython extensions need a full IPython shell); "
            "%r was not loaded.\n" % line.strip()
        )

    def magic_pinfo(self, line, detail_level=0):
        name = line.strip()
        found, obj = self._rt.lookup(name)
        if not found:
            print("Object `%s` not found." % name)
            return
        text = self._rt.object_info(name, obj, detail_level)
        self._rt.send(Kind.PAYLOAD, {"source": "page", "data": {"text/plain": text}, "start": 0})

    def magic_pinfo2(self, line):
        self.magic_pinfo(line, detail_level=1)

    def _hidden(self):
        return self._rt.initial_names

    def _user_vars(self):
        hidden = self._hidden()
        return sorted(k for k in self.user_ns if not k.startswith("_") and k not in hidden)

    def magic_who(self, line):
        names = self._user_vars()
        if not names:
            print("Interactive namespace is empty.")
            return
        print("\t".join(names) + "\t")

    def magic_whos(self, line):
        names = self._user_vars()
        if not names:
            print("Interactive namespace is empty.")
            return
        rows = [(n, type(self.user_ns[n]).__name__, _brief(self.user_ns[n])) for n in names]
        w1 = max(len("Variable"), max(len(r[0]) for r in rows)) + 3
        w2 = max(len("Type"), max(len(r[1]) for r in rows)) + 3
        print("Variable".ljust(w1) + "Type".ljust(w2) + "Data/Info")
        print("-" * (w1 + w2 + len("Data/Info")))
        for name, kind, info in rows:
            print(name.ljust(w1) + kind.ljust(w2) + info)

    def magic_reset(self, line):
        if "-f" not in line.split():
            answer = input("Once deleted, variables cannot be recovered. Proceed (y/[n])? ")
            if answer.strip().lower() not in ("y", "yes"):
                print("Nothing done.")
                return
        self._rt.reset_namespace()

    def magic_run(self, line):
        args = shlex.split(line)
        if not args:
            raise UsageError("%run needs a file name: %run script.py [args]")
        path = os.path.expanduser(args[0])
        try:
            with open(path, encoding="utf-8") as f:
                source = f.read()
        except OSError as exc:
            raise UsageError("%%run: could not read %s: %s" % (path, exc))
        ns = {"__name__": "__main__", "__file__": os.path.abspath(path), "__builtins__": __builtins__}
        saved_argv = sys.argv
        sys.argv = [path] + args[1:]
        try:
            exec(compile(source, os.path.abspath(path), "exec"), ns)
        finally:
            sys.argv = saved_argv
            self.user_ns.update({k: v for k, v in ns.items() if not k.startswith("__")})

    def magic_time(self, line):
        return self._time(line)

    def cell_time(self, line, cell):
        return self._time(cell, is_cell=True)

    def _time(self, source, is_cell=False):
        (u0, s0), w0 = _cpu_times(), time.perf_counter()
        try:
            result = self._rt.run_nested(source) if is_cell else self._eval_or_exec(source)
        finally:
            (u1, s1), w1 = _cpu_times(), time.perf_counter()
            user, system = u1 - u0, s1 - s0
            print(
                "CPU times: user %s, sys: %s, total: %s"
                % (format_time(user), format_time(system), format_time(user + system))
            )
            print("Wall time: %s" % format_time(w1 - w0))
        return result

    def _eval_or_exec(self, source):
        try:
            code = compile(source, "<timed>", "eval")
        except SyntaxError:
            exec(compile(source, "<timed>", "exec"), self.user_ns)
            return None
        return eval(code, self.user_ns)

    def magic_timeit(self, line):
        m = re.match(r"\s*((?:-[nr]\s*\d+\s+|-q\s+)*)(.*)$", line, re.S)
        return self._timeit(m.group(2), m.group(1))

    def cell_timeit(self, line, cell):
        return self._timeit(cell, line)

    def _timeit(self, stmt, options):
        import timeit

        number = re.search(r"-n\s*(\d+)", options)
        repeat = re.search(r"-r\s*(\d+)", options)
        number = int(number.group(1)) if number else None
        repeat = int(repeat.group(1)) if repeat else 7
        timer = timeit.Timer(stmt, globals=self.user_ns)
        if number is None:
            number, _ = timer.autorange()
        runs = [t / number for t in timer.repeat(repeat, number)]
        mean = sum(runs) / len(runs)
        std = math.sqrt(sum((r - mean) ** 2 for r in runs) / len(runs))
        if "-q" not in options.split():
            print(
                "%s \xb1 %s per loop (mean \xb1 std. dev. of %d run%s, %d loop%s each)"
                % (format_time(mean), format_time(std), repeat, "" if repeat == 1 else "s", number, "" if number == 1 else "s")
            )

    def cell_writefile(self, line, cell):
        args = shlex.split(line)
        append = "-a" in args or "--append" in args
        names = [a for a in args if a not in ("-a", "--append")]
        if not names:
            raise UsageError("%%writefile needs a file name: %%writefile [-a] path")
        path = os.path.expanduser(names[0])
        exists = os.path.exists(path)
        if append:
            print("Appending to %s" % path)
        else:
            print(("Overwriting %s" if exists else "Writing %s") % path)
        with open(path, "a" if append else "w", encoding="utf-8") as f:
            f.write(cell)

    def cell_bash(self, line, cell):
        self._script(["bash"] + shlex.split(line), cell)

    def cell_sh(self, line, cell):
        self._script(["sh"] + shlex.split(line), cell)

    def _script(self, argv, cell):
        code = self._run_streaming(argv, stdin_text=cell)
        if code:
            raise subprocess.CalledProcessError(code, argv[0] + " (cell body)")

    def cell_capture(self, line, cell):
        args = shlex.split(line)
        flags = set(a for a in args if a.startswith("--"))
        names = [a for a in args if not a.startswith("--")]
        captured = self._rt.capture(cell, stdout="--no-stdout" not in flags, stderr="--no-stderr" not in flags,
                                    display="--no-display" not in flags)
        if names:
            self.user_ns[names[0]] = captured

    def _display_mime(self, mime, cell):
        self._rt.send(Kind.DISPLAY, {"data": {mime: cell, "text/plain": "<%s>" % mime}, "metadata": {}, "transient": {}})

    # -- misc IPython API ------------------------------------------------

    def set_next_input(self, text, replace=False):
        self._rt.send(Kind.PAYLOAD, {"source": "set_next_input", "text": text, "replace": replace})

    def ask_exit(self):
        self._rt.send(Kind.PAYLOAD, {"source": "ask_exit", "keepkernel": False})

    def ev(self, expr):
        return eval(expr, self.user_ns)

    def ex(self, cmd):
        exec(cmd, self.user_ns)


def _cpu_times():
    """(user, system) CPU seconds of this process, as precisely as the platform tells."""
    try:
        import resource

        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime, usage.ru_stime
    except ImportError:  # not on Unix
        t = os.times()
        return t.user, t.system


def _brief(value):
    try:
        text = repr(value)
    except Exception as exc:
        text = "<repr failed: %r>" % (exc,)
    text = text.replace("\n", " ")
    return text if len(text) <= 60 else text[:57] + "..."
