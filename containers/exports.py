"""What of the submitting shell's environment enters a job's container: ``dlsub submit --export``, with sbatch's
meaning and syntax, read against the environment at submit time (as sbatch reads it).

The values are written into the job directory's env file (private to the user) that ``podman run --env-file``
reads, never onto a command line, where every user of the node could read them (``ps``).

``NONE`` (the default) passes nothing of the shell: the container has its image's environment and dlsub's own
variables. ``ALL`` passes every variable but those that belong to the host, to Slurm or to dlsub (:data:`NEVER`,
:data:`NEVER_PREFIXES`): the image's ``PATH`` and the node's ``SLURM_*`` are the container's, never the login
shell's. ``NAME`` passes one variable as the shell has it, ``NAME=value`` sets it; a comma separates several,
after ``ALL,`` or alone. A name of the never-list given by name is refused, not dropped.

``PYTHONPATH`` is the one variable that is merged, not passed: its entries that the container sees (on a mounted
path) follow dlsub's library; the others are left out, and submit says which.

The site's own variables for every job (policy.toml ``[containers] environment``: a threads setting for its
nodes, a cache or proxy path) follow the same rules and come first: a user's ``--export`` of the same name wins.

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
    # Read by a shell or a dynamic loader in the container, or naming host paths the image does not have.
    "BASH_ENV", "ENV", "IFS", "PS4", "PROMPT_COMMAND", "CDPATH", "GLOBIGNORE", "SHELLOPTS", "BASHOPTS", "TMP",
    "TEMP", "CPATH", "LIBRARY_PATH", "PKG_CONFIG_PATH", "MANPATH", "INFOPATH", "CUDA_HOME", "CUDA_PATH",
    "ZE_AFFINITY_MASK", "ONEAPI_DEVICE_SELECTOR",
})
#: Prefixes of the same: the dynamic loader's, Slurm's and its MPI's, dlsub's, torchrun's, the desktop session's.
NEVER_PREFIXES = ("LD_", "SLURM_", "SLURMD_", "SBATCH_", "SRUN_", "SALLOC_", "SPANK_", "PMI_", "PMIX_", "OMPI_",
                  "DLSUB_", "TORCHELASTIC_", "PET_", "XDG_", "SSH_", "DBUS_", "BASH_FUNC_", "__MODULES_", "_LMFILES_",
                  "NVIDIA_", "LMOD_", "__LMOD_", "_ModuleTable")
#: Set for the container by the batch step from the shell's own at submit (sbatch keeps it): named with --export,
#: they are refused with that said, not as the node's.
FROM_THE_BATCH_STEP = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
#: Merged into the container's own (see the module's doc), never passed as it is.
MERGED = "PYTHONPATH"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
#: The most bytes one value, and all of them, may have (they are the container's environment, which the kernel
#: bounds with its arguments: ARG_MAX).
MAX_VALUE = 64 * 1024
MAX_TOTAL = 256 * 1024


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
    entries = _split(text)
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
        if name in FROM_THE_BATCH_STEP:
            raise ExportError(f"--export: {name} is set in the container from your shell's own at submit (else "
                              "the site's, else the node's interface): export it in your shell before dlsub submit "
                              "and leave it out of --export")
        if never_passed(name):
            raise ExportError(f"--export: {name} never enters the container: the host's, Slurm's, torchrun's and "
                              "dlsub's variables are the node's (PATH is the image's); leave it out")
        if has_value:
            value = _unquoted(value)
            problem = _value_problem(value)
            if problem:
                raise ExportError(f"--export: the value of {name} {problem}")
            values.append((name, value))
        else:
            names.append(name)
    return Exports(everything, tuple(names), tuple(values))


def _split(text: str) -> list[str]:
    """``text`` split at its commas, as Slurm splits --export: a value in quotes ('a,b' or "a,b") keeps its own."""
    entries: list[str] = []
    current = quote = ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"" and current.endswith("="):  # a value that opens with a quote runs to its close
            quote = ch
        elif ch == ",":
            entries.append(current)
            current = ""
            continue
        current += ch
    if quote:
        raise ExportError(f"--export {text}: a quote is not closed")
    return [*entries, current]


def _unquoted(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def _value_problem(value: str) -> str:
    """Why ``value`` cannot be passed ("" when it can): it is one line of the job's env file, UTF-8, bounded."""
    if any(ch in value for ch in "\0\r\n"):
        return "holds a line break or a NUL byte (each variable is one line of the job's env file)"
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return "is not UTF-8 text"
    if size > MAX_VALUE:
        return f"is over {MAX_VALUE // 1024} KiB"
    return ""


def exported(exports: Exports, environ: Mapping[str, str]) -> Exported:
    """What enters the container of ``exports`` read against ``environ`` (the submitting shell's)."""
    env: dict[str, str] = {}
    notes: list[str] = []
    if exports.all:
        taken = {n: v for n, v in environ.items()
                 if not never_passed(n) and n != MERGED and _NAME.match(n)}  # never_passed: the batch step's too
        unfit = sorted(n for n, v in taken.items() if _value_problem(v))
        env.update((n, v) for n, v in taken.items() if n not in unfit)
        shown = sorted(env)
        notes.append(f"--export ALL: {len(env)} variable(s) of your shell enter the container ("
                     f"{', '.join(shown[:12])}{', ...' if len(shown) > 12 else ''}); the host's, Slurm's, torchrun's "
                     f"and dlsub's never do ({sum(n not in taken and n != MERGED for n in environ)} left out)"
                     + (f"; left out too, as no env file line can hold them: {', '.join(unfit)}" if unfit else ""))
    for name in exports.names:
        if name not in environ:
            notes.append(f"--export {name}: {name} is not set in your shell; the job gets none")
        elif name != MERGED:
            problem = _value_problem(environ[name])
            if problem:
                raise ExportError(f"--export {name}: its value in your shell {problem}")
            env[name] = environ[name]
    env.update(exports.values)
    if sum(len(n) + len(v.encode()) + 2 for n, v in env.items()) > MAX_TOTAL:
        raise ExportError(f"--export: the variables come to over {MAX_TOTAL // 1024} KiB, more than a process's "
                          "environment should carry; name the ones the job needs (--export NAME,...)")
    # PYTHONPATH is merged into the container's (the caller keeps the entries the container sees).
    path_text = env.pop(MERGED, None)
    if path_text is None and (exports.all or MERGED in exports.names):
        path_text = environ.get(MERGED)
    path = tuple(p for p in (path_text or "").split(":") if p)
    return Exported(tuple(sorted(env.items())), path, tuple(notes))


def site_variable_problem(name: str, value: str) -> str:
    """Why the site's policy cannot set ``name`` to ``value`` in every job's container ("" when it can)."""
    if not _NAME.match(name):
        return "is not a variable's name (letters, digits and _, not starting with a digit)"
    if name in FROM_THE_BATCH_STEP:
        return "is set from [containers] socket_ifname; set that instead"
    if name == MERGED:
        return "is dlsub's library's and the user's (--export PYTHONPATH, --venv); name packages' paths there"
    if never_passed(name):
        return "is the node's (the host's, Slurm's, torchrun's and dlsub's variables are never set in the container)"
    problem = _value_problem(value)
    return f"has a value that {problem}" if problem else ""


def with_site_variables(site: Sequence[tuple[str, str]],
                        user: Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The container's variables: the site's, each replaced by the user's ``--export`` of the same name."""
    return tuple(sorted({**dict(site), **dict(user)}.items()))


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
