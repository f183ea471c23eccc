"""Helpers for the integration tests: act as the testbed user on the live testbed."""

from __future__ import annotations

import json
import os
import pwd
import re
import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dlsub.slurm_plugins.client import SlurmClient

USER = os.environ.get("DLSUB_TESTBED_USER", "dltest")
#: A second unprivileged user: "another user" in the privacy and trust tests.
USER2 = os.environ.get("DLSUB_TESTBED_USER2", "dltest2")
#: A third, who has never run Podman: the site's image is all it has (testbed/up.sh).
USER3 = os.environ.get("DLSUB_TESTBED_USER3", "dltest3")
#: The user who exists only in the site's LDAP directory (testbed/ldap.sh).
LDAP_USER = os.environ.get("DLSUB_TESTBED_LDAP_USER", "dlldap")
#: The site's read-only image store every host's Podman reads (testbed/common.sh, containers/site-image-store.sh).
SITE_IMAGE_STORE = Path("/var/lib/dlsub-images")
#: Each host's own disk, where each user's Podman keeps its containers (etc/testbed/storage.conf).
NODE_LOCAL = Path("/var/lib/dlsub-local")
EXAMPLES = Path(os.environ.get("DLSUB_PREFIX", "/opt/dlsub")) / "examples"
#: The kind of each GPU node's GPUs, as the testbed's Slurm names them (GRES types, etc/testbed/slurm.conf).
GPU_TYPES = {"gpu1": "a100", "gpu2": "v100"}
#: The testbed's compute nodes, each a host of its own (testbed/hosts.sh); the tests run on its login host.
NODES = ("cpu1", "cpu2", "gpu1", "gpu2")
HOSTS_DIR = Path("/var/lib/dlsub-testbed/hosts")


def on_host(host: str) -> list[str]:
    """The command prefix that runs what follows on one of the testbed's hosts, from any host: through the
    host's keeper process (testbed/hosts.sh), whose namespaces are the host's."""
    keeper = Path(f"/run/dlsub-testbed/host-{host}.pid").read_text().strip()
    return ["nsenter", "-t", keeper, "--net", "--uts", "--mount", "--"]


# The states `dlsub status` gives a job that will not run again.
ENDED = ("COMPLETED", "FAILED", "CANCELLED")


