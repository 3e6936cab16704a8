"""daytona-kernel: a Jupyter kernel for Python that runs every cell in a Daytona sandbox."""

__version__ = "0.1.0"
