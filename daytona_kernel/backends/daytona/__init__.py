"""The Daytona backend: the Daytona SDK behind the ``Sandbox`` interface (docs/architecture.md)."""
