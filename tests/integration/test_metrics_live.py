"""Integration (live Slurm testbed, the agent service with the testbed's policy, `[metrics] port = 9464`):
the agent's /metrics on 127.0.0.1 parses with prometheus-client's parser, its tick counter moves as the
agent ticks, and the GPUs it reports per partition are the ones sinfo counts."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from livebed import sinfo_gpus, wait_for

URL = "http://127.0.0.1:9464/metrics"


pytestmark = pytest.mark.usefixtures("service_agent_for_module")


def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = urllib.request.urlopen(URL, timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_parse_and_move_when_the_agent_ticks() -> None:
    first = wait_for("the agent's metrics endpoint", lambda: _try_scrape(), timeout=30)
    ticks = first.get(("dlsub_agent_ticks_total", ()), 0.0)
    later = wait_for("another tick", lambda: (s := scrape()).get(("dlsub_agent_ticks_total", ()), 0) > ticks and s,
                     timeout=30, interval=1)
    # The two move together (a scrape may fall between them).
    assert later[("dlsub_agent_tick_duration_seconds_count", ())] >= later[("dlsub_agent_ticks_total", ())] - 1
    names = {name for name, _ in later}
    for name in ("dlsub_agent_errors_total", "dlsub_agent_last_tick_timestamp_seconds", "dlsub_partition_gpus"):
        assert name in names, name
    for partition, gpus in sinfo_gpus().items():
        idle = later.get(("dlsub_partition_gpus", (("partition", partition), ("state", "idle"))), 0)
        busy = later.get(("dlsub_partition_gpus", (("partition", partition), ("state", "busy"))), 0)
        assert idle + busy <= gpus and (gpus == 0 or idle + busy > 0), partition
    assert not any(k == "user" for _, labels in later for k, _ in labels), "no user label in the testbed's policy"


def _try_scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
    try:
        return scrape()
    except OSError:
        return None
