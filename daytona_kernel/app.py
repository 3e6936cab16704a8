"""The kernel application: ipykernel's, with our config files and env-var layer."""

from __future__ import annotations

import atexit
import logging
from typing import Any

from ipykernel.kernelapp import IPKernelApp, kernel_aliases, kernel_flags
from IPython.core.profiledir import ProfileDir
from jupyter_client.session import Session
from traitlets import Dict, Type

from .config import SECTION, checked, load_config, masked
from .kernel import DaytonaKernel

CONTROL_JOIN_TIMEOUT_S = 10.0


_SHELL_CLASSES = {"InteractiveShell", "InteractiveShellApp", "PlainTextFormatter"}


def _trait_class(alias: str | tuple[str, str]) -> str:
    return (alias if isinstance(alias, str) else alias[0]).split(".")[0]


class MaskedRecords(logging.Filter):
    """Every line of the kernel's log with URL credentials and known token shapes masked (``config.masked``):
    a line that names a setting such as ``repo_url`` cannot carry its token into the log."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = masked(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:  # a traceback's text (the formatter uses it as it is)
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = masked(record.exc_text)
        if record.stack_info:
            record.stack_info = masked(record.stack_info)
        return True


class DaytonaKernelApp(IPKernelApp):
    """Loads ``jupyter_config.*`` and ``daytona_kernel_config.*`` from the Jupyter
    config path, then DAYTONA_KERNEL_* variables on top.

    The command line is applied after all of them (by the base class), so it wins.
    """

    name = "daytona-kernel"
    description = (
        "The Daytona Jupyter kernel: a Python kernel whose cells run in a Daytona sandbox "
        "(backend 'daytona') or in a worker process on this machine (backend 'local'). Jupyter "
        "starts it from a kernelspec; `daytona-kernel --help` manages kernelspecs, sandboxes and "
        "configuration. Every setting is a DaytonaKernel option (`daytona-kernel config --help-all` lists "
        "them), also settable as "
        "DAYTONA_KERNEL_<NAME> or in daytona_kernel_config.py."
    )
    subcommands: dict[str, Any] = {}  # IPKernelApp's `install` would install ipykernel's spec
    classes = [DaytonaKernel, ProfileDir, Session]  # type: ignore[assignment]
    # Without IPython's shell options (autocall, pylab, --no-ignore-cwd ...): cells do not run in this process.
    aliases = Dict({k: v for k, v in kernel_aliases.items() if _trait_class(v) not in _SHELL_CLASSES})
    flags = Dict({k: v for k, v in kernel_flags.items() if not set(v[0]) & _SHELL_CLASSES})
    kernel_class = Type(DaytonaKernel, klass="ipykernel.kernelbase.Kernel")  # type: ignore[assignment]  # a trait, as in IPKernelApp

    config_problems: dict[str, str]  # DaytonaKernel settings refused by checked(), set by init_kernel

    def init_kernel(self) -> None:
        """Leave out invalid DaytonaKernel values before the kernel reads its config; it reports them."""
        good, self.config_problems = checked(self.config)
        self.config[SECTION] = good[SECTION]
        super().init_kernel()

    def initialize(self, argv: list[str] | None = None) -> None:
        super().initialize(argv)
        # atexit runs handlers last-registered first: this one runs before ipykernel stops iopub.
        atexit.register(self._stop_control_thread)

    def _stop_control_thread(self) -> None:
        """Let the control thread finish its request before the iopub thread goes away.

        The control thread flushes stdout through the iopub thread after each request,
        shutdown included. If iopub stops first, that flush waits out its timeout and
        the kernel lingers after a shutdown until the kernel manager kills it.
        """
        if self.control_thread and self.control_thread.is_alive():
            self.control_thread.stop()
            self.control_thread.join(CONTROL_JOIN_TIMEOUT_S)

    def get_default_logging_config(self) -> dict[str, Any]:
        """The kernel's log (stderr, which Jupyter keeps) also takes our modules' loggers, at its level.

        Without this the ``daytona_kernel.*`` loggers had no handler: ``--debug`` left out what the
        backends do, and their warnings went through logging's last-resort handler to whatever
        ``sys.stderr`` was at that moment, which in a kernel is a cell's output stream.
        """
        config: dict[str, Any] = super().get_default_logging_config()
        if "loggers" in config:  # not under pythonw, where traitlets turns logging off
            config["loggers"]["daytona_kernel"] = {"level": "DEBUG", "handlers": ["console"], "propagate": False}
            config.setdefault("filters", {})["masked"] = {"()": MaskedRecords}
            config["handlers"]["console"].setdefault("filters", []).append("masked")
        return config

    def load_config_file(self, *args: Any, **kwargs: Any) -> None:
        super().load_config_file(*args, **kwargs)
        self.update_config(load_config(self.log))


def main() -> None:
    DaytonaKernelApp.launch_instance()
