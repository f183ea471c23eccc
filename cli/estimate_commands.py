"""``dlsub estimate``: options parsed here, the work in :mod:`dlsub.estimate.estimator`, the table rendered here."""

from __future__ import annotations

import getpass
import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from dlsub.cli.errors import fail
from dlsub.cli.submit_options import environment_options, parse_mem, read_exports
from dlsub.containers.mounts import MountRequest
from dlsub.containers.podman import ImageError
from dlsub.estimate.estimator import EstimateRequest, Estimator, fmt_s, normalize_batch_arg
from dlsub.estimate.gpu_kinds import parse_gpu_types
from dlsub.estimate.recommend import Horizon, where
from dlsub.job.budget_check import check_budget
from dlsub.job.partition_choice import PlanningError
from dlsub.job.settings import load_settings
from dlsub.job.submit import SubmitError
from dlsub.job.user_store import JobStore
from dlsub.site_config.cost import Spend
from dlsub.site_config.policy_file import AgentPolicy, PolicyFileError, load_policy
from dlsub.slurm_plugins.client import SlurmClient, SlurmError, SlurmUnreachable
from dlsub.slurm_plugins.timespec import TimeSpecError


def parse_batch_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        sizes = ()
    if not sizes or any(s < 1 for s in sizes) or len(set(sizes)) != len(sizes):
        raise SubmitError(f"--batch-sizes {text!r}: give distinct positive integers separated by commas, "
                          f"e.g. --batch-sizes 32,64,128")
    return sizes


def render_estimate(payload: dict[str, Any]) -> str:
    """The iScheduler-style table: partition (× GPU type) × batch size -> memory, walltime, cost, start,
    finish, feasible. The GPU column and the profiling costs appear only where some partition's GPUs have a
    kind (an untyped cluster's table is as it was)."""
    typed = any(r.get("gpu_type") for r in payload["rows"])
    header = ["#", "PARTITION", *(["GPU"] if typed else []), "BATCH", "MEMORY", "WALLTIME", "COST", "EST.START",
              "EST.FINISH", "FEASIBLE"]
    body = []
    for r in payload["rows"]:
        body.append([str(r["choice"]), r["partition"], *([r.get("gpu_type") or "-"] if typed else []),
                     str(r["batch_size"]) + ("" if r["profiled"] else "*"),
                     "-" if r["memory_mb"] is None else f"{r['memory_mb']} MB", fmt_s(r["walltime_s"]),
                     "-" if r["cost"] is None else f"{r['cost']:.3f}",
                     "now" if r["start_s"] is not None and r["start_s"] < 1 else fmt_s(r["start_s"]),
                     fmt_s(r["finish_s"]), "yes" if r["feasible"] else f"no: {r['why']}"])
    widths = [max(len(x) for x in col) for col in zip(header, *body, strict=True)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in [header, *body]]
    lines.append("(* predicted from the batch sizes profiled; times from now, h:mm:ss; cost at the site's "
                 "cost_per_node_hour" + (", or the GPU type's cost_per_gpu_hour where it prices the type; each "
                                         "type's rows from its own profiles" if typed else "") + ")")
    for spent in payload.get("profiling", []):
        lines.append(f"profiling {spent['gpu_type']} (on {spent['partition']}, for "
                     f"{', '.join(spent['stands_for'])}): {spent['measured']} of {spent['runs']} run(s) measured "
                     f"now, {spent['from_cache']} from cache; about {fmt_s(spent['seconds'])} on "
                     f"{payload['nodes']} node(s) x {payload['gpus']} GPU(s), {spent['gpu_hours']:.4f} GPU-hours, "
                     f"cost {spent['cost']:.3f}")
    rec = payload["recommendation"]
    ideal, immediate = rec.get("ideal"), rec.get("immediate")
    if ideal:
        lines.append(f"ideal:     wait for {where(ideal)} (row {ideal['choice']}): starts in "
                     f"{fmt_s(ideal['start_s'])}, finishes in {fmt_s(ideal['finish_s'])}")
    if immediate:
        move_to = where({"partition": immediate["move_to"], "gpu_type": immediate.get("move_to_gpu_type")})
        lines.append(f"immediate: start now on {where(immediate)} (row {immediate['choice']}), move to "
                     f"{move_to} when it frees up: finishes in {fmt_s(immediate['finish_s'])}")
    if rec.get("choice") is not None:
        lines.append(f"recommended: row {rec['choice']} ({rec['mode']}): {rec['reason']}")
        lines.append(f"submit it:   dlsub submit --from-estimate {payload['id']} --choice {rec['choice']}")
    else:
        lines.append(f"recommended: nothing: {rec['reason']}")
    lines.append(f"estimate {payload['id']}: {payload['profiled_now']} profile(s) run, {payload['from_cache']} "
                 f"from cache, {payload['elapsed_s']:.1f} s")
    return "\n".join(lines)


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--batch-sizes", default="32,64,128", show_default=True,
              help="Global batch sizes to profile and predict, comma-separated.")
