"""Unit (real torch c10d rendezvous over a TCPStore on loopback, two handlers in one process as two nodes; no
Slurm, no containers): dlsub.checkpointing.group_membership, what a group does when a node stops answering.

torch drops a node by the wall clock of its last heartbeat, so the two tests that need it wait seconds for it
(wall_clock: make test runs them at normal priority, where a heartbeat thread is not starved)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

torch_distributed = pytest.importorskip("torch.distributed")

from torch.distributed import TCPStore  # noqa: E402
from torch.distributed.elastic.rendezvous import RendezvousParameters  # noqa: E402
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend  # noqa: E402
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler  # noqa: E402

from dlsub.checkpointing import group_membership  # noqa: E402


def _handler(store: TCPStore, run_id: str, max_attempts: int) -> Any:
    params = RendezvousParameters(backend="c10d", endpoint="127.0.0.1", run_id=run_id, min_nodes=2, max_nodes=2,
                                  join_timeout="20", last_call_timeout="1", keep_alive_interval="1",
                                  keep_alive_max_attempt=str(max_attempts))
    return create_handler(store, C10dRendezvousBackend(store, run_id), params)


def _formed(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
            max_attempts: int) -> Iterator[tuple[Any, Any]]:
    """Two nodes of one group, formed in one round (min 2 nodes), with the membership watch installed. Each has
    a store client of its own, as each node's torchrun has (one client's blocking get would hold up the
    other's calls); the rendezvous's store is the training's too (torch's store sharing off: no second
    server for rank 0). A node is dropped once its last heartbeat is 1 s x ``max_attempts`` old."""
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    assert group_membership.install()
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    run_id = f"membership-{request.node.name}"
    first, second = (_handler(TCPStore("127.0.0.1", server.port, is_master=False), run_id, max_attempts)
                     for _ in range(2))
    joined = threading.Thread(target=second.next_rendezvous)
    joined.start()
    first.next_rendezvous()
    joined.join(timeout=30)
    assert not joined.is_alive()
    yield first, second
    for handler in (first, second):
        handler._stop_heartbeats()


@pytest.fixture
def two_nodes(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Any]]:
    """Two nodes whose silence counts after 3 s (torchrun's default: 15 s)."""
    yield from _formed(request, monkeypatch, max_attempts=3)


@pytest.fixture
def two_patient_nodes(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Any]]:
    """Two nodes whose silence counts only after 30 s: a node that answers is never dropped for a heartbeat
    that a loaded machine wrote late (torch writes one only once the last is a period old: up to two periods
    apart, which a 3 s expiry barely covers when the unit tests share the CPU with the live ones)."""
    yield from _formed(request, monkeypatch, max_attempts=30)


def _after(seconds: float) -> None:
    time.sleep(seconds)  # torch drops a node by the wall clock of its last heartbeat: nothing else to wait on


SILENCE_S = 4.5  # more than keep_alive_interval x keep_alive_max_attempt (3 s), and a heartbeat's write


@pytest.mark.wall_clock
def test_a_member_that_stops_answering_restarts_the_group_and_finds_itself_dropped(
        two_nodes: tuple[Any, Any]) -> None:
    first, second = two_nodes
    # A node writes its heartbeat once the last is keep_alive_interval old, on a timer of that period: a
    # heartbeat may be two periods old, which is why torch's expiry is three (by default 3 x 5 s). Both answer:
    # nothing changes.
    _after(SILENCE_S)
    assert first.num_nodes_waiting() == 0 and second.num_nodes_waiting() == 0, "both answer: nothing changes"
    second._stop_heartbeats()  # cut off: no heartbeat reaches the store
    _after(SILENCE_S)
    assert first.num_nodes_waiting() == 1, "the node left restarts its group, as for a node waiting to join"
    assert first._dlsub_silent_peer, "and that restart stops its processes with a short grace"
    with pytest.raises(group_membership.LeftTheGroup, match="dropped from its group's rendezvous"):
        second.num_nodes_waiting()  # its link back: it ends instead of joining again
    assert second.shutdown() is True
    state = first._state_holder.state
    assert not state.closed, "the dropped node leaves the rendezvous open for the others"
    assert first._this_node in state.participants and second._this_node not in state.participants


@pytest.mark.wall_clock
def test_a_node_dropped_while_its_processes_failed_does_not_join_the_next_round(two_nodes: tuple[Any, Any]) -> None:
    """Its processes fail when its link returns (their peers are gone) and torchrun restarts them: the next
    rendezvous it asks for ends it instead."""
    first, second = two_nodes
    second._stop_heartbeats()
    _after(SILENCE_S)
    first.num_nodes_waiting()  # the others' sync drops it
    with pytest.raises(group_membership.LeftTheGroup):
        second.next_rendezvous()


def test_install_changes_torch_once() -> None:
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    assert group_membership.install()
    installed = dr.DynamicRendezvousHandler.num_nodes_waiting
    assert installed.__name__ == "_num_nodes_waiting"
    assert group_membership.install() and dr.DynamicRendezvousHandler.num_nodes_waiting is installed, "not twice"


