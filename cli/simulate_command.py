"""``dlsub simulate WORKLOAD.csv --policy NAME``: replay a workload in the simulator.

Lives apart from the rest of the CLI because it needs numpy and scipy,
which submitting a job does not.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import click

from dlsub.cli.errors import fail


@contextlib.contextmanager
def _native_stdout_to_stderr() -> Iterator[None]:
    """Send what native code writes on file descriptor 1 to 2 meanwhile: HiGHS (the ``sia`` policy's
    solver) prints a diagnostic line there, which would break ``--json``'s output."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no descriptor 1 to protect
        yield
        return
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _resize_penalty(text: str) -> tuple[float | None, float | None]:
    """--resize-penalty as (SimConfig.resize_penalty_s, SimConfig.shrink_penalty_s): ``restart`` (None, None),
    seconds for a grow and a shrink alike (S, S), or ``GROW/SHRINK`` seconds."""
    from dlsub.sim.engine import resize_penalties

    try:
        grow, shrink = resize_penalties(text)
    except ValueError:
        raise click.BadParameter(f"{text!r}: seconds (at least 0), GROW/SHRINK seconds or 'restart'",
                                 param_hint="'--resize-penalty'") from None
    return grow, grow if shrink is None else shrink


@click.command()
@click.argument("workload", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--policy", "policy_name", default="goodput", show_default=True,
              help="Scheduling policy (fifo, rr, efifo, gang, tiresias, optimus, goodput, pollux, sia, worker-greedy).")
@click.option("--cluster", "cluster_file", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Cluster TOML (nodes, gpus_per_node or [[group]], each with an optional gpu_type) "
                   "[default: 16 nodes x 4 GPUs].")
@click.option("--traces", "traces_dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Application traces, one folder per application [default: the traces/ folder beside the "
                   "workload's folder]. A cluster with GPU types reads each type's placements-<type>.csv "
                   "and scalability-<type>.csv there (Sia's layout).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--out", "out_dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Write jobs.csv, timeline.csv and summary.json here.")
