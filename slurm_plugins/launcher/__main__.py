"""``python -m dlsub.slurm_plugins.launcher ROLE ...``: what the batch script execs (slurm_plugins/batch.sh)."""

import sys

from dlsub.slurm_plugins.launcher.roles import main

sys.exit(main(sys.argv[1:]))
