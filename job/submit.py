"""Turn a ``dlsub submit`` request into a planned, rendered and submitted Slurm job.

Checks everything that can be checked before anything is written, so a bad
request submits nothing and leaves no job directory behind.
"""

from __future__ import annotations

import dataclasses
import getpass
import os
import shutil
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import dlsub
from dlsub.containers.exports import Exported, seen_entries, with_site_variables
from dlsub.containers.mounts import ORIGIN_USER, Mount, MountError, MountRequest, resolve_mount
from dlsub.containers.podman import (
    ContainerSpec,
    ImageError,
    check_image,
    check_image_contents,
    check_mount_path,
    env_file_text,
)
from dlsub.contract import (
    BATCH_SCRIPT,
    CONTAINER_ENV_FILE,
    MAX_SCRIPT_BYTES,
    WORKER_SCRIPT,
    application_digest,
    valid_gpu_type,
)
from dlsub.job.filesystems import filesystem_type, mount_table, on_network_filesystem
from dlsub.job.partition_choice import Choice, Request, choose_partition
from dlsub.job.private_files import AgentAccess, let_agent_through, make_job_dir
from dlsub.job.script_library import script_uses_library
from dlsub.job.settings import Settings
from dlsub.job.user_store import JobRecord, JobStore
from dlsub.job.venv import VenvError, site_packages
from dlsub.site_config.policy_file import SitePaths
from dlsub.slurm_plugins.client import SlurmClient
from dlsub.slurm_plugins.models import user_groups
from dlsub.slurm_plugins.sbatch import BatchSpec, render_sbatch, safe_job_name


class SubmitError(ValueError):
    """A request that cannot be submitted; the message says what to change."""


@dataclass(frozen=True)
class SubmitRequest:
    script: Path
    args: tuple[str, ...]
    gpus_per_node: int
    nodes: int  # the main job's nodes (an elastic job's least members)
    cpus: int | None
    mem_mb: int | None
    time_limit_min: int | None
    partition: str | None
    image: str | None
    name: str | None
    workdir: Path
    mode: str = "ideal"  # "immediate": start on what is free now, move to GPUs later
    # From the site's policy: resume-requeues the batch script may make
    # (time_limits.max_continuations; 0 when continuation is off).
    max_continuations: int = 20
    # An elastic job's most members (``--nodes MIN:MAX``: nodes; ``--gpus MIN:MAX``: the main job and its
    # workers): ``nodes`` is the main job's.
    max_members: int | None = None
    # GPUs of each worker of a job elastic in GPUs (``--gpus-step``); 0: a whole node of ``gpus_per_node``.
    worker_gpus: int = 0
    # A CPU component of this many nodes beside the trainers (one heterogeneous job).
    cpu_nodes: int = 0
    cpu_partition: str | None = None  # default: the site's cpu-role partition, else one without GPUs
    # Host paths the container sees besides the script's, submit and job directories: the site's shared file
    # systems (policy.toml [containers]) and the user's --mount/--mount-rw, in that order.
    mounts: tuple[MountRequest, ...] = ()
    # The site's OCI runtime (policy.toml [containers] runtime; None: the node's Podman default);
    # $DLSUB_RUNTIME (Settings.runtime) overrides it.
    runtime: str | None = None
    # The site's interface for gloo and NCCL (policy.toml [containers] socket_ifname; "": the node's own).
    socket_ifname: str = ""
    # What becomes of a script that uses no dlsub library in immediate mode (policy.toml [moves]): "restart"
    # (start on CPUs; the agent restarts it on its GPUs from scratch within restart_plain_max_s of run time)
    # or "wait" (never started on CPUs: it waits for its GPU partition).
    plain_scripts: str = "restart"
    restart_plain_max_s: float = 600.0
    # The kind of GPU to run on, as Slurm's GRES names it (``--gres=gpu:a100:N``; a row of ``dlsub estimate``
    # profiled on that kind); "": any kind the partition has.
    gpu_type: str = ""
    # Where the site's hosts see the same files (policy.toml [site]): the job's paths must be there. None: not
    # checked (a request made without the site's policy).
    site_paths: SitePaths | None = None
    # What of the submitting shell's environment enters the container (``--export``, read at submit).
    exports: Exported = Exported()
    # The site's variables for every job's container (policy.toml [containers] environment); an --export of the
    # same name replaces one.
    site_env: tuple[tuple[str, str], ...] = ()
    # --venv: a virtualenv or conda environment on a shared path whose packages the job uses (job.venv).
    venv: str | None = None
    # The site's image per partition (policy.toml [containers] partition_images; none when the user names an
    # image): each is checked as ``image`` is, and each attempt runs the one of its partition.
    partition_images: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Plan:
    dlsub_id: str
    choice: Choice
    batch: BatchSpec
    script_text: str
    # An elastic job's held worker array (one node per task), submitted first.
    workers: BatchSpec | None = None
    worker_gpus: int = 0  # a job elastic in GPUs: each worker's (SubmitRequest.worker_gpus)
    warnings: tuple[str, ...] = ()  # what the user should know, nothing that stops the submit
    notes: tuple[str, ...] = ()  # what dlsub can and cannot do for this job (a script that uses no library)
    mode: str = "ideal"  # the mode it is submitted in (a plain script may wait for GPUs: see SubmitRequest)


