"""The site files dlsub ships beside its code (installed as ``dlsub.etc``, so that a site that installs the
wheel has them; `dlsub doctor` says where): ``policy.toml.example``, the systemd units (``systemd/``), the
backfill cron entry (``cron.d/``) and the TaskEpilog (``slurm/taskepilog.sh``). Nothing here is imported;
``etc/testbed/`` (the testbed's own configuration) is not installed."""
