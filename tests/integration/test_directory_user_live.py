"""Integration (live testbed, rootless Podman, the agent service): a user who exists only in the site's LDAP
directory uses dlsub as any user does (issue 50 item 1).

testbed/ldap.sh runs slapd on the head; every host resolves users through NSS, its files first, then LDAP
through an nslcd of its own. dlldap is in no /etc/passwd; its subordinate ids come from etc/subid-ranges.sh,
the admin guide's script (by uid, the same on every host). It submits from login1 and from login2: each job
runs in the site's image and completes, the second moved from cpu to gpu by the agent; `dlsub why` and
`dlsub status` answer it on login2 about its own jobs; its 0700 home lets the agent alone pass (submit's
ACL); another user can neither read its progress nor learn anything of its jobs through `dlsub why`; `dlsub
doctor` finds its ranges and says it is a directory's user.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from livebed import AGENT_USER, EXAMPLES, LDAP_USER, NODES, TestbedUser, attempts, hold_all, on_host, wait_for

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
        # Its home lets no one else in (0700, as pam_mkhomedir makes it): submit let the agent alone pass.
        acl = subprocess.run(["getfacl", "-p", str(directory_user.home)], capture_output=True, text=True).stdout
        assert f"user:{AGENT_USER}:--x" in acl and "group::---" in acl and "other::---" in acl, acl
        assert user2.run("ls", str(directory_user.home)).returncode != 0
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


def test_the_agent_runs_as_its_service_account() -> None:
    pid = wait_for("the agent's pid file", lambda: Path("/run/dlsub/agent.pid").read_text().strip() or None,
                   timeout=30)
    uid = int(Path(f"/proc/{pid}/status").read_text().split("Uid:")[1].split()[0])
    assert uid != 0, "the agent runs as root"