@click.option("--plot", is_flag=True, help="Write a PNG of the JCT distribution and utilisation (into --out, or .).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for --arrival-jitter.")
@click.option("--arrival-jitter", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Delay each arrival by up to this many seconds (seeded).")
@click.option("--interval", type=click.IntRange(min=1), default=60, show_default=True,
              help="Scheduling interval, seconds.")
@click.option("--information", type=click.Choice(["online", "oracle"]), default="online", show_default=True,
              help="What a learning policy (goodput, pollux) is told: online, only what each job reported at the sizes "
                   "it ran (as the live agent); oracle, every job's true performance and remaining work. "
                   "Baselines see what their papers gave them either way.")
@click.option("--history", type=click.Choice(["none", "columns", "one-user"]), default="none", show_default=True,
              help="Online, whose earlier runs a job's throughput fit may start from: none; the workload's user "
                   "and command columns; or one-user, an assumption (the workload is one user's and a command "
                   "is an application and batch size; every job of an application is then a clone).")
@click.option("--restart-penalty", type=click.IntRange(min=0), default=30, show_default=True,
              help="Seconds without progress after every (re)allocation that is not a resize in place.")
@click.option("--resize-penalty", default="6/0.4", show_default=True, metavar="SECONDS|GROW/SHRINK|restart",
              help="Seconds without progress after a resize in place (the same kind of GPUs, grown onto more or "
                   "shrunk onto fewer of the GPUs a job holds; never more than its restart), a grow's and a "
                   "shrink's apart as GROW/SHRINK: 6/0.4 is dlsub's measured resize in process, 0 free resizes "
                   "(a bound); restart charges a resize a restart, as the simulator did before issue 52.")
@click.option("--calibration", type=click.Choice(["auto", "none", "sia"]), default="auto", show_default=True,
              help="sia: Sia's per-application slowdowns and restart penalties (which replace --restart-penalty), "
                   "as its artifact calibrated them; auto: sia on a cluster with GPU types, else none.")
def simulate(
    workload: Path,
    policy_name: str,
    cluster_file: Path | None,
    traces_dir: Path | None,
    as_json: bool,
    out_dir: Path | None,
    plot: bool,
    seed: int,
    arrival_jitter: float,
    interval: int,
    restart_penalty: int,
    resize_penalty: str,
    information: str,
    history: str,
    calibration: str,
) -> None:
    """Replay WORKLOAD (name,time,application,num_replicas,batch_size) under a policy.

    The Pollux workloads ship with dlsub: pollux/workloads/workload-1.csv ...
    workload-8.csv (1.0x load) and pollux/workloads-0.5/ (0.5x).
    """
    from dlsub.policies.api import PolicyError
    from dlsub.policies.registry import get_policy
    from dlsub.sim.cluster_file import ClusterFileError, default_cluster, load_cluster
    from dlsub.sim.engine import SimConfig
    from dlsub.sim.engine import simulate as run_simulation
    from dlsub.sim.report import write_outputs, write_plot
    from dlsub.sim.workload import POLLUX_DIR, WorkloadError, default_traces_dir, read_workload

    if not workload.exists() and (POLLUX_DIR.parent / workload).is_file():
        workload = POLLUX_DIR.parent / workload  # the shipped pollux/... workloads by name
    try:
        policy = get_policy(policy_name)
        cluster = load_cluster(cluster_file) if cluster_file else default_cluster()
        jobs = read_workload(workload)
        traces = traces_dir or default_traces_dir(workload)
        if traces is None or not traces.is_dir():
            fail(f"no traces folder for {workload}; pass --traces DIR (the folder with one sub-folder per application)")
        assert traces is not None
        if calibration == "auto":
            calibration = "sia" if cluster.gpu_types() else "none"
        grow_s, shrink_s = _resize_penalty(resize_penalty)
        config = SimConfig(interval_s=interval, restart_penalty_s=restart_penalty, seed=seed,
                           arrival_jitter_s=arrival_jitter, information=information, history=history,
                           calibration=calibration, resize_penalty_s=grow_s, shrink_penalty_s=shrink_s)
        with click.progressbar(length=len(jobs), label=f"{policy.name} on {workload.name}", file=sys.stderr,
                               show_pos=True) as bar:
            done = [0]

            def on_progress(completed: int, total: int) -> None:
                bar.update(completed - done[0])
                done[0] = completed

            with _native_stdout_to_stderr():
                result = run_simulation(jobs, traces, policy, cluster, config, workload_name=workload.stem,
                                        on_progress=on_progress)
    except (PolicyError, ClusterFileError, WorkloadError) as exc:
        fail(str(exc))
    summary = result.summary()
    written: list[Path] = []
    if out_dir is not None:
        written += write_outputs(result, out_dir)
    if plot:
        target = (out_dir or Path(".")) / f"{workload.stem}-{policy.name}.png"
        try:
            written.append(write_plot(result, target))
        except RuntimeError as exc:
            fail(str(exc))
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        for key, value in summary.items():
            click.echo(f"{key:>16}: {value}")
    for path in written:
        click.echo(f"dlsub: wrote {path}", err=True)
    if result.stalled:
        click.echo("dlsub: the simulation stalled: jobs waited with no progress (see 'completed')", err=True)
        sys.exit(3)


@click.command("generate-workload")
@click.argument("out", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--load", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="Relative job load: 160 jobs in the 8-hour window at 1.0.")
@click.option("--seed", type=int, default=1, show_default=True, help="One seed, one workload.")
@click.option("--philly", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="The Philly trace (timestamp,duration,num_gpus,gpu_time,cluster) "
                   "[default: ../shared/data/pollux/traces/philly.csv].")
@click.option("--stated-missing", type=click.FloatRange(0, 1), default=0.5, show_default=True,
              help="Share of jobs whose user states no length (stated_epochs blank).")
@click.option("--stated-error", type=click.FloatRange(min=1), default=2.0, show_default=True,
              help="A stated length is off by a factor drawn log-uniformly in [1/E, E] (1: exact).")
def generate_workload(out: Path, load: float, seed: int, philly: Path | None, stated_missing: float,
                      stated_error: float) -> None:
    """Write a workload to OUT as the Pollux paper sampled its own from the Philly trace, at any load.

    dlsub simulate replays it (with the shipped Pollux traces)."""
    from dlsub.sim.generate import Statements, generate, read_philly
    from dlsub.sim.workload import WorkloadError, write_workload

    trace = philly or Path.cwd().parent / "shared/data/pollux/traces/philly.csv"
    try:
        jobs = generate(read_philly(trace), load, seed, Statements(stated_missing, stated_error))
        write_workload(jobs, out)
    except WorkloadError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot write {out}: {exc.strerror}")
    click.echo(f"dlsub: wrote {out}: {len(jobs)} jobs at {load:g}x load, seed {seed}", err=True)
