"""Writing a simulation's results: per-job CSV, summary JSON, timeline, plot."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from dlsub.sim.engine import SimResult

JOB_COLUMNS = ("name", "application", "arrival_s", "start_s", "completion_s", "jct_s", "restarts", "gpu_s")


def write_outputs(result: SimResult, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs_csv = out_dir / "jobs.csv"
    with jobs_csv.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(JOB_COLUMNS)
        for job in result.jobs:
            writer.writerow(
                (job.name, job.application, job.arrival_s, job.start_s, job.completion_s, job.jct_s,
                 job.restarts, round(job.gpu_s, 1))
            )
    timeline_csv = out_dir / "timeline.csv"
    with timeline_csv.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(("time_s", "allocated_gpus", "running_jobs", "waiting_jobs"))
        for s in result.timeline:
            writer.writerow((s.time_s, s.allocated_gpus, s.running_jobs, s.waiting_jobs))
    summary_json = out_dir / "summary.json"
    summary_json.write_text(json.dumps(result.summary(), indent=2) + "\n")
    return [jobs_csv, timeline_csv, summary_json]


def write_plot(result: SimResult, path: Path) -> Path:
    """A PNG: the JCT distribution (CDF) and GPU allocation over time."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError("--plot needs matplotlib: pip install 'dlsub[plot]'") from None
    jcts = sorted(j.jct_s for j in result.jobs if j.jct_s is not None)
    fig, (ax_jct, ax_util) = plt.subplots(1, 2, figsize=(11, 4))
    if jcts:
        ax_jct.plot([j / 3600 for j in jcts], [(i + 1) / len(jcts) for i in range(len(jcts))])
        ax_jct.set_xscale("log")
    ax_jct.set_xlabel("job completion time (h)")
    ax_jct.set_ylabel("fraction of jobs")
    ax_jct.set_title(f"JCT, {result.policy}")
    ax_jct.grid(True, alpha=0.3)
    times = [s.time_s / 3600 for s in result.timeline]
    ax_util.plot(times, [s.allocated_gpus / result.total_gpus for s in result.timeline], label="GPUs allocated")
    ax_util.set_xlabel("time (h)")
    ax_util.set_ylabel("fraction of cluster GPUs")
    ax_util.set_ylim(0, 1.05)
    ax_util.set_title("cluster utilisation")
    ax_util.grid(True, alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
