"""The kernel application: ipykernel's, with our config files and env-var layer."""

from __future__ import annotations

from ipykernel.kernelapp import IPKernelApp
from jupyter_core.paths import jupyter_config_path
from traitlets import Type

from .config import env_config
from .kernel import DaytonaKernel

CONFIG_FILES = ("jupyter_config", "daytona_kernel_config")


class DaytonaKernelApp(IPKernelApp):
    """Loads ``jupyter_config.*`` and ``daytona_kernel_config.*`` from the Jupyter
    config path, then DAYTONA_KERNEL_* variables on top.

    The command line is applied after all of them (by the base class), so it wins.
    """

    name = "daytona-kernel"
    kernel_class = Type(DaytonaKernel, klass="ipykernel.kernelbase.Kernel")

    def load_config_file(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        super().load_config_file(*args, **kwargs)
        for basename in CONFIG_FILES:
            for config, filename in self._load_config_files(basename, path=jupyter_config_path(), log=self.log):
                self.log.debug("loaded config file %s", filename)
                self.update_config(config)
        self.update_config(env_config())


def main() -> None:
    DaytonaKernelApp.launch_instance()
