"""dlsub's settings for a user's commands: one typed object, one precedence.

Precedence: command-line options > environment (``DLSUB_*``) > defaults here.
(The admin policy file, /etc/dlsub/policy.toml, comes with the agent.)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dlsub.containers.podman import DEFAULT_IMAGE
from dlsub.job.filesystems import posix_acls_work

#: A user's dlsub home under their home directory, without ``$DLSUB_HOME``; the job store in it.
HOME_DIR = ".dlsub"
STORE_FILE = "dlsub.db"


def store_of(user_home: Path) -> Path:
    """The job store of an account whose home directory is ``user_home`` (where its own commands keep it,
    unless its ``$DLSUB_HOME`` says otherwise: another account's environment is not known)."""
    return user_home / HOME_DIR / STORE_FILE


@dataclass(frozen=True)
class Settings:
    home: Path  # per-user state: the job store and job directories
    image: str = DEFAULT_IMAGE
    # The OCI runtime for your containers ($DLSUB_RUNTIME); None: the site's (policy.toml [containers]
    # runtime), else the node's Podman default.
    runtime: str | None = None
    cpus: int = 2
    mem_mb: int = 4096
    signal_grace_s: int = 60  # SIGUSR1 this long before the time limit
    # Where the job directories go instead of ``home``/jobs (the site's [site] job_directories, where the
    # home has no POSIX ACLs); None: under ``home``.
    jobs_root: Path | None = None

    @property
    def db_path(self) -> Path:
        return self.home / STORE_FILE

    @property
    def jobs_dir(self) -> Path:
        return self.jobs_root or self.home / "jobs"


_ENV = {
    "image": ("DLSUB_IMAGE", str),
    "runtime": ("DLSUB_RUNTIME", str),
    "cpus": ("DLSUB_CPUS", int),
    "mem_mb": ("DLSUB_MEM_MB", int),
    "signal_grace_s": ("DLSUB_SIGNAL_GRACE", int),
}


def load_settings(environ: Mapping[str, str] | None = None, job_directories: Path | None = None) -> Settings:
    """The settings from ``environ`` (the process's). ``job_directories``: the site's folder for this user's job
    directories where their dlsub home keeps no POSIX ACLs (:meth:`SitePaths.job_directories_of`); used only
    there, and never over ``$DLSUB_HOME``, which is the user's own choice."""
    env = os.environ if environ is None else environ
    home = Path(env.get("DLSUB_HOME") or Path.home() / HOME_DIR)
    jobs_root = None
    if job_directories is not None and not env.get("DLSUB_HOME") and not posix_acls_work(home / "jobs"):
        jobs_root = job_directories
    values: dict[str, object] = {}
    for name, (var, kind) in _ENV.items():
        if env.get(var):
            try:
                values[name] = kind(env[var])
            except ValueError as exc:
                raise ValueError(f"${var}={env[var]!r} is not a valid {kind.__name__}") from exc
    return Settings(home=home, jobs_root=jobs_root, **values)  # type: ignore[arg-type]
