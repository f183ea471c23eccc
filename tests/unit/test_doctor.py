"""`dlsub doctor`: every check's ok and problem paths. Unit tests with fakes: the stateful fake Slurm
(answering as each version) and a fake host (files, users, podman, the agent's socket)."""

from __future__ import annotations

import inspect
import json
import os
import pwd
import stat
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dlsub.cli import doctor as doctor_module
from dlsub.cli.doctor import OK, PROBLEM, SKIPPED, WARN, Finding, Host, blocking, run_doctor
from dlsub.cli.doctor_commands import doctor
from dlsub.contract import CDI_GPU_KIND, CDI_SPEC_DIRS, SUBMIT_RECORD_PREFIX
from dlsub.job.agent_client import AgentUnavailable
from dlsub.site_config.policy_file import parse_policy
from dlsub.slurm_plugins.client import SlurmClient, parse_config
from dlsub.slurm_plugins.dialects import SlurmVersion
from dlsub.slurm_plugins.fake import FakeSlurm
from dlsub.slurm_plugins.fake import testbed_cluster as cluster
from dlsub.slurm_plugins.launcher.gpus import node_has_cdi_gpus
from dlsub.slurm_plugins.sbatch import template_text

POLICY = parse_policy({"policy": "fifo", "partitions": {"gpu": {"role": "gpu"}, "gpu-dev": {"role": "dev"},
                                                        "cpu": {"role": "cpu"}}})
USER = pwd.struct_passwd(("alice", "x", 1001, 1001, "", "/home/alice", "/bin/bash"))
#: The dlsub package jobs mount, as a site installs it (a venv under /opt).
LIBRARY = Path("/opt/dlsub/venv/lib/python3.11/site-packages/dlsub")


def dir_stat(uid: int, mode: int) -> os.stat_result:
    return os.stat_result((stat.S_IFDIR | mode, 0, 0, 2, uid, uid, 0, 0, 0, 0))


def file_stat(mode: int) -> os.stat_result:
    return os.stat_result((stat.S_IFREG | mode, 0, 0, 1, 0, 0, 0, 0, 0, 0))