@click.option("--epochs", type=float, default=None, help="Horizon: predict for this many epochs.")
@click.option("--target-loss", type=float, default=None, help="Horizon: predict until the loss reaches this.")
@click.option("--gpus", type=int, default=0, show_default=True, help="GPUs per node, as for submit.")
@click.option("--nodes", type=int, default=1, show_default=True, help="Nodes, as for submit.")
@click.option("--cpus", type=int, default=None, help="CPUs, as for submit.")
@click.option("--mem", default=None, help="Memory per node for the profiling runs, as for submit.")
@click.option("-p", "--partition", default=None, help="Profile and predict this partition only.")
@click.option("--image", default=None, help="Container image, as for submit.")
@click.option("--mount", "mount", multiple=True, metavar="PATH",
              help="A directory or file the profiling runs see, read-only, as for submit; repeatable.")
@click.option("--mount-rw", "mount_rw", multiple=True, metavar="PATH",
              help="As --mount, read-write; repeatable.")
@click.option("--gpu-type", "gpu_type", default=None, metavar="KIND[,KIND]",
              help="On partitions whose GPUs have kinds (Slurm GRES types, e.g. gpu:a100:4): profile and predict "
                   "only these kinds [default: each kind, one profile per kind].")
@click.option("--batch-arg", default="--batch-size", show_default=True,
              help="The script's batch-size flag ('none': pass no argument, the script reads run.batch_size).")
@environment_options
@click.option("--no-cache", is_flag=True, help="Profile again even where a cached profile exists.")
@click.option("--parallel", is_flag=True,
              help="Run the profiles of every partition and kind at once, even where they share nodes (default: "
                   "at once only where they share no node, so that no two skew each other's step times).")
@click.option("--one-at-a-time", is_flag=True, help="Run every profile one after another, whatever its nodes.")
@click.option("--json", "as_json", is_flag=True, help='Print {"id": ..., "rows": [...], "recommendation": {...}}.')
@click.argument("script", type=click.Path(path_type=Path, dir_okay=True, exists=False))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def estimate(batch_sizes: str, epochs: float | None, target_loss: float | None, gpus: int, nodes: int,
             cpus: int | None, mem: str | None, partition: str | None, image: str | None,
             mount: tuple[str, ...], mount_rw: tuple[str, ...], gpu_type: str | None, batch_arg: str,
             export: str | None, venv: str | None, no_cache: bool, parallel: bool, one_at_a_time: bool,
             as_json: bool, script: Path, args: tuple[str, ...]) -> None:
    """Profile SCRIPT briefly through Slurm; predict memory, walltime, cost, start and finish per partition
    (and kind of GPU, where Slurm's GRES or the site names kinds) and batch size, and recommend where to run.

    Options go before SCRIPT; everything after it is the script's. --epochs and
    --target-loss are the horizon of the prediction and are not passed to the script.
    """
    try:
        if epochs is not None and target_loss is not None:
            raise SubmitError("give --epochs or --target-loss, not both")
        if epochs is not None and epochs <= 0:
            raise SubmitError(f"--epochs must be positive, not {epochs:g}")
        if gpus < 0 or nodes < 1 or (cpus is not None and cpus < 1):
            raise SubmitError("--gpus must be 0 or more, --nodes and --cpus 1 or more")
        if parallel and one_at_a_time:
            raise SubmitError("--parallel and --one-at-a-time contradict each other: give one of them (or neither: "
                              "partitions that share no node profile at once)")
        kinds = parse_gpu_types(gpu_type)
        if kinds and gpus < 1:
            raise SubmitError("--gpu-type goes with --gpus N: a job without GPUs runs on no kind of GPU")
        try:
            mem_mb = parse_mem(mem) if mem is not None else None
        except click.BadParameter as exc:
            raise SubmitError(f"--mem: {exc.message}") from exc
        try:
            policy = load_policy()
        except PolicyFileError as exc:
            click.echo(f"dlsub: warning: {exc}; using dlsub's default policy", err=True)
            policy = AgentPolicy()
        settings, client = load_settings(), SlurmClient()
        check_budget(policy, client, getpass.getuser(), Spend())  # profiling runs count against the budget
        request = EstimateRequest(
            script=script, args=tuple(args), batch_sizes=parse_batch_sizes(batch_sizes),
            horizon=Horizon(epochs=epochs, target_loss=target_loss), workdir=Path.cwd(), gpus=gpus, nodes=nodes,
            cpus=cpus, mem_mb=mem_mb, image=policy.containers.image_for(image, os.environ), partition=partition,
            batch_arg=normalize_batch_arg(batch_arg),
            use_cache=not no_cache, queues="each" if parallel else "one" if one_at_a_time else "by-node",
            gpu_types=kinds, exports=read_exports(export),
            venv=venv, partition_images=policy.containers.partition_images_for(image, os.environ),
            mounts=(*(MountRequest(p, True) for p in mount), *(MountRequest(p, False) for p in mount_rw)))
        estimator = Estimator(settings, client, JobStore(settings.db_path), policy,
                              say=lambda msg: click.echo(f"dlsub: {msg}", err=True))
        try:
            payload = estimator.run(request)
        except KeyboardInterrupt:
            sys.exit(130)
    except (SubmitError, PlanningError, SlurmUnreachable, ImageError, TimeSpecError) as exc:
        fail(str(exc), 2)
    except SlurmError as exc:
        fail(str(exc), 1)
    if as_json:
        click.echo(json.dumps({k: v for k, v in payload.items() if k != "profiles"}, indent=2))
    else:
        click.echo(render_estimate(payload))