@pytest.mark.parametrize(("args", "across"), [
    (["--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1", "s.py"], True),
    (["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1", "s.py"], True),
    (["--standalone", "--nnodes", "1", "s.py"], False),
    (["--nnodes", "1:2", "--rdzv-backend", "static", "s.py"], False),
])
def test_only_a_group_that_may_span_nodes_through_c10d_gets_the_watch(args: list[str], across: bool) -> None:
    from dlsub.checkpointing.torchrun_main import _across_nodes, _torchrun_options

    options = _torchrun_options(args)
    assert options is not None and _across_nodes(options) is across


def test_the_restart_for_a_silent_member_stops_the_processes_with_a_short_grace_and_only_that_one() -> None:
    """Unit (torch's LocalElasticAgent method on a bare instance; its _shutdown recorded, no processes)."""
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    assert group_membership.install()
    agent = object.__new__(LocalElasticAgent)
    calls: list[dict[str, object]] = []
    agent._shutdown = lambda **kwargs: calls.append(kwargs)  # type: ignore[method-assign]
    handler = SimpleNamespace(_dlsub_silent_peer=True)
    group = SimpleNamespace(spec=SimpleNamespace(rdzv_handler=handler))
    LocalElasticAgent._stop_workers(agent, group)  # type: ignore[arg-type]
    assert calls == [{"timeout": group_membership.SILENT_PEER_STOP_S}] and not handler._dlsub_silent_peer
    LocalElasticAgent._stop_workers(agent, group)  # type: ignore[arg-type]
    assert calls[1] == {}, "any other stop is torchrun's own (its 30 s grace)"


def _agent_at_exit_barrier(handler: Any, timeout_s: float) -> Any:
    """torch's LocalElasticAgent, bare, as its run leaves it when its processes succeeded: the round's store and
    group (two nodes), no processes."""
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    agent = object.__new__(LocalElasticAgent)
    agent._store = handler._get_store()  # the round's store, as torch's agent has it from its rendezvous
    agent._worker_group = SimpleNamespace(spec=SimpleNamespace(rdzv_handler=handler), group_world_size=2,
                                          state="SUCCEEDED")
    agent._exit_barrier_timeout = timeout_s
    agent._in_exit_barrier = False
    return agent


def _exit_barrier_s(agent: Any) -> float:
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    start = time.monotonic()
    LocalElasticAgent._exit_barrier(agent)
    assert not agent._in_exit_barrier
    return time.monotonic() - start


@pytest.mark.wall_clock
def test_the_exit_barrier_ends_when_both_nodes_reach_it(two_patient_nodes: tuple[Any, Any]) -> None:
    first, second = two_patient_nodes
    waited: list[float] = []
    other = threading.Thread(target=lambda: waited.append(_exit_barrier_s(_agent_at_exit_barrier(second, 60))))
    other.start()
    assert _exit_barrier_s(_agent_at_exit_barrier(first, 60)) < 10
    other.join(timeout=10)
    assert waited and waited[0] < 10


@pytest.mark.wall_clock
def test_the_exit_barrier_does_not_wait_for_a_node_that_stopped_answering(two_nodes: tuple[Any, Any]) -> None:
    """The node whose worker job ended while the group re-formed to finish never reaches the barrier: the node
    that finished waits until the rendezvous drops it (3 s here, 15 s under torchrun's defaults), not 60 s."""
    first, second = two_nodes
    second._stop_heartbeats()
    waited = _exit_barrier_s(_agent_at_exit_barrier(first, 60))
    assert waited < SILENCE_S + 3 * group_membership.EXIT_BARRIER_LOOK_S, waited


@pytest.mark.wall_clock
def test_the_exit_barrier_does_not_wait_for_a_node_that_left_the_round_for_the_next(
        two_patient_nodes: tuple[Any, Any]) -> None:
    """The race a live elastic test met: the other node's processes failed as the group finished, so its torchrun
    left the round to form the next one (it waits to join, answering still); it will never reach this round's
    barrier, and the node that finished ends it at its first look, not after torch's 300 s."""
    first, second = two_patient_nodes
    def rejoin() -> None:
        with contextlib.suppress(Exception):  # it waits in the wait list until its join timeout, then gives up
            second.next_rendezvous()

    rejoining = threading.Thread(target=rejoin, daemon=True)
    rejoining.start()
    wait_until = time.monotonic() + 10
    while second._this_node in first._state_holder.state.participants and time.monotonic() < wait_until:
        time.sleep(0.1)
        group_membership._synced(first)
    waited = _exit_barrier_s(_agent_at_exit_barrier(first, 60))
    assert waited < 2 * group_membership.EXIT_BARRIER_LOOK_S + 1, waited


@pytest.mark.wall_clock
def test_the_exit_barrier_waits_for_a_node_that_still_answers(two_patient_nodes: tuple[Any, Any]) -> None:
    """A node still finishing (its heartbeats go on) is waited for, to torch's timeout, as torch's barrier does."""
    first, _second = two_patient_nodes
    waited = _exit_barrier_s(_agent_at_exit_barrier(first, 3))
    assert waited >= 3, waited