class FakeHost(Host):
    """The testbed's machine, as doctor reads it; each attribute can be broken on purpose."""

    def __init__(self) -> None:
        self.files = {"/etc/slurm/job_submit.lua": f"-- dlsub\nlocal p = '{SUBMIT_RECORD_PREFIX}'\n",
                      "/etc/subuid": "alice:200000:65536\n", "/etc/subgid": "alice:200000:65536\n"}
        self.stats = {"/run/user/1001": dir_stat(1001, 0o700), "/sys/fs/cgroup/unified": dir_stat(0, 0o555),
                      str(LIBRARY): dir_stat(0, 0o755), str(LIBRARY / "checkpointing" / "launch.py"): file_stat(0o644),
                      "/opt": dir_stat(0, 0o755),
                      "/dev/fuse": os.stat_result((stat.S_IFCHR | 0o666, 0, 0, 1, 0, 0, 0, 0, 0, 0))}
        self.fuse_usable = True  # as `test -r /dev/fuse -a -w /dev/fuse` run as the user answers
        self.mount_program = "/usr/bin/fuse-overlayfs"  # the testbed's: this kernel has no rootless overlay
        self.image_rc = 0
        self.image_stderr = ""
        self.agent: dict[str, Any] | None = {"running": True, "late": False}
        self.clock = time.mktime(time.strptime("2026-11-24T12:00:01", "%Y-%m-%dT%H:%M:%S"))
        self.ran: list[list[str]] = []
        self.graph_root = "/var/lib/dlsub-local/alice/storage"  # node-local, as the testbed's (testbed/up.sh)
        self.fs = "ext2/ext3"
        self.tools: dict[str, str] = {}  # commands on PATH (none: no getsubids, /etc/subuid is read)
        self.name = "login1"  # the login host, not a Slurm node
        self.env: dict[str, str] = {}
        self.dirs: dict[str, list[str]] = {}  # directories doctor lists (containers.conf.d drop-ins)
        self.real_dirs: list[Path] = []  # temporary directories read as they are (CDI spec directories)
        self.no_acls: set[str] = set()  # folders whose file system keeps no POSIX ACLs (every other one does)
        self.acls_unasked = False  # the user's probe of ACLs could not run
        self.acls_asked: list[tuple[str, str]] = []  # (user, path) of each probe
        self.home_fs = "ext2/ext3"

    def hostname(self) -> str:
        return self.name

    def environ(self) -> dict[str, str]:
        return self.env

    def list_dir(self, path: Path) -> list[str]:
        if any(path == folder or folder in path.parents for folder in self.real_dirs):
            return super().list_dir(path)
        return sorted(self.dirs.get(str(path), []))

    def read_text(self, path: Path) -> str | None:
        if any(folder in path.parents for folder in self.real_dirs):
            return super().read_text(path)
        return self.files.get(str(path))

    def stat(self, path: Path) -> os.stat_result | None:
        return self.stats.get(str(path))

    def user(self, name: str) -> pwd.struct_passwd | None:
        return USER if name == "alice" else None

    def run_as(self, user: pwd.struct_passwd, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        self.ran.append(list(argv))
        if list(argv[:2]) == ["podman", "info"]:
            options = {"overlay.mount_program": {"Executable": self.mount_program}} if self.mount_program else {}
            info = {"store": {"graphRoot": self.graph_root, "graphOptions": options}}
            return subprocess.CompletedProcess(list(argv), 0, json.dumps(info) + "\n", "")
        if list(argv[:1]) == ["test"]:
            return subprocess.CompletedProcess(list(argv), 0 if self.fuse_usable else 1, "", "")
        return subprocess.CompletedProcess(list(argv), self.image_rc, "", self.image_stderr)

    def which(self, command: str) -> str | None:
        return self.tools.get(command)

    def fs_type(self, path: Path) -> str | None:
        if str(path) == USER.pw_dir:
            return self.home_fs
        return self.fs if str(path) == self.graph_root else None

    def posix_acls(self, user: pwd.struct_passwd, path: Path) -> bool | None:
        self.acls_asked.append((user.pw_name, str(path)))
        if self.acls_unasked:
            return None
        return not any(path == Path(f) or Path(f) in path.parents for f in self.no_acls)

    def agent_status(self, socket_path: Path) -> dict[str, Any]:
        if self.agent is None:
            raise AgentUnavailable(f"no agent socket at {socket_path}: the agent is not running")
        return self.agent

    def now(self) -> float:
        return self.clock


def findings(fake: FakeSlurm | None = None, host: FakeHost | None = None,
             user: str | None = "alice", cdi_dirs: Sequence[Path] = ()) -> dict[str, Finding]:
    found = run_doctor(SlurmClient(runner=fake or cluster()), host or FakeHost(), POLICY, user=user,
                       image="localhost/img", socket_path=Path("/run/dlsub/agent.sock"), library=LIBRARY,
                       cdi_dirs=cdi_dirs)
    return {f.check.split(" of ")[0]: f for f in found}


@pytest.mark.parametrize("version", ["22.05.8", "24.11.5", "26.05.5"])
def test_a_testbed_like_site_is_ok_on_every_tested_version(version: str) -> None:
    got = findings(cluster(version=version))
    assert {name: f.status for name, f in got.items()} == {
        "slurm version": OK, "job_submit.lua": OK, "cred_expire": OK, "clocks": OK, "GPU gres": OK,
        "agent is a Slurm Operator": OK, "policy partitions exist": OK, "agent": OK, "subordinate ids": OK,
        "cgroups": WARN, "runtime directory": OK, "image": OK, "job cgroups": OK, "container storage": OK,
        "dlsub package for containers": OK, "shared mounts": OK, "CDI spec": SKIPPED,
        "Podman cgroup settings": OK, "site images": SKIPPED, "FUSE device": OK, "job directories": OK}
    assert not blocking(list(got.values()))
    assert version in got["slurm version"].detail


def test_versions_older_untested_and_tested() -> None:
    assert doctor_module.check_version(SlurmVersion(21, 8, 8)).status == PROBLEM
    assert doctor_module.check_version(SlurmVersion(25, 5, 1)).status == WARN
    assert doctor_module.check_version(SlurmVersion(24, 11, 5)).status == OK


def test_job_submit_plugin_missing_inactive_or_not_dlsubs() -> None:
    host = FakeHost()
    del host.files["/etc/slurm/job_submit.lua"]
    got = findings(host=host)["job_submit.lua"]
    assert got.status == PROBLEM and "missing" in got.detail and "job_submit.lua" in got.fix
    fake = cluster()
    fake.config["JobSubmitPlugins"] = ""
    assert findings(fake)["job_submit.lua"].status == PROBLEM
    host = FakeHost()
    host.files["/etc/slurm/job_submit.lua"] = "function slurm_job_submit() return 0 end"
    assert "not dlsub's" in findings(host=host)["job_submit.lua"].detail


def test_the_agent_stopped_is_a_problem_with_its_fix() -> None:
    host = FakeHost()
    host.agent = None
    got = findings(host=host)["agent"]
    assert got.status == PROBLEM and "not running" in got.detail and "start" in got.fix


def test_a_missing_subuid_entry_is_a_problem_with_its_fix() -> None:
    host = FakeHost()
    host.files["/etc/subuid"] = "bob:200000:65536\n"
    got = findings(host=host)["subordinate ids"]
    assert got.status == PROBLEM and "/etc/subuid has 0" in got.detail and "usermod --add-subuids" in got.fix
    host.files["/etc/subuid"] = "1001:200000:1000\n"  # by uid, but too few
    assert findings(host=host)["subordinate ids"].status == PROBLEM


def _fake_getsubids(tmp_path: Path, uids: str, gids: str, rc: int = 0) -> str:
    """A stand-in for shadow-utils' getsubids: prints what SSSD or LDAP would serve, as the real one does."""
    tool = tmp_path / "getsubids"
    to = " >&2" if rc else ""  # the real one says "Error fetching ranges" on stderr
    tool.write_text(f"#!/bin/bash\nif [ \"$1\" = -g ]; then shift; printf '{gids}'{to}; else printf '{uids}'{to}; fi\n"
                    f"[ -n \"$1\" ] || exit 2\nexit {rc}\n")
    tool.chmod(0o755)
    return str(tool)


def test_subordinate_ids_served_by_sssd_or_ldap_count_through_getsubids(tmp_path: Path) -> None:
    """Unit, with a fake getsubids command (really run): /etc/subuid has nothing for alice, getsubids does."""
    host = FakeHost()
    host.files["/etc/subuid"] = host.files["/etc/subgid"] = ""
    assert findings(host=host)["subordinate ids"].status == PROBLEM  # no getsubids: the files say none
    host.tools["getsubids"] = _fake_getsubids(tmp_path, "0: alice 300000 32768\n1: alice 400000 32768\n",
                                              "0: alice 300000 65536\n")
    got = findings(host=host)["subordinate ids"]
    assert got.status == OK and "getsubids" in got.detail


def test_too_few_ids_from_getsubids_are_a_problem_naming_it(tmp_path: Path) -> None:
    host = FakeHost()
    host.tools["getsubids"] = _fake_getsubids(tmp_path, "0: alice 300000 1000\n", "0: alice 300000 65536\n")
    got = findings(host=host)["subordinate ids"]
    assert got.status == PROBLEM and "getsubids gives 1000 uids" in got.detail and "gids" not in got.detail
    assert "SSSD or LDAP" in got.fix and "usermod --add-subuids" in got.fix
    # None at all: getsubids exits 1 saying so.
    host.tools["getsubids"] = _fake_getsubids(tmp_path, "Error fetching ranges\n", "Error fetching ranges\n", rc=1)
    got = findings(host=host)["subordinate ids"]
    assert got.status == PROBLEM and "getsubids gives 0 uids (Error fetching ranges)" in got.detail


def test_a_directory_users_missing_ranges_point_at_the_sites_script_not_usermod() -> None:
    """Unit (fake host): alice is not in the host's /etc/passwd (LDAP or SSSD serve her): with no ranges the fix
    is the shipped subid-ranges.sh, which usermod cannot replace for her; with them, doctor says whose they are."""
    host = FakeHost()
    host.files["/etc/passwd"] = "root:x:0:0:root:/root:/bin/bash\n"
    host.files["/etc/subuid"] = host.files["/etc/subgid"] = ""
    got = findings(host=host)["subordinate ids"]
    assert got.status == PROBLEM and "not in this host's /etc/passwd" in got.detail, got
    assert "subid-ranges.sh alice" in got.fix and "usermod" not in got.fix, got.fix
    host.files["/etc/subuid"] = host.files["/etc/subgid"] = "alice:1000065536:65536\n"
    got = findings(host=host)["subordinate ids"]
    assert got.status == OK and "directory's user" in got.detail, got


def test_the_sites_subid_script_gives_each_directory_user_the_range_of_its_uid_once(tmp_path: Path) -> None:
    """Unit, the shipped etc/subid-ranges.sh really run (bash) with a stand-in getent: users in the uid range get
    BASE + (uid - FIRST) * 65536 in both files, by name; one with a line (by name or uid) keeps it; local users
    below the range and unknown names are left out, an unknown name asked for by name is an error; a second run
    adds nothing."""
    import subprocess

    from dlsub.cli.doctor import shipped_site_files

    getent = tmp_path / "getent"
    getent.write_text("#!/bin/bash\n[ \"$1\" = passwd ] || exit 2\nlines='root:x:0:0::/root:/bin/sh\n"
                      "alice:x:10001:10001::/home/alice:/bin/sh\nbob:x:10002:10002::/home/bob:/bin/sh\n"
                      "carol:x:1001:1001::/home/carol:/bin/sh'\nif [ -n \"$2\" ]; then grep \"^$2:\" <<<\"$lines\""
                      " || exit 2; else echo \"$lines\"; fi\n")
    getent.chmod(0o755)
    subuid, subgid = tmp_path / "subuid", tmp_path / "subgid"
    subuid.write_text("10002:5000000:65536\n")  # bob has one, by uid
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "SUBUID_FILE": str(subuid), "SUBGID_FILE": str(subgid),
           "SUBID_LOCK_FILE": str(tmp_path / "lock")}
    script = str(shipped_site_files() / "subid-ranges.sh")
    for _ in range(2):
        run = subprocess.run(["bash", script], env=env, capture_output=True, text=True, check=True)
    assert "0 line(s) added" in run.stderr, run.stderr
    assert subuid.read_text() == "10002:5000000:65536\nalice:1000065536:65536\n"
    assert subgid.read_text() == "alice:1000065536:65536\nbob:1000131072:65536\n"
    missing = subprocess.run(["bash", script, "dave"], env=env, capture_output=True, text=True)
    assert missing.returncode == 1 and "no such user: dave" in missing.stderr


