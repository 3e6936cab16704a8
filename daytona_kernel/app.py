"""The kernel application: ipykernel's, with our config files and env-var layer."""

from __future__ import annotations

import atexit
from typing import Any

from ipykernel.kernelapp import IPKernelApp
from traitlets import Type

from .config import SECTION, checked, load_config
from .kernel import DaytonaKernel

CONTROL_JOIN_TIMEOUT_S = 10.0


class DaytonaKernelApp(IPKernelApp):
    """Loads ``jupyter_config.*`` and ``daytona_kernel_config.*`` from the Jupyter
    config path, then DAYTONA_KERNEL_* variables on top.

    The command line is applied after all of them (by the base class), so it wins.
    """

    name = "daytona-kernel"
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

    def load_config_file(self, *args: Any, **kwargs: Any) -> None:
        super().load_config_file(*args, **kwargs)
        self.update_config(load_config(self.log))


def main() -> None:
    DaytonaKernelApp.launch_instance()