def library_dir() -> Path:
    """The installed ``dlsub`` package, mounted into containers for ``from dlsub import checkpointing``."""
    return Path(dlsub.__file__).resolve().parent


def new_dlsub_id() -> str:
    """A fresh dlsub id: 8 hex digits, never all decimal ones, so it can never be read as a Slurm job id."""
    while True:
        candidate = uuid.uuid4().hex[:8]
        if not candidate.isdigit():
            return candidate


def check_script(script: Path) -> Path:
    if not script.exists():
        raise SubmitError(f"script {str(script)!r} does not exist; give the path of your training script")
    if not script.is_file():
        raise SubmitError(f"{str(script)!r} is not a file; give the path of your training script")
    if not os.access(script, os.R_OK):
        raise SubmitError(f"script {str(script)!r} is not readable; check its permissions (chmod u+r)")
    return script.resolve()


def plan_job(req: SubmitRequest, settings: Settings, client: SlurmClient, *, check_images: bool = True) -> Plan:
    """Check ``req``, choose its partition and render its batch script(s), writing nothing.

    The checks run in order: the request alone, the local paths, Slurm,
    the image; a failure raises :class:`SubmitError` (or that step's own
    error, e.g. Slurm unreachable) and nothing has been written.
    """
    script = check_script(req.script)
    _check_shape(req)
    req = _gang_mode(req)
    plain = not script_uses_library(script)
    waits = _waits_for_gpus(req, plain)
    if waits:
        req = dataclasses.replace(req, mode="ideal")
    image = req.image or settings.image
    cpus = req.cpus or settings.cpus
    mem_mb = req.mem_mb or settings.mem_mb
    _check_paths(script, req.workdir, settings.jobs_dir)
    mounts, warnings = check_mounts(req.mounts, req.workdir)
    if req.site_paths is not None:
        _check_seen_by_nodes(req.site_paths, script, req.workdir, settings.jobs_dir, mounts)
    _check_gpu_type(req)
    choice = _choose_partition(client, req, cpus, mem_mb)
    if waits:
        choice = dataclasses.replace(choice, reason="its script uses no dlsub library, so it waits for GPUs "
                                     "rather than start on CPUs (the site's policy.toml [moves] plain_scripts = "
                                     f"\"wait\"): {choice.reason}")
    notes: tuple[str, ...] = (plain_script_note(script, req, choice, waits),) if plain else ()
    if choice.ideal_partition is not None and req.gpus_per_node > 0:
        notes += (immediate_cpu_note(req, choice, cpus, mem_mb),)
    image_id, python, unchecked = _checked_image(image, req, settings) if check_images else (None, None, "")
    warnings += (unchecked,) if unchecked else ()
    there = _partition_images(req, settings, check_images)
    by_partition = there.images
    warnings += there.warnings
    venv = _venv(req, python, settings.jobs_dir, there.pythons)

    dlsub_id = new_dlsub_id()
    container = dataclasses.replace(_container_spec(req, settings, script, image, settings.jobs_dir / dlsub_id),
                                    extra_mounts=mounts, image_id=image_id,
                                    user_env=with_site_variables(req.site_env, req.exports.env),
                                    partition_images=by_partition)
    if venv is not None:
        container = dataclasses.replace(container, extra_mounts=(*container.extra_mounts, venv[0]))
    python_path, unseen = seen_entries(req.exports.python_path,
                                       [PurePosixPath(m.target) for m in container.mounts()])
    # The environment's packages first after dlsub's library: they are what the user asked the job to run on.
    container = dataclasses.replace(container, python_path=(*((str(venv[1]),) if venv else ()), *python_path))
    notes += req.exports.notes
    container, userns_note = _userns_for_mounts(container)
    notes += (userns_note,) if userns_note else ()
    if unseen:
        notes += (f"PYTHONPATH: {', '.join(unseen)} left out: the container sees only the script's, submit and job "
                  "directories and the mounted paths (--mount, the site's shared file systems)",)
    batch = BatchSpec(
        dlsub_id=dlsub_id,
        job_name=req.name or safe_job_name(script.stem),
        partition=choice.partition,
        container=container,
        nodes=req.nodes,
        # Immediate mode may start on fewer GPUs than asked (none, on CPU nodes) until the agent moves it.
        gpus_per_node=req.gpus_per_node if choice.gpus_now is None else choice.gpus_now,
        cpus_per_task=cpus,
        mem_mb=mem_mb,
        time_limit_min=req.time_limit_min,
        signal_grace_s=settings.signal_grace_s,
        dlsub_version=dlsub.__version__,
        tags=(*_agent_tags(req, choice, plain, _application(script, req)),
              *((("image", image_id[:12]),) if image_id else ()), *_images_tag(by_partition)),
        max_continuations=max(0, req.max_continuations),
        gpus_wanted=req.gpus_per_node if choice.ideal_partition is not None and choice.gpus_now is not None else 0,
        elastic=(req.nodes, req.max_members) if req.max_members is not None else None,
        # Named only where the job gets GPUs now (an immediate start on CPU nodes asks for none).
        gpu_type=req.gpu_type if choice.gpus_now is None else "",
    )
    if req.cpu_nodes:
        batch = dataclasses.replace(batch, cpu_nodes=req.cpu_nodes, cpu_cpus=cpus, cpu_mem_mb=mem_mb,
                                    cpu_partition=_cpu_partition(client, req, cpus, mem_mb))
    workers = _worker_array(batch, req.worker_gpus or req.gpus_per_node)
    return Plan(dlsub_id, choice, batch, render_sbatch(batch), workers, req.worker_gpus, warnings, notes, req.mode)