def test_a_getsubids_that_cannot_run_falls_back_to_the_files(tmp_path: Path) -> None:
    host = FakeHost()
    host.tools["getsubids"] = str(tmp_path / "no-such-getsubids")
    got = findings(host=host)["subordinate ids"]
    assert got.status == OK and "/etc/subuid" in got.detail


def test_the_dlsub_package_jobs_mount_missing_or_closed_is_a_problem_saying_how_a_site_provides_it() -> None:
    ok = findings()["dlsub package for containers"]
    assert ok.status == OK and str(LIBRARY) in ok.detail and "shared software path" in ok.detail \
        and "per node" in ok.detail and "this node's own disk" in ok.detail
    host = FakeHost()
    del host.stats[str(LIBRARY / "checkpointing" / "launch.py")]  # a compute node without the install
    got = findings(host=host)["dlsub package for containers"]
    assert got.status == PROBLEM and "missing on this host" in got.detail
    assert "shared software path" in got.fix and "per node at this same path" in got.fix
    host = FakeHost()
    host.stats["/opt"] = dir_stat(0, 0o700)  # root's own: other users' containers cannot reach the package
    got = findings(host=host)["dlsub package for containers"]
    assert got.status == PROBLEM and "/opt" in got.detail and "chmod" in got.fix


