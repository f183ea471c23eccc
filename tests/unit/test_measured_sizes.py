"""Unit (pure): a job's progress events folded into the rates it measured at each size it has run."""

from __future__ import annotations

from typing import Any

from dlsub.job_progress import ProgressSummary


def start(t: float, world: int, nodes: int, attempt: str = "7-0") -> dict[str, Any]:
    return {"event": "start", "time": t, "attempt": attempt, "world_size": world, "nodes": nodes}


def report(t: float, step: int, attempt: str = "7-0", **extra: Any) -> dict[str, Any]:
    return {"event": "progress", "time": t, "attempt": attempt, "step": step, "samples": step * 32, **extra}


def test_each_size_keeps_its_own_rates_across_regroupings_of_one_attempt() -> None:
    summary = ProgressSummary()
    for event in [start(0, 2, 1), report(10, 10), report(20, 30), report(30, 50),
                  # The group re-forms on 2 nodes within the same Slurm attempt: a new start event.
                  start(40, 4, 2), report(50, 60), report(60, 100)]:
        summary.feed(event)
    measured = ProgressSummary.from_dict(summary.to_dict()).progress().measured
    assert measured == {(1, 2): (2.0, 64.0), (2, 4): (4.0, 128.0)}


def test_a_rate_needs_two_reports_at_that_size_and_startup_time_is_not_counted() -> None:
    summary = ProgressSummary()
    for event in [start(0, 2, 1), report(100, 10)]:
        summary.feed(event)
    assert summary.progress().measured == {}
    summary.feed(report(110, 20))
    assert summary.progress().measured == {(1, 2): (1.0, 32.0)}


def test_a_report_naming_another_world_size_starts_a_new_size_even_without_a_start_event() -> None:
    summary = ProgressSummary()
    for event in [start(0, 2, 1), report(10, 10, world_size=2), report(20, 20, world_size=2),
                  report(30, 25, world_size=4), report(40, 45, world_size=4)]:
        summary.feed(event)
    measured = summary.progress().measured
    assert measured[(1, 2)] == (1.0, 32.0) and measured[(1, 4)] == (2.0, 64.0)


def counted(t: float, step: int) -> dict[str, Any]:
    """What the library writes for a loop that has not called report(): a count of its should_stop() calls."""
    return {"event": "progress", "time": t, "attempt": "7-0", "step": step, "counted": "polls"}


def test_a_loop_that_never_reports_is_measured_in_steps_from_its_counted_polls() -> None:
    summary = ProgressSummary()
    for event in [start(0, 2, 1), counted(10, 10), counted(20, 30)]:
        summary.feed(event)
    assert summary.progress().measured == {(1, 2): (2.0, None)}


def test_counted_polls_never_enter_a_rate_beside_the_loops_own_reports() -> None:
    # A loop that reports every 10 steps: the library counted its first polls (its steps by another basis, no
    # samples) until the first report. The rates are the reports' alone, samples/s included.
    summary = ProgressSummary()
    for event in [start(0, 2, 1), counted(5, 500), report(10, 10), report(20, 30)]:
        summary.feed(event)
    assert summary.progress().measured == {(1, 2): (2.0, 64.0)}
    summary = ProgressSummary.from_dict(summary.to_dict())
    summary.feed(report(30, 50))
    assert summary.progress().measured == {(1, 2): (2.0, 64.0)}


def test_a_file_of_made_up_sizes_keeps_only_the_newest_configurations() -> None:
    from dlsub.job_progress import MAX_CONFIGS

    summary = ProgressSummary()
    for i in range(200):
        for event in (start(10 * i, i + 1, 1), report(10 * i + 1, 100 * i), report(10 * i + 2, 100 * i + 1)):
            summary.feed(event)
    configs = summary.progress().configs
    assert len(configs) == MAX_CONFIGS and configs[-1].replicas == 200


def test_the_command_digest_of_the_latest_start_is_kept_and_anything_else_is_refused() -> None:
    summary = ProgressSummary()
    summary.feed({**start(0, 2, 1), "application": "0123456789abcdef" * 2})
    assert summary.progress().application == "0123456789abcdef" * 2, "known before any report"
    for hostile in ("../../etc/passwd", "A" * 32, "0" * 33, 12345, None, ["0" * 32]):
        summary.feed({**start(1, 2, 1), "application": hostile})
        assert summary.progress().application == "0123456789abcdef" * 2, hostile
    summary.feed({**start(2, 2, 1), "application": "f" * 32})
    summary.feed(report(10, 10))
    assert ProgressSummary.from_dict(summary.to_dict()).progress().application == "f" * 32


def test_each_kind_of_gpu_keeps_its_own_rates_and_the_current_kinds_are_what_it_measured() -> None:
    """A job moved from a100 to v100 at the same size: two configurations, one per kind; `measured` (what the
    resize rules and the live models read) is the current kind's alone, and survives the agent's store."""
    summary = ProgressSummary()
    for event in [{**start(0, 2, 1), "gpu_type": "a100"}, report(10, 10), report(20, 50),
                  {**start(30, 2, 1, attempt="7-1"), "gpu_type": "v100"}, report(40, 60, attempt="7-1"),
                  report(50, 70, attempt="7-1")]:
        summary.feed(event)
    progress = ProgressSummary.from_dict(summary.to_dict()).progress()
    assert [(c.gpu_type, c.steps_per_s) for c in progress.configs] == [("a100", 4.0), ("v100", 1.0)]
    assert progress.gpu_type == "v100" and progress.measured == {(1, 2): (1.0, 32.0)}
    assert [c.gpu_type for c in progress.configs_here] == ["v100"]


def test_a_gpu_type_that_is_not_a_name_counts_as_none() -> None:
    summary = ProgressSummary()
    for event in [{**start(0, 2, 1), "gpu_type": "a100@x,1"}, report(10, 10), report(20, 30)]:
        summary.feed(event)
    progress = summary.progress()
    assert progress.gpu_type is None and [c.gpu_type for c in progress.configs] == [None]
    assert progress.measured == {(1, 2): (2.0, 64.0)}


def test_each_start_after_the_first_is_a_restart_and_the_count_survives_the_store() -> None:
    """Every attempt and every re-forming of an elastic group writes a start event: the policies are told the
    restarts after the first start (pollux's restart factor; goodput across kinds moves a job that has
    restarted often less readily). A summary stored before it counted starts loads with none."""
    summary = ProgressSummary()
    assert summary.progress().restarts == 0
    summary.feed(start(0, 2, 1))
    assert summary.progress().restarts == 0, "its first start is no restart"
    for event in [report(10, 10), start(20, 4, 2), report(30, 20), start(40, 2, 1, attempt="7-1")]:
        summary.feed(event)
    stored = ProgressSummary.from_dict(summary.to_dict())
    assert stored.progress().starts == 3 and stored.progress().restarts == 2
    older = {k: v for k, v in summary.to_dict().items() if k != "starts"}
    assert ProgressSummary.from_dict(older).progress().restarts == 0
