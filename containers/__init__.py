"""Rootless Podman: the container command a job runs, and image checks.

Only argv lists are built here; rendering into a batch script happens in
:mod:`dlsub.slurm_plugins.sbatch`, and nothing here submits anything.
"""

from dlsub.containers.podman import DEFAULT_IMAGE, ContainerSpec, ImageError, Raw, podman_run_lines, podman_run_words

__all__ = ["DEFAULT_IMAGE", "ContainerSpec", "ImageError", "Raw", "podman_run_lines", "podman_run_words"]