def _checked_image(image: str, req: SubmitRequest, settings: Settings) -> tuple[str, str | None, str]:
    """``image`` as a job runs it: its ID in the user's Podman, its Python's version (None: unknown) and a warning
    ("" for none) from what it holds (containers.podman.check_image_contents); ImageError when it cannot run one."""
    image_id = check_image(image)
    if not image_id:  # a stand-in for Podman that knows no IDs (unit tests' cli_env): nothing to look into
        return image_id, None, ""
    python, unchecked = check_image_contents(image, image_id, settings.home / "checked-images",
                                             settings.runtime or req.runtime or None)
    return image_id, python, unchecked


@dataclasses.dataclass(frozen=True)
class PartitionImages:
    """The site's image of each partition it names, as submit checked them."""

    #: (partition, name, ID; None unchecked), what the batch script chooses from.
    images: tuple[tuple[str, str, str | None], ...] = ()
    #: (partition, its image's Python version; None unknown), what --venv's environment must fit.
    pythons: tuple[tuple[str, str | None], ...] = ()
    #: Warnings of the images Podman could not start here.
    warnings: tuple[str, ...] = ()


def _partition_images(req: SubmitRequest, settings: Settings, check_images: bool) -> PartitionImages:
    """The site's image of each partition it names, checked as the job's own image is (in the user's Podman,
    then what it holds). An image missing or unfit is refused, naming its partition: the job may run there
    (a move)."""
    found: list[tuple[str, str, str | None]] = []
    pythons: list[tuple[str, str | None]] = []
    warnings: list[str] = []
    for partition, image in req.partition_images:
        if not check_images:
            found.append((partition, image, None))
            continue
        try:
            image_id, python, unchecked = _checked_image(image, req, settings)
        except ImageError as exc:
            raise ImageError(f"the site's image for partition {partition} (policy.toml [containers] "
                             f"partition_images): {exc}; tell your site's admins (`dlsub doctor` shows it), or "
                             "name an image for every partition with --image") from None
        found.append((partition, image, image_id))
        pythons.append((partition, python))
        if unchecked and unchecked not in warnings:
            warnings.append(unchecked)
    return PartitionImages(tuple(found), tuple(pythons), tuple(warnings))


