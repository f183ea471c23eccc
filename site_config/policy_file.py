"""The admin's policy file, ``/etc/dlsub/policy.toml``: one typed, validated object.

Every table and key is checked: an unknown key is an error that lists the
valid ones, a wrong type names the key and the type wanted, and a cron
expression or policy name that cannot be used says why. ``dlsub config
check FILE`` runs exactly this. etc/policy.toml.example documents each key.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta, timezone
from pathlib import Path, PurePosixPath
from typing import Any

from dlsub.containers.exports import site_variable_problem
from dlsub.containers.mounts import ORIGIN_SITE, MountError, MountRequest, check_path_text
from dlsub.contract import MAX_PARTITION_IMAGES, valid_gpu_type, valid_partition
from dlsub.site_config.budget import BudgetError, Budgets, parse_budgets
from dlsub.site_config.cost import Prices
from dlsub.strict import read_toml, unknown_keys

DEFAULT_PATH = Path("/etc/dlsub/policy.toml")
ROLES = ("gpu", "cpu", "dev")
MODES = ("immediate", "ideal")


class PolicyFileError(ValueError):
    """The policy file cannot be used; the message names the key and the fix."""


@dataclass(frozen=True)
class PartitionRole:
    # What the partition is to dlsub: "gpu" (where jobs belong), "dev" (GPUs for short runs and off-hours
    # backfill) or "cpu" (where immediate mode starts jobs that wait for GPUs).
    role: str
    speed: float = 1.0  # relative training speed of one job here (gpu = 1.0)
    # The price of a node-hour here: `dlsub estimate`, `dlsub status` (cost so far), `dlsub usage`, budgets.
    cost_per_node_hour: float = 0.0
    # The kind of GPU the partition's nodes have, for sites that keep one kind a partition and whose GRES
    # does not name it ("": Slurm's GRES type, where it names one, is the kind).
    gpu_type: str = ""


@dataclass(frozen=True)
class GpuTypePrice:
    """``[gpu_types.NAME]``: GPUs of this kind cost this per GPU-hour, on any partition (in place of the
    partition's node-hour price)."""

    # The price of one GPU-hour of this kind, on any partition (in place of the partition's node-hour price).
    cost_per_gpu_hour: float = 0.0


@dataclass(frozen=True)
class Window:
    """An off-hours window: opens at each ``start`` cron time, closes at the next ``end``."""

    # The window's name, as `dlsub agent status` and backfill decisions give it.
    name: str
    # When it opens: a cron expression (minute hour day month weekday), in the agent host's time zone.
    start: str
    # When it closes: a cron expression; the first time after it opened.
    end: str

    def _fires(self, expr: str, since: datetime, until: datetime) -> list[datetime]:
        trigger = cron_trigger(expr, since.tzinfo)
        times: list[datetime] = []
        previous: datetime | None = None
        moment = trigger.get_next_fire_time(None, since)
        while moment is not None and moment <= until and len(times) < 10_000:
            times.append(moment)
            previous = moment
            moment = trigger.get_next_fire_time(previous, previous + timedelta(seconds=1))
        return times

    def state(self, now: float, tz: timezone | None = None) -> tuple[bool, float | None]:
        """(is the window open at ``now``, when it next closes or opens, epoch seconds)."""
        zone = tz or datetime.now().astimezone().tzinfo
        moment = datetime.fromtimestamp(now, zone)
        since = moment - timedelta(days=8)
        last_start = max(self._fires(self.start, since, moment), default=None)
        last_end = max(self._fires(self.end, since, moment), default=None)
        is_open = last_start is not None and (last_end is None or last_end < last_start)
        horizon = moment + timedelta(days=8)
        upcoming = self._fires(self.end if is_open else self.start, moment + timedelta(seconds=1), horizon)
        return is_open, (upcoming[0].timestamp() if upcoming else None)


@dataclass(frozen=True)
class Backfill:
    # Let waiting jobs start on idle nodes of the roles below while a window is open.
    enabled: bool = True
    # Roles whose idle nodes may take waiting jobs inside a window.
    roles: tuple[str, ...] = ("dev", "cpu")
    windows: tuple[Window, ...] = ()


@dataclass(frozen=True)
class Moves:
    # Move jobs from cpu/dev partitions onto GPU partitions when GPUs go idle.
    enabled: bool = True
    # Users whose jobs may be moved; "*" is everyone.
    users: tuple[str, ...] = ("*",)
    # What a restart costs (container start, restore, warm-up), seconds.
    restart_cost_s: float = 60.0
    # A move must save at least this much more than it costs.
    min_saving_s: float = 60.0
    # Scripts that use no dlsub library (never checkpoint, so never moved with their progress), in
    # immediate mode: "restart" starts them on CPUs and restarts them from scratch on their GPU partition
    # when its GPUs free up, if they have run at most restart_plain_max_s there; "wait" never starts them
    # on CPUs (submit sends them to the GPU partition, where they wait).
    plain_scripts: str = "restart"
    # The most run time (seconds on the slow partition) such a restart may throw away.
    restart_plain_max_s: float = 600.0
    # How long a running attempt may go without its training's start event (checkpointing.init() writes
    # it) before the agent takes the job for one that uses no library.
    plain_grace_s: float = 120.0


@dataclass(frozen=True)
class GoodputSettings:
    """``[goodput]``: how ``policy = "goodput"`` sizes elastic jobs live."""

    # Where a partition's nodes have GPUs of several kinds (Slurm's GRES types, gpu:a100:4), choose each
    # elastic job's kind and size together with the simulator's typed goodput policy, on what the job measured
    # on each kind, and move a job to another kind (checkpoint, requeue onto it) when the gain beats the
    # restart. Off: every GPU of a partition counts as the same GPU (a job is never moved between kinds).
    across_gpu_types: bool = False


#: What ``[moves] plain_scripts`` may say.
PLAIN_SCRIPTS = ("restart", "wait")


@dataclass(frozen=True)
class TimeLimits:
    # Checkpoint and continue in a new attempt before the limit cuts a job off.
    continue_jobs: bool = True
    # At most this many continuations per job.
    max_continuations: int = 20


@dataclass(frozen=True)
class Limits:
    # Counted over everything the user holds in Slurm (dlsub's jobs or not),
    # moves in flight and the same tick's decisions: the agent starts no move
    # or backfill that would take a user past either.
    max_jobs_per_user: int = 100
    # The GPUs a user may hold, counted the same way.
    max_gpus_per_user: int = 64
    # The most GPUs the agent gives one job, whatever it asked for at submit.
    max_gpus_per_job: int = 8


@dataclass(frozen=True)
class Retention:
    # The agent's database keeps progress samples this long, in days.
    progress_days: float = 14.0
    # The agent's database keeps its decisions (`dlsub why`'s history) this long, in days.
    decisions_days: float = 90.0


@dataclass(frozen=True)
class MetricsPolicy:
    # Prometheus metrics on address:port (0: none).
    port: int = 0
    # The address the metrics listen on: 127.0.0.1 (this host only), the agent host's address on the network
    # the site's Prometheus scrapes from, or 0.0.0.0 (every interface). The metrics name no user unless
    # per_user_labels; anyone who reaches the port reads them.
    address: str = "127.0.0.1"
    # Per-user labels (jobs by user) are off unless the site allows them.
    per_user_labels: bool = False


@dataclass(frozen=True)
class Failover:
    # The agent's database lies on a file system two login hosts mount (DLSUB_AGENT_DB or --db) and an agent
    # runs on each: one holds a lease in the database and acts, the other stands by and takes over when the
    # lease runs out. The database then uses a rollback journal (SQLite's WAL works on one host only).
    shared_state: bool = False
    # How long the lease lasts after the active agent's last tick that reached Slurm, seconds; more than twice
    # tick_interval_s. A standby takes over within lease_s + tick_interval_s of that tick.
    lease_s: float = 15.0


@dataclass(frozen=True)
class ContainerSite:
    """How this site's nodes run a job's container (the ``[containers]`` table)."""

    # The OCI runtime (podman --runtime, e.g. "crun", "runc"); "": the node's Podman default.
    runtime: str = ""
    # Shared file systems every job's container sees at the same path, read-only / read-write.
    shared_mounts: tuple[str, ...] = ()
    # The same, mounted read-write (where jobs write: /scratch).
    shared_mounts_rw: tuple[str, ...] = ()
    # The network interface gloo and NCCL bind to (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME, in NCCL's syntax:
    # "ib0", "eth0,eth1", "^docker"); "": the interface of each node's own address (what its name resolves to).
    socket_ifname: str = ""
    # The image a job runs when its user names none (--image, $DLSUB_IMAGE): the site's training image, in its
    # image store ("": dlsub's own, containers.podman.DEFAULT_IMAGE).
    image: str = ""
    # The image of the jobs whose user names none, per partition (``partition_images = {gpu = "..."}``): GPU
    # partitions a CUDA image, CPU ones a CPU image. A job that runs on another partition than it was submitted
    # to (immediate mode's move from the CPUs onto its GPUs) runs the image of each partition it runs on.
    # Partitions not named run ``image``.
    partition_images: tuple[tuple[str, str], ...] = ()
    # Variables every job's container gets (``environment = { OMP_NUM_THREADS = "1" }``): the site's defaults for
    # its nodes; a user's --export of the same name replaces one. Names of the host, Slurm, torchrun and dlsub
    # are refused (containers.exports).
    environment: tuple[tuple[str, str], ...] = ()

    def image_for(self, given: str | None, environ: Mapping[str, str]) -> str | None:
        """The image a job runs: the user's --image, else their $DLSUB_IMAGE, else the site's (None: dlsub's)."""
        return given or environ.get("DLSUB_IMAGE") or self.image or None

    def partition_images_for(self, given: str | None, environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
        """The site's image per partition for a job, none when its user names an image (theirs runs everywhere)."""
        return () if given or environ.get("DLSUB_IMAGE") else self.partition_images

    def mount_requests(self) -> tuple[MountRequest, ...]:
        return (*(MountRequest(p, True, ORIGIN_SITE) for p in self.shared_mounts),
                *(MountRequest(p, False, ORIGIN_SITE) for p in self.shared_mounts_rw))


#: Folders that are each host's own on a cluster (a login node's ``/tmp`` is not a compute node's): a job whose
#: script, submit directory, job directories or ``--mount`` lie there would not find them on its node.
NODE_LOCAL_PATHS = ("/tmp", "/var/tmp", "/dev/shm", "/run")


def _under(path: PurePosixPath, folder: str) -> bool:
    root = PurePosixPath(folder)
    return path == root or root in path.parents


@dataclass(frozen=True)
class SitePaths:
    """Where this site's hosts see the same files (the ``[site]`` table): a job's files must be there."""

    # File systems every login and compute node mounts at the same path ("/home", "/scratch"). Named: a job's
    # paths must lie on one of them. Empty: any path that is not node-local is taken as shared.
    shared_paths: tuple[str, ...] = ()
    # Folders each host has of its own (None: NODE_LOCAL_PATHS, /tmp, /var/tmp, /dev/shm and /run). A shared
    # path inside one (a site's "/tmp/shared") is named in shared_paths: the nearer folder decides.
    node_local_paths: tuple[str, ...] | None = None
    # Where a user's job directories go when their dlsub home is on a file system without POSIX ACLs (NFSv4,
    # sshfs), "{user}" standing for their name ("/scratch/{user}/dlsub-jobs"): there the agent reads their
    # progress through an ACL, as in a home that has them. Empty: such a home keeps them, opened by mode bits
    # (directories 0711, progress and attempt files 0644; submit warns).
    job_directories: str = ""

    def job_directories_of(self, user: str) -> Path | None:
        """``job_directories`` for ``user`` (None: the key is not set)."""
        return Path(self.job_directories.replace("{user}", user)) if self.job_directories else None

    @property
    def node_local(self) -> tuple[str, ...]:
        return NODE_LOCAL_PATHS if self.node_local_paths is None else self.node_local_paths

    def unseen_by_nodes(self, path: Path) -> str | None:
        """Why a job's nodes would not see the absolute ``path`` (None: they do): the node-local folder it lies
        in, or "" when the site names its shared file systems and it lies on none."""
        where = PurePosixPath(path)
        local = max((f for f in self.node_local if _under(where, f)), key=len, default=None)
        shared = max((f for f in self.shared_paths if _under(where, f)), key=len, default=None)
        if local is not None and (shared is None or len(shared) <= len(local)):
            return local
        if self.shared_paths and shared is None:
            return ""
        return None


@dataclass(frozen=True)
class AgentPolicy:
    # Which policy (dlsub.policies) orders the jobs that want idle GPUs: fifo, rr, efifo, gang, tiresias,
    # optimus, goodput.
    policy: str = "fifo"
    # What `dlsub train.py` does when the ideal partition has no room now: "immediate" starts on what is free
    # (CPU or dev nodes) and moves later, "ideal" waits. Users override it with --mode.
    default_mode: str = "immediate"
    # How often the agent looks at the cluster, seconds (it also wakes as each backfill window opens and closes).
    tick_interval_s: float = 30.0
    # A tick that takes longer stops observing more jobs (they wait for the
    # next tick) and `dlsub agent status` shows it late.
    tick_deadline_s: float = 20.0
    # How long a job needs to write a checkpoint and exit once asked (by the agent, or by Slurm before a time
    # limit): the agent asks this much earlier.
    checkpoint_grace_s: float = 90.0
    # Users who see every job's decisions (root always does).
    admins: tuple[str, ...] = ()
    # The agent's service account: job directories grant it read access to
    # the progress and attempt files, and nothing else.
    agent_user: str = "dlsub"
    # Where the agent answers `dlsub why` and `dlsub agent status` (a Unix
    # socket; the kernel tells the agent who is asking).
    socket: str = "/run/dlsub/agent.sock"
    # Where the agent also listens on TCP for users on other login hosts, "HOST:PORT" (the agent's host as
    # clients reach it); "" (the default): the Unix socket only. Callers prove who they are with munge.
    agent_address: str = ""
    partitions: dict[str, PartitionRole] = field(default_factory=dict)
    gpu_types: dict[str, GpuTypePrice] = field(default_factory=dict)
    moves: Moves = Moves()
    goodput: GoodputSettings = GoodputSettings()
    time_limits: TimeLimits = TimeLimits()
    backfill: Backfill = Backfill()
    limits: Limits = Limits()
    retention: Retention = Retention()
    # Node-hours or cost per user/account and period (dlsub.site_config.budget); none by default.
    budgets: Budgets = Budgets()
    metrics: MetricsPolicy = MetricsPolicy()
    failover: Failover = Failover()
    containers: ContainerSite = ContainerSite()
    site: SitePaths = SitePaths()

    def is_admin(self, user: str) -> bool:
        return user == "root" or user in self.admins

    def role_of(self, partition: str) -> str | None:
        role = self.partitions.get(partition)
        return role.role if role else None

    def speed_of(self, partition: str) -> float:
        role = self.partitions.get(partition)
        return role.speed if role else 1.0

    def prices(self) -> Prices:
        """What the site charges, per partition node-hour and per GPU-hour of each kind it prices."""
        return Prices({name: role.cost_per_node_hour for name, role in self.partitions.items()},
                      {name: kind.cost_per_gpu_hour for name, kind in self.gpu_types.items()},
                      {name: role.gpu_type for name, role in self.partitions.items() if role.gpu_type})


# ---------------------------------------------------------------- parsing

_TOML_KEYS = {  # the file's own spellings where they differ from the fields
    "TimeLimits": {"continue": "continue_jobs"},
}


def _check_keys(where: str, table: dict[str, Any], valid: list[str]) -> None:
    message = unknown_keys(where, table, valid)
    if message:
        raise PolicyFileError(message)


def _typed(where: str, key: str, value: Any, kind: type) -> Any:
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if kind is bool and not isinstance(value, bool) or kind is not bool and isinstance(value, bool):
        raise PolicyFileError(f"{where}.{key}: expected {kind.__name__}, got {value!r}")
    if not isinstance(value, kind):
        raise PolicyFileError(f"{where}.{key}: expected {kind.__name__}, got {type(value).__name__} {value!r}")
    return value


def _simple(where: str, cls: type, table: Any) -> Any:
    """A flat dataclass from a TOML table: known keys only, each of its declared type."""
    if not isinstance(table, dict):
        raise PolicyFileError(f"{where}: expected a table")
    renames: dict[str, str] = _TOML_KEYS.get(cls.__name__, {})
    spelled: dict[str, str] = {renames.get(str(k), str(k)): str(k) for k in table}
    names = {f.name: f for f in fields(cls)}
    _check_keys(where, table, [next((t for t, f in renames.items() if f == n), n) for n in names])
    from dataclasses import MISSING

    missing = [
        n for n, f in names.items() if f.default is MISSING and f.default_factory is MISSING and n not in spelled
    ]
    if missing:
        raise PolicyFileError(f"{where}: missing key{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
    values: dict[str, Any] = {}
    for name, original in spelled.items():
        hint = str(names[name].type)
        value = table[original]
        if hint.startswith("tuple"):
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise PolicyFileError(f"{where}.{original}: expected a list of strings")
            values[name] = tuple(value)
        else:
            kind = {"float": float, "int": int, "bool": bool, "str": str}[hint]
            values[name] = _typed(where, original, value, kind)
            if kind in (int, float) and values[name] < 0:
                raise PolicyFileError(f"{where}.{original}: must not be negative")
    return cls(**values)


WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


def _weekdays(field_text: str) -> str:
    """A cron weekday field (0 or 7 = Sunday, as crontab(5) says) as explicit day names.

    APScheduler's own crontab parser numbers days from Monday = 0, so a
    site's "1-5" would silently mean Tuesday to Saturday; names are unambiguous.
    """
    if field_text == "*":
        return "*"
    days: list[int] = []
    for part in field_text.split(","):
        body, _, step_text = part.partition("/")
        step = int(step_text) if step_text else 1
        if body == "*":
            lo, hi = 0, 6
        elif "-" in body:
            lo_text, hi_text = body.split("-", 1)
            lo, hi = _day_number(lo_text), _day_number(hi_text)
            if hi < lo:
                hi += 7
        else:
            lo = hi = _day_number(body)
        days.extend(d % 7 for d in range(lo, hi + 1, step))
    return ",".join(WEEKDAYS[d] for d in sorted(set(days)))


def _day_number(text: str) -> int:
    text = text.strip().lower()
    if text[:3] in WEEKDAYS:
        return WEEKDAYS.index(text[:3])
    value = int(text)
    if not 0 <= value <= 7:
        raise ValueError(f"weekday {value} is not 0-7")
    return value % 7


def cron_trigger(expr: str, tz: Any = None) -> Any:
    """An APScheduler CronTrigger for a standard 5-field crontab expression."""
    from apscheduler.triggers.cron import CronTrigger

    parts = expr.split()
    if len(parts) != 5:
        raise ValueError(f"expected 5 fields (minute hour day month weekday), got {len(parts)}")
    minute, hour, day, month, weekday = parts
    return CronTrigger(minute=minute, hour=hour, day=day, month=month, day_of_week=_weekdays(weekday),
                       timezone=tz)


def _window(where: str, table: Any) -> Window:
    window: Window = _simple(where, Window, table)
    for key in ("start", "end"):
        try:
            cron_trigger(getattr(window, key))
        except ValueError as exc:
            raise PolicyFileError(
                f"{where}.{key}: {getattr(window, key)!r} is not a cron expression "
                f"(minute hour day month weekday, e.g. '0 19 * * 1-5'): {exc}"
            ) from None
    return window


#: An image's name as Podman takes it: ``localhost/site-torch:2.13.0-cu128``, ``name:tag``, ``name@sha256:...``.
_IMAGE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,254}")


def _image_text(where: str, image: str) -> None:
    if not _IMAGE_NAME.fullmatch(image):
        raise PolicyFileError(f"{where}: {image!r}; name an image as Podman does "
                              "(\"localhost/site-torch:2.13.0-cu128\", registry/name:tag or name@sha256:...)")


def _partition_images(where: str, table: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(table, dict):
        raise PolicyFileError(f"{where}: expected a table of partition = \"image\", e.g. "
                              "{ gpu = \"localhost/site-torch:2.13.0-cu128\" }")
    for partition, image in table.items():
        if not valid_partition(partition):
            raise PolicyFileError(f"{where}: {partition!r} is not a partition's name (letters, digits, '._-')")
        if not isinstance(image, str):
            raise PolicyFileError(f"{where}.{partition}: expected an image's name (a string)")
        _image_text(f"{where}.{partition}", image)
    if len(set(table.values())) > MAX_PARTITION_IMAGES:
        raise PolicyFileError(f"{where}: {len(set(table.values()))} images; at most {MAX_PARTITION_IMAGES} (each "
                              "job records the ID of every one): give partitions of one kind the same image")
    return tuple(sorted((str(k), str(v)) for k, v in table.items()))


def _environment(where: str, table: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(table, dict):
        raise PolicyFileError(f"{where}: expected a table of NAME = \"value\", e.g. {{ OMP_NUM_THREADS = \"1\" }}")
    pairs: list[tuple[str, str]] = []
    for name, value in table.items():
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise PolicyFileError(f"{where}.{name}: expected a string (or a whole number), e.g. \"1\"")
        problem = site_variable_problem(str(name), str(value))
        if problem:
            raise PolicyFileError(f"{where}: {name!r} {problem}; leave it out")
        pairs.append((str(name), str(value)))
    return tuple(sorted(pairs))


def _containers(where: str, table: Any) -> ContainerSite:
    tables = ("partition_images", "environment")
    rest = {k: v for k, v in table.items() if k not in tables} if isinstance(table, dict) else table
    site: ContainerSite = _simple(where, ContainerSite, rest)
    if isinstance(table, dict) and "partition_images" in table:
        site = dataclasses.replace(site, partition_images=_partition_images(f"{where}.partition_images",
                                                                            table["partition_images"]))
    if isinstance(table, dict) and "environment" in table:
        site = dataclasses.replace(site, environment=_environment(f"{where}.environment", table["environment"]))
    if any(ch.isspace() for ch in site.runtime):
        raise PolicyFileError(f"{where}.runtime: {site.runtime!r}; name one runtime (crun, runc or a path), "
                              "or leave it out for the node's Podman default")
    if site.image:
        _image_text(f"{where}.image", site.image)
    if not re.fullmatch(r"[\^=]?[A-Za-z0-9_.:-]*(,[A-Za-z0-9_.:-]+)*", site.socket_ifname):
        raise PolicyFileError(f"{where}.socket_ifname: {site.socket_ifname!r}; name interfaces as NCCL_SOCKET_IFNAME "
                              "takes them (\"ib0\", \"eth0,eth1\", \"^docker\"), or leave it out for the interface "
                              "of each node's own address")
    for key in ("shared_mounts", "shared_mounts_rw"):
        for path in getattr(site, key):
            try:
                check_path_text(path, "path")
            except MountError as exc:
                raise PolicyFileError(f"{where}.{key}: {exc}") from None
            if not path.startswith("/") or path.rstrip("/") == "":
                raise PolicyFileError(f"{where}.{key}: {path!r}: expected an absolute path below /, "
                                      "e.g. \"/scratch\"")
    both = sorted(set(site.shared_mounts) & set(site.shared_mounts_rw))
    if both:
        raise PolicyFileError(f"{where}: {', '.join(both)} in both shared_mounts and shared_mounts_rw; "
                              "keep each path in one of them")
    return site


def _site(where: str, table: Any) -> SitePaths:
    site: SitePaths = _simple(where, SitePaths, table)
    for key in ("shared_paths", "node_local_paths"):
        for path in getattr(site, key) or ():
            try:
                check_path_text(path, "path")
            except MountError as exc:
                raise PolicyFileError(f"{where}.{key}: {exc}") from None
            if not path.startswith("/") or PurePosixPath(path) != PurePosixPath(os.path.normpath(path)):
                raise PolicyFileError(f"{where}.{key}: {path!r}: expected an absolute, normal path, e.g. "
                                      "\"/scratch\"")
    if site.job_directories:
        template = site.job_directories
        example = site.job_directories_of("alice")
        try:
            check_path_text(template, "path")
        except MountError as exc:
            raise PolicyFileError(f"{where}.job_directories: {exc}") from None
        if (not template.startswith("/") or "{user}" not in template or example is None
                or str(example) != os.path.normpath(example) or "{" in str(example) or "}" in str(example)):
            raise PolicyFileError(f"{where}.job_directories: {template!r}: expected an absolute, normal path with "
                                  "{user} in it, e.g. \"/scratch/{user}/dlsub-jobs\"")
    return site


def _failover(where: str, table: Any, tick_interval_s: float) -> Failover:
    failover: Failover = _simple(where, Failover, table)
    if failover.lease_s <= 0:
        raise PolicyFileError(f"{where}.lease_s: must be positive")
    if failover.shared_state and failover.lease_s <= 2 * tick_interval_s:
        raise PolicyFileError(f"{where}.lease_s: {failover.lease_s:g} s; with ticks every {tick_interval_s:g} s "
                              f"(tick_interval_s) the lease must last more than two ticks, so that one slow tick "
                              f"does not hand it over (e.g. lease_s = {5 * tick_interval_s:g})")
    return failover


def parse_policy(data: dict[str, Any], where: str = "policy.toml") -> AgentPolicy:
    top = [f.name for f in fields(AgentPolicy)]
    _check_keys(where, data, top)
    values: dict[str, Any] = {}
    for key in ("policy", "default_mode", "agent_user", "socket", "agent_address"):
        if key in data:
            values[key] = _typed(where, key, data[key], str)
    if "admins" in data:
        admins = data["admins"]
        if not isinstance(admins, list) or not all(isinstance(a, str) for a in admins):
            raise PolicyFileError(f"{where}.admins: expected a list of user names")
        values["admins"] = tuple(admins)
    if "socket" in values and not values["socket"].startswith("/"):
        raise PolicyFileError(f"{where}.socket: expected an absolute path, got {values['socket']!r}")
    if values.get("agent_address"):
        try:
            host, _ = parse_address(values["agent_address"])
        except ValueError as exc:
            raise PolicyFileError(f"{where}.agent_address: {exc}") from None
        if host in ("0.0.0.0", "::"):
            raise PolicyFileError(f"{where}.agent_address: {values['agent_address']!r}; name the agent's host as "
                                  "the other login hosts reach it (they connect there; the agent listens there), "
                                  "e.g. \"login1:6830\"")
    for key in ("tick_interval_s", "tick_deadline_s", "checkpoint_grace_s"):
        if key in data:
            values[key] = _typed(where, key, data[key], float)
            if values[key] <= 0:
                raise PolicyFileError(f"{where}.{key}: must be positive")
    if values.get("default_mode", "immediate") not in MODES:
        raise PolicyFileError(f"{where}.default_mode: {values['default_mode']!r}; valid modes: {', '.join(MODES)}")
    if "policy" in values:
        from dlsub.policies.registry import policy_names

        if values["policy"] not in policy_names():
            raise PolicyFileError(
                f"{where}.policy: unknown policy {values['policy']!r}; valid policies: {', '.join(policy_names())}"
            )
    partitions = {}
    raw_partitions = data.get("partitions", {})
    if not isinstance(raw_partitions, dict):
        raise PolicyFileError(f"{where}.partitions: expected a table of partitions")
    for name, table in raw_partitions.items():
        role = _simple(f"{where}.partitions.{name}", PartitionRole, table)
        if role.role not in ROLES:
            raise PolicyFileError(f"{where}.partitions.{name}.role: {role.role!r}; valid roles: {', '.join(ROLES)}")
        if role.speed <= 0:
            raise PolicyFileError(f"{where}.partitions.{name}.speed: must be positive")
        if role.gpu_type and valid_gpu_type(role.gpu_type) is None:
            raise PolicyFileError(f"{where}.partitions.{name}.gpu_type: {role.gpu_type!r}; name the kind as Slurm's "
                                  "GRES would (letters, digits, '_', '.', '-'; e.g. \"a100\")")
        partitions[name] = role
    values["partitions"] = partitions
    raw_types = data.get("gpu_types", {})
    if not isinstance(raw_types, dict):
        raise PolicyFileError(f"{where}.gpu_types: expected a table of GPU types ([gpu_types.a100])")
    gpu_types = {}
    for name, table in raw_types.items():
        if valid_gpu_type(name) is None:
            raise PolicyFileError(f"{where}.gpu_types: {name!r}; name the kind as Slurm's GRES does (letters, "
                                  "digits, '_', '.', '-'; e.g. [gpu_types.a100])")
        gpu_types[name] = _simple(f"{where}.gpu_types.{name}", GpuTypePrice, table)
    values["gpu_types"] = gpu_types
    if "moves" in data:
        values["moves"] = _simple(f"{where}.moves", Moves, data["moves"])
        if values["moves"].plain_scripts not in PLAIN_SCRIPTS:
            raise PolicyFileError(f"{where}.moves.plain_scripts: {values['moves'].plain_scripts!r}; valid values: "
                                  f"{', '.join(repr(v) for v in PLAIN_SCRIPTS)} (restart: from scratch on the GPU "
                                  "when it frees; wait: never start such jobs on CPUs)")
        if values["moves"].plain_grace_s <= 0:
            raise PolicyFileError(f"{where}.moves.plain_grace_s: must be positive (seconds a training has to "
                                  "write its start event)")
    if "goodput" in data:
        values["goodput"] = _simple(f"{where}.goodput", GoodputSettings, data["goodput"])
        if values["goodput"].across_gpu_types and values.get("policy", "fifo") != "goodput":
            raise PolicyFileError(f"{where}.goodput.across_gpu_types: only the goodput policy places jobs across "
                                  f"GPU kinds; set policy = \"goodput\" or leave across_gpu_types = false")
    if "time_limits" in data:
        values["time_limits"] = _simple(f"{where}.time_limits", TimeLimits, data["time_limits"])
    if "limits" in data:
        values["limits"] = _simple(f"{where}.limits", Limits, data["limits"])
    if "retention" in data:
        values["retention"] = _simple(f"{where}.retention", Retention, data["retention"])
    if "budgets" in data:
        try:
            values["budgets"] = parse_budgets(data["budgets"], f"{where}.budgets")
        except BudgetError as exc:
            raise PolicyFileError(str(exc)) from None
    if "metrics" in data:
        values["metrics"] = _simple(f"{where}.metrics", MetricsPolicy, data["metrics"])
        if values["metrics"].port > 65535:
            raise PolicyFileError(f"{where}.metrics.port: {values['metrics'].port} is not a port (1-65535, 0: off)")
        try:
            ipaddress.ip_address(values["metrics"].address)
        except ValueError:
            raise PolicyFileError(f"{where}.metrics.address: {values['metrics'].address!r} is not an IP address "
                                  "(\"127.0.0.1\", this host's address, or \"0.0.0.0\" for every interface)") from None
    if "failover" in data:
        values["failover"] = _failover(f"{where}.failover", data["failover"],
                                       values.get("tick_interval_s", AgentPolicy.tick_interval_s))
    if "containers" in data:
        values["containers"] = _containers(f"{where}.containers", data["containers"])
    if "site" in data:
        values["site"] = _site(f"{where}.site", data["site"])
    if "backfill" in data:
        table = data["backfill"]
        if not isinstance(table, dict):
            raise PolicyFileError(f"{where}.backfill: expected a table")
        raw_windows = table.get("window", [])
        if not isinstance(raw_windows, list):
            raise PolicyFileError(f"{where}.backfill.window: expected [[backfill.window]] tables")
        windows = tuple(_window(f"{where}.backfill.window[{i}]", w) for i, w in enumerate(raw_windows))
        rest = {k: v for k, v in table.items() if k != "window"}
        _check_keys(f"{where}.backfill", rest, ["enabled", "roles"])
        backfill = _simple(f"{where}.backfill", Backfill, {k: v for k, v in rest.items()})
        bad = [r for r in backfill.roles if r not in ROLES]
        if bad:
            raise PolicyFileError(f"{where}.backfill.roles: {bad}; valid roles: {', '.join(ROLES)}")
        values["backfill"] = Backfill(backfill.enabled, backfill.roles, windows)
    return AgentPolicy(**values)


def parse_address(text: str, *, any_port: bool = False) -> tuple[str, int]:
    """``HOST:PORT`` (``[ADDR]:PORT`` for an IPv6 address) as (host, port); ValueError says what is wrong.

    ``any_port``: port 0 (a listener's "any free port", for tests) is allowed.
    """
    host, colon, port_text = text.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    if bracketed:
        host = host[1:-1]
    if not colon or not re.fullmatch(r"[A-Za-z0-9_.:-]+", host) or (":" in host and not bracketed):
        raise ValueError(f"{text!r}: expected HOST:PORT, e.g. \"login1:6830\" (\"[ADDR]:PORT\" for IPv6)")
    if not port_text.isdigit() or not (0 if any_port else 1) <= int(port_text) < 65536:
        raise ValueError(f"{text!r}: the port must be a number from 1 to 65535")
    return host, int(port_text)


def policy_path(path: Path | None = None) -> Path | None:
    """The file :func:`load_policy` reads: ``path``, else $DLSUB_POLICY or /etc/dlsub/policy.toml where it
    exists; None: none does (dlsub's defaults)."""
    if path is not None:
        return path
    env = os.environ.get("DLSUB_POLICY")
    found = Path(env) if env else DEFAULT_PATH
    return found if found.exists() else None


def load_policy(path: Path | None = None) -> AgentPolicy:
    """The policy at ``path``, $DLSUB_POLICY, or /etc/dlsub/policy.toml; defaults when none exists."""
    read = policy_path(path)
    if read is None:
        return AgentPolicy()
    return parse_policy(read_toml(read, "policy file", PolicyFileError), str(read))
