"""What of the submitting shell's environment enters a job's container: ``dlsub submit --export``, with sbatch's
meaning and syntax, read against the environment at submit time (as sbatch reads it).

``NONE`` (the default) passes nothing of the shell: the container has its image's environment and dlsub's own
variables. ``ALL`` passes every variable but those that belong to the host, to Slurm or to dlsub (:data:`NEVER`,
:data:`NEVER_PREFIXES`): the image's ``PATH`` and the node's ``SLURM_*`` are the container's, never the login
shell's. ``NAME`` passes one variable as the shell has it, ``NAME=value`` sets it; a comma separates several,
after ``ALL,`` or alone. A name of the never-list given by name is refused, not dropped.

``PYTHONPATH`` is the one variable that is merged, not passed: its entries that the container sees (on a mounted
path) follow dlsub's library; the others are left out, and submit says which.

Pure: the caller gives the environment; nothing here reads or writes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

#: Variables the container never takes from the login shell: the host's (its PATH, HOME, shell and session),
#: Python's own (the image's interpreter), the GPUs Slurm gave the node, torchrun's and dlsub's.
NEVER = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "SHLVL", "PWD", "OLDPWD", "TMPDIR", "HOSTNAME", "TERM", "MAIL",
    "_", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV",
    "CONDA_EXE", "CONDA_SHLVL", "CONDA_PYTHON_EXE", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "MASTER_ADDR", "MASTER_PORT", "RANK",
    "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME",
    "ROLE_WORLD_SIZE", "NODE_RANK", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
    "DISPLAY", "XAUTHORITY", "KRB5CCNAME", "MODULEPATH", "LOADEDMODULES", "MODULESHOME",
})
#: Prefixes of the same: the dynamic loader's, Slurm's and its MPI's, dlsub's, torchrun's, the desktop session's.
NEVER_PREFIXES = ("LD_", "SLURM_", "SLURMD_", "SBATCH_", "SRUN_", "SALLOC_", "SPANK_", "PMI_", "PMIX_", "OMPI_",
                  "DLSUB_", "TORCHELASTIC_", "PET_", "XDG_", "SSH_", "DBUS_", "BASH_FUNC_", "__MODULES_", "_LMFILES_")
#: Merged into the container's own (see the module's doc), never passed as it is.
MERGED = "PYTHONPATH"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
#: The most bytes a value given or passed may have: it is written into the job's batch script.
MAX_VALUE = 64 * 1024


class ExportError(ValueError):
    """An --export that cannot be honoured; the message names the entry and what to do."""


@dataclass(frozen=True)
class Exports:
    """What --export asked for, parsed: every variable of the shell (``all``), the named ones, and the set ones."""

    all: bool = False
    names: tuple[str, ...] = ()
    values: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Exported:
    """The variables for the container (name, value, in name order), the shell's PYTHONPATH entries to merge,
    and what submit says about them (a name that was not set, how many ``ALL`` left out)."""

    env: tuple[tuple[str, str], ...] = ()
    python_path: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def never_passed(name: str) -> bool:
    return name in NEVER or name.startswith(NEVER_PREFIXES)


def parse_exports(text: str | None) -> Exports:
    """sbatch's --export syntax: ``NONE``, ``NIL``, ``ALL``, or ``[ALL,]NAME[=value][,NAME[=value]...]``."""
    if text is None or text.strip() in ("", "NONE", "NIL"):
        return Exports()
    entries = text.split(",")
    everything = entries[0] == "ALL"
    names: list[str] = []
    values: list[tuple[str, str]] = []
    for entry in entries[1:] if everything else entries:
        name, has_value, value = entry.partition("=")
        if entry in ("ALL", "NONE", "NIL"):
            raise ExportError(f"--export {text}: {entry} comes first and alone (as sbatch's: ALL,NAME,...)")
        if not _NAME.match(name):
            raise ExportError(f"--export: {entry!r} is not NAME or NAME=value (a name is letters, digits and _, "
                              "not starting with a digit; a value cannot hold a comma)")
        if never_passed(name):
            raise ExportError(f"--export: {name} never enters the container: the host's, Slurm's, torchrun's and "
                              "dlsub's variables are the node's (PATH is the image's); leave it out")
        if has_value:
            _check_value(name, value)
            values.append((name, value))
        else:
            names.append(name)
    return Exports(everything, tuple(names), tuple(values))


def _check_value(name: str, value: str) -> None:
    if "\0" in value or len(value.encode(errors="surrogateescape")) > MAX_VALUE:
        raise ExportError(f"--export: the value of {name} holds a NUL byte or is over {MAX_VALUE // 1024} KiB; "
                          "put it in a file the job reads")


def exported(exports: Exports, environ: Mapping[str, str]) -> Exported:
    """What enters the container of ``exports`` read against ``environ`` (the submitting shell's)."""
    env: dict[str, str] = {}
    notes: list[str] = []
    if exports.all:
        left_out = sorted(n for n in environ if never_passed(n) and n != MERGED)
        env.update((n, v) for n, v in environ.items() if not never_passed(n) and n != MERGED and _NAME.match(n))
        if left_out:
            notes.append(f"--export ALL: {len(env)} variable(s) of your shell enter the container; the host's, "
                         f"Slurm's and dlsub's never do ({len(left_out)} left out, e.g. {', '.join(left_out[:4])})")
    for name in exports.names:
        if name not in environ:
            notes.append(f"--export {name}: {name} is not set in your shell; the job gets none")
        elif name != MERGED:
            env[name] = environ[name]
    env.update(exports.values)
    for name, value in env.items():
        _check_value(name, value)
    # PYTHONPATH is merged into the container's (the caller keeps the entries the container sees).
    path_text = env.pop(MERGED, None)
    if path_text is None and (exports.all or MERGED in exports.names):
        path_text = environ.get(MERGED)
    path = tuple(p for p in (path_text or "").split(":") if p)
    return Exported(tuple(sorted(env.items())), path, tuple(notes))


def seen_entries(entries: Sequence[str], mounted: Sequence[PurePosixPath]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The PYTHONPATH ``entries`` the container sees (absolute, under a mounted path) and the others."""
    kept: list[str] = []
    left: list[str] = []
    for entry in entries:
        path = PurePosixPath(entry)
        seen = path.is_absolute() and ".." not in path.parts and any(
            path == m or m in path.parents for m in mounted)
        (kept if seen else left).append(entry)
    return tuple(kept), tuple(left)