def _images_tag(by_partition: Sequence[tuple[str, str, str | None]]) -> tuple[tuple[str, str], ...]:
    """The ``images=`` tag: the partition images' IDs (first 12 hex digits, each once), for `dlsub doctor`."""
    ids = list(dict.fromkeys(image_id[:12] for _, _, image_id in by_partition if image_id))
    return (("images", ".".join(ids)),) if ids else ()


def _userns_for_mounts(container: ContainerSpec) -> tuple[ContainerSpec, str]:
    """The container with the user's uid kept (keep-id) unless a path it mounts is on a network file system
    (ContainerSpec.keep_id), and the note that says so ("" where it is kept)."""
    table = mount_table()
    remote = [(m.source, filesystem_type(m.source, table)) for m in container.mounts()
              if on_network_filesystem(m.source, table)]
    if not remote:
        return container, ""
    source, kind = remote[0]
    return dataclasses.replace(container, keep_id=False), (
        f"{source} is on a network file system ({kind}), whose server checks the container's own ids: in the "
        "container your job runs as root, which is you on the host (your uid owns what it writes); your "
        "subordinate ids, which the server does not know, are left out of its mounts")


def _venv(req: SubmitRequest, python: str | None, jobs_dir: Path,
          partition_pythons: Sequence[tuple[str, str | None]] = ()) -> tuple[Mount, Path] | None:
    """``--venv``'s environment checked: its read-only mount and the site-packages the job's PYTHONPATH gets
    (for the image's ``python``, None: unknown); None without one. Where the site runs another image on some
    partitions (``partition_pythons``: each one's Python), the one site-packages must be for theirs too: the
    job may run there."""
    if req.venv is None:
        return None
    try:
        mount = resolve_mount(MountRequest(req.venv, read_only=True), req.workdir)
        found = site_packages(mount.target, python)
        for partition, theirs in partition_pythons:
            if theirs is not None and python is not None and theirs.split(".")[:2] != python.split(".")[:2]:
                raise VenvError(
                    f"--venv {req.venv}: its packages are for the Python of your job's image ({python}), but the "
                    f"site's image for partition {partition} runs Python {theirs}, and the job may run there "
                    "(policy.toml [containers] partition_images): name one image for every partition with "
                    "--image, or ask your site for images of one Python")
        if req.site_paths is not None:
            _check_seen_by_nodes(req.site_paths, req.script, req.workdir, jobs_dir, (mount,))
    except (MountError, VenvError, SubmitError) as exc:
        raise SubmitError(str(exc).replace("--mount ", "--venv ", 1)) from None
    # The script's and submit directories are mounted read-write: an environment that holds them would be too.
    for path in (req.script.resolve().parent, req.workdir.resolve()):
        if path == mount.source or mount.source in path.parents:
            raise SubmitError(f"--venv {req.venv}: it holds {path}, which the job writes to; keep the environment "
                              "in a folder of its own (e.g. ./.venv) and give that")
    return mount, found


def _waits_for_gpus(req: SubmitRequest, plain: bool) -> bool:
    """Whether this job, a script that uses no library, is kept off CPUs by the site (plain_scripts = "wait")."""
    return (plain and req.plain_scripts == "wait" and req.mode == "immediate" and req.gpus_per_node > 0
            and req.partition is None)


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def plain_script_note(script: Path, req: SubmitRequest, choice: Choice, waits: bool) -> str:
    """One line: what dlsub can and cannot do for a script that uses no dlsub library, and how to change it."""
    what = (f"{script.name} uses no dlsub library (no `from dlsub import checkpointing`, nor its Lightning or "
            "Hugging Face adapter): it never checkpoints, so no move, continuation past a time limit or resize "
            "keeps its progress")
    fix = "to keep its progress, save and restore through `from dlsub import checkpointing` (docs/user-guide.md)"
    if choice.ideal_partition is not None:  # started on CPUs in immediate mode
        if req.plain_scripts == "restart":
            what += (f"; it starts on {choice.partition} and is restarted from scratch on {choice.ideal_partition} "
                     f"if GPUs free up within {_minutes(req.restart_plain_max_s)} of its start (the site's "
                     f"restart_plain_max_s), else it runs on {choice.partition} to its end")
        fix += f", or submit with --mode ideal to wait for {choice.ideal_partition}'s GPUs"
    elif waits:
        what += f"; it waits for GPUs on {choice.partition} rather than start on CPUs"
    return f"{what}; {fix}"


