"""`dlsub doctor`: what a site must have for dlsub, each checked, with its fix in one line.

Each check is a small function from what it read to a :class:`Finding`; :func:`run_doctor`
reads (Slurm through the one client, the machine through :class:`Host`) and never lets one
failing probe stop the others: a probe that fails is its own check's problem.
"""

from __future__ import annotations

import collections
import json
import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from dlsub.contract import CDI_GPU_KIND, CDI_SPEC_DIRS, SUBMIT_RECORD_PREFIX
from dlsub.job.agent_client import AgentEndpoint, AgentUnavailable, ask
from dlsub.job.filesystems import NETWORK_FILESYSTEMS, filesystem_type
from dlsub.job.settings import HOME_DIR
from dlsub.job.submit import library_dir
from dlsub.site_config.policy_file import DEFAULT_PATH as DEFAULT_POLICY_PATH
from dlsub.site_config.policy_file import AgentPolicy
from dlsub.slurm_plugins.client import SlurmClient, SlurmConfig, SlurmError
from dlsub.slurm_plugins.dialects import OLDEST_SUPPORTED, TESTED_VERSIONS, SlurmVersion
from dlsub.slurm_plugins.models import SlurmJob, SlurmNode

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


#: Podman's own variables for its configuration files (containers.conf(5), containers-storage.conf(5)): a job
#: that has them in its environment runs Podman with them, so doctor reads and passes on the ones it is given.
PODMAN_CONFIG_ENV = ("CONTAINERS_CONF", "CONTAINERS_CONF_OVERRIDE", "CONTAINERS_STORAGE_CONF")


