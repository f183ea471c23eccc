"""The ``podman run`` command for one attempt of a dlsub job, as a list of words.

Words are literal strings (quoted when rendered) except :class:`Raw` words,
which are shell text produced here from fixed templates, used only where the
batch script must expand a variable at run time (``$SLURM_JOB_ID``, the GPU
device arguments). User-supplied paths and arguments are never Raw.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import subprocess
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dlsub import contract
from dlsub.containers.mounts import ORIGIN_JOB, Mount, merge_mounts

DEFAULT_IMAGE = "localhost/dlsub-torch:2.13.0-cpu"
#: Where the host's dlsub package is mounted inside the container (read-only).
LIBRARY_MOUNT = "/opt/dlsub-lib"

# Slurm's view of the job, passed into the container by name (Podman takes
# each value from the batch script's environment; unset ones are skipped).
SLURM_ENV = (
    "SLURMD_NODENAME",  # the node's name in Slurm, for output labels (the testbed's slurmds share one host)
    "SLURM_JOB_ID",
    "SLURM_JOB_NAME",
    "SLURM_JOB_PARTITION",
    "SLURM_JOB_NODELIST",
    "SLURM_NNODES",
    "SLURM_NODEID",
    "SLURM_RESTART_COUNT",
    "SLURM_CPUS_PER_TASK",
    "SLURM_CPUS_ON_NODE",
    "SLURM_MEM_PER_NODE",
    "SLURM_JOB_GPUS",  # Slurm's global ids of the GPUs (the batch step's)
    "SLURM_STEP_GPUS",  # the same for an srun step (a gang's node)
    "SLURM_GPUS_ON_NODE",
    "SLURM_SUBMIT_DIR",
    "SLURM_CLUSTER_NAME",
)


class Raw(str):
    """A word of shell text to be emitted unquoted (built from fixed templates only)."""


class ImageError(RuntimeError):
    """The requested image is not in the user's Podman storage, or Podman is missing."""


class RuntimeDirError(ImageError):
    """Podman's runtime directory is not private to the user (e.g. squatted in /tmp by another)."""


def runtime_dir_fallback(uid: int | None = None) -> Path:
    return contract.runtime_dir_fallback(os.getuid() if uid is None else uid)


def private_runtime_dir(path: Path) -> Path:
    """Make ``path`` (mode 0700) if missing; raise unless it is a real directory of ours with mode 0700.

    The fallback lives in /tmp, where another user may have made it first
    (or left a symlink there) to watch or hijack our Podman.
    """
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise RuntimeDirError(f"cannot create Podman's runtime directory {path}: {exc.strerror}") from exc
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() \
            or info.st_mode & 0o777 != 0o700:
        raise RuntimeDirError(
            f"{path}, Podman's runtime directory, is not a directory of yours with mode 700 "
            f"(someone else may have made it); remove it, or set XDG_RUNTIME_DIR to a private directory"
        )
    return path


