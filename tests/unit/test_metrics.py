"""Unit, against the stateful fake Slurm: the agent's Prometheus metrics parse with prometheus-client's
own parser and move when the agent ticks (ticks, decisions and moves by kind, jobs by state, GPUs per
partition, moves in flight, errors); the HTTP endpoint serves them on 127.0.0.1; no user label unless
the policy allows it."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
from agent_world import NOW, World, policy
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dlsub.agent.metrics import AgentMetrics, RecordingSlurmClient
from dlsub.site_config.policy_file import PolicyFileError, parse_policy
from dlsub.slurm_plugins.client import SlurmError


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the exposition, parsed by prometheus-client's parser."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


def world(tmp_path: Path, **policy_overrides: object) -> World:
    w = World(tmp_path, policy(**policy_overrides))
    w.client = RecordingSlurmClient(runner=w.fake)
    return w


def test_counters_move_when_the_agent_ticks(tmp_path: Path) -> None:
    w = world(tmp_path)
    job_id, job_dir = w.submit("0123abcd")
    w.progress(job_dir, job_id)
    clock = [NOW]
    agent = w.agent(clock=lambda: clock[0])
    metrics = AgentMetrics()
    tick = metrics.instrumented(agent)
    before = samples(generate_latest(metrics.registry).decode())
    assert value(before, "dlsub_agent_ticks_total") == 0

    tick()  # the job on the cpu partition is signalled to move onto the idle GPUs
    first = samples(generate_latest(metrics.registry).decode())
    assert value(first, "dlsub_agent_ticks_total") == 1
    assert value(first, "dlsub_agent_tick_duration_seconds_count") == 1
    assert value(first, "dlsub_agent_decisions_total", kind="move") == 1
    assert value(first, "dlsub_agent_moves_total", kind="move") == 1
    assert value(first, "dlsub_moves_in_flight", kind="move") == 1
    assert value(first, "dlsub_jobs", state="RUNNING") == 1
    # The testbed cluster: gpu1 and gpu2 with 4 GPUs each, all idle.
    assert value(first, "dlsub_partition_gpus", partition="gpu", state="idle") == 8
    assert value(first, "dlsub_partition_gpus", partition="gpu", state="busy") == 0
    assert value(first, "dlsub_partition_gpus", partition="cpu", state="idle") == 0

    w.batch_script_moves(job_dir, job_id)
    clock[0] = NOW + 5
    tick()  # retarget and release
    w.fake.start(job_id, "gpu1", int(NOW + 6))
    w.fake.nodes["gpu1"].gpus_used = 1
    clock[0] = NOW + 10
    tick()  # the move is done
    last = samples(generate_latest(metrics.registry).decode())
    assert value(last, "dlsub_agent_ticks_total") == 3
    assert value(last, "dlsub_agent_decisions_total", kind="move-done") == 1
    assert value(last, "dlsub_agent_moves_total", kind="move") == 1, "one move, counted once"
    assert value(last, "dlsub_moves_in_flight", kind="move") == 0
    assert value(last, "dlsub_partition_gpus", partition="gpu", state="busy") == 1
    assert value(last, "dlsub_partition_gpus", partition="gpu", state="idle") == 7
    assert not any(("user", "alice") in labels for _, labels in last), "no user label by default"


def test_a_tick_that_cannot_reach_slurm_counts_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = world(tmp_path)
    agent = w.agent(clock=lambda: NOW)
    metrics = AgentMetrics()
    tick = metrics.instrumented(agent)

    def down(*args: object, **kwargs: object) -> list[object]:
        raise SlurmError(["squeue"], 1, "", "slurm_load_jobs error: Unable to contact slurm controller")

    monkeypatch.setattr(w.client, "queue", down)  # the tick's first read of Slurm
    tick()
    found = samples(generate_latest(metrics.registry).decode())
    assert value(found, "dlsub_agent_errors_total", where="slurm") == 1
    assert value(found, "dlsub_agent_ticks_total") == 1


def test_per_user_labels_only_when_the_policy_allows(tmp_path: Path) -> None:
    w = world(tmp_path, metrics={"per_user_labels": True})
    w.submit("0123abcd", user="alice")
    agent = w.agent(clock=lambda: NOW)
    metrics = AgentMetrics(per_user_labels=w.policy.metrics.per_user_labels)
    metrics.instrumented(agent)()
    found = samples(generate_latest(metrics.registry).decode())
    assert value(found, "dlsub_user_jobs", user="alice", state="RUNNING") == 1


def test_the_endpoint_serves_on_loopback(tmp_path: Path) -> None:
    w = world(tmp_path)
    agent = w.agent(clock=lambda: NOW)
    metrics = AgentMetrics()
    tick = metrics.instrumented(agent)
    server = metrics.serve(0)
    try:
        host, port = server.server_address[:2]
        assert host == "127.0.0.1"
        url = f"http://127.0.0.1:{port}/metrics"
        before = value(samples(urllib.request.urlopen(url, timeout=5).read().decode()), "dlsub_agent_ticks_total")
        tick()
        after = value(samples(urllib.request.urlopen(url, timeout=5).read().decode()), "dlsub_agent_ticks_total")
        assert (before, after) == (0, 1)
    finally:
        server.shutdown()
        server.server_close()


def test_the_metrics_table_is_checked() -> None:
    assert parse_policy({"metrics": {"port": 9464}}).metrics.port == 9464
    assert parse_policy({}).metrics.port == 0
    with pytest.raises(PolicyFileError, match="port"):
        parse_policy({"metrics": {"port": 70000}})
    with pytest.raises(PolicyFileError, match="adress"):
        parse_policy({"metrics": {"adress": "0.0.0.0"}})


def test_the_metrics_listen_on_the_address_the_policy_names(tmp_path: Path) -> None:
    """What the agent service runs (daemon_commands._with_metrics): the metrics on [metrics] address, here
    127.0.0.2 (loopback, as every 127/8 address is on Linux), so that a central Prometheus can be given the
    agent host's own address; 127.0.0.1, the default, gets nothing then."""
    import socket
    import urllib.error

    from dlsub.cli.daemon_commands import _with_metrics

    assert parse_policy({}).metrics.address == "127.0.0.1"
    with pytest.raises(PolicyFileError, match="'login1' is not an IP address"):
        parse_policy({"metrics": {"port": 9464, "address": "login1"}})
    with socket.socket() as probe:
        probe.bind(("127.0.0.2", 0))
        port = probe.getsockname()[1]
    w = world(tmp_path, metrics={"port": port, "address": "127.0.0.2"})
    tick = _with_metrics(w.agent(clock=lambda: NOW), w.policy)
    tick()
    served = samples(urllib.request.urlopen(f"http://127.0.0.2:{port}/metrics", timeout=5).read().decode())
    assert value(served, "dlsub_agent_ticks_total") == 1
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
