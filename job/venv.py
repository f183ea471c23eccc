"""``dlsub submit --venv PATH``: a virtualenv or conda environment of the user's, on a path the nodes share,
whose packages a job uses beside its image's.

The container mounts the environment read-only at its own path and puts its ``site-packages`` on the
job's PYTHONPATH after dlsub's library: the image's Python imports the environment's packages, as it would
with the environment's own interpreter, and torch comes from the environment when it has one. An environment
is made for one Python version (``lib/pythonX.Y/site-packages``); its version must be the image's, or its
compiled packages would not load: submit refuses another, naming both.
"""

from __future__ import annotations

import re
from pathlib import Path

_SITE = re.compile(r"^python(\d+)\.(\d+)\Z")


class VenvError(ValueError):
    """An environment a job cannot use; the message names the path and what to do."""


def site_packages(env: Path, python: str | None) -> Path:
    """The ``site-packages`` of the environment at ``env`` (a virtualenv's or conda's ``lib/pythonX.Y``) for the
    image's ``python`` ("3.11.2"; None: unknown, then the environment's only one)."""
    if not ((env / "pyvenv.cfg").is_file() or (env / "conda-meta").is_dir()):
        raise VenvError(f"--venv {env}: not a virtualenv or conda environment (it has no pyvenv.cfg nor "
                        "conda-meta); give the folder you made with python3 -m venv, virtualenv or conda create")
    if not (env / "lib").is_dir():
        raise VenvError(f"--venv {env}: not a virtualenv or conda environment (no lib/pythonX.Y/site-packages in "
                        "it); give the folder you made with python3 -m venv, virtualenv or conda create")
    found = {f"{m.group(1)}.{m.group(2)}": p / "site-packages" for p in sorted((env / "lib").iterdir())
             if (m := _SITE.match(p.name)) and (p / "site-packages").is_dir()}
    if not found:
        raise VenvError(f"--venv {env}: no lib/pythonX.Y/site-packages in it; give the folder you made with "
                        "python3 -m venv, virtualenv or conda create")
    wanted = ".".join(python.split(".")[:2]) if python else None
    if wanted is None and len(found) == 1:
        return next(iter(found.values()))
    if wanted in found:
        return found[wanted]
    raise VenvError(f"--venv {env}: its packages are for Python {', '.join(sorted(found))}, the image runs Python "
                    f"{wanted or 'of a version not known here'}: make the environment with the image's Python "
                    "(podman run --rm -v \"$PWD:$PWD\" IMAGE python3 -m venv --system-site-packages PATH), or "
                    "choose an image of its version with --image")