@dataclass(frozen=True)
class ContainerSpec:
    image: str
    script: Path  # absolute
    script_args: tuple[str, ...]
    job_dir: Path  # absolute
    workdir: Path  # absolute: the submit directory
    library_dir: Path  # the host's installed ``dlsub`` package directory
    nproc_per_node: int | None = None  # None: one per GPU the attempt got, else 1
    # The OCI runtime (podman --runtime): the site's or the user's choice; None: the node's Podman default.
    runtime: str | None = None
    # The site's interface for gloo and NCCL ("": the batch script finds the node's own, slurm_plugins/batch.sh).
    socket_ifname: str = ""
    grace_s: int = 30
    env: tuple[tuple[str, str], ...] = ()
    # The variables of the user's shell that --export passes (containers.exports): in the job directory's
    # contract.CONTAINER_ENV_FILE, read by podman --env-file, so that no value is on a command line (ps).
    user_env: tuple[tuple[str, str], ...] = ()
    # The user's PYTHONPATH entries the container sees (containers.exports: on a mounted path), after dlsub's library.
    python_path: tuple[str, ...] = ()
    # The site's shared file systems and the user's --mount/--mount-rw paths, checked (containers.mounts).
    extra_mounts: tuple[Mount, ...] = field(default_factory=tuple)
    # A gang: torchrun's --nnodes ("N", or "MIN:MAX" for an elastic job) and
    # the c10d rendezvous the batch script sets up; None: --standalone.
    nnodes: str | None = None
    rendezvous_id: str = ""
    # Run the script with plain python3 (one process, no torchrun): a
    # heterogeneous job's CPU component.
    plain: bool = False
    # An elastic job's main nodes start torchrun again when the group stops
    # for a node that left. A worker (``follow``) does so only when its main
    # job says it re-forms (contract.reform_marker); otherwise it goes back to
    # the pool (its main job may be gone or requeued).
    reform: bool = True
    follow: bool = False
    # The image's ID as submit found it (check_image): every attempt runs this one, whatever the name points
    # to later (a site updating its image under the same name). None: the name (a dry run without Podman).
    image_id: str | None = None
    # The site's image of each partition it names (policy.toml [containers] partition_images): (partition, name,
    # ID as submit found it, None in a dry run). The batch script runs the one of the partition each attempt
    # runs on (``image_choice_lines``), ``image`` elsewhere. Empty: ``image`` on every partition.
    partition_images: tuple[tuple[str, str, str | None], ...] = ()
    # The user is the same uid in the container (Podman's --userns keep-id). False where a path it mounts lies on
    # a network file system: there the container's root, which makes the mounts, would be one of the user's
    # subordinate ids, which the file server does not know (rootless.md: "Does not work on NFS homedirs"), and a
    # 0700 home would refuse it; the container's root is then the user (--userns host, Podman's rootless default).
    keep_id: bool = True

    @property
    def elastic(self) -> bool:
        return self.nnodes is not None and ":" in self.nnodes

    def mounts(self) -> list[Mount]:
        """What the container sees of the host: the script's, submit and job directories read-write at
        their own paths, and the extra mounts, parents first (containers.mounts.merge_mounts)."""
        own = [Mount(p, p, read_only=False, origin=ORIGIN_JOB)
               for p in (self.script.parent, self.workdir, self.job_dir)]
        return merge_mounts([*own, *self.extra_mounts])


def env_file_text(pairs: Sequence[tuple[str, str]]) -> str:
    """``podman run --env-file``'s lines: ``NAME=value``, literal (podman strips and expands nothing in a value);
    names and values are containers.exports' checked ones (no line break in either)."""
    return "".join(f"{name}={value}\n" for name, value in pairs)


def check_mount_path(path: Path) -> None:
    """Podman's ``-v SRC:DST`` cannot carry a ':' in a path; say so before submitting."""
    if ":" in str(path):
        raise ValueError(f"{path} contains ':', which Podman's --volume cannot mount; move or rename it")


