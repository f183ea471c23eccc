"""The one Slurm client dlsub uses, batch-script rendering, and Slurm-side files.

Everything that talks to Slurm goes through :class:`SlurmClient` and its
single ``_run(argv)`` seam; :mod:`dlsub.slurm_plugins.fake` is a stateful
stand-in behind that seam for unit tests.
"""

from dlsub.slurm_plugins.client import SlurmClient, SlurmError, SlurmUnreachable
from dlsub.slurm_plugins.models import Partition, SlurmJob, SlurmNode

__all__ = ["SlurmClient", "SlurmError", "SlurmUnreachable", "SlurmNode", "Partition", "SlurmJob"]
