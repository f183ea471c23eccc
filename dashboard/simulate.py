"""The simulate page's runs: ``dlsub simulate`` on a shipped workload, bounded.

Only the workloads shipped with dlsub and the registered policies can be
named (the form's values are checked against both lists), at most
:data:`MAX_POLICIES` policies a request, each run a child process with a
time limit, one request at a time for the whole dashboard; results are
kept in memory, so asking again costs nothing.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Policies compared in one request at most.
MAX_POLICIES = 4
#: Seconds one `dlsub simulate` may take (the shipped workloads take about a second).
RUN_TIMEOUT_S = 60.0
#: Results kept.
CACHE_SIZE = 32


class SimulateError(ValueError):
    """The request cannot be run; the message says why (shown on the page)."""


class Busy(RuntimeError):
    """Another simulation is running."""


@dataclass
class PolicyRun:
    policy: str
    summary: dict[str, Any]
    jcts: list[float] = field(default_factory=list)
    utilisation: list[tuple[float, float]] = field(default_factory=list)  # (hours, fraction of GPUs busy)
    error: str = ""


def shipped_workloads() -> list[str]:
    """The workloads shipped with dlsub, as `dlsub simulate` names them (pollux/...)."""
    from dlsub.sim.workload import POLLUX_DIR

    found = []
    for folder in ("workloads-0.5", "workloads"):
        found += [f"pollux/{folder}/{p.name}" for p in sorted((POLLUX_DIR / folder).glob("*.csv"))]
    return found


def policy_names() -> list[str]:
    from dlsub.policies.registry import policy_names as names

    return names()


def check(workload: str, policies: list[str]) -> tuple[str, list[str]]:
    if workload not in shipped_workloads():
        raise SimulateError(f"unknown workload {workload!r}; pick one of the shipped workloads")
    chosen = list(dict.fromkeys(policies))
    if not chosen:
        raise SimulateError("pick at least one policy")
    unknown = [p for p in chosen if p not in policy_names()]
    if unknown:
        raise SimulateError(f"unknown policy {unknown[0]!r}; valid policies: {', '.join(policy_names())}")
    if len(chosen) > MAX_POLICIES:
        raise SimulateError(f"compare at most {MAX_POLICIES} policies at a time")
    return workload, chosen


class Simulator:
    def __init__(self, timeout_s: float = RUN_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, str], PolicyRun] = {}

    def run(self, workload: str, policies: list[str]) -> list[PolicyRun]:
        workload, chosen = check(workload, policies)
        todo = [p for p in chosen if (workload, p) not in self._cache]
        if todo:
            if not self._lock.acquire(blocking=False):
                raise Busy("another simulation is running; try again in a minute")
            try:
                for policy in todo:
                    self._cache[(workload, policy)] = self._one(workload, policy)
                    while len(self._cache) > CACHE_SIZE:
                        self._cache.pop(next(iter(self._cache)))
            finally:
                self._lock.release()
        return [self._cache[(workload, p)] for p in chosen]

    def _one(self, workload: str, policy: str) -> PolicyRun:
        with tempfile.TemporaryDirectory(prefix="dlsub-dashboard-sim-") as out:
            argv = [sys.executable, "-m", "dlsub", "simulate", workload, "--policy", policy, "--json", "--out", out]
            try:
                done = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout_s, cwd=out)
            except subprocess.TimeoutExpired:
                return PolicyRun(policy, {}, error=f"took longer than {self.timeout_s:g} s; stopped")
            if done.returncode not in (0, 3):  # 3: stalled, still a result
                return PolicyRun(policy, {}, error=(done.stderr.strip().splitlines() or ["failed"])[-1])
            try:
                summary = json.loads(done.stdout)
            except ValueError:
                return PolicyRun(policy, {}, error="no summary")
            run = PolicyRun(policy, summary)
            with open(Path(out) / "jobs.csv", newline="") as f:
                run.jcts = sorted(float(r["jct_s"]) for r in csv.DictReader(f) if r.get("jct_s"))
            gpus = _cluster_gpus()
            with open(Path(out) / "timeline.csv", newline="") as f:
                run.utilisation = [(float(r["time_s"]) / 3600, float(r["allocated_gpus"]) / gpus)
                                   for r in csv.DictReader(f)]
            return run


def _cluster_gpus() -> int:
    """GPUs of the cluster `dlsub simulate` uses without --cluster."""
    from dlsub.sim.cluster_file import default_cluster

    return max(1, default_cluster().total_gpus)


def cdf(values: list[float]) -> list[tuple[float, float]]:
    """(JCT in hours, fraction of jobs done within it)."""
    n = len(values)
    return [(v / 3600, (i + 1) / n) for i, v in enumerate(sorted(values))]