def test_the_sites_shared_mounts_missing_here_are_a_warning() -> None:
    policy = parse_policy({"containers": {"shared_mounts": ["/projects"], "shared_mounts_rw": ["/scratch"]}})
    host = FakeHost()
    host.stats["/scratch"] = dir_stat(0, 0o1777)
    got = {f.check: f for f in run_doctor(SlurmClient(runner=cluster()), host, policy, user=None, image="i",
                                          socket_path=Path("/s"), library=LIBRARY)}["shared mounts"]
    assert got.status == WARN and got.detail.startswith("/projects missing") and "policy.toml" in got.fix
    host.stats["/projects"] = dir_stat(0, 0o755)
    got = {f.check: f for f in run_doctor(SlurmClient(runner=cluster()), host, policy, user=None, image="i",
                                          socket_path=Path("/s"), library=LIBRARY)}["shared mounts"]
    assert got.status == OK and got.detail == "/projects, /scratch"


def test_operator_rights() -> None:
    fake = cluster()
    fake.admin_levels["dlsub"] = "None"
    got = findings(fake)["agent is a Slurm Operator"]
    assert got.status == PROBLEM and "adminlevel=Operator" in got.fix
    del fake.admin_levels["dlsub"]
    assert "no Slurm association" in findings(fake)["agent is a Slurm Operator"].detail


def test_cred_expire_default_is_a_warning() -> None:
    fake = cluster()
    del fake.config["AuthInfo"]
    got = findings(fake)["cred_expire"]
    assert got.status == WARN and "121 s" in got.detail


def test_partitions_named_in_the_policy_must_exist() -> None:
    fake = cluster()
    del fake.partitions["gpu-dev"]
    got = findings(fake)["policy partitions exist"]
    assert got.status == PROBLEM and "gpu-dev" in got.detail


def test_gpu_partitions_without_gpus_or_gres() -> None:
    fake = cluster()
    fake.config["GresTypes"] = ""
    assert findings(fake)["GPU gres"].status == PROBLEM
    fake = cluster()
    for node in fake.nodes.values():
        node.gpus = 0
    assert "no GPU node" in findings(fake)["GPU gres"].detail


def test_clock_skew() -> None:
    host = FakeHost()
    host.clock += 30
    got = findings(host=host)["clocks"]
    assert got.status == PROBLEM and "+31 s" in got.detail


def test_runtime_directory_and_image() -> None:
    host = FakeHost()
    host.stats["/run/user/1001"] = dir_stat(1001, 0o755)
    assert findings(host=host)["runtime directory"].status == PROBLEM
    del host.stats["/run/user/1001"]
    assert findings(host=host)["runtime directory"].status == WARN
    host = FakeHost()
    host.image_rc = 1
    got = findings(host=host)["image"]
    assert got.status == PROBLEM and "build-image.sh alice" in got.fix
    assert ["podman", "image", "exists", "localhost/img"] in host.ran


def test_a_dead_pause_process_is_named_with_its_reset() -> None:
    """Podman 4.3's words when the pause process died but its pid file stayed (seen after a reboot)."""
    host = FakeHost()
    host.image_rc = 1
    host.image_stderr = ('level=error msg="invalid internal status, try resetting the pause process with '
                         '\\"podman system migrate\\": could not find any running process: no such process"')
    got = findings(host=host)["image"]
    assert got.status == PROBLEM and "pause process" in got.detail
    assert got.fix == "run `podman system migrate` as alice"