def _memory(mem_mb: int) -> str:
    return f"{mem_mb // 1024} GB" if mem_mb % 1024 == 0 else f"{mem_mb} MB"


def immediate_cpu_note(req: SubmitRequest, choice: Choice, cpus: int, mem_mb: int) -> str:
    """One line: what a GPU job started on CPUs in immediate mode gets there, and what its script must bear."""
    gpus = req.gpus_per_node * req.nodes
    return (f"--gpus {gpus} starts on {choice.partition} now (immediate mode) as 1 training process with "
            f"{cpus} CPU{'s' if cpus != 1 else ''}, {_memory(mem_mb)} and no GPU, until the agent moves it to "
            f"{choice.ideal_partition}: the script must run without CUDA there (torch.cuda.is_available() is "
            f"False, .cuda() fails; if it dies of that, it is sent back once to wait for "
            f"{choice.ideal_partition}'s GPUs); --mode ideal waits for them from the start")


def check_mounts(requests: tuple[MountRequest, ...], workdir: Path) -> tuple[tuple[Mount, ...], tuple[str, ...]]:
    """The mounts checked on this host, and warnings. A user's path that cannot be mounted stops the submit;
    a site's shared file system missing here is left out with a warning (a job that needs it fails to find
    its files, a job that does not still runs), since Podman refuses to start a container on a missing path."""
    mounts: list[Mount] = []
    warnings: list[str] = []
    for request in requests:
        try:
            mounts.append(resolve_mount(request, workdir))
        except MountError as exc:
            if request.origin == ORIGIN_USER:
                raise SubmitError(str(exc)) from None
            warnings.append(f"{exc}: this job does not get it (policy.toml [containers] names it; tell the "
                            "site's admins)")
    return tuple(mounts), tuple(warnings)


def _check_shape(req: SubmitRequest) -> None:
    """Refuse GPU and node counts that no partition could satisfy, before asking Slurm anything."""
    if req.gpus_per_node < 0:
        raise SubmitError(f"--gpus must be 0 or more, not {req.gpus_per_node}")
    if req.nodes < 1:
        raise SubmitError(f"--nodes must be 1 or more, not {req.nodes}")
    if req.max_members is not None and req.max_members <= req.nodes:
        raise SubmitError(f"--nodes {req.nodes}:{req.max_members}: an elastic range needs MIN < MAX "
                          f"(or give one number for a fixed size)")
    if req.cpu_nodes < 0:
        raise SubmitError(f"--cpu-nodes must be 0 or more, not {req.cpu_nodes}")
    if req.cpu_nodes and req.max_members is not None:
        raise SubmitError("--cpu-nodes cannot go with an elastic --nodes MIN:MAX: Slurm's heterogeneous jobs "
                          "cannot be job arrays; give a fixed --nodes")


def _gang_mode(req: SubmitRequest) -> SubmitRequest:
    """``req``, in ideal mode if it is a gang that asked for immediate mode without naming a partition."""
    gang = req.nodes > 1 or req.max_members is not None or req.cpu_nodes > 0
    if gang and req.mode == "immediate" and req.partition is None:
        # A gang does not start on CPU nodes to be moved later: the agent resizes it instead.
        return dataclasses.replace(req, mode="ideal")
    return req


def _check_paths(script: Path, workdir: Path, jobs_dir: Path) -> None:
    """Refuse host paths the container cannot mount or the batch script cannot name."""
    for path in (script.parent, workdir, jobs_dir):
        try:
            check_mount_path(path)
        except ValueError as exc:
            raise SubmitError(str(exc)) from exc
    if any(ch in str(jobs_dir) for ch in "\n\r"):
        # The job directory is in #SBATCH --output=, one line of the batch script.
        raise SubmitError(f"the job directories' folder {str(jobs_dir)!r} has a line break, which "
                          "Slurm's #SBATCH --output cannot carry; set DLSUB_HOME to a path without one")


