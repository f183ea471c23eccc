"""Integration tests (live testbed, the agent service on login1, users on a second login host, login2):
`dlsub why`, `dlsub agent status` and the dashboard's data answer there about the caller's own jobs only.

login2 cannot see the agent's Unix socket (its /run/dlsub is its own), so every question travels over TCP
to the policy's `agent_address` inside a munge credential that the real munged of the testbed makes and
the agent decodes: another user's job is refused exactly as on the socket, a replayed or forged credential
is refused outright, and a cron backfill pass on login2 never ticks (the agent's state and lock are on
login1).
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from dlsub.site_config.policy_file import load_policy, parse_address
from livebed import AGENT_USER, POLICY_FILE, TestbedUser, on_host, put, wait_for

LOGIN2 = "login2"
SOCKET = "/run/dlsub/agent.sock"
PYTHON = str(Path(os.environ.get("DLSUB_PREFIX", "/opt/dlsub")) / "venv" / "bin" / "python")

pytestmark = pytest.mark.usefixtures("service_agent_for_module")


@pytest.fixture(scope="module")
def address() -> str:
    """The agent's TCP address; login2 up, on its own, and unable to see the agent's socket."""
    found = load_policy(POLICY_FILE).agent_address
    if not found:
        pytest.fail(f"{POLICY_FILE} sets no agent_address (etc/testbed/policy.toml names login1:6830)")
    if not Path(f"/run/dlsub-testbed/host-{LOGIN2}.pid").exists():
        pytest.fail(f"the testbed has no host {LOGIN2}: `make testbed` (testbed/hosts.sh)")
    name = subprocess.run([*on_host(LOGIN2), "hostname"], capture_output=True, text=True, check=True).stdout
    assert name.strip() == LOGIN2
    seen = subprocess.run([*on_host(LOGIN2), "test", "-e", SOCKET], check=False)
    assert seen.returncode != 0, f"{LOGIN2} sees {SOCKET}: it needs a /run/dlsub of its own"
    return found


@pytest.fixture(scope="module")
def decided_job(user: TestbedUser) -> Iterator[dict[str, Any]]:
    """A job of `dltest` that the agent has decided something about, asked after from login2."""
    dlsub_id = secrets.token_hex(4)
    job_dir = user.home / ".dlsub" / "jobs" / dlsub_id
    user.run("mkdir", "-p", str(job_dir), check=True)
    # As in test_privacy: a plain batch job that says it is dlsub's (immediate on cpu, wanting a GPU); the agent
    # follows it and says why it does not move it. It only sleeps.
    out = user.on_login(LOGIN2, "sbatch", "--parsable", "-p", "cpu", "--mem=50", "--time=10", "-J", "it-login2",
                        f"--comment=dlsub:{dlsub_id};mode=immediate;ideal=gpu;gpus=1",
                        f"--output={job_dir}/slurm-%j.out", "--wrap", "sleep 600", check=True)
    slurm_id = int(out.stdout.strip().split(";")[0])

    def owner_sees() -> list[dict[str, Any]]:
        res = user.on_login(LOGIN2, "dlsub", "why", dlsub_id, "--json")
        return json.loads(res.stdout) if res.returncode == 0 else []

    try:
        decisions = wait_for("the agent to decide something about the job (asked from login2)", owner_sees,
                             timeout=60)
        yield {"dlsub_id": dlsub_id, "slurm_job_id": slurm_id, "decisions": decisions}
    finally:
        subprocess.run(["scancel", str(slurm_id)], check=False)


def test_why_from_login2_answers_the_owner_and_refuses_another_user(
        address: str, user: TestbedUser, user2: TestbedUser, decided_job: dict[str, Any]) -> None:
    assert decided_job["decisions"] and all(d["uid"] == user.uid for d in decided_job["decisions"])
    reasons = [d["reason"] for d in decided_job["decisions"]]
    by_slurm_id = json.loads(user.on_login(LOGIN2, "dlsub", "why", str(decided_job["slurm_job_id"]), "--json",
                                           check=True).stdout)
    assert {d["reason"] for d in by_slurm_id} >= set(reasons)
    for job in (decided_job["dlsub_id"], str(decided_job["slurm_job_id"])):
        as_json = user2.on_login(LOGIN2, "dlsub", "why", job, "--json")
        assert as_json.returncode == 0, as_json.stderr
        assert json.loads(as_json.stdout) == []
        text = user2.on_login(LOGIN2, "dlsub", "why", job)
        assert "decided nothing" in text.stdout
        assert not any(r in text.stdout + text.stderr for r in reasons)


def test_agent_status_from_login2_knows_who_asks_through_munge(
        address: str, user: TestbedUser, user2: TestbedUser, decided_job: dict[str, Any]) -> None:
    for who in (user, user2):
        out = who.on_login(LOGIN2, "dlsub", "agent", "status", "--json", timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
        info = json.loads(out.stdout)
        assert info["running"] is True and info["host"] == "login1"
        assert info["you"] == {"uid": who.uid, "user": who.name, "admin": False, "via": "munge"}
        assert all(m.get("uid") == who.uid for m in info["moves_in_flight"])


DASHBOARD_DATA = """
import json, sys, types
from dlsub.dashboard.data import Dashboard, Viewer
from dlsub.job.settings import load_settings
from dlsub.site_config.policy_file import load_policy
policy = load_policy(None)
board = Dashboard(Viewer.current(policy), load_settings(), policy)
decisions, note = board.decisions(types.SimpleNamespace(id=sys.argv[1]))
print(json.dumps({"status": board.agent_status(), "decisions": decisions, "note": note}))
"""


def test_the_dashboards_agent_data_from_login2(address: str, user: TestbedUser, user2: TestbedUser,
                                               decided_job: dict[str, Any]) -> None:
    """The calls the dashboard's pages make to the agent (its status, a job's decisions), run on login2."""
    reasons = {d["reason"] for d in decided_job["decisions"]}
    own = json.loads(user.on_login(LOGIN2, PYTHON, "-c", DASHBOARD_DATA, decided_job["dlsub_id"],
                                   check=True).stdout)
    assert own["status"]["running"] is True and own["note"] == ""
    assert {d["reason"] for d in own["decisions"]} >= reasons
    other = json.loads(user2.on_login(LOGIN2, PYTHON, "-c", DASHBOARD_DATA, decided_job["dlsub_id"],
                                      check=True).stdout)
    assert other["status"]["running"] is True and other["decisions"] == [] and other["note"] == ""


# Sends stdin to the agent's port as it is and prints what comes back; a sealed answer (a munge credential)
# opened with this user's own unmunge, as {"sealed_by": uid, "answer": ...}.
SEND = """
import json, socket, subprocess, sys
host, port = sys.argv[1].rsplit(":", 1)
data = sys.stdin.buffer.read()
with socket.create_connection((host, int(port)), timeout=20) as s:
    s.sendall(data)
    out = b""
    while chunk := s.recv(65536):
        out += chunk
