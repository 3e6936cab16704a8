"""Benchmarks of daytona-kernel against stock ipykernel and the raw Daytona SDK."""