def test_a_dead_pause_process_podman_cannot_replace_is_named_with_its_reset() -> None:
    """Podman 4.3's words when the pause process died, its pid file stayed and its "alive" file did not (a killed
    run's runtime directory, CI rehearsal 34); `podman system migrate` fails the same way there."""
    host = FakeHost()
    host.image_rc = 125
    host.image_stderr = "Error: cannot re-exec process to join the existing user namespace\n"
    got = findings(host=host)["image"]
    assert got.status == PROBLEM and "pause process is gone" in got.detail
    assert got.fix == ("as alice, with no podman of theirs running on this host: "
                       "rm $XDG_RUNTIME_DIR/libpod/tmp/pause.pid")


def test_no_user_skips_podman_and_an_unknown_one_is_a_problem() -> None:
    assert findings(user=None)["rootless Podman"].status == SKIPPED
    assert findings(user="nobody-here")["rootless Podman"].status == PROBLEM


def test_slurm_unreachable_costs_its_checks_not_the_report() -> None:
    fake = cluster()
    fake.reachable = False
    got = findings(fake)
    assert got["slurm version"].status == PROBLEM and "scontrol ping" in got["slurm version"].fix
    assert got["agent"].status == OK and got["subordinate ids"].status == OK


def test_the_config_parser_reads_every_recorded_version() -> None:
    for version in ("22.05", "24.11", "26.05"):
        text = (Path(__file__).parent.parent / "fixtures" / "slurm" / version / "commands" /
                "config_text.txt").read_text()
        cfg = parse_config(text)
        assert cfg.get("JobSubmitPlugins") == "lua" and cfg.cred_expire_s == 10 and cfg.as_of is not None
        assert cfg.get("SLURM_VERSION").startswith(version)


