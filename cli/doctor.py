"""`dlsub doctor`: what a site must have for dlsub, each checked, with its fix in one line.

Each check is a small function from what it read to a :class:`Finding`; :func:`run_doctor`
reads (Slurm through the one client, the machine through :class:`Host`) and never lets one
failing probe stop the others: a probe that fails is its own check's problem.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dlsub.contract import SUBMIT_RECORD_PREFIX
from dlsub.job.agent_client import AgentEndpoint, AgentUnavailable, ask
from dlsub.job.submit import library_dir
from dlsub.site_config.policy_file import AgentPolicy
from dlsub.slurm_plugins.client import SlurmClient, SlurmConfig, SlurmError
from dlsub.slurm_plugins.dialects import OLDEST_SUPPORTED, TESTED_VERSIONS, SlurmVersion

OK, WARN, PROBLEM, SKIPPED = "ok", "warn", "problem", "skipped"
#: Clocks further apart than this make ETAs, move timing and the agent's deadlines wrong.
MAX_SKEW_S = 5.0
#: Subordinate ids rootless Podman needs at the least (one user namespace of 65,536 ids).
MIN_SUBIDS = 65536


@dataclass(frozen=True)
class Finding:
    check: str
    status: str  # ok | warn | problem | skipped
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


class Host:
    """What doctor reads from this machine besides Slurm (a seam for the unit tests)."""

    def read_text(self, path: Path) -> str | None:
        try:
            return path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None

    def stat(self, path: Path) -> os.stat_result | None:
        try:
            return path.lstat()
        except OSError:
            return None

    def user(self, name: str) -> pwd.struct_passwd | None:
        try:
            return pwd.getpwnam(name)
        except KeyError:
            return None

    def run_as(self, user: pwd.struct_passwd, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        """``argv`` as ``user`` (runuser when root), with that user's runtime directory."""
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME": user.pw_dir, "USER": user.pw_name,
               "XDG_RUNTIME_DIR": f"/run/user/{user.pw_uid}"}
        full = list(argv) if os.getuid() == user.pw_uid else ["runuser", "-u", user.pw_name, "--", *argv]
        try:
            return subprocess.run(full, capture_output=True, text=True, timeout=60, env=env, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return subprocess.CompletedProcess(full, 127, "", str(exc))

    def agent_status(self, socket_path: AgentEndpoint | Path) -> dict[str, Any]:
        reply = ask(socket_path, {"op": "status"}, timeout_s=5.0)
        if not reply.get("ok") or not isinstance(reply.get("status"), dict):
            raise AgentUnavailable(f"the agent answered with an error: {reply.get('error')}")
        status: dict[str, Any] = reply["status"]
        return status

    def now(self) -> float:
        return time.time()

    def which(self, command: str) -> str | None:
        """The path of ``command`` on this host's PATH, or None."""
        return shutil.which(command)

    def run(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        """``argv`` as the caller, briefly; a command that cannot start answers 127."""
        try:
            return subprocess.run(list(argv), capture_output=True, text=True, timeout=20, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return subprocess.CompletedProcess(list(argv), 127, "", str(exc))

    def fs_type(self, path: Path) -> str | None:
        """The file system type of ``path`` as the kernel names it (stat -f), or None if unknown."""
        try:
            out = subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True,
                                 timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return (out.stdout.strip() or None) if out.returncode == 0 else None


# ---------------------------------------------------------------- the checks, each from what it read


def check_version(version: SlurmVersion) -> Finding:
    name = "slurm version"
    if (version.major, version.minor) < OLDEST_SUPPORTED:
        return Finding(name, PROBLEM, f"Slurm {version} is older than dlsub reads",
                       f"upgrade Slurm to one of {', '.join(TESTED_VERSIONS)}")
    if version.series in TESTED_VERSIONS:
        return Finding(name, OK, f"Slurm {version} (tested)")
    return Finding(name, WARN, f"Slurm {version} is not one dlsub is tested on ({', '.join(TESTED_VERSIONS)})",
                   "run dlsub's tests on it (make test SLURM=...) or report what `dlsub status` misreads")


def check_operator(agent_user: str, level: str | None) -> Finding:
    name = "agent is a Slurm Operator"
    if level in ("Operator", "Administrator"):
        return Finding(name, OK, f"{agent_user}: {level}")
    shown = "no Slurm association" if level is None else f"admin level {level}"
    return Finding(name, PROBLEM, f"{agent_user} has {shown}: the agent cannot release, requeue or resize "
                   "users' jobs", f"sacctmgr -i modify user {agent_user} set adminlevel=Operator "
                   f"(after sacctmgr add user {agent_user} account=...)")


def check_job_submit(config: SlurmConfig, script: str | None, path: Path) -> Finding:
    name = "job_submit.lua"
    fix = (f"install dlsub's slurm_plugins/job_submit.lua as {path}, set JobSubmitPlugins=lua in slurm.conf, "
           "then scontrol reconfigure")
    if "lua" not in config.get("JobSubmitPlugins").split(","):
        return Finding(name, PROBLEM, f"JobSubmitPlugins is {config.get('JobSubmitPlugins') or 'unset'}: "
                       "no submit record, so the agent trusts no job's request", fix)
    if script is None:
        return Finding(name, PROBLEM, f"{path} is missing: slurmctld refuses every submission once it reloads",
                       fix)
    if SUBMIT_RECORD_PREFIX not in script:
        return Finding(name, PROBLEM, f"{path} is not dlsub's (it writes no {SUBMIT_RECORD_PREFIX} record)", fix)
    return Finding(name, OK, f"{path}, JobSubmitPlugins=lua")


def check_cred_expire(config: SlurmConfig) -> Finding:
    name = "cred_expire"
    seconds = config.cred_expire_s
    if seconds <= 30:
        return Finding(name, OK, f"a requeued job may start again after {seconds + 1} s")
    return Finding(name, WARN, f"a requeued job waits {seconds + 1} s before it may start again (moves and "
                   "continuations wait that long)", "AuthInfo=cred_expire=10 in slurm.conf (then restart the daemons)")


def check_job_cgroups(config: SlurmConfig) -> Finding:
    """Whether Slurm keeps each job, and so its container, in a cgroup of its own with its limits."""
    name = "job cgroups"
    missing = [f"ProctrackType={config.get('ProctrackType') or 'unset'}"] \
        if config.get("ProctrackType") != "proctrack/cgroup" else []
    if "task/cgroup" not in config.get("TaskPlugin").split(","):
        missing.append(f"TaskPlugin={config.get('TaskPlugin') or 'unset'}")
    missing += [f"{key}={config.get(key) or 'no'}" for key in ("ConstrainDevices", "ConstrainRAMSpace")
                if config.get(key).lower() != "yes"]
    if missing:
        return Finding(name, WARN, f"{', '.join(missing)}: a job's container is not held to the GPUs and memory "
                       "Slurm gave it, and a cancelled job can leave processes behind",
                       "ProctrackType=proctrack/cgroup and TaskPlugin=task/cgroup,task/affinity in slurm.conf, "
                       "ConstrainDevices=yes and ConstrainRAMSpace=yes in cgroup.conf (then restart the daemons)")
    return Finding(name, OK, f"proctrack/cgroup, task/cgroup, devices and memory constrained "
                   f"({config.get('CgroupPlugin') or 'cgroup'}); dlsub keeps containers in the job's cgroup")


#: File systems rootless Podman's storage does not work on (Podman's rootless.md): network and parallel ones.
SHARED_FILESYSTEMS = frozenset({"nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "smb2", "ceph", "fuse.ceph",
                                "panfs", "fuse.glusterfs", "fuse.sshfs", "wekafs"})


def check_storage(user: pwd.struct_passwd, info: subprocess.CompletedProcess[str], fs_type: str | None) -> Finding:
    """Rootless Podman's graph root must be on a node-local file system."""
    name = f"container storage of {user.pw_name}"
    graph_root = info.stdout.strip()
    if info.returncode != 0 or not graph_root:
        return Finding(name, PROBLEM, f"podman info failed: {(info.stderr or info.stdout).strip()[:200]}",
                       f"run `podman info` as {user.pw_name} and fix what it says")
    if fs_type in SHARED_FILESYSTEMS:
        return Finding(name, PROBLEM, f"the graph root {graph_root} is on {fs_type}, a shared file system "
                       "rootless Podman's storage does not work on",
                       f"graphroot = \"/tmp/{user.pw_name}_containers/storage\" (node-local disk) in "
                       f"{user.pw_dir}/.config/containers/storage.conf, or the site's /etc/containers/storage.conf")
    return Finding(name, OK, f"{graph_root} ({fs_type or 'file system unknown'})")


def check_gpus(config: SlurmConfig, gpu_partitions: dict[str, int]) -> Finding:
    name = "GPU gres"
    missing = sorted(p for p, gpus in gpu_partitions.items() if gpus == 0)
    if gpu_partitions and "gpu" not in config.get("GresTypes").split(","):
        return Finding(name, PROBLEM, "GresTypes has no gpu: Slurm hands out no GPUs",
                       "GresTypes=gpu and Gres=gpu:N on the GPU nodes (gres.conf), then restart the daemons")
    if missing:
        return Finding(name, PROBLEM, f"the policy's GPU partitions {', '.join(missing)} have no GPU node",
                       "add Gres=gpu:N to their nodes, or give those partitions another role in policy.toml")
    if not gpu_partitions:
        return Finding(name, WARN, "the policy names no GPU partition: jobs run on CPUs only",
                       "give the GPU partitions role = \"gpu\" in policy.toml")
    return Finding(name, OK, ", ".join(f"{p}: {g} GPUs" for p, g in sorted(gpu_partitions.items())))


def check_partitions(named: Sequence[str], existing: Sequence[str]) -> Finding:
    name = "policy partitions exist"
    missing = sorted(set(named) - set(existing))
    if missing:
        return Finding(name, PROBLEM, f"policy.toml names {', '.join(missing)}, which Slurm does not have "
                       f"(it has {', '.join(sorted(existing)) or 'none'})", "fix the names in policy.toml")
    return Finding(name, OK, ", ".join(sorted(named)) or "none named")


@dataclass(frozen=True)
class SubIds:
    """How many subordinate uids (or gids) a user has, and who said so."""

    count: int
    source: str  # "/etc/subuid", "/etc/subgid", or "getsubids" (shadow-utils: files, SSSD or LDAP per nsswitch)
    error: str = ""


def subids_from_file(user: pwd.struct_passwd, text: str | None, source: str) -> SubIds:
    """The ids /etc/subuid or /etc/subgid gives ``user`` (lines NAME-or-UID:FIRST:COUNT)."""
    count = 0
    for line in (text or "").splitlines():
        parts = line.strip().split(":")
        if len(parts) == 3 and parts[0] in (user.pw_name, str(user.pw_uid)) and parts[2].isdigit():
            count += int(parts[2])
    return SubIds(count, source)


def subids_from_getsubids(user: pwd.struct_passwd, result: subprocess.CompletedProcess[str]) -> SubIds:
    """What ``getsubids [-g] USER`` printed (lines "INDEX: NAME FIRST COUNT"); it exits 1 when the user has none."""
    count = 0
    for line in result.stdout.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0].endswith(":") and parts[1] in (user.pw_name, str(user.pw_uid)) \
                and parts[3].isdigit():
            count += int(parts[3])
    error = "" if result.returncode == 0 or count else (result.stderr or result.stdout).strip()[:200]
    return SubIds(count, "getsubids", error)


def read_subids(host: Host, user: pwd.struct_passwd, group: bool) -> SubIds:
    """Through ``getsubids`` where this host has it (it asks what nsswitch's ``subid:`` names, so ranges SSSD
    or LDAP serve count), else from /etc/subuid or /etc/subgid, which is all older shadow-utils read."""
    path = Path("/etc/subgid" if group else "/etc/subuid")
    tool = host.which("getsubids")
    if tool is None:
        return subids_from_file(user, host.read_text(path), str(path))
    result = host.run([tool, *(["-g"] if group else []), user.pw_name])
    if result.returncode not in (0, 1):  # it could not run at all: the files are what is left
        return subids_from_file(user, host.read_text(path), str(path))
    return subids_from_getsubids(user, result)


def check_subids(user: pwd.struct_passwd, uids: SubIds, gids: SubIds) -> Finding:
    name = f"subordinate ids of {user.pw_name}"
    short = []
    for kind, found in (("uids", uids), ("gids", gids)):
        if found.count < MIN_SUBIDS:
            where = f"getsubids{' -g' if kind == 'gids' else ''} gives {found.count} {kind}" \
                if found.source == "getsubids" else f"{found.source} has {found.count}"
            short.append(where + (f" ({found.error})" if found.error else ""))
    if short:
        served = any(f.source == "getsubids" for f in (uids, gids))
        return Finding(name, PROBLEM, f"rootless Podman needs {MIN_SUBIDS} subordinate ids: {'; '.join(short)}",
                       f"usermod --add-subuids 200000-265535 --add-subgids 200000-265535 {user.pw_name} "
                       "(a range no other user has)"
                       + ("; or, where SSSD or LDAP serve them (nsswitch.conf subid:), add the ranges there"
                          if served else ""))
    sources = sorted({uids.source, gids.source})
    return Finding(name, OK, "from getsubids (nsswitch's subid: source)" if sources == ["getsubids"]
                   else f"in {' and '.join(sources)}")


def check_cgroups(controllers: str | None, hybrid: bool) -> Finding:
    name = "cgroups"
    if controllers is not None:
        return Finding(name, OK, f"cgroup v2 ({controllers.strip() or 'no controllers delegated'})")
    if hybrid:
        return Finding(name, WARN, "hybrid cgroups (v1 and v2): rootless Podman sets no limits of its own and "
                       "crun refuses this layout (runc runs); a container has its job's, where Slurm constrains "
                       "jobs (job cgroups)", "a unified (v2) hierarchy with delegation; until then "
                       "runtime = \"runc\" in policy.toml [containers]")
    return Finding(name, WARN, "no cgroup v2 hierarchy: rootless Podman runs without resource limits (with runc)",
                   "boot with systemd.unified_cgroup_hierarchy=1 for limits")


def check_runtime_dir(user: pwd.struct_passwd, st: os.stat_result | None) -> Finding:
    path = f"/run/user/{user.pw_uid}"
    name = f"runtime directory of {user.pw_name}"
    if st is None:
        return Finding(name, WARN, f"{path} does not exist: jobs use their own private directory in /tmp",
                       "enable lingering (loginctl enable-linger) or pam_systemd so the login node makes it")
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != user.pw_uid or stat.S_IMODE(st.st_mode) & 0o077:
        return Finding(name, PROBLEM, f"{path} is not a directory of {user.pw_name}'s alone (mode "
                       f"{stat.S_IMODE(st.st_mode):o}, owner uid {st.st_uid})",
                       f"install -d -m 700 -o {user.pw_name} {path}")
    return Finding(name, OK, path)


def check_image(user: pwd.struct_passwd, image: str, result: subprocess.CompletedProcess[str]) -> Finding:
    name = f"image of {user.pw_name}"
    if result.returncode == 0:
        return Finding(name, OK, image)
    if result.returncode == 1 and not result.stderr.strip():
        return Finding(name, PROBLEM, f"{image} is not in {user.pw_name}'s Podman storage",
                       f"build or load it as {user.pw_name} (containers/build-image.sh {user.pw_name})")
    if "podman system migrate" in result.stderr:
        return Finding(name, PROBLEM, f"{user.pw_name}'s Podman pause process is gone (its pid file outlived it)",
                       f"run `podman system migrate` as {user.pw_name}")
    return Finding(name, PROBLEM, f"podman does not run for {user.pw_name}: "
                   f"{(result.stderr or result.stdout).strip()[:200]}",
                   "see `podman info` as that user (subuid/subgid, runtime directory, runc)")


#: What each container runs from the mounted package (python3 -m dlsub.checkpointing.launch).
LIBRARY_ENTRY = Path("checkpointing") / "launch.py"


def check_library(library: Path, entry: os.stat_result | None, package: os.stat_result | None,
                  closed: Sequence[Path], fs_type: str | None) -> Finding:
    """The installed dlsub package that every job's container mounts read-only (containers.podman.LIBRARY_MOUNT)
    from the path of the submitting dlsub: it must be there, readable by every user, on each compute node."""
    name = "dlsub package for containers"
    how = ("every compute node needs this same path: install dlsub on a shared software path that login and "
           "compute nodes all mount (e.g. a venv under /opt/dlsub on NFS), or install it per node at this same "
           "path and version (as on login nodes)")
    if entry is None or package is None:
        return Finding(name, PROBLEM, f"{library / LIBRARY_ENTRY} is missing on this host: jobs mount {library} "
                       "into their containers and fail to start dlsub's launcher", how)
    unreadable = [str(p) for p in closed]
    if not package.st_mode & stat.S_IROTH or not package.st_mode & stat.S_IXOTH \
            or not entry.st_mode & stat.S_IROTH:
        unreadable.append(str(library))
    if unreadable:
        return Finding(name, PROBLEM, f"{', '.join(unreadable)} cannot be read by other users, whose containers "
                       "mount the package from there", f"chmod -R a+rX {library} (and a+x on the folders above it)")
    where = f"a shared file system ({fs_type})" if fs_type in SHARED_FILESYSTEMS else \
        f"this node's own disk ({fs_type or 'file system unknown'})"
    return Finding(name, OK, f"{library}, on {where}; {how}")


def check_shared_mounts(present: dict[str, bool]) -> Finding:
    """The site's shared file systems (policy.toml [containers]) that jobs' containers mount, here."""
    name = "shared mounts"
    if not present:
        return Finding(name, OK, "none declared (policy.toml [containers] shared_mounts)")
    missing = sorted(path for path, there in present.items() if not there)
    if missing:
        return Finding(name, WARN, f"{', '.join(missing)} missing on this host: a job submitted from here does not "
                       "get it (a compute node without it cannot start the job's container)",
                       "mount it on every login and compute node, or take it out of policy.toml [containers]")
    return Finding(name, OK, ", ".join(sorted(present)))


def check_agent(socket_path: AgentEndpoint | Path, status: dict[str, Any] | None, error: str) -> Finding:
    name = "agent"
    if status is None:
        return Finding(name, PROBLEM, f"no answer on {socket_path}: {error}",
                       "start it: systemctl start dlsub-agent (etc/systemd/), or testbed/agent.sh start")
    if not status.get("running"):
        return Finding(name, PROBLEM, "the agent answers but is not ticking", "see its log; restart it")
    if status.get("late"):
        return Finding(name, WARN, "the agent is late with its ticks", "see its log (Slurm slow to answer?)")
    return Finding(name, OK, f"answering on {socket_path}")


def check_clock(slurm_time: float | None, local_time: float) -> Finding:
    name = "clocks"
    if slurm_time is None:
        return Finding(name, WARN, "slurmctld printed no time", "")
    skew = local_time - slurm_time
    if abs(skew) > MAX_SKEW_S:
        return Finding(name, PROBLEM, f"this host is {skew:+.0f} s off slurmctld's clock",
                       "run NTP (chrony) on every host: munge refuses credentials 5 min off")
    return Finding(name, OK, f"within {MAX_SKEW_S:.0f} s of slurmctld's")


# ---------------------------------------------------------------- gathering


def run_doctor(client: SlurmClient, host: Host, policy: AgentPolicy, *, user: str | None, image: str,
               socket_path: AgentEndpoint | Path, library: Path | None = None) -> list[Finding]:
    """Every check, in order; each probe's failure is that check's problem, never the report's."""
    findings: list[Finding] = []

    def probe(name: str, fix: str, work: Callable[[], Finding | list[Finding]]) -> None:
        try:
            found = work()
        except (SlurmError, OSError, ValueError) as exc:
            found = Finding(name, PROBLEM, str(exc).splitlines()[0][:300], fix)
        findings.extend(found if isinstance(found, list) else [found])

    slurm_fix = "check `scontrol ping` and munge (`munge -n | unmunge`)"
    probe("slurm version", slurm_fix, lambda: check_version(client.version()))
    config: list[SlurmConfig] = []

    def read_config() -> list[Finding]:
        config.append(client.config())
        return []

    probe("slurm configuration", slurm_fix, read_config)
    if config:
        cfg = config[0]
        conf_dir = Path(cfg.get("SLURM_CONF", "/etc/slurm/slurm.conf")).parent
        script = conf_dir / "job_submit.lua"
        findings.append(check_job_submit(cfg, host.read_text(script), script))
        findings.append(check_cred_expire(cfg))
        findings.append(check_job_cgroups(cfg))
        findings.append(check_clock(cfg.as_of, host.now()))
        probe("GPU gres", slurm_fix, lambda: check_gpus(cfg, _gpu_partitions(client, policy)))
    probe("agent is a Slurm Operator", "set up Slurm accounting (slurmdbd)",
          lambda: check_operator(policy.agent_user, client.admin_level(policy.agent_user)))
    probe("policy partitions exist", slurm_fix,
          lambda: check_partitions(list(policy.partitions), [p.name for p in client.partitions()]))
    try:
        status, error = host.agent_status(socket_path), ""
    except AgentUnavailable as exc:
        status, error = None, str(exc)
    findings.append(check_agent(socket_path, status, error))
    findings.append(_library_check(host, library_dir() if library is None else library))
    site = policy.containers
    findings.append(check_shared_mounts({path: host.stat(Path(path)) is not None
                                         for path in (*site.shared_mounts, *site.shared_mounts_rw)}))
    findings.extend(_podman_checks(host, user, image))
    return findings


def _library_check(host: Host, library: Path) -> Finding:
    """Reads what check_library judges: the entry point, the package folder, and folders above it that others
    cannot enter (those this host cannot stat are not judged)."""
    above = [p for p in library.parents if p != Path("/")]
    closed = [p for p in above if (st := host.stat(p)) is not None and stat.S_ISDIR(st.st_mode)
              and not st.st_mode & stat.S_IXOTH]
    return check_library(library, host.stat(library / LIBRARY_ENTRY), host.stat(library), closed,
                         host.fs_type(library))


def _gpu_partitions(client: SlurmClient, policy: AgentPolicy) -> dict[str, int]:
    gpus = {p.name: sum(n.gpus for n in p.nodes) for p in client.partitions()}
    return {name: gpus.get(name, 0) for name in policy.partitions if policy.role_of(name) in ("gpu", "dev")}


def _podman_checks(host: Host, user: str | None, image: str) -> list[Finding]:
    if user is None:
        return [Finding("rootless Podman", SKIPPED, "no user named", "dlsub doctor --user NAME checks one user's")]
    entry = host.user(user)
    if entry is None:
        return [Finding("rootless Podman", PROBLEM, f"no such user {user!r}", "name an existing user with --user")]
    controllers = host.read_text(Path("/sys/fs/cgroup/cgroup.controllers"))
    hybrid = host.stat(Path("/sys/fs/cgroup/unified")) is not None
    return [
        check_subids(entry, read_subids(host, entry, group=False), read_subids(host, entry, group=True)),
        check_cgroups(controllers, hybrid),
        check_runtime_dir(entry, host.stat(Path(f"/run/user/{entry.pw_uid}"))),
        check_image(entry, image, host.run_as(entry, ["podman", "image", "exists", image])),
        _storage_check(host, entry),
    ]


def _storage_check(host: Host, entry: pwd.struct_passwd) -> Finding:
    info = host.run_as(entry, ["podman", "info", "--format", "{{.Store.GraphRoot}}"])
    root = info.stdout.strip()
    return check_storage(entry, info, host.fs_type(Path(root)) if info.returncode == 0 and root else None)


def blocking(findings: Sequence[Finding]) -> bool:
    """Whether anything stops dlsub (warnings do not)."""
    return any(f.status == PROBLEM for f in findings)
