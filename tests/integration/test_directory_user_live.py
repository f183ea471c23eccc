"""Integration (live testbed, rootless Podman, the agent service): a user who exists only in the site's LDAP
directory uses dlsub as any user does (issue 50 item 1).

testbed/ldap.sh runs slapd on the head; every host resolves users through NSS, its files first, then LDAP
through an nslcd of its own. dlldap is in no /etc/passwd; its subordinate ids come from etc/subid-ranges.sh,
the admin guide's script (by uid, the same on every host). It submits from login1 and from login2: each job
runs in the site's image and completes, the second moved from cpu to gpu by the agent; `dlsub why` and
`dlsub status` answer it on login2 about its own jobs; its 0700 home lets the agent alone pass (submit's
ACL); another user can neither read its progress nor learn anything of its jobs through `dlsub why`; `dlsub
doctor` finds its ranges and says it is a directory's user, and, on a login host, that its job directories go
to the site's folder since its home keeps no ACLs.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
from pathlib import Path
from typing import Any

from livebed import AGENT_USER, EXAMPLES, LDAP_USER, NODES, TestbedUser, attempts, hold_all, on_host, wait_for

LOGIN_HOSTS = ("login1", "login2")

LDAP_UID = 10001  # testbed/ldap.sh
TRAIN = str(EXAMPLES / "train_digits.py")


def test_it_is_in_no_hosts_files_and_every_host_resolves_it_through_ldap(directory_user: TestbedUser) -> None:
    assert directory_user.uid == LDAP_UID
    assert not any(line.split(":", 1)[0] == LDAP_USER for line in Path("/etc/passwd").read_text().splitlines())
    for host in ("head", "login1", "login2", *NODES):
        files = subprocess.run([*on_host(host), "getent", "-s", "files", "passwd", LDAP_USER],
                               capture_output=True, text=True)
        ldap = subprocess.run([*on_host(host), "getent", "-s", "ldap", "passwd", LDAP_USER],
                              capture_output=True, text=True)
        assert files.returncode == 2 and ldap.stdout.split(":")[2] == str(LDAP_UID), (host, files, ldap)
    ranges = [line for line in Path("/etc/subuid").read_text().splitlines() if line.startswith(f"{LDAP_USER}:")]
    assert ranges == [f"{LDAP_USER}:{10**9 + (LDAP_UID - 10000) * 65536}:65536"], ranges


def test_it_trains_from_both_login_hosts_is_moved_cpu_to_gpu_and_only_it_can_see_its_jobs(
        directory_user: TestbedUser, user2: TestbedUser, directory_workdir: Path) -> None:
    """From login1, a job on CPUs; from login2, an immediate-mode job for a GPU, which starts on cpu while
    another user holds every GPU and is moved to gpu once one frees. Both complete."""
    blockers = hold_all(user2, ("gpu1", 4), ("gpu2", 4))
    here = directory_user.submit("--cpus", "1", "--mem", "1G", TRAIN, "--epochs", "1", cwd=directory_workdir)
    there_run = directory_user.on_login(
        "login2", "env", "-C", str(directory_workdir), "dlsub", "--json", "--mode", "immediate", "--gpus", "1", TRAIN,
        "--epochs", "10", "--throttle", "0.05", "--cpu-slowdown", "4", check=True)
    there = json.loads(there_run.stdout)
    jobs = (here, there)
    try:
        assert there["partition"] == "cpu", there
        wait_for("a checkpoint on cpu", lambda: (s := directory_user.status(there["id"]))["state"] == "RUNNING"
                 and s["last_checkpoint_step"], timeout=120)
        subprocess.run(["scancel", str(blockers.pop())], check=True)
        for job in jobs:
            ended = directory_user.wait_until_ended(job["id"], f"job {job['id']} to end", timeout=240)
            assert ended["state"] == "COMPLETED", ended
        assert [a["partition"] for a in attempts(there["job_dir"]) if a["event"] == "start"] == ["cpu", "gpu"]
        # Both jobs in its one store, whichever host asks.
        listed = json.loads(directory_user.on_login("login2", "dlsub", "status", "--json", check=True).stdout)
        assert {here["id"], there["id"]} <= {j["id"] for j in listed}, listed
        why = directory_user.on_login("login2", "dlsub", "why", there["id"])
        assert why.returncode == 0 and "moving to gpu" in why.stdout, why.stdout + why.stderr
        progress = Path(there["job_dir"]) / "progress.jsonl"
        assert progress.exists()
        denied = user2.run("cat", str(progress))
        assert denied.returncode != 0 and "Permission denied" in denied.stderr, denied
        # Its home (0700, on the network file system, which has no ACLs) lets no one else in, the agent neither:
        # its job directories are on /scratch (policy.toml [site] job_directories), the agent alone let in there.
        assert oct(directory_user.home.stat().st_mode & 0o777) == "0o700"
        assert user2.run("ls", str(directory_user.home)).returncode != 0
        for job in jobs:
            assert Path(job["job_dir"]).parent == Path(f"/scratch/{LDAP_USER}/dlsub-jobs"), job
        acl = subprocess.run(["getfacl", "-p", f"/scratch/{LDAP_USER}"], capture_output=True, text=True).stdout
        assert f"user:{AGENT_USER}:--x" in acl and "group::---" in acl and "other::---" in acl, acl
        other = user2.on_login("login2", "dlsub", "why", there["id"], "--json")
        assert other.returncode == 0 and json.loads(other.stdout) == [], other.stdout
    finally:
        subprocess.run(["scancel", *map(str, blockers), *(str(j["slurm_job_id"]) for j in jobs)], check=False)


def test_doctor_finds_its_ranges_and_says_it_is_a_directorys_user(directory_user: TestbedUser) -> None:
    result = subprocess.run(["dlsub", "doctor", "--user", LDAP_USER, "--json"], capture_output=True, text=True,
                            timeout=180)
    checks = {c["check"]: c for c in json.loads(result.stdout)["checks"]}
    found = checks[f"subordinate ids of {LDAP_USER}"]
    assert found["status"] == "ok" and "directory's user" in found["detail"], found
    assert checks[f"image of {LDAP_USER}"]["status"] == "ok", checks[f"image of {LDAP_USER}"]


def test_doctor_on_a_login_host_says_its_job_directories_go_to_the_sites_folder(
        directory_user: TestbedUser) -> None:
    """As root on login1, where its home is the network's (root squashed): doctor asks as dlldap whether the home
    keeps POSIX ACLs (it does not), and names the site's folder (policy.toml [site] job_directories)."""
    result = subprocess.run([*on_host("login1"), "dlsub", "doctor", "--user", LDAP_USER, "--json"],
                            capture_output=True, text=True, timeout=180)
    checks = {c["check"]: c for c in json.loads(result.stdout)["checks"]}
    found = checks[f"job directories of {LDAP_USER}"]
    assert found["status"] == "ok", found
    assert found["detail"].startswith(f"/scratch/{LDAP_USER}/dlsub-jobs (policy.toml [site] job_directories)"), found
    assert f"/home/{LDAP_USER} (fuse.sshfs) keeps no POSIX ACLs" in found["detail"], found