class TestbedUser:
    """Runs commands as the testbed user, in a login-like environment."""

    __test__ = False  # not a test class

    def __init__(self, name: str) -> None:
        entry = pwd.getpwnam(name)
        self.name, self.uid, self.gid, self.home = name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir)
        self.env = {
            "HOME": str(self.home), "USER": name, "LOGNAME": name,
            "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            "XDG_RUNTIME_DIR": f"/run/user/{self.uid}", "LANG": "C.UTF-8",
        }

    def run(self, *argv: str, cwd: Path | None = None, check: bool = False,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
        # The user enters the folder (env -C), not root before it: root is squashed in a home on the testbed's
        # network file system (testbed/nethome.sh), and may not enter a folder there.
        cmd = ["runuser", "-u", self.name, "--", "env", "-i", "-C", str(cwd or self.home),
               *(f"{k}={v}" for k, v in self.env.items()), *argv]
        result = subprocess.run(cmd, cwd="/", capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"{argv} exited {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}")
        return result

    def dlsub(self, *args: str, cwd: Path | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run("dlsub", *args, cwd=cwd, check=check)

    def submit(self, *args: str, cwd: Path | None = None) -> dict[str, Any]:
        return json.loads(self.dlsub("--json", *args, cwd=cwd).stdout)

    def status(self, job: str) -> dict[str, Any]:
        return json.loads(self.dlsub("status", job, "--json").stdout)

    def wait_until_ended(self, job: str, what: str = "the job to end", timeout: float = 240,
                         interval: float = 1.0) -> dict[str, Any]:
        """The job's `dlsub status --json` once it has completed, failed or been cancelled."""
        return wait_for(what, lambda: (s := self.status(job))["state"] in ENDED and s,
                        timeout=timeout, interval=interval)

    def node_runtime_dir(self) -> str:
        """Podman's runtime directory for this user's jobs on a compute node: no logind makes /run/user/UID
        there, so the batch script's private fallback in the node's own /tmp."""
        return f"/tmp/dlsub-xdg-{self.uid}"

    def on_node(self, node: str, *argv: str, check: bool = False) -> subprocess.CompletedProcess[str]:
        """A command as this user on a compute node, with the environment its jobs' Podman has there."""
        env = {**self.env, "XDG_RUNTIME_DIR": self.node_runtime_dir()}
        cmd = [*on_host(node), "runuser", "-u", self.name, "--", "env", "-i", "-C", str(self.home),
               *(f"{k}={v}" for k, v in env.items()), *argv]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if check and result.returncode != 0:
            raise AssertionError(f"{node}: {argv} exited {result.returncode}\n{result.stdout}\n{result.stderr}")
        return result

    def on_login(self, host: str, *argv: str, check: bool = False,
                 timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """A command as this user on another login host (``login2``), as :meth:`run` runs it on this one:
        the host's own name, network and node-local files; the shared home."""
        cmd = [*on_host(host), "runuser", "-u", self.name, "--", "env", "-i", "-C", str(self.home),
               *(f"{k}={v}" for k, v in self.env.items()), *argv]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"{host}: {argv} exited {result.returncode}\n{result.stdout}\n{result.stderr}")
        return result

    def containers(self, label: str, nodes: tuple[str, ...] = NODES) -> list[str]:
        """This user's containers with the label, on every compute node (each node has its own Podman)."""
        names = []
        for node in nodes:
            if not (HOSTS_DIR / node / "tmp" / f"dlsub-xdg-{self.uid}").is_dir():
                continue  # no job of this user has run Podman there
            out = self.on_node(node, "podman", "ps", "-a", "--format", "{{.Names}}", "--filter", f"label={label}",
                               check=True)
            names += out.stdout.split()
        return names


def put(user: TestbedUser, path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    # The file and the folders between it and the test's own workdir (a dlsub-it-* folder).
    for p in (path, *[q for q in path.parents if any(part.startswith("dlsub-it-") for part in q.parts)]):
        os.chown(p, user.uid, user.gid)
    return path


#: (test, what was waited for, seconds) of every wait_for of this process: the live suite's closing summary
#: (tests/integration/conftest.py) lists the longest, so that where CI's time goes is read, not guessed.
WAITS: list[tuple[str, str, float]] = []


def wait_for(what: str, predicate: Callable[[], Any], timeout: float = 120, interval: float = 1.0) -> Any:
    began = time.monotonic()
    deadline = began + timeout
    last: Any = None
    try:
        while time.monotonic() < deadline:
            last = predicate()
            if last:
                return last
            time.sleep(interval)
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")
    finally:
        test = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
        WAITS.append((test, what, time.monotonic() - began))


def _cpu_idle_ticks() -> tuple[int, int]:
    """(idle + iowait + niced ticks, all ticks) of the whole machine since boot, from /proc/stat.

    Niced work counts as idle: it yields to the run being measured (at nice 19 it gets about 1.5% of a core
    a normal process wants). (In the CI runs seen, the unit tests had ended before the estimate test began: its
    234-258 s are its profiling and timed runs.)"""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return ticks[1] + ticks[3] + ticks[4], sum(ticks)


#: sched_setscheduler's SCHED_IDLE, as /proc/PID/stat's policy field gives it.
SCHED_IDLE = 5


def _idle_class_ticks() -> dict[int, int]:
    """pid -> CPU ticks (user + system) of every process running under SCHED_IDLE. make test runs the unit tests
    so beside the live ones (`chrt --idle`): /proc/stat counts their ticks as any process's, and counted as busy
    they would hold a wait here at its 90 s limit whenever a measurement falls while they run."""
    ticks = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            text = Path(entry.path, "stat").read_text()
        except OSError:  # ended since the listing
            continue
        fields = text[text.rindex(")") + 2:].split()  # from field 3 (state) on: the name may hold spaces
        if int(fields[38]) == SCHED_IDLE:  # field 41, policy
            ticks[int(entry.name)] = int(fields[11]) + int(fields[12])  # fields 14 and 15, utime and stime
    return ticks


def wait_until_quiet(idle_share: float = 0.8, timeout: float = 90) -> bool:
    """Wait until Slurm holds no pending or running job and the CPUs were ``idle_share`` idle for two
    consecutive seconds: a measurement of one undisturbed run starts there. Every testbed node shares this
    machine's cores, so a previous test's jobs still ending, or their containers being removed, slow the
    next run. Work under SCHED_IDLE (CI's unit tests) counts as idle: it yields the cores at once. False when
    the machine stayed busy for ``timeout`` s (the caller measures anyway and says so).
    """
    deadline = time.monotonic() + timeout
    calm = 0
    while time.monotonic() < deadline:
        queued = subprocess.run(["squeue", "-h", "-t", "PD,R,CG,S"], capture_output=True, text=True).stdout
        before, yielding_before = _cpu_idle_ticks(), _idle_class_ticks()
        time.sleep(1.0)
        idle, total = (a - b for a, b in zip(_cpu_idle_ticks(), before, strict=True))
        yielding = sum(max(0, t - yielding_before[pid]) for pid, t in _idle_class_ticks().items()
                       if pid in yielding_before)
        calm = calm + 1 if not queued.strip() and total and (idle + yielding) / total >= idle_share else 0
        if calm >= 2:
            return True
    return False


def timed_run(user: TestbedUser, workdir: Path, *args: str, timeout: float = 180) -> tuple[float, float]:
    """(walltime of its one attempt, the training's peak resident memory it reported) of `dlsub submit ARGS`.

    Submitted once the testbed is quiet (:func:`wait_until_quiet`), and waited for in the attempt records
    the batch script writes: a `dlsub status` is a Python process, and on this 2-core machine polling it
    took CPU from the very run being timed (a ~10 s run, polled every 3 s: 11-12 s; not polled: 9.5-10.5).
    """
    if not wait_until_quiet():
        print("the testbed stayed busy for 90 s; measuring anyway")
    job = user.submit(*args, cwd=workdir)
    wait_for("the timed run's attempt to end", lambda: any(a["event"] == "end" for a in attempts(job["job_dir"])),
             timeout=timeout, interval=0.5)
    done = user.wait_until_ended(job["id"], "the timed run to end", timeout=60)
    assert done["state"] == "COMPLETED", user.dlsub("logs", job["id"]).stdout
    records = attempts(job["job_dir"])
    start = next(a["time"] for a in records if a["event"] == "start")
    end = next(a["time"] for a in records if a["event"] == "end")
    progress = progress_events(job["job_dir"])
    return end - start, max(float(e.get("peak_rss_mb") or 0) for e in progress)


REPO = Path(__file__).resolve().parents[1]
AGENT_USER = os.environ.get("DLSUB_AGENT_USER", "dlsub")


def slurm_jobs() -> list[dict[str, Any]]:
    """Slurm's own records of every job it still holds (squeue --json, as root, ended jobs too), in the
    flat shape dlsub's client reads whatever the Slurm version (slurm_plugins/dialects.py)."""
    client = SlurmClient()
    dialect = client.dialect()
    out = subprocess.run(["squeue", "--json", *dialect.all_states], capture_output=True, text=True, check=True).stdout
    return [dialect.job(raw) for raw in json.loads(out).get("jobs", [])]


def jobs_made_since(before: set[int]) -> set[int]:
    """The ids of the jobs Slurm holds now that it did not hold at ``before`` (:func:`slurm_jobs`' ids then).
    Not ``now == before``: Slurm forgets ended jobs MinJobAge after they end, and in the full suite one of
    them is forgotten every few seconds, so a set of all jobs can shrink between two looks (CI, once)."""
    return {j["job_id"] for j in slurm_jobs()} - before


def slurm_job(job_id: int) -> dict[str, Any] | None:
    """Slurm's own record of a job (see :func:`slurm_jobs`), or None once it is gone."""
    found = [j for j in slurm_jobs() if j.get("job_id") == job_id]
    return found[0] if found else None


def agent_service(action: str, host: str | None = None, db: Path | None = None) -> None:
    """Start, stop or kill -9 the testbed's agent (testbed/agent.sh, by its pid file): login1's, or the one on
    ``host`` (login2: the second of a pair); ``db``: its state database (``--db``) when not the default."""
    env = {**os.environ, "DLSUB_AGENT_DB": str(db)} if db else None
    subprocess.run(["bash", str(REPO / "testbed" / "agent.sh"), action, *([host] if host else [])], check=True,
                   capture_output=True, env=env)


def agent_moves(db: Path) -> list[tuple[str, str]]:
    """(dlsub id, phase) of each move in flight in an agent's database, read-only ([] while it cannot be read)."""
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            return conn.execute("select dlsub_id, phase from moves").fetchall()
        finally:
            conn.close()
    except sqlite3.Error:
        return []


#: The testbed's agent policy (testbed/up.sh installs etc/testbed/policy.toml there: policy = "fifo").
POLICY_FILE = Path("/etc/dlsub/policy.toml")


@contextmanager
def agent_policy(name: str, tables: str = "", values: Mapping[str, str] | None = None) -> Iterator[None]:
    """The agent service restarted under ``policy = NAME`` (and ``tables``, TOML appended to the file, e.g.
    ``[goodput]`` ``across_gpu_types = true``; ``values``: keys the file sets once, set to these TOML values
    instead, e.g. ``{"restart_cost_s": "5"}``); the file restored and the agent restarted after (also for
    "fifo", so that every run starts from a fresh agent)."""
    original = POLICY_FILE.read_text()
    assert 'policy = "fifo"' in original, f"{POLICY_FILE} is not the testbed's fifo file: is another run using it?"
    changed = original.replace('policy = "fifo"', f'policy = "{name}"', 1)
    for key, value in (values or {}).items():
        changed, count = re.subn(rf"^{re.escape(key)} = .*$", f"{key} = {value}", changed, flags=re.MULTILINE)
        assert count == 1, f"{POLICY_FILE} sets {key} {count} times, not once"
    POLICY_FILE.write_text(changed + (f"\n{tables}\n" if tables else ""))
    agent_service("restart")
    try:
        yield
    finally:
        POLICY_FILE.write_text(original)
        agent_service("restart")


def agent_tick(db: Path, now: float | None = None, policy: Path | None = None) -> list[dict[str, Any]]:
    """One agent tick as the service account, with a fake clock when ``now`` is given."""
    argv = ["runuser", "-u", AGENT_USER, "--", "dlsub", "agent", "tick", "--db", str(db), "--json"]
    if policy is not None:
        argv += ["--policy", str(policy)]
    if now is not None:
        argv += ["--now", f"{now:.3f}"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise AssertionError(f"agent tick failed: {result.stdout}\n{result.stderr}")
    return json.loads(result.stdout)


def blockers(user: TestbedUser, count: int = 2, gpus: int = 4) -> list[int]:
    """Jobs that hold every GPU of the testbed, as a busy GPU queue would."""
    ids = []
    for _ in range(count):
        out = user.run("sbatch", "--parsable", "-p", "gpu", f"--gres=gpu:{gpus}", "-J", "blocker", "--mem=200",
                       "--cpus-per-task=1", "--time=30", "--wrap", "sleep 900", check=True)
        ids.append(int(out.stdout.strip().split(";")[0]))
    try:
        wait_for("the blockers to hold the GPUs",
                 lambda: all((slurm_job(i) or {}).get("job_state") == "RUNNING" for i in ids), timeout=60)
    except AssertionError:
        # A fixture that fails before it yields has no teardown: blockers left queued would hold the GPUs
        # for the tests after this one.
        subprocess.run(["scancel", *map(str, ids)], check=False)
        raise
    return ids


def cancel_leftovers(*job_ids: int | None) -> None:
    """scancel what a test started and may have left running (ids that are None were never started)."""
    started = [str(i) for i in job_ids if i]
    if started:
        subprocess.run(["scancel", *started], check=False)


def hold_gpus(user: TestbedUser, node: str, gpus: int, partition: str = "gpu") -> int:
    """A job that holds ``gpus`` GPUs of ``node`` in ``partition`` (until cancelled), once it runs."""
    out = user.run("sbatch", "--parsable", "-p", partition, "-w", node, f"--gres=gpu:{gpus}", "-J", "blocker",
                   "--mem=200", "--cpus-per-task=1", "--time=30", "--wrap", "sleep 900", check=True)
    job = int(out.stdout.strip().split(";")[0])
    try:
        wait_for(f"{gpus} GPU(s) of {node} held", lambda: (slurm_job(job) or {}).get("job_state") == "RUNNING",
                 timeout=60)
    except AssertionError:
        subprocess.run(["scancel", str(job)], check=False)  # not left to hold the GPUs for the tests after
        raise
    return job


def hold_all(user: TestbedUser, *holds: tuple[str, int], partition: str = "gpu") -> list[int]:
    """:func:`hold_gpus` for each (node, GPUs), in order. Where one fails, those already held are cancelled: in
    ``[hold_gpus(a), hold_gpus(b)]`` a failing b leaves a's job holding its GPUs for the tests after, since the
    list that would name it is never made."""
    held: list[int] = []
    try:
        for node, gpus in holds:
            held.append(hold_gpus(user, node, gpus, partition))
    except BaseException:
        cancel_leftovers(*held)
        raise
    return held


def agent_last_tick(user: TestbedUser) -> float:
    """When the agent's last tick began (epoch seconds; 0: none yet), as ``dlsub agent status`` tells ``user``."""
    status = json.loads(user.run("dlsub", "agent", "status", "--json", timeout=60).stdout)
    return float(status.get("last_tick") or 0.0)


def jsonl_records(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file a job may be writing as it is read, each line a record; none where it
    does not exist. Only whole lines count: on the testbed's network home (sshfs) a reader on another host can
    see a line its writer has not finished, as dlsub's own reader (dlsub.jobdir) allows for."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    whole = text[:text.rfind("\n") + 1]
    return [json.loads(line) for line in whole.splitlines() if line.strip()]


def attempts(job_dir: str) -> list[dict[str, Any]]:
    return jsonl_records(Path(job_dir) / "attempts.jsonl")


def progress_events(job_dir: str, kind: str | None = None) -> list[dict[str, Any]]:
    """The job's progress.jsonl events (of one ``kind``, or all), in the order written."""
    return [e for e in jsonl_records(Path(job_dir) / "progress.jsonl") if kind is None or e.get("event") == kind]


def reports_on(job_dir: str, gpu_type: str) -> int:
    """Progress reports since the training last started on GPUs of ``gpu_type`` (0: it did not start there last)."""
    count, current = 0, None
    for event in progress_events(job_dir):
        if event.get("event") == "start":
            current, count = event.get("gpu_type"), 0
        elif event.get("event") == "progress" and current == gpu_type:
            count += 1
    return count


def job_output(job_dir: str) -> str:
    """The job's Slurm output files (every attempt's, its workers'), in name order."""
    return "".join(p.read_text(errors="replace") for p in sorted(Path(job_dir).glob("slurm-*.out")))


def listpids(slurm_job_id: int, node: str) -> str:
    """``scontrol listpids`` of a job, which asks the slurmd of the host it runs on: run on that node."""
    return subprocess.run([*on_host(node), "scontrol", "listpids", str(slurm_job_id)], capture_output=True,
                          text=True).stdout


def job_pids(slurm_job_id: int, node: str) -> list[int]:
    out = listpids(slurm_job_id, node)
    return [int(line.split()[0]) for line in out.splitlines()[1:] if line.split() and line.split()[0].isdigit()]


def processes_of_job(slurm_job_id: int, node: str | None = None) -> list[int]:
    """Every process in one of the job's cgroups (``.../job_<id>/...`` in any hierarchy), its containers' included;
    with ``node``, those on that node only (each slurmd's cgroups sit under ``/slurm_<node>``).

    Read from /proc, not from ``scontrol listpids`` (which asks the node's slurmd, gone when a node is lost):
    with proctrack/cgroup that is every process Slurm tracks and kills for the job."""
    where = rf"/slurm_{re.escape(node)}/(?:.*/)?" if node else "/"
    pattern = re.compile(rf"{where}job_{slurm_job_id}(/|$)")
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cgroups = (proc / "cgroup").read_text()
        except OSError:  # ended while we looked
            continue
        if any(pattern.search(line.rsplit(":", 1)[-1]) for line in cgroups.splitlines()):
            found.append(int(proc.name))
    return found


def parent_of(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("PPid:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def kill_node(user: TestbedUser, node: str, slurm_job_id: int, label: str) -> None:
    """The node "dies" under a job: its slurmd, the job's processes and stepds there, and its containers
    (those with ``label``), all at once, as root. On this one-host testbed that is what a node loss looks
    like to Slurm and to the other nodes. Bring it back with :func:`node_back`."""
    pids = job_pids(slurm_job_id, node)  # asked of the node's slurmd: before it dies
    stepds = {p for p in (parent_of(pid) for pid in pids) if p and "slurmstepd" in Path(f"/proc/{p}/comm").read_text()}
    kill_slurmd(node)
    for pid in [*stepds, *pids]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for name in user.containers(label, nodes=(node,)):
        user.on_node(node, "podman", "rm", "-f", name)


def slurmd_pidfile(node: str) -> Path:
    """Where testbed/node.sh keeps the pid of a node's slurmd."""
    return Path(f"/run/dlsub-testbed/slurmd-{node}.pid")


def kill_slurmd(node: str) -> None:
    """Only the node's slurmd dies (SIGKILL): the job's slurmstepd and processes there live on, as they do when
    a slurmd crashes. Slurm marks the node down after SlurmdTimeout; :func:`node_back` starts it again."""
    os.kill(int(slurmd_pidfile(node).read_text()), signal.SIGKILL)


#: testbed/hosts.sh's namespace of the testbed's bridge; each host's link ends there as ``p-<host>``.
FABRIC_NS = "dlsub-fabric"


def set_link(node: str, up: bool) -> None:
    """Cut a testbed host off the testbed's network, or join it again: its port on the bridge (the veth's end in
    the testbed's own fabric namespace) down or up. The host and its processes run on, unreachable, as behind a
    failed switch port; nothing outside the testbed's namespaces is touched."""
    subprocess.run(["ip", "-n", FABRIC_NS, "link", "set", f"p-{node}", "up" if up else "down"], check=True)


def node_back(node: str) -> None:
    """Start a node's slurmd again and return the node to service (it was marked down)."""
    # The slurmd of the Slurm version that is up (testbed/node.sh knows where it is).
    subprocess.run(["bash", str(REPO / "testbed" / "node.sh"), "start", node], check=False)

    def up() -> bool:
        state = subprocess.run(["sinfo", "-h", "-n", node, "-o", "%t"], capture_output=True, text=True).stdout.strip()
        if "down" in state or "drain" in state:
            subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], capture_output=True)
        return state.rstrip("*") in ("idle", "mix", "alloc")

    wait_for(f"{node} back in service", up, timeout=90, interval=2)


#: The testbed's two heads (testbed/hosts.sh): the primary slurmctld's and the backup's (etc/testbed/slurm.conf).
PRIMARY_HEAD, BACKUP_HEAD = "head", "head2"


def slurmctld_pid(head: str) -> int | None:
    """The pid of the slurmctld listening on a head's port, if one does (its pid file may name the pid it
    re-executed from: testbed/common.sh's slurmctld_on_port)."""
    out = subprocess.run([*on_host(head), "ss", "-Hltnp", "sport = :6817"], capture_output=True, text=True).stdout
    found = re.search(r"pid=(\d+)", out)
    return int(found.group(1)) if found else None


def controllers() -> dict[str, str]:
    """Each controller's state as ``scontrol ping`` gives it: ``{"primary": "UP", "backup": "DOWN"}``."""
    out = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=90).stdout
    return dict(re.findall(r"Slurmctld\((\w+)\) at \S+ is (\w+)", out))


def slurmctld_saved_at() -> float:
    """When the controller in charge last wrote its jobs' state (StateSaveLocation/job_state, which a backup
    reads when it takes control). Slurm writes it about a second after a change; what changed inside that second
    before a controller's crash, its successor never learns (a job cancelled then comes back running)."""
    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, check=True).stdout
    location = re.search(r"^StateSaveLocation\s*=\s*(\S+)", config, re.MULTILINE)
    assert location, config
    return (Path(location.group(1)) / "job_state").stat().st_mtime


def kill_slurmctld(head: str) -> None:
    """A head's slurmctld dies (SIGKILL), as in a crash of its host: the other head's takes control once it has
    not answered for SlurmctldTimeout. :func:`slurmctld_back` starts it again."""
    pid = slurmctld_pid(head)
    assert pid is not None, f"no slurmctld listens on {head}"
    os.kill(pid, signal.SIGKILL)


def slurmctld_back(head: str) -> None:
    """Start a head's slurmctld again (if it is not running) and wait until both controllers answer: the
    primary, started again, takes control back from the backup."""
    subprocess.run(["bash", str(REPO / "testbed" / "controller.sh"), "start", head], check=True)
    wait_for(f"slurmctld on {head} back, both controllers answering",
             lambda: controllers() == {"primary": "UP", "backup": "UP"}, timeout=120, interval=2)


def why_as_agent(job: str, db: Path) -> str:
    """`dlsub why JOB` over a test agent's own database: readable by the service account only."""
    result = subprocess.run(["runuser", "-u", AGENT_USER, "--", "dlsub", "why", job, "--db", str(db)],
                            capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise AssertionError(f"dlsub why failed: {result.stdout}\n{result.stderr}")
    return result.stdout


def sinfo_gpus() -> dict[str, int]:
    """GPUs per partition as sinfo counts them (one line per node and partition)."""
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %P %G"], capture_output=True, text=True, check=True).stdout
    gpus: dict[str, int] = {}
    for line in out.splitlines():
        _node, partition, gres = line.split()
        found = re.search(r"gpu(?::[^:,(]+)?:(\d+)", gres)
        gpus[partition.rstrip("*")] = gpus.get(partition.rstrip("*"), 0) + (int(found.group(1)) if found else 0)
    return gpus


#: An agent pair's one database (issue 53): a folder on the machine's disk, which both login hosts see as they
#: would a shared filesystem.
PAIR_DIR = Path("/var/lib/dlsub-pair")
PAIR_DB = PAIR_DIR / "agent.db"
#: Where testbed/agent.sh keeps login2's agent's pid (its /run/dlsub, as the machine sees it) and log.
LOGIN2_PIDFILE = HOSTS_DIR / "login2" / "run-dlsub" / "agent.pid"
LOGIN2_LOG = Path("/var/log/dlsub/agent-login2.log")


def pair_lease(db: Path = PAIR_DB) -> dict[str, Any] | None:
    """An agent pair's lease as its database holds it (holder host, token, expiry); None while unreadable."""
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            row = conn.execute("select host, token, expires from lease where id = 1").fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    return {"host": row[0], "token": row[1], "expires": row[2]} if row else None


@contextmanager
def agent_pair(lease_s: float = 15) -> Iterator[None]:
    """login1's service agent stopped; a pair started on a fresh PAIR_DB under ``[failover]``: login2's agent
    first (it takes the lease), then login1's. Afterwards both stopped, login2's link up and its agent running
    (SIGCONT) whatever was done to them, the policy restored and login1's service agent started again."""
    original = POLICY_FILE.read_text()
    assert "[failover]" not in original, f"{POLICY_FILE} already has a [failover] table: is another run using it?"
    agent_service("stop")
    subprocess.run(["install", "-d", "-m", "700", "-o", AGENT_USER, "-g", AGENT_USER, str(PAIR_DIR)], check=True)
    for suffix in ("", "-journal", "-wal", "-shm"):
        Path(f"{PAIR_DB}{suffix}").unlink(missing_ok=True)
    LOGIN2_LOG.unlink(missing_ok=True)
    POLICY_FILE.write_text(f"{original}\n[failover]\nshared_state = true\nlease_s = {lease_s:g}\n")
    try:
        agent_service("start", "login2", PAIR_DB)
        wait_for("login2's agent to take the lease", lambda: (pair_lease() or {}).get("host") == "login2",
                 timeout=30)
        agent_service("start", "login1", PAIR_DB)
        yield
    finally:
        set_link("login2", up=True)
        if LOGIN2_PIDFILE.exists():
            try:
                thaw(int(LOGIN2_PIDFILE.read_text()))
            except ValueError:
                pass
        agent_service("stop", "login2")
        agent_service("stop", "login1")
        POLICY_FILE.write_text(original)
        agent_service("start")


def holds_a_record_lock(pid: int) -> bool:
    """Whether ``pid`` holds a POSIX record lock (/proc/locks): SQLite's, inside a transaction."""
    return any(fields[1] == "POSIX" and fields[4] == str(pid)
               for fields in (line.split() for line in Path("/proc/locks").read_text().splitlines())
               if len(fields) > 4)


def freeze_outside_a_transaction(pid: int) -> None:
    """SIGSTOP ``pid`` between two of its transactions on the database. A frozen process keeps the locks it holds,
    and on this machine's filesystem nothing breaks them (a host lost for good would lose them with its NFS
    lease): frozen inside a transaction, it would stall the other agent as no lost host does."""
    for _ in range(100):
        os.kill(pid, signal.SIGSTOP)
        if not holds_a_record_lock(pid):
            return
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.05)
    raise AssertionError(f"the agent (pid {pid}) held a lock on its database at each of 100 tries")


def lose_login2() -> int:
    """login2 lost: its agent frozen where it is (a process that will wake believing it still acts), its link
    cut. Returns the frozen agent's pid, for :func:`login2_back`."""
    pid = int(LOGIN2_PIDFILE.read_text())
    freeze_outside_a_transaction(pid)
    set_link("login2", up=False)
    return pid


def thaw(pid: int) -> None:
    """SIGCONT a frozen agent and the ``runuser`` that started it: runuser stops itself when its child stops (as su
    does, for a shell's job control) and resumes only on a SIGCONT of its own; left stopped, it never reaps the
    agent once it ends (a stopped runuser and a zombie were left after each pair test)."""
    try:
        parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        parent = 0
    for target in (pid, parent):
        try:
            if target > 1 and (target == pid or Path(f"/proc/{target}/comm").read_text().strip() == "runuser"):
                os.kill(target, signal.SIGCONT)
        except OSError:  # gone already (ProcessLookupError among them)
            pass


def login2_back(pid: int) -> None:
    """login2's link up and its agent (``pid``, frozen by :func:`lose_login2`) woken, if it still lives."""
    set_link("login2", up=True)
    thaw(pid)