def _check_seen_by_nodes(site: SitePaths, script: Path, workdir: Path, jobs_dir: Path,
                         mounts: tuple[Mount, ...]) -> None:
    """Refuse a job whose files its nodes would not see (a login node's /tmp is its own), naming the path and the
    file systems the site shares: accepted, it would fail on its node ("couldn't change working dir")."""
    paths = [("the script", script), ("the folder you submit from", workdir.resolve()),
             ("dlsub's job directories ($DLSUB_HOME)", jobs_dir.resolve())]
    paths += [(f"--mount{'' if m.read_only else '-rw'} {str(m.target)!r}", m.source)
              for m in mounts if m.origin == ORIGIN_USER]
    shared = ", ".join(site.shared_paths)
    for what, path in paths:
        local = site.unseen_by_nodes(path)
        if local is None:
            continue
        if local:
            where = (f"is in {local}, which each host of the cluster has of its own (node-local): the job's node "
                     "would not find it there")
        else:
            where = "is on none of the file systems the cluster's nodes share: the job's node would not find it"
        if shared:
            use = f"put it on a shared file system ({shared}: policy.toml [site] shared_paths)"
        else:
            use = (f"put it on a file system the nodes share, such as your home directory ({Path.home()}); "
                   "this site's policy.toml names none ([site] shared_paths)")
        raise SubmitError(f"{what} ({str(path)!r}) {where}; {use}, and submit from there")


def _choose_partition(client: SlurmClient, req: SubmitRequest, cpus: int, mem_mb: int) -> Choice:
    """The partition the job starts on; an elastic job's must also have nodes for its MAX."""
    client.ping()  # an unreachable slurmctld fails here, with SlurmUnreachable's hint, before any query
    parts = client.partitions()
    choice = choose_partition(
        parts,
        Request(gpus_per_node=req.gpus_per_node, cpus=cpus, mem_mb=mem_mb, time_limit_min=req.time_limit_min,
                nodes=req.nodes, partition=req.partition, immediate=req.mode == "immediate",
                gpu_type=req.gpu_type or None, groups=user_groups(getpass.getuser()),
                account=_account(client) if any(p.restricts_accounts for p in parts)
                else None),
    )
    chosen = next((p for p in parts if p.name == choice.partition), None)
    if req.max_members is None or chosen is None:
        return choice
    if req.worker_gpus and chosen.nodes:
        most = req.gpus_per_node + (req.max_members - 1) * req.worker_gpus
        there, per_node = sum(n.gpus for n in chosen.nodes), max(n.gpus for n in chosen.nodes)
        if there < most or per_node < req.worker_gpus:
            raise SubmitError(f"--gpus {req.gpus_per_node}:{most}: partition {choice.partition} has {there} GPUs "
                              f"in all (at most {per_node} on a node); ask for at most {there}, in steps that fit "
                              "one node")
    elif not req.worker_gpus and len(chosen.nodes) < req.max_members:
        raise SubmitError(f"--nodes {req.nodes}:{req.max_members}: partition {choice.partition} has only "
                          f"{len(chosen.nodes)} nodes; ask for at most {len(chosen.nodes)}")
    return choice


def _account(client: SlurmClient) -> str | None:
    """The account the job will run under: sbatch's $SBATCH_ACCOUNT where set, else the user's default one (None:
    not known; Slurm then decides, and says so if it refuses)."""
    return os.environ.get("SBATCH_ACCOUNT") or client.default_account(getpass.getuser())


def _check_gpu_type(req: SubmitRequest) -> None:
    """Refuse a GPU type that is not a GRES type's name, or that asks for no GPUs, before any partition is
    chosen by it."""
    if not req.gpu_type:
        return
    if valid_gpu_type(req.gpu_type) is None:
        raise SubmitError(f"GPU type {req.gpu_type!r}: name it as Slurm's GRES does (letters, digits, '_', '.', "
                          "'-'; e.g. a100)")
    if req.gpus_per_node < 1:
        raise SubmitError(f"GPU type {req.gpu_type}: the job asks for no GPUs; give --gpus N")


