"""`dlsub submit`'s options as one typed record: from the command line, the script's ``#DLSUB`` lines and an
estimate's row, merged by the rules users rely on (the command line wins, mounts add up, an estimate fills
only what the user left unset), then checked into a job's shape and resources.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import click

from dlsub.containers.exports import Exported, ExportError, exported, parse_exports
from dlsub.job.shape import Shape, ShapeError, resolve_shape
from dlsub.job.submit import SubmitError
from dlsub.slurm_plugins.timespec import parse_time_limit


def parse_mem(text: str) -> int:
    """Slurm's --mem syntax (``4096``, ``512M``, ``4G``, ``1T``) in megabytes."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)B?\s*", text, flags=re.IGNORECASE)
    if not m or int(m.group(1)) == 0:
        raise click.BadParameter(f"{text!r} is not a memory size; use e.g. 4096, 512M, 4G")
    value, unit = int(m.group(1)), m.group(2).upper() or "M"
    factor = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}[unit]
    return max(1, int(value * factor))


@dataclass(frozen=True)
class Resources:
    """The checked per-job resources: None where the user gave nothing (dlsub's defaults apply later)."""

    cpus: int | None
    mem_mb: int | None
    time_limit_min: int | None


@dataclass(frozen=True)
class SubmitOptions:
    """Every option `dlsub submit` takes that a ``#DLSUB`` line may also set, as given (not yet checked).

    The field names are the click parameter names, so the command's parameters and a directive line's parse
    map onto it one to one (``from_params``).
    """

    gpus: str | int | None = None
    gpus_per_node: int | None = None
    gpus_step: int | None = None
    nodes: str | int | None = None
    cpu_nodes: int | None = None
    cpu_partition: str | None = None
    cpus: int | None = None
    mem: str | None = None
    time_limit: str | None = None
    partition: str | None = None
    gpu_type: str | None = None
    image: str | None = None
    name: str | None = None
    mode: str | None = None
    mount: tuple[str, ...] = ()
    mount_rw: tuple[str, ...] = ()
    dry_run: bool = False
    as_json: bool = False
    target_loss: float | None = None
    export: str | None = None
    venv: str | None = None

    #: Options whose values add up over #DLSUB lines and the command line, rather than the last one's winning.
    ADDED_UP = ("mount", "mount_rw")

    @classmethod
    def names(cls) -> frozenset[str]:
        return frozenset(f.name for f in dataclasses.fields(cls))

    @classmethod
    def _checked(cls, params: Mapping[str, Any]) -> dict[str, Any]:
        unknown = set(params) - cls.names()
        if unknown:  # a new submit option that this record does not hold yet: a bug, never dropped silently
            raise TypeError(f"not submit options: {', '.join(sorted(unknown))}")
        return {k: (tuple(v) if k in cls.ADDED_UP else v) for k, v in params.items()}

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> SubmitOptions:
        """The options click parsed (by parameter name)."""
        return cls(**cls._checked(params))

    def changed(self, given: Mapping[str, Any]) -> SubmitOptions:
        """These options with ``given``'s in place of theirs."""
        return dataclasses.replace(self, **self._checked(given))

    def filled(self, picked: Mapping[str, Any]) -> SubmitOptions:
        """These options with each one still unset taken from ``picked`` (an estimate's row): the user's win."""
        defaults = SubmitOptions()
        unset = {k: v for k, v in self._checked(picked).items()
                 if v is not None and getattr(self, k) == getattr(defaults, k)}
        return dataclasses.replace(self, **unset)

    def resources(self) -> Resources:
        """--cpus, --mem and --time, checked: SubmitError (or TimeSpecError) naming the option otherwise."""
        if self.cpus is not None and self.cpus < 1:
            raise SubmitError(f"--cpus must be 1 or more, not {self.cpus}")
        try:
            mem_mb = parse_mem(self.mem) if self.mem is not None else None
        except click.BadParameter as exc:
            raise SubmitError(f"--mem: {exc.message}") from exc
        limit = parse_time_limit(self.time_limit) if self.time_limit is not None else None
        return Resources(self.cpus, mem_mb, limit)

    def shape(self) -> Shape:
        """GPUs per node and the (elastic) node count from --gpus, --gpus-per-node, --gpus-step and --nodes."""
        try:
            return resolve_shape(self.nodes, self.gpus, self.gpus_per_node, self.gpus_step)
        except ShapeError as exc:
            raise SubmitError(str(exc)) from exc


#: submit's and estimate's --export and --venv: what of the user's environment the job (or a profiling run) sees.
ENVIRONMENT_OPTIONS: tuple[Callable[[Any], Any], ...] = (
    click.option("--export", "export", default=None, metavar="NONE|ALL|[ALL,]NAME[=value],...",
                 help="What of your shell's environment enters the container, as sbatch's --export: NONE (nothing: "
                      "the image's environment and dlsub's), ALL (all but the host's, Slurm's and dlsub's: PATH, "
                      "LD_*, SLURM_*, ...), or the variables named (NAME as your shell has it, NAME=value set). Your "
                      "PYTHONPATH's entries on mounted paths follow dlsub's library [default: NONE]."),
    click.option("--venv", "venv", default=None, metavar="PATH",
                 help="A virtualenv or conda environment on a shared path, made with the image's Python version: its "
                      "packages follow dlsub's library on the job's PYTHONPATH (mounted read-only)."),
)


def environment_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``command`` with --export and --venv, as submit takes them."""
    for option in reversed(ENVIRONMENT_OPTIONS):
        command = option(command)
    return command


def read_exports(text: str | None) -> Exported:
    """--export read against this shell's environment, as sbatch reads it at submit."""
    try:
        return exported(parse_exports(text), os.environ)
    except ExportError as exc:
        raise SubmitError(str(exc)) from exc
