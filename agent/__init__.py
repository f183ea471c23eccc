"""The agent: the daemon that watches Slurm each tick and moves and resizes jobs (reconcile.py is the tick)."""
