"""Render the batch script for a dlsub job (pure: a spec in, a string out).

The script is the packaged template ``batch.sh`` (valid bash, checked by
shellcheck): Slurm's ``#SBATCH`` lines, the ``podman run`` line of the job's
container, and an ``exec`` of dlsub's batch launcher
(``slurm_plugins/launcher/``) with the job's settings. The launcher carries the
resume protocol, so no daemon is needed for it:

* ``#SBATCH --signal=B:USR1@GRACE``: Slurm signals the batch step GRACE
  seconds before the time limit; ``dlsub requeue`` sends the same signal.
  The launcher forwards it to ``podman run``, which proxies it to the launcher
  in the container, which asks the training processes to checkpoint.
* SIGTERM (scancel, preemption) is forwarded the same way, but the job is not
  requeued by the launcher: Slurm decides (cancel, or requeue on preemption).
* When the container exits with RESUME_EXIT_CODE after anything but SIGTERM,
  the launcher runs ``scontrol requeue``; the next attempt restores the checkpoint.
* SIGUSR2 is the agent's "checkpoint for a move": the training is asked to
  checkpoint (SIGUSR1 to the container) and the job is requeued *held*
  (``scontrol requeuehold``), so that the agent can change its partition and
  GPUs before releasing it; the next attempt resumes there.
* The launcher removes the attempt's container when it ends; the TaskEpilog in
  etc/slurm catches what it cannot (SIGKILL after KillWait).
* Resume-requeues are bounded by the site's ``max_continuations``, counted
  in the job directory (``contract.MARKERS_DIR/REQUEUE_COUNT_FILE``); moves
  do not count.

Its ``@NAME@`` placeholders take contract constants (checked to be plain
words) and user strings quoted with :func:`shlex.quote`; the only unquoted
words of the ``podman run`` line are :class:`~dlsub.containers.podman.Raw`
templates, the node's values the launcher hands the script's ``container``
part. A ``# @NAME@`` line takes whole lines (the ``#SBATCH`` directives).
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources

from dlsub import contract
from dlsub.containers.podman import ContainerSpec, Raw, image_choice_lines, podman_run_lines
from dlsub.slurm_plugins.timespec import format_minutes

TEMPLATE = "batch.sh"
_PLACEHOLDER = re.compile(r"@([A-Z][A-Z0-9_]*)@")
_LINE_PLACEHOLDER = re.compile(r"^# @([A-Z][A-Z0-9_]*)@$", re.MULTILINE)
_WORD = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclass(frozen=True)
class BatchSpec:
    dlsub_id: str
    job_name: str
    partition: str
    container: ContainerSpec
    nodes: int = 1
    gpus_per_node: int = 0
    cpus_per_task: int = 2
    mem_mb: int = 4096
    time_limit_min: int | None = None  # None: the partition's DefaultTime
    signal_grace_s: int = 60
    dlsub_version: str = ""
    # Tags after the id in --comment, for the agent: mode, ideal partition, GPUs wanted.
    tags: tuple[tuple[str, str], ...] = ()
    # Resume-requeues the script may make (policy time_limits.max_continuations; 0: none).
    max_continuations: int = 20
    # The GPUs per node a job started on none asked for (immediate mode on CPUs); 0 otherwise. An attempt
    # without GPUs that dies of torch's no-GPU error is then sent back, once, to wait for them.
    gpus_wanted: int = 0
    # main | worker (a task of an elastic job's held worker array)
    role: str = "main"
    # An elastic job's node range (MIN, MAX): the main job holds MIN nodes and
    # a held worker array of MAX - MIN one-node tasks joins its rendezvous.
    elastic: tuple[int, int] | None = None
    # The main job's worker array, ended with the job (its Slurm id, once submitted).
    worker_array: int | None = None
    # A heterogeneous job's CPU component: nodes on another partition that run
    # the same script with ``run.role == "cpu"`` (data loading, evaluation, a
    # parameter server) beside the GPU trainers. One hetjob: all start together.
    cpu_nodes: int = 0
    cpu_partition: str = ""
    cpu_cpus: int = 2
    cpu_mem_mb: int = 4096
    # The kind of GPU asked for, as Slurm's GRES names it (``--gres=gpu:a100:4``); "": any kind (``gpu:4``).
    gpu_type: str = ""
    # The Python of the dlsub installation that renders the script (its venv's, beside ``container.library_dir``):
    # it runs the batch launcher on every node, so every node needs it at this path.
    python: str = field(default_factory=lambda: sys.executable)

    @property
    def gang(self) -> bool:
        """Whether torchrun forms its group through a rendezvous (several nodes, or an elastic range)."""
        return self.nodes > 1 or self.elastic is not None


def safe_job_name(text: str) -> str:
    """A Slurm job name from a script name: letters, digits, ``._-`` only."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")
    return name[:64] or "dlsub"