def _container_spec(req: SubmitRequest, settings: Settings, script: Path, image: str, job_dir: Path) -> ContainerSpec:
    """What each attempt's ``podman run`` starts: the user's script in their image, with dlsub's library."""
    return ContainerSpec(
        image=image,
        script=script,
        script_args=req.args,
        job_dir=job_dir,
        workdir=req.workdir,
        library_dir=library_dir(),
        nproc_per_node=None,  # one per GPU of each attempt (they may differ after a move)
        runtime=settings.runtime or req.runtime or None,
        socket_ifname=req.socket_ifname,
        # Half of Slurm's warning before the time limit: the rest is the batch script's, after the container.
        grace_s=max(5, settings.signal_grace_s // 2),
    )


def _agent_tags(req: SubmitRequest, choice: Choice, plain: bool,
                application: str | None = None) -> tuple[tuple[str, str], ...]:
    """The ``--comment`` tags the agent acts on: the mode, where the job ideally runs, the GPUs and
    an elastic job's node range it asked for (the start may differ from all of them), whether its
    script reads as one that uses no dlsub library (the agent may then restart it from scratch), and an
    elastic job's command (``application``: what its user's earlier runs of it measured place it while it
    waits)."""
    elastic: tuple[tuple[str, str], ...] = ()
    if req.max_members is not None:
        elastic = (("nodes", f"{req.nodes}-{req.max_members}"),)
    if req.max_members is not None and req.worker_gpus:
        elastic += (("step", str(req.worker_gpus)),)  # elastic in GPUs: each worker adds this many
    if req.max_members is not None and application:
        elastic += (("app", application),)
    # The kind it asked for: a job that starts without it (immediate mode, on CPUs) is moved onto that kind.
    kind = (("gpu_type", req.gpu_type),) if req.gpu_type else ()
    # A partition its user named is theirs: an elastic job is never placed on another while it waits.
    pin = (("pin", "partition"),) if req.partition is not None and req.max_members is not None else ()
    return (("mode", req.mode), ("ideal", choice.ideal_partition or choice.partition), ("gpus", str(req.gpus_per_node)),
            *elastic, *((("script", "plain"),) if plain else ()), *kind, *pin)


def _application(script: Path, req: SubmitRequest) -> str | None:
    """The digest of the command the job trains (:func:`dlsub.contract.application_digest`), as the training's
    start event will name it: its script's bytes and its arguments. None for a script too big to read."""
    try:
        if script.stat().st_size > MAX_SCRIPT_BYTES:
            return None
        return application_digest(script.read_bytes(), list(req.args))
    except OSError:
        return None


def _worker_array(batch: BatchSpec, gpus: int) -> BatchSpec | None:
    """An elastic job's held worker array (None for a fixed-size job), checked by rendering it."""
    if batch.elastic is None:
        return None
    # The workers wait, held, on the partition the job runs on; each is one node of the same shape, or, for a
    # job elastic in GPUs, a task of ``gpus`` GPUs (its step) on any node with as many idle, CPUs and memory as
    # the main job's.
    tags = dict(batch.tags)
    workers = dataclasses.replace(
        batch, nodes=1, role="worker", gpus_per_node=gpus,
        tags=(("mode", "ideal"), ("ideal", tags["ideal"]), ("gpus", str(gpus)), ("role", "worker"),
              ("nodes", tags["nodes"]), *((("step", tags["step"]),) if "step" in tags else ())))
    render_sbatch(workers)  # a worker script that cannot be rendered fails the plan, before anything is written
    return workers


def _cpu_partition(client: SlurmClient, req: SubmitRequest, cpus: int, mem_mb: int) -> str:
    """Where a heterogeneous job's CPU component runs: the one asked for, else the first partition
    without GPUs that has enough nodes for it."""
    parts = client.partitions()
    names = [p.name for p in parts]
    if req.cpu_partition is not None and req.cpu_partition not in names:
        raise SubmitError(f"--cpu-partition: unknown partition {req.cpu_partition!r}; this cluster has: "
                          f"{', '.join(names)}")
    for p in parts:
        if req.cpu_partition is not None and p.name != req.cpu_partition:
            continue
        if req.cpu_partition is None and p.max_gpus_per_node:
            continue
        fit = [n for n in p.nodes if n.cpus >= cpus and n.real_memory_mb >= mem_mb]
        if len(fit) >= req.cpu_nodes:
            return p.name
        if req.cpu_partition is not None:
            raise SubmitError(f"--cpu-nodes {req.cpu_nodes}: partition {p.name} has {len(fit)} node(s) with "
                              f"{cpus} CPUs and {mem_mb} MB")
    raise SubmitError(f"--cpu-nodes {req.cpu_nodes}: no partition without GPUs has {req.cpu_nodes} node(s) with "
                      f"{cpus} CPUs and {mem_mb} MB; name one with --cpu-partition")


def _write_new(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


@dataclass
class Submitted:
    record: JobRecord
    warnings: list[str] = field(default_factory=list)


def submit_plan(plan: Plan, settings: Settings, client: SlurmClient, store: JobStore,
                agent_user: str = "dlsub", sbatch_args: tuple[str, ...] = ()) -> Submitted:
    """Write the job directory, sbatch it, record it; undo the directory if sbatch fails.

    The job directory is private to the user except the progress and attempt
    files, which the agent's account may read (see :mod:`dlsub.job.private_files`).
    """
    spec = plan.batch
    job_dir = spec.container.job_dir
    access = AgentAccess(agent_user)
    warnings: list[str] = []
    if job_dir.exists() or job_dir.is_symlink():
        raise SubmitError(f"{job_dir} already exists; submit again for a fresh job id")
    try:
        make_job_dir(job_dir, access)
        opened, blocked = let_agent_through(job_dir, access)
        for directory in opened:
            warnings.append(
                f"{directory} let no one else in: dlsub let the agent (user {agent_user}) pass through it, as it "
                f"passes ~/.dlsub (it may enter, never list), so that it can follow your jobs; `setfacl -x "
                f"u:{agent_user} {directory}` takes that back, and then the agent cannot follow or move them")
        if blocked is not None:
            warnings.append(
                f"the agent (user {agent_user}) cannot enter {blocked}, so it cannot follow this job's progress "
                f"or move it; set DLSUB_HOME to a directory on shared storage that it can enter, "
                f"or let it pass with `setfacl -m u:{agent_user}:x {blocked}`")
        script_path = job_dir / BATCH_SCRIPT
        record = JobRecord(
            id=plan.dlsub_id,
            name=spec.job_name,
            user=getpass.getuser(),
            script=str(spec.container.script),
            args=list(spec.container.script_args),
            job_dir=str(job_dir),
            partition=spec.partition,
            gpus_per_node=int(dict(spec.tags).get("gpus", spec.gpus_per_node)),
            nodes=spec.nodes,
            cpus=spec.cpus_per_task,
            mem_mb=spec.mem_mb,
            time_limit_min=spec.time_limit_min,
            image=spec.container.image,
            image_id=spec.container.image_id,
            max_nodes=spec.elastic[1] if spec.elastic else None,
            worker_gpus=plan.worker_gpus or None,
            mounts=[m.to_json() for m in spec.container.extra_mounts],
        )
        store.add(record)
        # Slurm creates the output file with the umask sbatch had: owner-only.
        previous_umask = os.umask(0o077)
        workers: int | None = None
        try:
            script_text = plan.script_text
            if spec.container.user_env:
                _write_new(job_dir / CONTAINER_ENV_FILE, env_file_text(spec.container.user_env))
            if plan.workers is not None:
                # The held workers first, so the main job's script knows the array it ends with.
                _write_new(job_dir / WORKER_SCRIPT, render_sbatch(plan.workers))
                workers = client.submit(job_dir / WORKER_SCRIPT)
                record.worker_array_id = workers
                store.update(record.id, worker_array_id=workers)
                script_text = render_sbatch(dataclasses.replace(spec, worker_array=workers))
            _write_new(script_path, script_text)
            # sbatch runs in the user's current directory: that is SLURM_SUBMIT_DIR.
            slurm_job_id = client.submit(script_path, args=sbatch_args)
        except BaseException:
            if workers is not None:
                client.cancel(workers)  # no half-submitted job: the workers go with the main job
            store.remove(record.id)
            raise
        finally:
            os.umask(previous_umask)
    except BaseException:
        shutil.rmtree(job_dir, ignore_errors=True)
        raise
    store.update(record.id, slurm_job_id=slurm_job_id)
    record.slurm_job_id = slurm_job_id
    return Submitted(record, warnings + access.warnings)
