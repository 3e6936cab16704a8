"""The local backend: the ``Sandbox`` interface with a worker process on this machine per context."""