def lines_to_shell(lines: Sequence[Sequence[str]], indent: str = "    ") -> str:
    """One shell command from lines of words: literal words quoted, Raw words as they are."""
    rendered = [" ".join(w if isinstance(w, Raw) else shlex.quote(w) for w in line) for line in lines]
    return (" \\\n" + indent).join(rendered)


def template_text() -> str:
    return resources.files("dlsub.slurm_plugins").joinpath(TEMPLATE).read_text(encoding="utf-8")


def fill_template(template: str, words: Mapping[str, str], lines: Mapping[str, str]) -> str:
    """Replace ``# @NAME@`` lines by ``lines[NAME]`` and ``@NAME@`` by ``words[NAME]``, in one pass each.

    Every placeholder must have a value and every value a placeholder, so a
    renamed one fails here rather than reaching Slurm. Values are inserted
    as they are: callers quote them.
    """
    used: set[str] = set()

    def take(table: Mapping[str, str], match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in table:
            raise KeyError(f"template {TEMPLATE} has @{name}@, which the renderer does not fill")
        used.add(name)
        return table[name]

    text = _LINE_PLACEHOLDER.sub(lambda m: take(lines, m), template)
    # The podman line goes in last: user strings in it are never scanned for placeholders.
    text = _PLACEHOLDER.sub(lambda m: take(words, m), text)
    missing = (set(words) | set(lines)) - used
    if missing:
        raise KeyError(f"template {TEMPLATE} lacks {', '.join(sorted('@' + m + '@' for m in missing))}")
    return text


def _word(value: object) -> str:
    """A contract constant as a bare shell word (no quoting needed, and none inside JSON strings)."""
    text = str(value)
    if not _WORD.match(text):
        raise ValueError(f"{text!r} is not a plain word; contract names, codes and signals must be")
    return text


def render_sbatch(spec: BatchSpec) -> str:
    """The batch script for ``spec``: ``#SBATCH`` lines, then the template with its placeholders filled.

    Every check runs before any text is produced, so a spec Slurm would
    misread raises ``ValueError`` instead of becoming a script.
    """
    _check_spec(spec)
    container = _rendezvous_container(spec)
    directives = _sbatch_directives(spec, container)
    podman, podman_cpu = _podman_commands(spec, container)
    words = _template_words(spec, container, podman, podman_cpu)
    lines = {"SBATCH_DIRECTIVES": "\n".join(f"#SBATCH {d}" for d in directives)}
    return fill_template(template_text(), words, lines)


def _check_spec(spec: BatchSpec) -> None:
    """Refuse the shapes the script and Slurm cannot run, with what to change."""
    if spec.nodes < 1:
        raise ValueError(f"nodes must be 1 or more, not {spec.nodes}")
    if spec.max_continuations < 0:
        raise ValueError(f"max_continuations must be 0 or more, not {spec.max_continuations}")
    if spec.role not in contract.ROLES:
        raise ValueError(f"role {spec.role!r}; valid roles: {', '.join(contract.ROLES)}")
    if spec.elastic is not None and not 1 <= spec.elastic[0] < spec.elastic[1]:
        raise ValueError(f"elastic range {spec.elastic} is not MIN < MAX")
    if spec.role == "worker" and (spec.elastic is None or spec.nodes != 1):
        raise ValueError("a worker script belongs to an elastic job and runs on one node")
    if spec.gpu_type and contract.valid_gpu_type(spec.gpu_type) is None:
        raise ValueError(f"GPU type {spec.gpu_type!r}: letters, digits, '_', '.', '-' only (as Slurm's GRES names it)")
    for partition, _, _ in spec.container.partition_images:
        if not contract.valid_partition(partition):
            raise ValueError(f"partition {partition!r} of the site's partition_images: letters, digits, '._-' only")
    if not spec.python.startswith("/"):
        raise ValueError(f"the launcher's Python {spec.python!r} is not an absolute path")
    if spec.cpu_nodes and (spec.elastic is not None or not spec.cpu_partition):
        raise ValueError("a CPU component needs its partition, and an elastic job cannot have one "
                         "(Slurm's heterogeneous jobs cannot be job arrays)")


def _rendezvous_container(spec: BatchSpec) -> ContainerSpec:
    """The container with torchrun's rendezvous set when the job is a gang, else as given.

    The rendezvous id is the dlsub id so every node (and an elastic job's
    workers) meets in the same group; the main job re-forms it after a member
    leaves, and a worker re-forms with it only when the main job says so.
    """
    if not spec.gang:
        return spec.container
    low, high = spec.elastic or (spec.nodes, spec.nodes)
    return dataclasses.replace(spec.container, nnodes=f"{low}:{high}" if high > low else str(low),
                               rendezvous_id=spec.dlsub_id, follow=spec.role == "worker")


def _sbatch_directives(spec: BatchSpec, container: ContainerSpec) -> list[str]:
    """The ``#SBATCH`` options, in the order the golden scripts have them."""
    directives = [*_resource_directives(spec), *_resume_directives(spec, container),
                  *_cpu_component_directives(spec)]
    for d in directives:
        # Each directive is one line of the script: a line break would start a new (unchecked) line.
        if any(ch in d for ch in "\n\r"):
            raise ValueError(f"newline in an #SBATCH directive: {d!r}")
    return directives


def _resource_directives(spec: BatchSpec) -> list[str]:
    """Name, partition and what each node of the (first) component gets."""
    directives = [
        f"--job-name={safe_job_name(spec.job_name)}",
        f"--partition={spec.partition}",
        f"--nodes={spec.nodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={spec.cpus_per_task}",
        f"--mem={spec.mem_mb}M",
    ]
    if spec.role == "worker":
        assert spec.elastic is not None
        # One task per node the job may add; held until the agent points one at idle GPUs.
        directives += [f"--array=0-{spec.elastic[1] - spec.elastic[0] - 1}", "--hold"]
    if spec.time_limit_min is not None:
        directives.append(f"--time={format_minutes(spec.time_limit_min)}")
    if spec.gpus_per_node:
        kind = f"{spec.gpu_type}:" if spec.gpu_type else ""
        directives.append(f"--gres=gpu:{kind}{spec.gpus_per_node}")
    return directives


def _resume_directives(spec: BatchSpec, container: ContainerSpec) -> list[str]:
    """Output into the job directory, the checkpoint signal before the time limit, requeueing, and
    the ``--comment`` tags the agent reads."""
    comment = ";".join([f"{contract.COMMENT_PREFIX}{spec.dlsub_id}", *(f"{k}={v}" for k, v in spec.tags)])
    # A worker task's own file (`dlsub logs` reads them after the main job's): with %j each would be named by
    # the job id Slurm gives the task only when it starts, which `dlsub logs` would have to ask Slurm for.
    pattern = contract.WORKER_OUTPUT_PATTERN if spec.role == "worker" else contract.OUTPUT_PATTERN
    return [
        f"--output={container.job_dir}/{pattern}",
        "--open-mode=append",
        f"--signal=B:{contract.CHECKPOINT_SIGNAL}@{spec.signal_grace_s}",
        "--requeue",
        "--comment=" + comment,
    ]


def _cpu_component_directives(spec: BatchSpec) -> list[str]:
    """A heterogeneous job's CPU component, after sbatch's own ``hetjob`` separator; none without one."""
    if not spec.cpu_nodes:
        return []
    return ["hetjob", f"--partition={spec.cpu_partition}", f"--nodes={spec.cpu_nodes}",
            "--ntasks-per-node=1", f"--cpus-per-task={spec.cpu_cpus}", f"--mem={spec.cpu_mem_mb}M"]


def _image_choice(container: ContainerSpec) -> str:
    """The container part's lines that pick the image of the attempt's partition (the site's image per
    partition), or a comment that the podman line names the one image."""
    lines = image_choice_lines(container)
    if not lines:
        return "# One image on every partition: the podman line below names it."
    return "\n    ".join(["# The image of the partition this attempt runs on (the site's policy.toml [containers]",
                          "# partition_images, as submit found them), else the job's own.", *lines])


def _container_labels(spec: BatchSpec) -> list[str]:
    """The ``podman run --label`` values; the Slurm ones are expanded by the batch shell at run time."""
    return [f"{contract.LABEL_JOB_ID}={spec.dlsub_id}", Raw(f'"{contract.LABEL_SLURM_JOB_ID}=${{SLURM_JOB_ID}}"'),
            Raw(f'"{contract.LABEL_ATTEMPT}=${{SLURM_JOB_ID}}-${{SLURM_RESTART_COUNT:-0}}"'),
            Raw(f'"{contract.LABEL_NODE}=${{SLURMD_NODENAME:-}}"')]


def _podman_commands(spec: BatchSpec, container: ContainerSpec) -> tuple[str, str]:
    """The trainers' ``exec podman run`` command and the CPU component's; without a CPU component the
    template's CPU branch gets ``exit 2``, so a stray ``DLSUB_ROLE=cpu`` fails instead of training."""
    labels = _container_labels(spec)
    podman = "exec " + lines_to_shell(podman_run_lines(container, Raw('"$container"'), Raw('"${gpu_args[@]}"'),
                                                        labels), indent="        ")
    if not spec.cpu_nodes:
        return podman, "exit 2"
    # The CPU component's container runs the script itself, no torchrun: one process, role "cpu".
    cpu_container = dataclasses.replace(container, nnodes=None, plain=True,
                                        env=(*container.env, (contract.ENV_ROLE, contract.ROLE_CPU)))
    podman_cpu = "exec " + lines_to_shell(podman_run_lines(cpu_container, Raw('"$container"'),
                                                           Raw('"${gpu_args[@]}"'), labels), indent="            ")
    return podman, podman_cpu


def _template_words(spec: BatchSpec, container: ContainerSpec, podman: str, podman_cpu: str) -> dict[str, str]:
    """The template's ``@NAME@`` values: the job's settings as checked plain words, its paths quoted, and the
    ``podman run`` commands (already quoted word by word)."""
    return {
        "DLSUB_VERSION": _word(spec.dlsub_version or "unknown"),
        "DLSUB_ID": _word(spec.dlsub_id),
        "ROLE": _word(spec.role),
        "GANG": "1" if spec.gang else "0",
        "HET": "1" if spec.cpu_nodes else "0",
        "PODMAN_RUN_CPU": podman_cpu,
        "WORKER_ARRAY": _word(spec.worker_array) if spec.worker_array is not None else "''",
        "JOB_DIR": shlex.quote(str(container.job_dir)),
        "LIBRARY_DIR": shlex.quote(str(container.library_dir)),
        "PYTHON": shlex.quote(spec.python),
        "MAX_CONTINUATIONS": _word(int(spec.max_continuations)),
        "SOCKET_IFNAME": shlex.quote(container.socket_ifname),
        "GPUS_WANTED": _word(int(spec.gpus_wanted)),
        "PODMAN_RUN": podman,
        "IMAGE_CHOICE": _image_choice(container),
    }
