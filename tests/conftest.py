"""Shared fixtures. Unit tests (tests/unit) use fakes; integration tests
(tests/integration) use the live local Slurm testbed and rootless Podman."""
