"""Unit: two agents, one on each login host, on one shared state database (issue 53, item 3).

Each test's agents share the stateful fake Slurm behind their own client's ``_run`` seam (one cluster; each
host's calls recorded apart, and its link to slurmctld cut at will) and one SQLite file in tmp_path, opened
by each with the lease terms of a pair; fake clocks, one per host. Only one acts; the holder killed or cut
off loses the lease and the other takes over and finishes the half-done move or resize from the records; a
deposed agent's late write (the tick's writes, a write-ahead record) is refused and it asks Slurm nothing
more; status and metrics say which is active.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from agent_world import ME, NOW, World, policy
from click.testing import CliRunner
from prometheus_client import generate_latest
from test_agent_resize import elastic
from test_metrics import samples, value

from dlsub.agent import failpoints
from dlsub.agent.agent_store import AgentStore
from dlsub.agent.leadership import Leadership, Role
from dlsub.agent.lease import Deposed, Holder, LeaseTerms
from dlsub.agent.metrics import AgentMetrics
from dlsub.agent.query import Caller, answer
from dlsub.agent.reconcile import Agent
from dlsub.agent.records import ResizePhase
from dlsub.agent.store_rows import Writes
from dlsub.cli import daemon_commands
from dlsub.cli.query_commands import status
from dlsub.site_config.policy_file import PolicyFileError, parse_policy
from dlsub.slurm_plugins.client import SlurmClient

TERMS = LeaseTerms(lease_s=15.0)  # margin 5 s
ID = "0123abcd"


class LoginHost:
    """One login host and its agent of the pair: its own clock, Slurm client (on the shared fake cluster) and
    connection to the shared database."""

    def __init__(self, world: World, name: str, now: float = NOW) -> None:
        self.world, self.name, self.now = world, name, now
        self.calls: list[list[str]] = []
        self.cut = False  # its link to slurmctld
        self.client = SlurmClient(runner=self._run)
        self.store = AgentStore(world.db, terms=TERMS)
        self.me = Holder(name, 4000 + len(name), f"{name}-instance")
        self.pair = Leadership(self.store, self.client, self._agent, self.me, clock=lambda: self.now)

    def _agent(self) -> Agent:
        return Agent(self.client, self.store, self.world.policy, clock=lambda: self.now)

    def _run(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(argv))
        if self.cut:
            return subprocess.CompletedProcess(list(argv), 1, "", "Unable to contact slurm controller")
        return self.world.fake(argv)

    def tick(self, at: float) -> list[str]:
        self.now = at
        return [a.kind for a in self.pair.tick()]

    def changes(self) -> list[list[str]]:
        """The Slurm commands this host ran that change something (a standby's ping and reads are not)."""
        reads = ("show", "ping", "--version")
        return [c for c in self.calls if c[0] == "scancel" or (c[0] == "scontrol" and c[1] not in reads)]


def pair(tmp_path: Path) -> tuple[World, LoginHost, LoginHost]:
    world = World(tmp_path)
    return world, LoginHost(world, "login1"), LoginHost(world, "login2")


def moving_job(world: World) -> tuple[int, Path]:
    """A job on the cpu partition that the agent moves onto the idle GPUs at its first tick."""
    job_id, job_dir = world.submit(ID)
    world.progress(job_dir, job_id)
    return job_id, job_dir


def kinds(store: AgentStore) -> list[str]:
    return [d.kind for d in store.decisions(ID)]


def test_two_agents_on_one_shared_database_only_one_acts(tmp_path: Path) -> None:
    """Unit (fake Slurm behind each client's _run seam): the first to ask holds the lease and moves the job; the
    other stands by, runs no command that changes anything, and answers nothing of the policy."""
    world, login1, login2 = pair(tmp_path)
    job_id, _ = moving_job(world)
    assert login1.tick(NOW) == ["signal-move"]
    assert login2.tick(NOW + 1) == [] and login2.tick(NOW + 4) == []
    assert (login1.pair.role, login2.pair.role) == (Role.ACTIVE, Role.STANDBY)
    assert login2.changes() == [] and {c[1] for c in login2.calls} == {"ping"}, "a standby only asks if Slurm is up"
    assert world.fake.jobs[job_id].signals == ["USR2"]
    assert login1.tick(NOW + 3) == [], "the holder goes on (renewing its lease)"
    lease = login1.store.lease()
    assert lease is not None and (lease.host, lease.token, lease.expires) == ("login1", 1, NOW + 3 + 15)


def test_the_holder_killed_mid_move_the_standby_takes_over_after_the_lease_and_finishes_it_once(
        tmp_path: Path) -> None:
    """Unit (fake Slurm behind each client's _run seam): login1 signals the move and dies (never ticks again);
    login2 waits out the lease (15 s after login1's last renewal), takes it with the next token and finishes
    the move from the record: retarget, release, done; one signal, one requeue, one move decision."""
    world, login1, login2 = pair(tmp_path)
    job_id, job_dir = moving_job(world)
    assert login1.tick(NOW) == ["signal-move"]
    world.batch_script_moves(job_dir, job_id)  # the job checkpoints and requeues itself held
    assert login2.tick(NOW + 14) == [], "the lease still runs"
    assert login2.tick(NOW + 16) == ["retarget", "release"], "taken over within lease_s + one tick"
    lease = login2.store.lease()
    assert lease is not None and (lease.host, lease.token) == ("login2", 2)
    job = world.fake.jobs[job_id]
    world.fake.start(job_id, "gpu1", int(NOW + 17))
    assert login2.tick(NOW + 19) == ["finish-move"]
    assert job.signals == ["USR2"] and job.restart_cnt == 1 and len(world.fake.jobs) == 1
    assert job.options["partition"] == "gpu" and login2.store.moves() == []
    assert kinds(login2.store) == ["move", "move-done"]
    assert sum(1 for c in login1.changes() if c[0] == "scancel") == 1, "login1's signal, before it died"


class Crash(BaseException):
    """kill -9 of login1's agent at a failpoint."""


def test_the_holder_killed_in_a_grow_the_standby_takes_over_and_releases_the_worker_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unit (fake Slurm behind each client's _run seam): login1 dies with a grow written ahead and not yet sent
    (failpoint grow-planned); login2 takes over after the lease and releases the worker on the node planned,
    once."""
    world, login1, login2 = pair(tmp_path)
    _, array, _ = elastic(world)
    handle = f"{array}_0"

    def die(point: str) -> None:
        if point == "grow-planned":
            raise Crash(point)

    monkeypatch.setattr(failpoints, "reach", die)
    with pytest.raises(Crash):
        login1.tick(NOW)
    monkeypatch.undo()
    planned = login2.store.resizes()[handle]
    assert planned.phase == ResizePhase.PLANNED and world.fake.task(handle).reason == "JobHeldUser"
    assert login2.tick(NOW + 10) == []
    login2.tick(NOW + 16)
    login2.tick(NOW + 19)
    worker = world.fake.task(handle)
    assert worker.reason == "None" and worker.options.get("nodelist") == planned.node
    releases = [c for c in world.fake.calls if c[:2] == ["scontrol", "release"] and c[-1] == handle]
    assert len(releases) == 1 and login2.store.resizes() == {}
    assert len([d for d in login2.store.decisions() if d.kind == "grow"]) == 1
    assert login1.changes() == []


def test_a_deposed_agents_late_tick_writes_are_refused_and_it_asks_slurm_nothing(tmp_path: Path) -> None:
    """Unit (fake Slurm behind each client's _run seam): login1 stalls inside a tick (its clock stops, as a
    paused process's does) just after renewing, long enough for login2 to take the lease. Its write-ahead of
    the move is refused (nothing of it in the store), it sends no signal and stands by; login2 moves the job,
    once."""
    world, login1, login2 = pair(tmp_path)
    job_id, job_dir = world.submit(ID)
    assert "signal-move" not in login1.tick(NOW), "no progress yet: nothing to move"
    store = login1.store
    renew = store.renew_lease

    def renew_then_stall(now: float) -> None:
        renew(now)
        assert login2.store.take_lease(login2.me, now + 60) is not None  # login2's clock: a minute later

    store.renew_lease = renew_then_stall  # type: ignore[method-assign]
    login1.now = NOW + 3
    world.progress(job_dir, job_id)
    assert login1.pair.tick() == []
    assert login1.pair.role == Role.STANDBY and store.token is None
    assert store.moves() == [] and "move" not in kinds(store), "the write-ahead was refused whole"
    assert login1.changes() == [] and world.fake.jobs[job_id].signals == []
    with pytest.raises(Deposed, match="does not hold"):
        store.write(Writes(meta={"doing": "late"}))
    store.token = 1  # a process that has not noticed yet, writing with its old token
    with pytest.raises(Deposed, match="held by login2"):
        store.write(Writes(meta={"doing": "late"}))
    assert store.meta().get("doing") != "late"
    login2.tick(NOW + 64)
    assert world.fake.jobs[job_id].signals == ["USR2"] and kinds(login2.store).count("move") == 1


def test_a_deposed_agent_between_its_write_ahead_and_the_signal_sends_nothing(tmp_path: Path) -> None:
    """Unit (fake Slurm behind each client's _run seam): login1's write-ahead of the move is committed, then it
    stalls and login2 takes the lease before the signal: the fence before the Slurm call stops login1 (no
    USR2 from it) and login2 finishes the move from login1's record, signalling it once."""
    world, login1, login2 = pair(tmp_path)
    job_id, job_dir = moving_job(world)
    store = login1.store
    write = store.write

    def write_then_stall(writes: Writes) -> None:
        write(writes)
        if writes.moves:
            assert login2.store.take_lease(login2.me, NOW + 60) is not None

    store.write = write_then_stall  # type: ignore[method-assign]
    assert login1.tick(NOW) == []
    assert login1.pair.role == Role.STANDBY and login1.changes() == []
    assert [m["phase"] for m in login2.store.moves()] == ["planned"], "the record login2 finishes from"
    assert world.fake.jobs[job_id].signals == []
    assert login2.tick(NOW + 61) == ["signal-move"]
    world.batch_script_moves(job_dir, job_id)
    assert login2.tick(NOW + 64) == ["retarget", "release"]
    assert world.fake.jobs[job_id].signals == ["USR2"] and kinds(login2.store).count("move") == 1


def test_a_leader_cut_off_from_slurm_stops_renewing_and_loses_the_lease(tmp_path: Path) -> None:
    """Unit (fake Slurm behind each client's _run seam): login1's link to slurmctld is cut while the shared
    database still answers. Its ticks read nothing and renew nothing; login2 takes over once the lease (from
    login1's last good tick) runs out; login1's next tick finds itself deposed, and while cut off it never
    takes the lease back, though it runs out again."""
    world, login1, login2 = pair(tmp_path)
    moving_job(world)
    login1.tick(NOW)
    login1.cut = True
    for t in (NOW + 3, NOW + 6, NOW + 9, NOW + 12):
        assert login1.tick(t) == []
        assert login2.tick(t + 1) == []
    lease = login1.store.lease()
    assert lease is not None and lease.renewed == NOW, "no renewal without Slurm"
    login2.tick(NOW + 16)
    assert login2.pair.role == Role.ACTIVE and login2.store.token == 2
    assert login1.tick(NOW + 17) == [] and login1.pair.role == Role.STANDBY
    login2.cut = True  # now both are cut off: the lease runs out and nobody takes it
    login2.tick(NOW + 20)
    assert login1.tick(NOW + 60) == [] and login1.pair.role == Role.STANDBY, "cut off: never takes the lease"
    assert [c[1] for c in login1.calls[-1:]] == ["ping"]


def test_a_leader_whose_renewals_failed_stops_acting_before_its_lease_runs_out(tmp_path: Path) -> None:
    """Unit (no Slurm): the margin. A lease renewed at NOW lasts to NOW + 15; before each Slurm call the holder
    checks it has more than 5 s left by its own clock, so it stops at NOW + 10, before a standby whose clock
    runs a few seconds ahead could take over."""
    world, login1, _ = pair(tmp_path)
    assert login1.store.take_lease(login1.me, NOW) is not None
    login1.store.check_lease(NOW + 9.9)
    with pytest.raises(Deposed, match="runs out"):
        login1.store.check_lease(NOW + 10.1)
    with pytest.raises(Deposed, match="does not hold"):
        login1.store.write(Writes(meta={"doing": "x"}))
    assert TERMS.takeover_within_s(3.0) == 18.0 and TERMS.margin_s == 5.0


def test_a_clean_stop_hands_the_lease_over_at_the_standbys_next_turn(tmp_path: Path) -> None:
    """Unit (fake Slurm behind each client's _run seam): login1 stopped with SIGTERM gives the lease up; login2
    takes it at its next turn, not 15 s later."""
    world, login1, login2 = pair(tmp_path)
    login1.tick(NOW)
    login1.pair.stop()
    assert login1.pair.role == Role.STANDBY
    login2.tick(NOW + 1)
    assert login2.pair.role == Role.ACTIVE and login2.store.token == 2


def test_status_and_metrics_say_which_agent_is_active(tmp_path: Path) -> None:
    """Unit (fake Slurm behind each client's _run seam): each agent's status answer says its role and the
    lease (holder, token, expiry); its metrics say dlsub_agent_active and dlsub_agent_lease_token; status
    read from the database (--db) shows the lease too."""
    world, login1, login2 = pair(tmp_path)
    login1.tick(NOW)
    login2.tick(NOW + 1)
    reader = AgentStore(world.db, readonly=True)
    caller = Caller(ME, "alice", admin=False)
    for host, role in ((login1, "active"), (login2, "standby")):
        reply = answer({"op": "status"}, caller, reader, world.policy, NOW + 2, role=host.pair.role.value)
        got = reply["status"]
        assert got["role"] == role and got["answered_by"]
        assert got["lease"] == {"holder": "login1", "pid": login1.me.pid, "token": 1, "renewed": NOW,
                                "expires": NOW + 15, "expires_in_s": 13.0, "live": True}
    for host, active, token in ((login1, 1, 1), (login2, 0, 0)):
        metrics = AgentMetrics()
        metrics.after_tick(host.pair, 0.1)
        found = samples(generate_latest(metrics.registry).decode())
        assert value(found, "dlsub_agent_active") == active and value(found, "dlsub_agent_lease_token") == token
    lone = AgentMetrics()
    lone.after_tick(World(tmp_path / "lone").agent(), 0.1)
    assert value(samples(generate_latest(lone.registry).decode()), "dlsub_agent_active") == 1, "a lone agent acts"
    printed = CliRunner().invoke(status, ["--db", str(world.db)])
    assert "lease: held by login1" in printed.output and "token 1" in printed.output, printed.output


def test_a_shared_database_uses_a_rollback_journal_and_a_lone_one_wal(tmp_path: Path) -> None:
    """Unit (no Slurm): SQLite's WAL needs one host's shared memory; a pair's database is opened with DELETE."""
    shared = AgentStore(tmp_path / "shared.db", terms=TERMS)
    lone = AgentStore(tmp_path / "lone.db")
    assert shared.conn.execute("pragma journal_mode").fetchone()[0] == "delete"
    assert lone.conn.execute("pragma journal_mode").fetchone()[0] == "wal"
    assert lone.lease() is None and lone.holds_lease(), "one host's agent needs no lease"


def test_the_failover_table_of_the_policy(tmp_path: Path) -> None:
    """Unit (no Slurm): [failover] shared_state and lease_s; a lease of two ticks or less is refused."""
    assert not policy().failover.shared_state
    good = parse_policy({"tick_interval_s": 3, "failover": {"shared_state": True, "lease_s": 15}})
    assert good.failover.shared_state and good.failover.lease_s == 15.0
    with pytest.raises(PolicyFileError, match="more than two ticks"):
        parse_policy({"tick_interval_s": 3, "failover": {"shared_state": True, "lease_s": 6}})
    with pytest.raises(PolicyFileError, match="valid keys|unknown"):
        parse_policy({"failover": {"shared": True}})


def test_a_cron_pass_ticks_on_a_shared_database_only_while_no_agent_holds_the_lease(tmp_path: Path) -> None:
    """Unit (fake Slurm behind the client's _run seam): the per-host lock moves beside the socket; a pass (or
    `dlsub agent tick`) while login1's agent holds the lease does nothing and calls no Slurm command; once the
    lease is free it ticks with a lease of its own and gives it back."""
    world, login1, _ = pair(tmp_path)
    moving_job(world)
    shared = parse_policy({"tick_interval_s": 3, "socket": str(tmp_path / "run" / "agent.sock"),
                           "failover": {"shared_state": True}})
    assert daemon_commands.lock_path(world.db, shared) == tmp_path / "run" / "agent.lock"
    assert daemon_commands.lock_path(world.db, world.policy) == Path(f"{world.db}.lock")
    login1.tick(NOW)
    calls = len(world.fake.calls)
    cron = Agent(SlurmClient(runner=world.fake), AgentStore(world.db, terms=TERMS), world.policy)
    assert daemon_commands._one_tick(cron, NOW + 1) is None and len(world.fake.calls) == calls
    login1.pair.stop()
    assert daemon_commands._one_tick(cron, NOW + 2) is not None
    lease: Any = cron.store.lease()
    assert lease.token == 2 and not lease.live(NOW + 2.5), "taken for the pass, and given back"


def test_the_guide_and_the_unit_state_the_times_the_lease_gives() -> None:
    """Unit (no Slurm): the admin guide's pair section states the takeover bound and the margin that
    LeaseTerms gives its example (lease 15 s, ticks every 3 s), and the agent's unit says how to run the pair."""
    repo = Path(__file__).resolve().parents[2]
    guide = (repo / "docs" / "admin-guide.md").read_text()
    section = guide[guide.index("### Two agents, one on each login host"):guide.index("### The dashboard")]
    assert "lease_s = 15" in section and "tick_interval_s = 3" in section
    assert f"{TERMS.takeover_within_s(3.0):g} s with the values above" in section
    assert f"({TERMS.margin_s:g} s)" in section
    unit = (repo / "etc" / "systemd" / "dlsub-agent.service").read_text()
    for needed in ("shared_state = true", "DLSUB_AGENT_DB=", "RuntimeDirectoryPreserve=yes", "NTP"):
        assert needed in unit, needed
