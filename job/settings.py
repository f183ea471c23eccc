"""dlsub's settings for a user's commands: one typed object, one precedence.

Precedence: command-line options > environment (``DLSUB_*``) > defaults here.
(The admin policy file, /etc/dlsub/policy.toml, comes with the agent.)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from dlsub.containers.podman import DEFAULT_IMAGE

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

    @property
    def db_path(self) -> Path:
        return self.home / STORE_FILE

    @property
    def jobs_dir(self) -> Path:
        return self.home / "jobs"


_ENV = {
    "image": ("DLSUB_IMAGE", str),
    "runtime": ("DLSUB_RUNTIME", str),
    "cpus": ("DLSUB_CPUS", int),
    "mem_mb": ("DLSUB_MEM_MB", int),
    "signal_grace_s": ("DLSUB_SIGNAL_GRACE", int),
}


def load_settings(environ: dict[str, str] | None = None) -> Settings:
    env = os.environ if environ is None else environ
    home = Path(env.get("DLSUB_HOME") or Path.home() / HOME_DIR)
    values: dict[str, object] = {}
    for name, (var, kind) in _ENV.items():
        if env.get(var):
            try:
                values[name] = kind(env[var])
            except ValueError as exc:
                raise ValueError(f"${var}={env[var]!r} is not a valid {kind.__name__}") from exc
    return Settings(home=home, **values)  # type: ignore[arg-type]