if out.startswith(b"MUNGE:"):
    opened = subprocess.run(["unmunge", "--numeric", "--keys", "UID"], input=out, capture_output=True, check=True)
    head, _, payload = opened.stdout.partition(b"\\n\\n")
    uid = int(head.decode().split(":", 1)[1])
    print(json.dumps({"sealed_by": uid, "answer": json.loads(payload)}))
else:
    print(out.decode())
"""


def test_a_replayed_or_forged_credential_from_login2_is_refused(address: str, user: TestbedUser) -> None:
    host, port = parse_address(address)
    made = user.on_login(LOGIN2, "munge", "-s", '{"op": "status"}', check=True).stdout

    def send(data: str) -> dict[str, Any]:
        cmd = [*on_host(LOGIN2), "runuser", "-u", user.name, "--", PYTHON, "-c", SEND, f"{host}:{port}"]
        out = subprocess.run(cmd, input=data, capture_output=True, text=True, timeout=60, check=True)
        return json.loads(out.stdout)

    sealed = send(made)  # the answer sealed for this user by the agent's account (opened with its unmunge)
    first = sealed["answer"]
    assert sealed["sealed_by"] == pwd.getpwnam(AGENT_USER).pw_uid, sealed
    assert first["ok"] is True and first["you"]["uid"] == user.uid and first["you"]["via"] == "munge"
    assert send(made) == {"ok": False, "error": "refused: the credential was already used (replayed): every "
                                                "request needs a fresh one"}
    forged = send("MUNGE:" + "A" * 120 + ":\n")
    assert forged["ok"] is False and "not a valid munge credential" in forged["error"]
    assert send('{"op": "status"}\n')["error"].startswith("refused: expected a munge credential")
    # The agent is unharmed.
    assert json.loads(user.on_login(LOGIN2, "dlsub", "agent", "status", "--json", check=True).stdout)["running"]


def test_a_cron_backfill_pass_on_login2_leaves_it_to_the_agent(address: str) -> None:
    """etc/cron.d/dlsub-backfill's command, run on login2: the agent's lock is on login1's disk, so the pass
    asks the agent over TCP and never ticks from a state of its own."""
    out = subprocess.run([*on_host(LOGIN2), "runuser", "-u", AGENT_USER, "--", "dlsub", "backfill", "--once",
                          "--policy", str(POLICY_FILE)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "the agent runs on login1 and backfills on its own" in out.stdout


def test_submits_from_both_login_hosts_at_once_both_land_in_the_store(
        address: str, user: TestbedUser, workdir: Path) -> None:
    """One user submits from login1 and login2 at the same moment (#50: concurrent submits from two login
    hosts): both jobs are in the one store on the shared home, `dlsub status` lists both on each host, and both
    run. Both hosts here are one kernel, so the store keeps WAL; on a home shared over the network it keeps the
    rollback journal, whose locks the hosts share (tests/unit/test_filesystems.py)."""
    script = put(user, workdir / "short.py", "print('done')\n")
    submit = ("dlsub", "--json", "-p", "cpu", "--time", "2", str(script))
    with ThreadPoolExecutor(2) as pool:
        here = pool.submit(user.run, *submit, check=True)
        there = pool.submit(user.on_login, LOGIN2, *submit, check=True)
        jobs = [json.loads(f.result().stdout) for f in (here, there)]
    ids = {job["id"] for job in jobs}
    assert len(ids) == 2, jobs
    for listed in (user.run("dlsub", "status", "--json", check=True),
                   user.on_login(LOGIN2, "dlsub", "status", "--json", check=True)):
        assert ids <= {job["id"] for job in json.loads(listed.stdout)}, listed.stdout
    for job in jobs:
        assert user.wait_until_ended(job["id"], "each job to run", timeout=180)["state"] == "COMPLETED"
