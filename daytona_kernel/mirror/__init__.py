"""The mirror: the project folder on this machine and the sandbox's working directory, kept the same
both ways (docs/architecture.md, docs/security.md)."""