#: Run as the user by :meth:`Host.posix_acls` (``python -I -c``: argv[1] is the path).
_ACL_PROBE = ("import sys; from pathlib import Path; from dlsub.job.filesystems import posix_acls_work; "
              "print('yes' if posix_acls_work(Path(sys.argv[1])) else 'no')")


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
        """``argv`` as ``user`` (runuser when root), with that user's runtime directory and the Podman
        configuration variables doctor was given (PODMAN_CONFIG_ENV), so it sees what a job given them sees."""
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME": user.pw_dir, "USER": user.pw_name,
               "XDG_RUNTIME_DIR": f"/run/user/{user.pw_uid}",
               **{k: v for k, v in self.environ().items() if k in PODMAN_CONFIG_ENV}}
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

    def hostname(self) -> str:
        """This host's short name, which Slurm's node names are on most sites (NodeName = hostname -s)."""
        return socket.gethostname().split(".")[0]

    def environ(self) -> Mapping[str, str]:
        return os.environ

    def list_dir(self, path: Path) -> list[str]:
        """The names in ``path``, sorted; none when it is not a readable directory."""
        try:
            return sorted(os.listdir(path))
        except OSError:
            return []

    def which(self, command: str) -> str | None:
        """The path of ``command`` on this host's PATH, or None."""
        return shutil.which(command)

    def run(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        """``argv`` as the caller, briefly; a command that cannot start answers 127."""
        try:
            return subprocess.run(list(argv), capture_output=True, text=True, timeout=20, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return subprocess.CompletedProcess(list(argv), 127, "", str(exc))

    def posix_acls(self, user: pwd.struct_passwd, path: Path) -> bool | None:
        """Whether ``path``'s file system keeps POSIX ACLs, by dlsub's own test (``posix_acls_work``, what submit
        decides by), asked as ``user``: root may be squashed on a home the network serves. None where the
        question could not be asked."""
        asked = self.run_as(user, [sys.executable, "-I", "-c", _ACL_PROBE, str(path)])
        return {"yes": True, "no": False}.get(asked.stdout.strip()) if asked.returncode == 0 else None

    def fs_type(self, path: Path) -> str | None:
        """The file system type of ``path`` as the mount table names it (a FUSE one by its subtype, fuse.sshfs,
        which stat -f calls fuseblk), or as stat -f does where the table cannot be read; None if unknown."""
        listed = filesystem_type(path)
        if listed:
            return listed
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


def check_storage(user: pwd.struct_passwd, info: subprocess.CompletedProcess[str], fs_type: str | None, *,
                  compute_node: bool) -> Finding:
    """Rootless Podman's graph root must be on a node-local file system: not a network one, and not the user's
    home directory, which a cluster shares across its nodes (whatever file system type this host reports)."""
    name = f"container storage of {user.pw_name}"
    graph_root = info.stdout.strip()
    if info.returncode != 0 or not graph_root:
        return Finding(name, PROBLEM, f"podman info failed: {(info.stderr or info.stdout).strip()[:200]}",
                       f"run `podman info` as {user.pw_name} and fix what it says")
    fix = (f"rootless_storage_path = \"/local/containers/$USER/storage\" (node-local disk, a directory of each "
           f"user's own) in /etc/containers/storage.conf, or graphroot = \"...\" on node-local disk in "
           f"{user.pw_dir}/.config/containers/storage.conf; images from a read-only additional image store on "
           "shared storage")
    if fs_type in NETWORK_FILESYSTEMS:
        return Finding(name, PROBLEM, f"the graph root {graph_root} is on {fs_type}, a shared file system "
                       "rootless Podman's storage does not work on", fix)
    if _inside(Path(graph_root), Path(user.pw_dir)):
        where = "this compute node" if compute_node else "this host (not a Slurm node: fine for building images)"
        return Finding(name, PROBLEM if compute_node else WARN,
                       f"the graph root {graph_root} on {where} is in {user.pw_name}'s home directory, which a "
                       "cluster shares across its nodes: every node's Podman would write one storage, which "
                       "rootless Podman does not support", fix)
    return Finding(name, OK, f"{graph_root} ({fs_type or 'file system unknown'}), outside the home directory")


#: Where rootless Podman's fuse-overlayfs opens FUSE (Debian's udev rule makes it mode 0666).
FUSE_DEVICE = Path("/dev/fuse")


def check_fuse(user: pwd.struct_passwd, mount_program: str, device: os.stat_result | None,
               usable: bool) -> Finding:
    """Where the user's Podman mounts each container's overlay with a FUSE program (fuse-overlayfs: a kernel
    without rootless overlay), the user must be able to open /dev/fuse, or no container of theirs starts."""
    name = f"FUSE device of {user.pw_name}"
    if not mount_program:
        return Finding(name, OK, "Podman mounts the overlay itself (no FUSE program)")
    if device is None or not stat.S_ISCHR(device.st_mode):
        return Finding(name, PROBLEM, f"no {FUSE_DEVICE}: {mount_program}, which {user.pw_name}'s Podman mounts "
                       "containers with, cannot run, so no container starts", "modprobe fuse (and load it at boot)")
    if not usable:
        return Finding(name, PROBLEM, f"{FUSE_DEVICE} (mode {stat.S_IMODE(device.st_mode):o}, owner uid "
                       f"{device.st_uid}) cannot be opened by {user.pw_name}: {mount_program}, which their Podman "
                       "mounts containers with, fails (\"fuse: failed to open /dev/fuse: Permission denied\"), so "
                       "no container of theirs starts",
                       f"chmod 0666 {FUSE_DEVICE}, as Debian's udev rule sets it (KERNEL==\"fuse\", MODE=\"0666\")")
    return Finding(name, OK, f"{mount_program} can open {FUSE_DEVICE}")


def _inside(path: Path, folder: Path) -> bool:
    """Whether ``path`` is ``folder`` or below it (both as written: doctor judges what Podman was told)."""
    return path == folder or folder in path.parents


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


def shipped_site_files() -> Path:
    """Where this installation keeps the site files dlsub ships (the example policy, systemd units, TaskEpilog,
    cron entry: the ``dlsub.etc`` package, ``etc/`` of a checkout)."""
    return Path(str(resources.files("dlsub.etc")))


def check_policy_file(read: Path | None, shipped: Path) -> Finding:
    """The policy file dlsub reads here (``read``; None: none exists, so dlsub's defaults), and where the shipped
    example and units are to start from."""
    name = "policy file"
    files = (f"dlsub's site files: {shipped} (policy.toml.example, systemd/, slurm/taskepilog.sh, cron.d/); "
             "every key and its default: `python -m dlsub.site_config.policy_keys` (docs/policy-keys.md)")
    if read is None:
        return Finding(name, WARN, f"none at {DEFAULT_POLICY_PATH} ($DLSUB_POLICY unset): dlsub's defaults are "
                       f"in use (no partition roles, prices or moves of the site's); {files}",
                       f"install -m 644 {shipped / 'policy.toml.example'} {DEFAULT_POLICY_PATH}, edit it, and "
                       f"check it with `dlsub config check {DEFAULT_POLICY_PATH}`")
    return Finding(name, OK, f"{read}; {files}")


def check_partitions(named: Sequence[str], existing: Sequence[str]) -> Finding:
    """The partitions policy.toml names ([partitions], [containers] partition_images) against Slurm's: a name
    Slurm lacks is a typo, whose jobs run elsewhere or with the default image."""
    name = "policy partitions exist"
    named = list(dict.fromkeys(named))
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


def local_user(user: pwd.struct_passwd, passwd: str | None) -> bool:
    """Whether ``user`` is in this host's /etc/passwd (``passwd``: its text; None: unreadable, taken as local):
    ``usermod`` changes only such users; one from a directory (LDAP, SSSD) gets its ranges another way."""
    return passwd is None or any(line.split(":", 1)[0] == user.pw_name for line in passwd.splitlines())


def check_subids(user: pwd.struct_passwd, uids: SubIds, gids: SubIds, local: bool = True) -> Finding:
    """Whether the user has the subordinate ids rootless Podman needs; ``local``: whether the user is in this
    host's /etc/passwd (the fix differs for a directory's user)."""
    name = f"subordinate ids of {user.pw_name}"
    short = []
    for kind, found in (("uids", uids), ("gids", gids)):
        if found.count < MIN_SUBIDS:
            where = f"getsubids{' -g' if kind == 'gids' else ''} gives {found.count} {kind}" \
                if found.source == "getsubids" else f"{found.source} has {found.count}"
            short.append(where + (f" ({found.error})" if found.error else ""))
    if short:
        served = any(f.source == "getsubids" for f in (uids, gids))
        # Without them Podman maps the user's own id only: an image whose files belong to other uids fails.
        problem = f"rootless Podman needs {MIN_SUBIDS} subordinate ids: {'; '.join(short)}"
        if not local:
            return Finding(name, PROBLEM, f"{problem}; {user.pw_name} is not in this host's /etc/passwd (a "
                           "directory's user), so usermod cannot give them",
                           f"run {shipped_site_files() / 'subid-ranges.sh'} {user.pw_name} as root on every host "
                           "(ranges by uid, the same on each: docs/admin-guide.md, \"Users from a directory\")"
                           + ("; or, where SSSD serves them (nsswitch.conf subid:), add the ranges there"
                              if served else ""))
        return Finding(name, PROBLEM, problem,
                       f"usermod --add-subuids 200000-265535 --add-subgids 200000-265535 {user.pw_name} "
                       "(a range no other user has)"
                       + ("; or, where SSSD or LDAP serve them (nsswitch.conf subid:), add the ranges there"
                          if served else ""))
    sources = sorted({uids.source, gids.source})
    whose = "" if local else f" ({user.pw_name} is a directory's user, not in /etc/passwd)"
    return Finding(name, OK, ("from getsubids (nsswitch's subid: source)" if sources == ["getsubids"]
                              else f"in {' and '.join(sources)}") + whose)


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


#: What Podman 4.3 says when its pause process's pid file names a process that is gone and it will not replace it.
STALE_PAUSE_PID = "cannot re-exec process to join the existing user namespace"


def check_image(user: pwd.struct_passwd, image: str, result: subprocess.CompletedProcess[str],
                host_name: str = "this host", partition: str = "") -> Finding:
    """Whether ``image`` is in ``user``'s Podman storage as Podman on *this* host sees it (its graph root and
    its additional image stores): run on a compute node, that node's view. ``partition``: the partition whose
    image it is (policy.toml [containers] partition_images); "": the image of the others."""
    name = f"image of {user.pw_name}" + (f" on partition {partition}" if partition else "")
    if result.returncode == 0:
        return Finding(name, OK, f"{image}, on {host_name}")
    if result.returncode == 1 and not result.stderr.strip():
        return Finding(name, PROBLEM, f"{image} is not in {user.pw_name}'s Podman storage on {host_name} (its "
                       "graph root and additional image stores): jobs placed here cannot start",
                       "images reach every node through a read-only additional image store on shared storage: "
                       "list it in additionalimagestores in the node's storage.conf and build or load the image "
                       f"into it once, on a login host (containers/build-image.sh {user.pw_name}); see "
                       "docs/admin-guide.md, \"The training image on every node\"")
    if "podman system migrate" in result.stderr:
        return Finding(name, PROBLEM, f"{user.pw_name}'s Podman pause process is gone (its pid file outlived it)",
                       f"run `podman system migrate` as {user.pw_name}")
    if STALE_PAUSE_PID in result.stderr:
        # Podman 4.3, where the pause process died and its "alive" file is gone too (a runtime directory that a
        # reboot did not empty): it neither joins nor replaces the dead process, and `podman system migrate`
        # fails the same way. Its pid file, gone, lets the next podman start a new one.
        return Finding(name, PROBLEM, f"{user.pw_name}'s Podman pause process is gone and Podman cannot replace "
                       "it while its pid file names it (\"cannot re-exec process to join the existing user "
                       "namespace\")",
                       f"as {user.pw_name}, with no podman of theirs running on this host: "
                       "rm $XDG_RUNTIME_DIR/libpod/tmp/pause.pid")
    return Finding(name, PROBLEM, f"podman does not run for {user.pw_name}: "
                   f"{(result.stderr or result.stdout).strip()[:200]}",
                   "see `podman info` as that user (subuid/subgid, runtime directory, runc)")


def images_of(job: SlurmJob) -> list[str]:
    """The images a job runs (their IDs' first 12 hex digits): its own and the site's per partition, from the
    tags its submit record froze (the comment's when the site has no job_submit.lua); none for a job that names
    none (not dlsub's, or an older dlsub's)."""
    record = job.submit_record
    tags = record.tags if record is not None else job.tags
    if tags is None:
        return []
    return list(dict.fromkeys([*((tags.image,) if tags.image else ()), *tags.images]))


def check_site_images(listing: subprocess.CompletedProcess[str], jobs: Sequence[SlurmJob]) -> Finding:
    """The site's read-only images as a user's Podman sees them, each with the jobs Slurm holds that still run
    it: an older version of a name stays until none does (a requeue or a move runs the image a job was
    submitted with), and is then removed with the fix's command."""
    name = "site images"
    try:
        images = [i for i in json.loads(listing.stdout or "[]") if isinstance(i, dict) and i.get("ReadOnly")]
    except ValueError:
        images = []
    if listing.returncode != 0 or not images:
        return Finding(name, SKIPPED, "no read-only (site) image store in this user's Podman",
                       "see docs/admin-guide.md, \"The training image on every node\"")
    in_use = collections.Counter(tag for job in jobs if not job.terminal for tag in images_of(job))
    parts, unused = [], []
    for image in sorted(images, key=lambda i: -int(i.get("Created") or 0)):
        short = str(image.get("Id", ""))[:12]
        names = [str(n) for n in image.get("Names") or []]
        users = in_use.get(short, 0)
        parts.append(f"{short} {', '.join(names) or '(an older version, untagged)'}: "
                     f"{users} job{'' if users == 1 else 's'} in Slurm run it")
        if not names and not users:
            unused.append(short)
    fix = (f"as root, on each node's store: containers/site-image-store.sh remove {' '.join(unused)}"
           if unused else "")
    return Finding(name, OK, "; ".join(parts), fix)


#: What each container runs from the mounted package (python3 -P -m dlsub.checkpointing.launch).
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
    where = f"a shared file system ({fs_type})" if fs_type in NETWORK_FILESYSTEMS else \
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


def check_job_directories(user: pwd.struct_passwd, home_acls: bool | None, home_fs: str | None,
                          site_folder: Path | None, site_acls: bool | None) -> Finding:
    """Where the user's job directories go (job/settings.py ``load_settings``): in their dlsub home where its
    file system keeps POSIX ACLs (submit lets the agent's account alone in), else in the site's folder (policy.toml
    [site] job_directories), else in the home by mode bits, where every user can read their progress."""
    name = f"job directories of {user.pw_name}"
    home_jobs = _home_jobs(user)
    if home_acls is None:
        return Finding(name, WARN, f"could not ask, as {user.pw_name}, whether {home_jobs}'s file system keeps POSIX "
                       "ACLs", _run_where_the_home_is(user))
    if home_acls:
        return Finding(name, OK, f"{home_jobs} (its file system keeps POSIX ACLs: the agent's account alone is let "
                       "in), unless they set DLSUB_HOME")
    bare = f"{user.pw_dir} ({home_fs or 'file system unknown'}) keeps no POSIX ACLs"
    if site_folder is None:
        return Finding(name, WARN, f"{bare}: {user.pw_name}'s job directories there are opened by mode bits, and "
                       "every user can read their progress and attempt files",
                       'policy.toml [site] job_directories = "/scratch/{user}/dlsub-jobs" (a file system every '
                       "node mounts that keeps POSIX ACLs), or the user sets DLSUB_HOME there")
    if site_acls is False:
        return Finding(name, WARN, f"{bare}, and neither does the site's folder for them, {site_folder}: every user "
                       "can read their progress and attempt files",
                       "point policy.toml [site] job_directories at a file system that keeps POSIX ACLs")
    return Finding(name, OK, f"{site_folder} (policy.toml [site] job_directories): {bare}; unless they set "
                   "DLSUB_HOME")


def _home_jobs(user: pwd.struct_passwd) -> Path:
    """Where dlsub keeps ``user``'s job directories by default (job/settings.py: $DLSUB_HOME unset)."""
    return Path(user.pw_dir) / HOME_DIR / "jobs"


def _run_where_the_home_is(user: pwd.struct_passwd) -> str:
    return f"run dlsub doctor --user {user.pw_name} on a host that mounts their home"


def check_agent(socket_path: AgentEndpoint | Path, status: dict[str, Any] | None, error: str, *,
                compute_node: str | None = None) -> Finding:
    """The agent answers on its socket; on a compute node, where it does not run, no answer is no problem."""
    name = "agent"
    if status is None and compute_node is not None:
        return Finding(name, SKIPPED, f"no agent on {socket_path} here: it runs on a login host, not on compute "
                       f"node {compute_node} (run doctor on the agent's host to check it)")
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


#: Where this node's CDI specs are (dlsub.contract, which the batch script is rendered from).
CDI_DIRS = tuple(Path(folder) for folder in CDI_SPEC_DIRS)


def find_cdi_spec(host: Host, dirs: Sequence[Path]) -> Path | None:
    """The first CDI spec in ``dirs`` that names GPUs of CDI_GPU_KIND: the files and the test the batch
    script uses (slurm_plugins/batch.sh, node_has_cdi_gpus), from the same contract constants."""
    for folder in dirs:
        for entry in host.list_dir(folder):
            if entry.endswith((".yaml", ".json")) and CDI_GPU_KIND in (host.read_text(folder / entry) or ""):
                return folder / entry
    return None


def check_cdi(host_name: str, node: SlurmNode | None, spec: Path | None, dirs: Sequence[Path]) -> Finding:
    """A GPU node needs a CDI spec naming its GPUs, or its jobs' containers get no GPU device."""
    name = "CDI spec"
    if node is None:
        return Finding(name, SKIPPED, f"{host_name} is not a Slurm node (not in scontrol show node): no GPUs to "
                       "give containers here; run doctor on a GPU node for this check")
    if node.gpus == 0:
        return Finding(name, SKIPPED, f"{node.name} has no GPU gres: its containers need no CDI spec")
    where = " or ".join(str(d) for d in dirs)
    if spec is None:
        return Finding(name, PROBLEM, f"{node.name} has {node.gpus} GPUs in Slurm but no CDI spec naming "
                       f"{CDI_GPU_KIND} in {where}: its jobs' containers get no GPU device",
                       "nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml (NVIDIA's container toolkit; again "
                       "after each driver upgrade)")
    return Finding(name, OK, f"{spec} names {CDI_GPU_KIND} ({node.gpus} GPUs in Slurm on {node.name})")


#: The containers.conf keys that take a container out of the job's cgroup and the values dlsub passes for them
#: on its own command line (containers/podman.py: podman --cgroup-manager cgroupfs run --cgroupns host), which
#: win over any containers.conf: (table, key, dlsub's value, its option).
OVERRIDDEN_CGROUP_KEYS = (("engine", "cgroup_manager", "cgroupfs", "--cgroup-manager cgroupfs"),
                          ("containers", "cgroupns", "host", "--cgroupns host"))
#: The values of [containers] cgroups, the one such key dlsub leaves to containers.conf, that break its
#: containers: "disabled" conflicts with --cgroupns (podman-run(1)), and runc refuses it ("not compatible with
#: NoCgroups", Podman 4.3). "enabled" (rootless with cgroupfs: no cgroup of the container's own unless a cgroup
#: parent is given), "no-conmon" and "split" (sub-cgroups of the caller's) all leave the container in the job's.
BREAKING_CGROUPS_MODES = ("disabled",)


def containers_conf_files(host: Host, user: pwd.struct_passwd, environ: Mapping[str, str]) -> list[Path]:
    """The containers.conf files Podman reads for ``user``, lowest priority first (later ones win, key by key):
    containers.conf(5) as Podman 4 reads them: $CONTAINERS_CONF alone if set, else the system's files, their
    drop-in directories (each's *.conf in name order), the user's file and drop-ins; $CONTAINERS_CONF_OVERRIDE
    last. (Podman 5 reads only the first of the user's, /etc's and /usr/share's main files that exists; reading
    all three in this order can only flag more: a site's setting that users without a file of their own get.)"""
    def drop_ins(folder: Path) -> list[Path]:
        return [folder / n for n in host.list_dir(folder) if n.endswith(".conf")]

    override = [Path(environ["CONTAINERS_CONF_OVERRIDE"])] if environ.get("CONTAINERS_CONF_OVERRIDE") else []
    if environ.get("CONTAINERS_CONF"):
        return [Path(environ["CONTAINERS_CONF"]), *override]
    user_dir = Path(user.pw_dir) / ".config" / "containers"
    files = [Path("/usr/share/containers/containers.conf"), Path("/etc/containers/containers.conf")]
    for folder in ("/usr/share/containers/containers.conf.d", "/etc/containers/containers.conf.d",
                   "/usr/share/containers/containers.rootless.conf.d",
                   "/etc/containers/containers.rootless.conf.d",
                   f"/etc/containers/containers.rootless.conf.d/{user.pw_uid}"):
        files += drop_ins(Path(folder))
    return [*files, user_dir / "containers.conf", *drop_ins(user_dir / "containers.conf.d"), *override]


@dataclass(frozen=True)
class PodmanSetting:
    """A key's value and the file that set it last."""

    value: object
    source: Path


@dataclass(frozen=True)
class PodmanConf:
    """What containers.conf files set of the keys doctor checks (the last file's value wins), which files
    Podman cannot parse, and which files there were."""

    settings: dict[tuple[str, str], PodmanSetting]
    errors: list[str]
    read: list[Path]


def read_containers_conf(host: Host, files: Sequence[Path]) -> PodmanConf:
    settings: dict[tuple[str, str], PodmanSetting] = {}
    errors: list[str] = []
    read: list[Path] = []
    wanted = {(t, k) for t, k, _, _ in OVERRIDDEN_CGROUP_KEYS} | {("containers", "cgroups")}
    for path in files:
        text = host.read_text(path)
        if text is None:
            continue
        read.append(path)
        try:
            parsed = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            errors.append(f"{path}: {exc}")
            continue
        for table, key in wanted:
            section = parsed.get(table)
            if isinstance(section, dict) and key in section:
                settings[(table, key)] = PodmanSetting(section[key], path)
    return PodmanConf(settings, errors, read)


def check_podman_cgroups(user: pwd.struct_passwd, conf: PodmanConf) -> Finding:
    """Podman settings that would take containers out of the job's cgroup (or stop dlsub's from starting)."""
    name = f"Podman cgroup settings of {user.pw_name}"
    settings, errors = conf.settings, conf.errors
    if errors:
        return Finding(name, PROBLEM, f"Podman cannot read {'; '.join(errors)[:300]}: every podman command fails",
                       "fix the TOML or remove the file")
    mode = settings.get(("containers", "cgroups"))
    if mode is not None and mode.value in BREAKING_CGROUPS_MODES:
        return Finding(name, PROBLEM, f"cgroups = \"{mode.value}\" in {mode.source}: it conflicts with the "
                       "--cgroupns host dlsub runs Podman with (podman-run(1)), and runc refuses it (\"not "
                       "compatible with NoCgroups\"): dlsub's containers do not start",
                       f"remove cgroups = \"{mode.value}\" from {mode.source}: without it dlsub's containers "
                       "stay in the job's cgroup")
    leaving = [(s, key, value, option) for table, key, value, option in OVERRIDDEN_CGROUP_KEYS
               if (s := settings.get((table, key))) is not None and s.value != value]
    if leaving:
        shown = "; ".join(f"{key} = \"{s.value}\" in {s.source}" for s, key, _, _ in leaving)
        return Finding(name, WARN, f"{shown}: takes containers out of the job's cgroup (Slurm's limits and "
                       "process tracking stop applying). dlsub overrides it for its own containers ("
                       + ", ".join(option for *_, option in leaving) + " on its command line), not for a "
                       "podman run of the user's own inside a job",
                       "remove " + "; ".join(f"{key} from {s.source}" for s, key, _, _ in leaving)
                       + " (dlsub's jobs need nothing: it overrides it)")
    where = ", ".join(str(p) for p in conf.read) or "none"
    return Finding(name, OK, "no containers.conf setting takes containers out of the job's cgroup (dlsub passes "
                   f"--cgroup-manager cgroupfs and --cgroupns host; read: {where})")


# ---------------------------------------------------------------- gathering


def run_doctor(client: SlurmClient, host: Host, policy: AgentPolicy, *, user: str | None, image: str,
               socket_path: AgentEndpoint | Path, library: Path | None = None,
               cdi_dirs: Sequence[Path] = CDI_DIRS) -> list[Finding]:
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
          lambda: check_partitions([*policy.partitions, *(name for name, _ in policy.containers.partition_images)],
                                   [p.name for p in client.partitions()]))
    # Which Slurm node this host is (none: a login or admin host): decides the CDI check, whether an agent
    # must answer here, and how a graph root in the shared home weighs.
    here = host.hostname()
    this_node: SlurmNode | None = None
    try:
        this_node = next((n for n in client.nodes() if n.name == here), None)
        cdi = check_cdi(here, this_node, find_cdi_spec(host, cdi_dirs), cdi_dirs)
    except (SlurmError, OSError, ValueError) as exc:
        cdi = Finding("CDI spec", PROBLEM, str(exc).splitlines()[0][:300], slurm_fix)
    try:
        status, error = host.agent_status(socket_path), ""
    except AgentUnavailable as exc:
        status, error = None, str(exc)
    findings.append(check_agent(socket_path, status, error, compute_node=this_node.name if this_node else None))
    findings.append(_library_check(host, library_dir() if library is None else library))
    site = policy.containers
    findings.append(check_shared_mounts({path: host.stat(Path(path)) is not None
                                         for path in (*site.shared_mounts, *site.shared_mounts_rw)}))
    findings.append(cdi)
    findings.extend(_podman_checks(host, user, image, here, compute_node=this_node is not None,
                                   partition_images=site.partition_images_for(None, host.environ())))
    entry = host.user(user) if user is not None else None
    if entry is not None:
        probe("job directories", _run_where_the_home_is(entry), lambda: _job_directories_check(host, entry, policy))
        probe("site images", slurm_fix, lambda: check_site_images(
            # --all: an older version a newer one was built FROM is an intermediate image, which plain
            # `podman images` hides, and it is the one whose jobs an admin waits for before removing it.
            host.run_as(entry, ["podman", "images", "--all", "--format", "json"]), client.jobs()))
    return findings


def _library_check(host: Host, library: Path) -> Finding:
    """Reads what check_library judges: the entry point, the package folder, and folders above it that others
    cannot enter (those this host cannot stat are not judged)."""
    above = [p for p in library.parents if p != Path("/")]
    closed = [p for p in above if (st := host.stat(p)) is not None and stat.S_ISDIR(st.st_mode)
              and not st.st_mode & stat.S_IXOTH]
    return check_library(library, host.stat(library / LIBRARY_ENTRY), host.stat(library), closed,
                         host.fs_type(library))


def _job_directories_check(host: Host, entry: pwd.struct_passwd, policy: AgentPolicy) -> Finding:
    home_acls = host.posix_acls(entry, _home_jobs(entry))
    site_folder = policy.site.job_directories_of(entry.pw_name)
    site_acls = host.posix_acls(entry, site_folder) if home_acls is False and site_folder is not None else None
    return check_job_directories(entry, home_acls, host.fs_type(Path(entry.pw_dir)), site_folder, site_acls)


def _gpu_partitions(client: SlurmClient, policy: AgentPolicy) -> dict[str, int]:
    gpus = {p.name: sum(n.gpus for n in p.nodes) for p in client.partitions()}
    return {name: gpus.get(name, 0) for name in policy.partitions if policy.role_of(name) in ("gpu", "dev")}


def _podman_checks(host: Host, user: str | None, image: str, here: str, *, compute_node: bool,
                   partition_images: Sequence[tuple[str, str]] = ()) -> list[Finding]:
    if user is None:
        return [Finding("rootless Podman", SKIPPED, "no user named", "dlsub doctor --user NAME checks one user's")]
    entry = host.user(user)
    if entry is None:
        return [Finding("rootless Podman", PROBLEM, f"no such user {user!r}", "name an existing user with --user")]
    controllers = host.read_text(Path("/sys/fs/cgroup/cgroup.controllers"))
    hybrid = host.stat(Path("/sys/fs/cgroup/unified")) is not None
    return [
        check_subids(entry, read_subids(host, entry, group=False), read_subids(host, entry, group=True),
                     local_user(entry, host.read_text(Path("/etc/passwd")))),
        check_cgroups(controllers, hybrid),
        check_runtime_dir(entry, host.stat(Path(f"/run/user/{entry.pw_uid}"))),
        check_image(entry, image, host.run_as(entry, ["podman", "image", "exists", image]), here),
        *(check_image(entry, name, host.run_as(entry, ["podman", "image", "exists", name]), here, partition)
          for partition, name in partition_images),
        *_storage_checks(host, entry, compute_node),
        check_podman_cgroups(entry, read_containers_conf(host, containers_conf_files(host, entry, host.environ()))),
    ]


def _storage_checks(host: Host, entry: pwd.struct_passwd, compute_node: bool) -> list[Finding]:
    """Where the user's Podman keeps containers (check_storage) and, where it mounts them through FUSE, whether
    it can (check_fuse): one ``podman info`` read for both."""
    info = host.run_as(entry, ["podman", "info", "--format", "json"])
    store: dict[str, Any] = {}
    if info.returncode == 0:
        try:
            found = json.loads(info.stdout).get("store")
            store = found if isinstance(found, dict) else {}
        except (ValueError, AttributeError):
            info = subprocess.CompletedProcess(info.args, 1, "", f"podman info printed no JSON: {info.stdout[:120]}")
    root = str(store.get("graphRoot") or "")
    graph_root = subprocess.CompletedProcess(info.args, info.returncode, root, info.stderr)
    findings = [check_storage(entry, graph_root, host.fs_type(Path(root)) if info.returncode == 0 and root else None,
                              compute_node=compute_node)]
    if info.returncode == 0 and root:
        options = store.get("graphOptions")
        program = options.get("overlay.mount_program") if isinstance(options, dict) else None
        executable = str(program.get("Executable") or "") if isinstance(program, dict) else ""
        usable = host.run_as(entry, ["test", "-r", str(FUSE_DEVICE), "-a", "-w", str(FUSE_DEVICE)]).returncode == 0
        findings.append(check_fuse(entry, executable, host.stat(FUSE_DEVICE), usable))
    return findings


def blocking(findings: Sequence[Finding]) -> bool:
    """Whether anything stops dlsub (warnings do not)."""
    return any(f.status == PROBLEM for f in findings)