def test_the_agent_runs_as_its_service_account() -> None:
    pid = wait_for("the agent's pid file", lambda: Path("/run/dlsub/agent.pid").read_text().strip() or None,
                   timeout=30)
    uid = int(Path(f"/proc/{pid}/status").read_text().split("Uid:")[1].split()[0])
    assert uid != 0, "the agent runs as root"


def test_its_home_is_the_heads_over_the_network_with_root_squashed(directory_user: TestbedUser) -> None:
    """Every host but the head mounts it from the head (sshfs, root's requests made as nobody's): the user reads
    and writes there from any host; root, there, reads nothing of it."""
    home = str(directory_user.home)
    for host in ("head2", *LOGIN_HOSTS, *NODES):
        mount = subprocess.run([*on_host(host), "findmnt", "-n", "-o", "FSTYPE,SOURCE", "--mountpoint", home],
                               capture_output=True, text=True).stdout.split()
        assert mount == ["fuse.sshfs", f"root@head:{LDAP_USER}"], (host, mount)
    note = directory_user.home / f".it-{os.getpid()}"
    directory_user.on_login("login1", "sh", "-c", f'echo written on login1 > "{note}"', check=True)
    try:
        read = directory_user.on_node("gpu2", "cat", str(note), check=True)
        assert read.stdout == "written on login1\n"
        owner = directory_user.on_login("login2", "stat", "-c", "%u %a", str(note), check=True).stdout.split()
        assert owner == [str(LDAP_UID), "644"], owner
        for host in ("login1", "cpu1"):
            squashed = subprocess.run([*on_host(host), "cat", str(note)], capture_output=True, text=True)
            assert squashed.returncode != 0 and "Permission denied" in squashed.stderr, (host, squashed)
            made = subprocess.run([*on_host(host), "touch", f"{home}/by-root"], capture_output=True, text=True)
            assert made.returncode != 0 and "Permission denied" in made.stderr, (host, made)
        # Its job store there keeps a rollback journal, never SQLite's WAL (whose shared memory is one host's).
        listing = directory_user.on_login("login2", "ls", "-a", f"{home}/.dlsub", check=True).stdout.split()
        assert "dlsub.db" in listing and not any(name.endswith(("-wal", "-shm")) for name in listing), listing
    finally:
        directory_user.run("rm", "-f", str(note))


def test_submits_at_once_from_both_login_hosts_all_reach_its_one_store(
        directory_user: TestbedUser, directory_workdir: Path) -> None:
    """Its store is on a file system whose byte-range locks each host keeps to itself: two login hosts' submits
    at the same moment must both be kept (SQLite's dot-file locking there, job/user_store.py)."""
    def submit(host: str) -> dict[str, Any]:
        out = directory_user.on_login(host, "env", "-C", str(directory_workdir), "dlsub", "--json", "--cpus", "1",
                                      "--mem", "500M", "--time", "5", TRAIN, "--epochs", "1", check=True)
        return dict(json.loads(out.stdout))

    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        jobs = list(pool.map(submit, LOGIN_HOSTS * 2))
    try:
        listed = json.loads(directory_user.on_login("login1", "dlsub", "status", "--json", check=True).stdout)
        assert {j["id"] for j in jobs} <= {j["id"] for j in listed}, (jobs, listed)
        assert len({j["id"] for j in jobs}) == 4
    finally:
        subprocess.run(["scancel", *(str(j["slurm_job_id"]) for j in jobs)], check=False)