def podman_run_lines(spec: ContainerSpec, container_name: Raw, gpu_args: Raw,
                     labels: Sequence[Raw | str]) -> list[list[str]]:
    """``podman run ... launch -- torchrun ... script args`` for one node of one attempt.

    Returned as lines of words (an option with its value per line) so the
    rendered script reads well; join them for the plain argv.
    """
    # The container stays in the job's cgroup, whatever the user's containers.conf says, so that Slurm's
    # memory, CPU and device limits and its process tracking keep applying to it: cgroupfs (no systemd scope
    # of its own) and the host's cgroup namespace (on cgroup v2 a private one is the default), as Slurm's
    # containers guide sets them for Podman. Rootless Podman cannot restrict devices itself.
    # The OCI runtime is the node's Podman default (containers.conf) unless the site or user names one.
    runtime = ["--runtime", spec.runtime] if spec.runtime else []
    lines: list[list[str]] = [["podman", *runtime, "--cgroup-manager", "cgroupfs", "run", "--rm"],
                              ["--name", container_name], ["--cgroupns", "host"]]
    lines += [["--label", label] for label in labels]
    if spec.nnodes is not None:
        # torchrun's c10d rendezvous tells nodes apart by (host name, torchrun's
        # pid). In a private pid namespace every container's torchrun has the
        # same small pid, so two nodes of a gang on one host (the testbed's
        # slurmds, or a node's name shared by its containers) would be one.
        lines.append(["--pid", "host"])
    lines += [
        ["--userns", "keep-id" if spec.keep_id else "host"],
        ["--network", "host"],  # /dev/net/tun is not usable by users; rendezvous uses host ports
        ["--shm-size", "1g"],  # DataLoader workers pass batches through /dev/shm (64 MB by default)
        ["--log-driver", "passthrough"],  # container stdio straight into Slurm's output file
        ["--stop-timeout", str(spec.grace_s)],
    ]
    for mount in spec.mounts():
        check_mount_path(mount.source)
        check_mount_path(mount.target)
        lines.append(["--volume", mount.volume()])
    check_mount_path(spec.library_dir)
    lines.append(["--volume", f"{spec.library_dir}:{LIBRARY_MOUNT}/dlsub:ro"])
    lines.append(["--workdir", str(spec.workdir)])
    if spec.user_env:
        # Read before the --env below, which win over it (podman's order): dlsub's own are never the user's.
        lines.append(["--env-file", str(spec.job_dir / contract.CONTAINER_ENV_FILE)])
    lines.append(["--env", ":".join(("PYTHONPATH=" + str(LIBRARY_MOUNT), *spec.python_path))])
    lines += [["--env", name] for name in (contract.ENV_JOB_ID, contract.ENV_JOB_DIR, contract.ENV_ATTEMPT,
                                           contract.ENV_CONTAINER, contract.ENV_GPU_TYPE, contract.ENV_WATCH_NO_GPU,
                                           *SLURM_ENV)]
    lines.append(["--env", Raw('CUDA_VISIBLE_DEVICES="${container_cuda_devices}"')])
    # Where gloo and NCCL open their sockets: the batch script's choice (the node's own address's interface,
    # or the site's), unless the user's environment names one.
    lines += [["--env", name] for name in contract.SOCKET_IFNAME_ENV]
    if spec.nnodes is not None:
        lines.append(["--env", contract.ENV_RDZV_ENDPOINT])
        # A node that joins a running group late needs the rendezvous store apart from the workers': with
        # torch's shared TCP store, a late member's agent finds the store gone when the group re-forms.
        lines.append(["--env", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"])
        lines.append(["--env", f"{contract.ENV_NNODES}={spec.nnodes}"])
    # A heterogeneous job's parts, for scripts whose trainers and CPU component talk.
    lines += [["--env", contract.ENV_TRAINER_NODES], ["--env", contract.ENV_CPU_NODES]]
    lines += [["--env", f"{key}={value}"] for key, value in spec.env]
    lines.append([gpu_args])
    if spec.partition_images:
        # The image of the attempt's partition, which the batch script chose (image_choice_lines).
        lines.append(["--label", Raw(f'"{contract.LABEL_IMAGE}=${{image_name}}"')])
        lines.append([Raw('"${image}"')])
    else:
        if spec.image_id:
            # The name, for whoever reads `podman ps`; the ID, which it runs.
            lines.append(["--label", f"{contract.LABEL_IMAGE}={spec.image}"])
        lines.append([spec.image_id or spec.image])
    # -P: the container's working directory (the submit directory) is not searched first, so a folder named
    # dlsub there never stands in for dlsub's launcher (Python 3.11's flag; submit checks the image's Python).
    launch = ["python3", "-P", "-m", "dlsub.checkpointing.launch", "--grace", str(spec.grace_s)]
    if spec.elastic and spec.reform:
        launch.append("--elastic")
        if spec.follow:
            launch.append("--follow")
    if spec.plain:
        lines.append([*launch, "--"])
        lines.append(["python3", str(spec.script), *spec.script_args])
        return lines
    # One process per GPU of this attempt: the batch script counts them, since
    # a job moved between CPU and GPU partitions gets different ones. The
    # launcher labels the output lines when there are several processes.
    nproc: str | Raw = str(spec.nproc_per_node) if spec.nproc_per_node else Raw('"${nproc}"')
    lines.append([*launch, "--nproc-per-node", nproc, "--"])
    if spec.nnodes is None:
        lines.append(["torchrun", "--standalone", "--nnodes", "1", "--nproc-per-node", nproc])
    else:
        lines.append(["torchrun", "--nnodes", spec.nnodes, "--nproc-per-node", nproc])
        lines.append(["--rdzv-backend", "c10d", "--rdzv-endpoint", Raw('"${DLSUB_RDZV_ENDPOINT}"'),
                      "--rdzv-id", spec.rendezvous_id, "--rdzv-conf", Raw('"${rdzv_conf}"')])
        # An elastic group re-forms when a node joins or is lost (a lost node
        # costs a restart; joins do not count).
        lines.append(["--max-restarts", "3" if spec.elastic else "0"])
    # Each process starts through dlsub's entry point, which hands its output
    # to the launcher and then execs ``python -u SCRIPT ARGS`` as torchrun would
    # (the launcher's ENTRY_POINT; it drops them for a process alone).
    lines.append(["-m", "dlsub.checkpointing.rank_output", str(spec.script), *spec.script_args])
    return lines


def image_choice_lines(spec: ContainerSpec) -> list[str]:
    """The batch script's lines that set ``image`` (what ``podman run`` runs: an ID, or a name in a dry run) and
    ``image_name`` to those of the partition the attempt runs on (``$SLURM_JOB_PARTITION``), else the job's own;
    [] when the site names no image per partition. Partition names are checked plain words (policy_file),
    images quoted."""
    if not spec.partition_images:
        return []
    lines = ['case "${SLURM_JOB_PARTITION:-}" in']
    for partition, name, image_id in spec.partition_images:
        lines.append(f"    {partition}) image={shlex.quote(image_id or name)} image_name={shlex.quote(name)} ;;")
    lines.append(f"    *) image={shlex.quote(spec.image_id or spec.image)} image_name={shlex.quote(spec.image)} ;;")
    lines.append("esac")
    return lines


def podman_run_words(spec: ContainerSpec, container_name: Raw, gpu_args: Raw, labels: Sequence[Raw | str]) -> list[str]:
    return [w for line in podman_run_lines(spec, container_name, gpu_args, labels) for w in line]


def _podman(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if not env.get("XDG_RUNTIME_DIR") or not os.access(env["XDG_RUNTIME_DIR"], os.W_OK):
        candidate = f"/run/user/{os.getuid()}"
        if os.access(candidate, os.W_OK):
            env["XDG_RUNTIME_DIR"] = candidate
        else:
            env["XDG_RUNTIME_DIR"] = str(private_runtime_dir(runtime_dir_fallback()))
    try:
        return subprocess.run(["podman", *argv], capture_output=True, text=True, env=env, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(["podman", *argv], PODMAN_TIMED_OUT, "", "podman did not answer in 60 s")
    except FileNotFoundError as exc:
        raise ImageError("podman is not installed on this host; dlsub runs jobs in rootless Podman containers") from exc


def local_images() -> list[str]:
    result = _podman(["images", "--format", "{{.Repository}}:{{.Tag}}"])
    return sorted({line for line in result.stdout.split() if "<none>" not in line})


def check_image(image: str) -> str:
    """``image``'s ID in this user's Podman (their own storage or the site's read-only image stores); raise
    :class:`ImageError`, naming where Podman looked, when it is in neither.

    A job runs the image by this ID on every attempt: a requeue or a move after the site updated the image
    under the same name still runs the one it was submitted with (the site keeps an old version while a job
    names it: ``dlsub doctor``)."""
    found = _podman(["image", "inspect", "--format", "{{.Id}}", image])
    image_id = found.stdout.strip()
    if found.returncode == 0 and IMAGE_ID.match(image_id):
        return image_id
    info = _podman(["info", "--format", "json"])
    if info.returncode != 0:
        # Not the image's fault: Podman itself does not run for this user here, and "not in your storage"
        # (with "images there: none") would send them looking for an image they have.
        raise ImageError(
            f"Podman does not run for you on this host ({podman_said(info)}), so image {image!r} could not be "
            "looked up; nothing was submitted: `dlsub doctor --user $USER` says what is wrong and how to fix it"
        )
    known = local_images()
    listing = ", ".join(known) if known else "none"
    raise ImageError(
        f"image {image!r} is not in your Podman storage ({_stores(info)}; images there: {listing}); "
        f"pass one of those with --image, or ask your site to add it to its image store "
        f"(or build/pull it into your own: podman build / podman load)"
    )


#: The oldest Python dlsub's library (mounted into every job's container) runs on.
MIN_PYTHON = (3, 11)
#: What a job's image is asked at submit: its python3's version and torch's, without importing torch (fast).
IMAGE_PROBE = (
    "import json, sys\n"
    "try:\n"
    "    from importlib.metadata import version\n"
    "    torch = version('torch')\n"
    "except Exception:\n"
    "    torch = None\n"
    "print(json.dumps({'python': '%d.%d.%d' % tuple(sys.version_info[:3]), 'torch': torch}))\n"
)


#: A Python version as the probe prints it and the check's record keeps it.
_VERSION = re.compile(r"\d+\.\d+\.\d+")
#: ``_podman``'s status when podman did not answer in time (timeout(1)'s); podman's own failures exit 125.
PODMAN_TIMED_OUT = 124
PODMAN_FAILED = 125


def _probed(probe: subprocess.CompletedProcess[str]) -> dict[str, str | None] | None:
    """:data:`IMAGE_PROBE`'s answer ({"python": "3.11.2", "torch": "2.13.0" or None}); None when it gave none."""
    try:
        found = json.loads(probe.stdout.strip().splitlines()[-1]) if probe.returncode == 0 else None
    except (ValueError, IndexError):
        return None
    if not isinstance(found, dict) or not _VERSION.fullmatch(str(found.get("python"))):
        return None
    torch = found.get("torch")
    return {"python": str(found["python"]), "torch": str(torch) if torch else None}


def _last_line(result: subprocess.CompletedProcess[str]) -> str:
    """What a failed podman command said last (its stderr, else its stdout), cut to 200 characters."""
    lines = (result.stderr or result.stdout).strip().splitlines()
    return lines[-1][:200] if lines else "no output"


#: runc's and crun's exit codes for a command the image lacks (127) or cannot run (126): the image's fault.
_NOT_IN_IMAGE = (126, 127)


def podman_failed(result: subprocess.CompletedProcess[str]) -> bool:
    """Whether ``podman run`` itself failed before the command in the container ran (it did not answer, or it
    said ``Error: ...`` and the command printed nothing): the host's Podman, not the image. Podman 4.3 exits 1,
    not 125, when it cannot mount the container's storage."""
    if result.returncode in (PODMAN_TIMED_OUT, PODMAN_FAILED):
        return True
    return (result.returncode not in (0, *_NOT_IN_IMAGE) and not result.stdout.strip()
            and any(line.startswith("Error: ") for line in result.stderr.splitlines()))


def podman_said(result: subprocess.CompletedProcess[str]) -> str:
    """What a failed podman command said that tells why: its last two lines that say something (runc's bare
    ``: exit status 1`` and fuse-overlayfs's ignored options left out), cut to 300 characters."""
    lines = [line.strip() for line in (result.stderr or result.stdout).splitlines()]
    telling = [line for line in lines if line and not line.startswith(":")
               and not line.startswith("unknown argument ignored")]
    return "; ".join(telling[-2:])[:300] if telling else _last_line(result)


def image_shortfalls(probe: subprocess.CompletedProcess[str]) -> list[str]:
    """What an image lacks to run a dlsub job, from :data:`IMAGE_PROBE`'s run in it ([]: nothing)."""
    return _shortfalls(probe, _probed(probe))


def _shortfalls(probe: subprocess.CompletedProcess[str], found: dict[str, str | None] | None) -> list[str]:
    if found is None:
        return [f"no python3 that runs (python3 in it: {_last_line(probe)})"]
    lacks = []
    version = tuple(int(v) for v in str(found["python"]).split(".")[:2])
    if version < MIN_PYTHON:
        lacks.append(f"Python {found.get('python')} (dlsub's library needs {'.'.join(map(str, MIN_PYTHON))} or "
                     "newer)")
    if not found.get("torch"):
        lacks.append("no torch (torchrun starts every job; pip install torch in the image)")
    return lacks


def check_image_contents(image: str, image_id: str, checked: Path,
                         runtime: str | None = None) -> tuple[str | None, str]:
    """The version of ``image``'s Python ("3.11.2"), and a warning ("" for none); raise :class:`ImageError`
    naming what the image (by its ID) lacks to run a job: a Python dlsub's library runs on, torch.

    The probe runs as the job's container does (its runtime, cgroupfs), once per ID: an ID that passed is
    recorded in the folder ``checked`` with its Python's version (an ID is its content). Where this host's
    Podman cannot start a container at all, nothing is said of the image: the version is None, and the warning
    says the image was not checked."""
    mark = checked / image_id
    try:
        known = mark.read_text().strip()
    except OSError:
        known = ""
    if _VERSION.fullmatch(known):
        return known, ""
    name = f"dlsub-image-check-{uuid.uuid4().hex[:12]}"
    probe = _podman([*(["--runtime", runtime] if runtime else []), "--cgroup-manager", "cgroupfs", "run", "--rm",
                     "--name", name, "--network", "none", "--entrypoint", "python3", image_id, "-c", IMAGE_PROBE])
    if podman_failed(probe):
        if probe.returncode == PODMAN_TIMED_OUT:
            _podman(["rm", "--force", "--ignore", name])
        return None, (f"could not start a container of {image} on this host to check what it holds "
                      f"({podman_said(probe)}); it is not checked: `dlsub doctor --user $USER` checks Podman here")
    found = _probed(probe)
    lacks = _shortfalls(probe, found)
    if lacks:
        raise ImageError(f"image {image!r} cannot run a dlsub job: {'; '.join(lacks)}; use an image with them "
                         f"(the site's: {DEFAULT_IMAGE} on the testbed), or add your packages to it with --venv; see "
                         "the user guide's \"Bringing your own code and environment\"")
    assert found is not None and found["python"] is not None  # no shortfall: it answered
    checked.mkdir(parents=True, exist_ok=True, mode=0o700)
    mark.write_text(found["python"] + "\n")
    return found["python"], ""


#: An image's ID as Podman gives it (sha256 of its config, 64 hex digits).
IMAGE_ID = re.compile(r"^[0-9a-f]{64}\Z")


def _stores(info: subprocess.CompletedProcess[str]) -> str:
    """Where this user's Podman keeps and finds images, in words (its graph root and additional stores), from
    ``podman info --format json``'s answer."""
    try:
        store = json.loads(info.stdout)["store"]
        options = store.get("graphOptions") or {}
        extra = [str(v) for k, v in options.items() if k.endswith(".imagestore")]
        return (f"looked in {store.get('graphRoot')}"
                + (f" and the site's read-only store {', '.join(extra)}" if extra else
                   ", and no site image store is configured (additionalimagestores in storage.conf)"))
    except (ValueError, KeyError, TypeError, AttributeError):
        return "podman info did not say where it looks"
