"""Unit (torch's own process context, real forked processes; no Slurm, no Podman): torchrun's heap is frozen
before it forks a training process, and the process ends as soon as it has handed torchrun its return value
(dlsub.checkpointing.fork_context). Unpatched, it sleeps until torchrun's monitor has read every value, and one
killed while it sleeps (the memory cgroup's OOM killer, at a job's --mem) leaves the monitor waiting forever: a live
test's job hung ten minutes so."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import NO_HANG_S

from dlsub.checkpointing import fork_context

pytest.importorskip("torch")
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, api, start_processes

#: Long enough for a forked process to end on its own on a loaded machine; an unpatched one never does.
ENDS_ALONE_S = 60.0


def hand_back(value: int) -> int:
    return value * 2


@pytest.fixture
def patched(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(api.MultiprocessContext, "_start", api.MultiprocessContext._start)  # restored after
    assert fork_context.install()
    yield
    gc.unfreeze()  # this test process's heap, frozen by the patched start, back in the collector's reach


def _start(tmp_path: Path, nprocs: int) -> api.PContext:
    ranks = range(nprocs)
    return start_processes("hand_back", hand_back, {r: (r + 20,) for r in ranks}, {r: {} for r in ranks},
                           DefaultLogsSpecs(log_dir=str(tmp_path / "logs")), start_method="fork")


def _all_ended(context: api.PContext, timeout: float) -> bool:
    """Whether every process of ``context`` ended by itself within ``timeout`` (nothing here reads their values)."""
    deadline = time.monotonic() + timeout
    for process in context._pc.processes:  # type: ignore[attr-defined]
        process.join(max(0.0, deadline - time.monotonic()))
    return all(not p.is_alive() for p in context._pc.processes)  # type: ignore[attr-defined]


def test_a_forked_process_ends_once_its_value_is_handed_back_and_torchrun_still_reads_it(
    tmp_path: Path, patched: None
) -> None:
    context = _start(tmp_path, 2)
    try:
        assert _all_ended(context, ENDS_ALONE_S), "each ended by itself, before torchrun read its value"
        assert [p.exitcode for p in context._pc.processes] == [0, 0]  # type: ignore[attr-defined]
        result = context.wait(timeout=NO_HANG_S)
        assert result is not None and not result.is_failed()
        assert result.return_values == {0: 40, 1: 42}, "the values were read from the queue after the processes ended"
    finally:
        context.close()


def test_torchrun_reads_the_values_through_an_event_nobody_sleeps_on(tmp_path: Path, patched: None) -> None:
    """What hung: a process killed after it put its value, while asleep on the event, before torchrun read it;
    torchrun's read then set the event and waited for that process to wake. Patched, the event is one that nobody
    sleeps on and whose set() waits for no one: torchrun reads the value of a process already gone, at once."""
    context = _start(tmp_path, 1)
    try:
        assert _all_ended(context, ENDS_ALONE_S)
        event = context._worker_finished_event  # type: ignore[attr-defined]
        assert isinstance(event, fork_context.ValueHandedBack)
        started = time.monotonic()
        result = context.wait(timeout=NO_HANG_S)
        assert result is not None and result.return_values == {0: 40}
        assert time.monotonic() - started < ENDS_ALONE_S
    finally:
        context.close()


def frozen_objects() -> int:
    return gc.get_freeze_count()


def test_the_heap_is_frozen_before_the_fork_so_the_processes_collector_copies_none_of_it(
    tmp_path: Path, patched: None
) -> None:
    gc.unfreeze()
    context = start_processes("frozen_objects", frozen_objects, {0: ()}, {0: {}},
                              DefaultLogsSpecs(log_dir=str(tmp_path / "logs")), start_method="fork")
    try:
        result = context.wait(timeout=NO_HANG_S)
        assert result is not None and not result.is_failed()
        # Every object this process tracked when it forked (tens of thousands under pytest) is frozen in the child.
        assert result.return_values[0] > 10_000, result.return_values
    finally:
        context.close()


def test_installing_twice_patches_once(patched: None) -> None:
    start = api.MultiprocessContext._start
    assert fork_context.install()
    assert api.MultiprocessContext._start is start


def test_without_the_patch_the_forked_process_waits_for_torchrun_to_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch as it is, which this module exists for: a process that has put its value does not end before torchrun
    reads it (if a torch stops waiting there, fork_context is no longer needed and this test says so)."""
    start = api.MultiprocessContext._start
    monkeypatch.setattr(api.MultiprocessContext, "_start", getattr(start, "__wrapped__", start))  # torch's own
    context = _start(tmp_path, 1)
    try:
        queue = context._ret_vals[0]  # type: ignore[attr-defined]
        deadline = time.monotonic() + ENDS_ALONE_S
        while queue.empty() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not queue.empty(), "the process put its value"
        assert not _all_ended(context, 2.0), "unpatched, it sleeps until torchrun has read its value"
        result = context.wait(timeout=NO_HANG_S)
        assert result is not None and result.return_values == {0: 40}
    finally:
        context.close()