def test_the_command_prints_json_and_exits_1_on_a_problem(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    host = FakeHost()
    host.agent = None
    policy = tmp_path / "policy.toml"
    policy.write_text('policy = "fifo"\n[partitions.gpu]\nrole = "gpu"\n')
    monkeypatch.setattr("dlsub.cli.doctor_commands.Host", lambda: host)
    monkeypatch.setattr("dlsub.cli.doctor_commands.SlurmClient", lambda: SlurmClient(runner=cluster()))
    monkeypatch.setattr("dlsub.cli.doctor.library_dir", lambda: LIBRARY)  # the fake host's install
    result = CliRunner().invoke(doctor, ["--json", "--user", "alice", "--policy", str(policy)])
    assert result.exit_code == 1
    report = json.loads(result.output)
    assert report["ok"] is False
    assert {c["check"]: c["status"] for c in report["checks"]}["agent"] == PROBLEM
    assert set(report["checks"][0]) == {"check", "status", "detail", "fix"}
    host.agent = {"running": True}
    result = CliRunner().invoke(doctor, ["--user", "alice", "--policy", str(policy)])
    assert result.exit_code == 0 and "nothing blocks dlsub" in result.output


def test_slurm_without_its_cgroup_plugins_is_a_warning_with_its_fix() -> None:
    fake = cluster()
    fake.config.update({"ProctrackType": "proctrack/linuxproc", "TaskPlugin": "task/none"})
    del fake.config["ConstrainDevices"]
    got = findings(fake)["job cgroups"]
    assert got.status == WARN
    assert "ProctrackType=proctrack/linuxproc" in got.detail and "ConstrainDevices=no" in got.detail
    assert "ConstrainRAMSpace" not in got.detail
    assert "task/cgroup" in got.fix and "ConstrainDevices=yes" in got.fix


def test_container_storage_on_a_shared_file_system_is_a_problem_with_its_fix() -> None:
    host = FakeHost()
    host.fs = "nfs"
    got = findings(host=host)["container storage"]
    assert got.status == PROBLEM and "nfs" in got.detail and host.graph_root in got.detail
    assert "graphroot" in got.fix and "/home/alice/.config/containers/storage.conf" in got.fix
    assert ["podman", "info", "--format", "json"] in host.ran


def test_a_fuse_device_the_user_cannot_open_is_a_problem_with_its_fix() -> None:
    """A machine without udev leaves /dev/fuse at the kernel's 0600: fuse-overlayfs, which rootless Podman mounts
    every container with on a kernel without rootless overlay, fails, and no container starts."""
    host = FakeHost()
    host.fuse_usable = False
    host.stats["/dev/fuse"] = os.stat_result((stat.S_IFCHR | 0o600, 0, 0, 1, 0, 0, 0, 0, 0, 0))
    got = findings(host=host)["FUSE device"]
    assert got.status == PROBLEM and "mode 600" in got.detail and "fuse-overlayfs" in got.detail
    assert got.fix.startswith("chmod 0666 /dev/fuse")
    assert ["test", "-r", "/dev/fuse", "-a", "-w", "/dev/fuse"] in host.ran, "asked as the user, groups and ACLs too"
    host.mount_program = ""
    assert findings(host=host)["FUSE device"].status == OK, "Podman's own overlay mount needs no FUSE"
    del host.stats["/dev/fuse"]
    host.mount_program = "/usr/bin/fuse-overlayfs"
    missing = findings(host=host)["FUSE device"]
    assert missing.status == PROBLEM and "modprobe fuse" in missing.fix


# ---------------------------------------------------------------- a compute node's own checks (issue 30, item 5)
# Unit tests with fakes: the fake Slurm behind the client's _run seam says which nodes exist and their GPUs,
# the fake host says which host this is; CDI spec directories are temporary directories read for real.

#: A CDI spec as `nvidia-ctk cdi generate` writes it (abridged), and as testbed/hosts.sh writes the testbed's.
NVIDIA_SPEC = 'cdiVersion: "0.5.0"\nkind: nvidia.com/gpu\ndevices:\n- name: "0"\n'


def cdi_dirs(tmp_path: Path) -> tuple[Path, Path]:
    """Stand-ins for /etc/cdi (missing, as on many nodes) and /var/run/cdi (empty)."""
    (tmp_path / "var-run-cdi").mkdir()
    return tmp_path / "etc-cdi", tmp_path / "var-run-cdi"


def on_node(name: str, tmp_path: Path) -> FakeHost:
    host = FakeHost()
    host.name = name
    host.real_dirs.append(tmp_path)
    return host


def test_a_gpu_node_with_a_cdi_spec_naming_its_gpus_is_ok(tmp_path: Path) -> None:
    dirs = cdi_dirs(tmp_path)
    (dirs[1] / "nvidia.yaml").write_text(NVIDIA_SPEC)
    got = findings(host=on_node("gpu1", tmp_path), cdi_dirs=dirs)["CDI spec"]
    assert got.status == OK and str(dirs[1] / "nvidia.yaml") in got.detail and "4 GPUs" in got.detail


def test_a_gpu_node_without_a_cdi_spec_is_a_problem_with_its_fix(tmp_path: Path) -> None:
    dirs = cdi_dirs(tmp_path)
    (dirs[1] / "amd.yaml").write_text(NVIDIA_SPEC.replace("nvidia.com", "amd.com"))  # another vendor's only
    (dirs[1] / "nvidia.yaml.bak").write_text(NVIDIA_SPEC)  # moved aside: neither Podman nor dlsub reads it
    got = findings(host=on_node("gpu1", tmp_path), cdi_dirs=dirs)
    cdi = got["CDI spec"]
    assert cdi.status == PROBLEM and blocking(list(got.values()))
    assert "gpu1 has 4 GPUs" in cdi.detail and str(dirs[0]) in cdi.detail and str(dirs[1]) in cdi.detail
    assert cdi.fix.startswith("nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml")


def test_the_cdi_check_skips_hosts_that_are_not_gpu_nodes_saying_why(tmp_path: Path) -> None:
    dirs = cdi_dirs(tmp_path)
    got = findings(host=on_node("cpu1", tmp_path), cdi_dirs=dirs)["CDI spec"]
    assert got.status == SKIPPED and "cpu1 has no GPU gres" in got.detail
    got = findings(host=on_node("login1", tmp_path), cdi_dirs=dirs)["CDI spec"]
    assert got.status == SKIPPED and "login1 is not a Slurm node" in got.detail


def test_the_cdi_check_without_slurm_is_a_problem_of_its_own(tmp_path: Path) -> None:
    fake = cluster()
    fake.reachable = False
    got = findings(fake, host=on_node("gpu1", tmp_path), cdi_dirs=cdi_dirs(tmp_path))["CDI spec"]
    assert got.status == PROBLEM and "scontrol ping" in got.fix


def test_doctor_and_the_batch_script_read_the_same_cdi_directories_and_kind(tmp_path: Path) -> None:
    """One source of truth: the batch launcher reads the contract constants doctor defaults to."""
    assert doctor_module.CDI_DIRS == tuple(Path(d) for d in CDI_SPEC_DIRS)
    defaults = inspect.signature(node_has_cdi_gpus).parameters
    assert defaults["spec_dirs"].default == CDI_SPEC_DIRS and defaults["kind"].default == CDI_GPU_KIND
    template = template_text()
    code = [line for line in template.splitlines() if not line.lstrip().startswith("#")]
    assert not [line for line in code if "nvidia.com" in line or "/etc/cdi" in line]  # no literal of its own
    dirs = cdi_dirs(tmp_path)
    (dirs[1] / "nvidia.json").write_text(f'{{"kind": "{CDI_GPU_KIND}"}}')  # the script greps *.json too
    assert doctor_module.find_cdi_spec(on_node("gpu1", tmp_path), dirs) == dirs[1] / "nvidia.json"


def test_a_graph_root_in_the_shared_home_is_a_problem_on_a_compute_node_and_a_warning_on_a_login_node(
        tmp_path: Path) -> None:
    host = on_node("gpu1", tmp_path)
    host.graph_root = "/home/alice/.local/share/containers/storage"  # Podman's default: the user's home
    got = findings(host=host, cdi_dirs=cdi_dirs(tmp_path))["container storage"]
    assert got.status == PROBLEM and host.graph_root in got.detail and "home directory" in got.detail
    assert "rootless_storage_path" in got.fix and "node-local" in got.fix
    host.name = "login1"
    got = findings(host=host)["container storage"]
    assert got.status == WARN and "not a Slurm node" in got.detail
    host.graph_root = "/home/alicia/storage"  # beside the home, not in it
    assert findings(host=host)["container storage"].status == OK


def test_the_image_missing_on_a_node_says_how_images_reach_nodes(tmp_path: Path) -> None:
    host = on_node("gpu2", tmp_path)
    host.image_rc = 1
    got = findings(host=host, cdi_dirs=cdi_dirs(tmp_path))["image"]
    assert got.status == PROBLEM and "on gpu2" in got.detail and "additional image stores" in got.detail
    assert "additionalimagestores" in got.fix and "The training image on every node" in got.fix


def test_podman_is_run_with_the_configuration_variables_doctor_was_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unit test of the real Host: CONTAINERS_STORAGE_CONF reaches the user's podman, nothing else does."""
    monkeypatch.setenv("CONTAINERS_STORAGE_CONF", "/tmp/a storage.conf")
    monkeypatch.setenv("UNRELATED_DOCTOR_VARIABLE", "1")
    me = pwd.getpwuid(os.getuid())
    out = Host().run_as(me, ["env"]).stdout.splitlines()
    assert "CONTAINERS_STORAGE_CONF=/tmp/a storage.conf" in out
    assert not any(line.startswith("UNRELATED_DOCTOR_VARIABLE=") for line in out)


def podman_settings(host: FakeHost) -> Finding:
    return findings(host=host)["Podman cgroup settings"]


def test_the_testbeds_containers_conf_keeps_containers_in_the_job() -> None:
    host = FakeHost()
    testbed_conf = Path(__file__).parents[2] / "etc" / "testbed" / "containers.conf"
    host.files["/home/alice/.config/containers/containers.conf"] = testbed_conf.read_text()
    got = podman_settings(host)
    assert got.status == OK and "/home/alice/.config/containers/containers.conf" in got.detail


def test_settings_dlsub_overrides_are_a_warning_naming_the_file_and_the_override() -> None:
    host = FakeHost()
    user_conf = "/home/alice/.config/containers/containers.conf"
    host.files[user_conf] = '[engine]\ncgroup_manager = "systemd"\n[containers]\ncgroupns = "private"\n'
    got = podman_settings(host)
    assert got.status == WARN
    assert f'cgroup_manager = "systemd" in {user_conf}' in got.detail and "--cgroup-manager cgroupfs" in got.detail
    assert 'cgroupns = "private"' in got.detail and "--cgroupns host" in got.detail
    assert got.fix.startswith(f"remove cgroup_manager from {user_conf}; cgroupns from {user_conf}")
    assert "overrides" in got.fix


def test_cgroups_disabled_is_a_problem_dlsubs_containers_do_not_start() -> None:
    host = FakeHost()
    host.files["/etc/containers/containers.conf"] = '[containers]\ncgroups = "disabled"\n'
    got = podman_settings(host)
    assert got.status == PROBLEM and "/etc/containers/containers.conf" in got.detail
    assert got.fix.startswith('remove cgroups = "disabled" from /etc/containers/containers.conf')
    host.files["/etc/containers/containers.conf"] = '[containers]\ncgroups = "split"\n'  # sub-cgroups of the job's
    assert podman_settings(host).status == OK


def test_drop_ins_are_read_after_the_files_they_extend_in_name_order() -> None:
    host = FakeHost()
    host.files["/etc/containers/containers.conf"] = '[engine]\ncgroup_manager = "systemd"\n'
    host.dirs["/etc/containers/containers.conf.d"] = ["20-site.conf", "10-first.conf", "notes.txt"]
    host.files["/etc/containers/containers.conf.d/10-first.conf"] = '[engine]\ncgroup_manager = "systemd"\n'
    host.files["/etc/containers/containers.conf.d/20-site.conf"] = '[engine]\ncgroup_manager = "cgroupfs"\n'
    host.files["/etc/containers/containers.conf.d/notes.txt"] = '[engine]\ncgroup_manager = "systemd"\n'
    assert podman_settings(host).status == OK  # the site's later drop-in wins
    host.dirs["/home/alice/.config/containers/containers.conf.d"] = ["99-mine.conf"]
    mine = "/home/alice/.config/containers/containers.conf.d/99-mine.conf"
    host.files[mine] = '[engine]\ncgroup_manager = "systemd"\n'
    got = podman_settings(host)
    assert got.status == WARN and mine in got.detail  # the user's drop-in is read last


def test_containers_conf_in_the_environment_replaces_the_files_and_the_override_comes_last() -> None:
    host = FakeHost()
    host.files["/home/alice/.config/containers/containers.conf"] = '[engine]\ncgroup_manager = "systemd"\n'
    host.files["/tmp/only.conf"] = '[engine]\nevents_logger = "file"\n'
    host.env["CONTAINERS_CONF"] = "/tmp/only.conf"
    got = podman_settings(host)
    assert got.status == OK and "read: /tmp/only.conf)" in got.detail
    host.files["/tmp/override.conf"] = '[containers]\ncgroupns = "private"\n'
    host.env["CONTAINERS_CONF_OVERRIDE"] = "/tmp/override.conf"
    got = podman_settings(host)
    assert got.status == WARN and "/tmp/override.conf" in got.detail


def test_a_containers_conf_podman_cannot_parse_is_a_problem() -> None:
    host = FakeHost()
    host.files["/etc/containers/containers.conf"] = "[engine\ncgroup_manager = 1\n"
    got = podman_settings(host)
    assert got.status == PROBLEM and "/etc/containers/containers.conf" in got.detail


def test_no_agent_on_a_compute_node_is_no_problem_but_on_a_login_node_it_is(tmp_path: Path) -> None:
    host = on_node("gpu1", tmp_path)
    host.agent = None
    (cdi := cdi_dirs(tmp_path))[1].joinpath("nvidia.yaml").write_text(NVIDIA_SPEC)
    got = findings(host=host, cdi_dirs=cdi)
    assert got["agent"].status == SKIPPED and "compute node gpu1" in got["agent"].detail
    assert not blocking(list(got.values()))
    host.name = "login1"
    assert findings(host=host)["agent"].status == PROBLEM


# ---------------------------------------------------------------- where a user's job directories go


def _with_job_directories(template: str) -> Any:
    return parse_policy({"policy": "fifo", "partitions": {"gpu": {"role": "gpu"}, "cpu": {"role": "cpu"}},
                         "site": {"job_directories": template}})


def _job_directories(host: FakeHost, policy: Any = POLICY) -> Finding:
    found = run_doctor(SlurmClient(runner=cluster()), host, policy, user="alice", image="localhost/img",
                       socket_path=Path("/run/dlsub/agent.sock"), library=LIBRARY, cdi_dirs=())
    return next(f for f in found if f.check == "job directories of alice")


def test_a_home_that_keeps_acls_keeps_the_job_directories_asked_as_the_user() -> None:
    host = FakeHost()
    got = _job_directories(host)
    assert got.status == OK and "/home/alice/.dlsub/jobs" in got.detail, got
    assert host.acls_asked == [("alice", "/home/alice/.dlsub/jobs")], "asked as alice: root may be squashed"


def test_a_home_without_acls_and_no_site_folder_warns_that_every_user_reads_the_progress() -> None:
    host = FakeHost()
    host.no_acls, host.home_fs = {"/home/alice"}, "fuse.sshfs"
    got = _job_directories(host)
    assert got.status == WARN, got
    assert "/home/alice (fuse.sshfs) keeps no POSIX ACLs" in got.detail and "every user can read" in got.detail
    assert "[site] job_directories" in got.fix and "DLSUB_HOME" in got.fix


def test_a_home_without_acls_puts_them_in_the_sites_folder_when_it_keeps_acls() -> None:
    host = FakeHost()
    host.no_acls, host.home_fs = {"/home/alice"}, "nfs4"
    got = _job_directories(host, _with_job_directories("/scratch/{user}/dlsub-jobs"))
    assert got.status == OK, got
    assert got.detail.startswith("/scratch/alice/dlsub-jobs (policy.toml [site] job_directories)"), got
    assert host.acls_asked[-1] == ("alice", "/scratch/alice/dlsub-jobs")


def test_a_site_folder_without_acls_either_warns() -> None:
    host = FakeHost()
    host.no_acls = {"/home/alice", "/scratch"}
    got = _job_directories(host, _with_job_directories("/scratch/{user}/dlsub-jobs"))
    assert got.status == WARN and "/scratch/alice/dlsub-jobs" in got.detail, got
    assert "POSIX ACLs" in got.fix


def test_a_probe_that_could_not_run_warns_and_blocks_nothing() -> None:
    host = FakeHost()
    host.acls_unasked = True
    got = _job_directories(host)
    assert got.status == WARN and "could not ask, as alice" in got.detail, got


def test_the_hosts_probe_answers_as_submit_decides(tmp_path: Path) -> None:
    """Host.posix_acls runs dlsub's own test as the user (here the caller, so no runuser): the same answer as
    posix_acls_work in this process, for a folder that exists and one that does not yet."""
    from dlsub.job.filesystems import posix_acls_work
    me = pwd.getpwuid(os.getuid())
    for path in (tmp_path, tmp_path / "not" / "yet"):
        assert Host().posix_acls(me, path) is posix_acls_work(path)


def test_the_hosts_file_system_type_is_the_mount_tables_with_fuses_subtype(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A home on sshfs is fuse.sshfs in the mount table, one of the network file systems, where stat -f says only
    fuseblk: doctor names it so (the graph root check judges by it)."""
    table = tmp_path / "mountinfo"
    table.write_text("22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
                     "90 22 0:52 / /home/alice rw,nosuid,nodev shared:40 - fuse.sshfs root@head:/alice rw\n")
    monkeypatch.setattr("dlsub.job.filesystems.MOUNTINFO", table)
    assert Host().fs_type(Path("/home/alice/.local/share/containers/storage")) == "fuse.sshfs"
    assert Host().fs_type(Path("/var/lib")) == "ext4"
