"""The ``dlsub`` command: ``dlsub train.py`` is ``dlsub submit train.py``.

Thin on purpose: options are parsed here, and the work is done by
:mod:`dlsub.job.submit`, :mod:`dlsub.job.status` and the Slurm client.
Bad input exits 2 with a message that says what to change; nothing is
submitted and nothing is left behind.
"""

from __future__ import annotations

import functools
import getpass
import importlib
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

import dlsub
from dlsub.cli.errors import fail
from dlsub.cli.submit_options import SubmitOptions, environment_options, read_exports
from dlsub.containers.exports import ExportError, parse_exports
from dlsub.containers.mounts import MountError, MountRequest, resolve_mount
from dlsub.containers.podman import ImageError
from dlsub.contract import CHECKPOINT_SIGNAL, ENV_TARGET_LOSS, JobState
from dlsub.estimate.apply_choice import FromEstimate, chosen_row, submit_options, with_env
from dlsub.job.budget_check import check_budget, extra_for
from dlsub.job.directives import Directive, DirectiveError, read_directives
from dlsub.job.output_files import OutputFiles
from dlsub.job.output_lines import LogPrinter, Selection
from dlsub.job.partition_choice import PlanningError
from dlsub.job.settings import Settings, load_settings
from dlsub.job.status import JobStatus, SlurmView, describe_mounts, render_table
from dlsub.job.submit import SubmitError, SubmitRequest, plan_job, submit_plan
from dlsub.job.user_store import JobRecord, JobStore, UnknownJob
from dlsub.site_config.policy_file import AgentPolicy, PolicyFileError, load_policy
from dlsub.slurm_plugins.client import SlurmClient, SlurmError, SlurmUnreachable
from dlsub.slurm_plugins.timespec import TimeSpecError

F = TypeVar("F", bound=Callable[..., Any])

USAGE_ERRORS = (SubmitError, PlanningError, SlurmUnreachable, ImageError, UnknownJob, TimeSpecError, DirectiveError)



def friendly_errors(func: F) -> F:
    """Our errors as one clear message and an exit code: 2 for what the user can fix."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except USAGE_ERRORS as exc:
            fail(str(exc), 2)
        except SlurmError as exc:
            fail(str(exc), 1)

    return wrapper  # type: ignore[return-value]


#: The subcommands of other modules: name -> (module, attribute), imported when run or listed (--help). The
#: agent's, doctor's, the estimator's and the simulator's modules import the agent, SciPy and more: imported for
#: every `dlsub status` they cost it about a second of a login node's CPU (a job's tests poll status each second).
OTHER_COMMANDS: dict[str, tuple[str, str]] = {
    "agent": ("dlsub.cli.agent_commands", "agent"),
    "backfill": ("dlsub.cli.daemon_commands", "backfill"),
    "config": ("dlsub.cli.agent_commands", "config"),
    "dashboard": ("dlsub.cli.dashboard_command", "dashboard"),
    "doctor": ("dlsub.cli.doctor_commands", "doctor"),
    "estimate": ("dlsub.cli.estimate_commands", "estimate"),
    "generate-workload": ("dlsub.cli.simulate_command", "generate_workload"),
    "simulate": ("dlsub.cli.simulate_command", "simulate"),
    "usage": ("dlsub.cli.usage_commands", "usage"),
    "why": ("dlsub.cli.query_commands", "why"),
}


class DefaultToSubmit(click.Group):
    """``dlsub [OPTIONS] SCRIPT [ARGS]...`` means ``dlsub submit [OPTIONS] SCRIPT [ARGS]...``; the commands of
    OTHER_COMMANDS are imported when asked for."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in OTHER_COMMANDS and \
                args[0] not in ("--help", "-h", "--version"):
            args = ["submit", *args]
        return super().parse_args(ctx, args)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *OTHER_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in OTHER_COMMANDS and cmd_name not in self.commands:
            module, attribute = OTHER_COMMANDS[cmd_name]
            command: click.Command = getattr(importlib.import_module(module), attribute)
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)


@click.group(cls=DefaultToSubmit, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(dlsub.__version__, prog_name="dlsub")
def main() -> None:
    """Run deep-learning training on Slurm without writing a Slurm script.

    \b
      dlsub train.py --lr 0.1        submit (shorthand of `dlsub submit`)
      dlsub status [JOB] [--json]    your jobs: state, step, loss, ETA
      dlsub logs JOB [-f] [--rank N] the job's output (--rank: one process's lines only)
      dlsub cancel JOB               stop it; no container is left behind
      dlsub requeue JOB              checkpoint now and continue in a new attempt
    """


def site_policy() -> AgentPolicy:
    """The site's policy.toml; its defaults, with a warning, when it cannot be read."""
    try:
        return load_policy()
    except PolicyFileError as exc:
        click.echo(f"dlsub: warning: {exc}; using dlsub's default policy (immediate mode)", err=True)
        return AgentPolicy()


def default_mode() -> str:
    """The site's default submission mode (policy.toml), immediate when it says none."""
    return site_policy().default_mode


def _context(policy: AgentPolicy | None = None) -> tuple[Settings, SlurmClient, JobStore]:
    """A user command's settings, Slurm client and job store; ``policy``: the site's, where the command makes job
    directories (their folder may be the site's, :meth:`SitePaths.job_directories_of`)."""
    folder = policy.site.job_directories_of(getpass.getuser()) if policy is not None else None
    settings = load_settings(job_directories=folder)
    return settings, SlurmClient(), JobStore(settings.db_path)


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--gpus", default=None,
              help="GPUs in all, split evenly over the nodes (one training process per GPU); MIN:MAX: elastic, "
                   "the agent grows and shrinks the job by --gpus-step GPUs, on its node first [default: 0].")
@click.option("--gpus-per-node", type=int, default=None,
              help="GPUs on each node (instead of --gpus); with --gpus MIN:MAX, grow by whole nodes of this many.")
@click.option("--gpus-step", type=int, default=None,
              help="GPUs each worker of an elastic --gpus MIN:MAX adds or takes away [default: 1].")
@click.option("--nodes", default=None,
              help="Nodes, one container each, under one torchrun rendezvous; MIN:MAX: elastic, the agent grows "
                   "and shrinks the job between them [default: 1].")
@click.option("--cpu-nodes", type=int, default=None,
              help="Beside the GPU trainers, this many CPU nodes running the same script with run.role == 'cpu' "
                   "(data loading, evaluation, a parameter server); one heterogeneous job, started all together.")
@click.option("--cpu-partition", default=None, help="Partition of the --cpu-nodes [default: one without GPUs].")
@click.option("--cpus", type=int, default=None, help="CPUs for the job [default: 2, or $DLSUB_CPUS].")
@click.option("--mem", "mem", default=None, help="Memory per node, Slurm syntax (4096, 512M, 4G) [default: 4G].")
@click.option("--time", "time_limit", default=None,
              help="Time limit, Slurm syntax (90, 1:30:00, 2-00) [default: the partition's].")
@click.option("-p", "--partition", default=None, help="Partition; default: one that can run the job now.")
@click.option("--gpu-type", "gpu_type", default=None, metavar="KIND",
              help="GPUs of one model, as Slurm's GRES names it (a100): a partition whose nodes have them.")
@click.option("--image", default=None, help="Container image in your Podman storage.")
@click.option("-J", "--name", default=None, help="Job name [default: the script's name].")
@click.option("--mode", type=click.Choice(["immediate", "ideal"]), default=None,
              help="immediate: start now on what is free (CPU or dev nodes) and move onto GPUs when they free up; "
                   "ideal: wait for the ideal partition [default: the site policy's, else immediate].")
@click.option("--mount", "mount", multiple=True, metavar="PATH",
              help="A directory or file the container sees at PATH, read-only (your data on /scratch, "
                   "/projects, ...); repeat for more. Besides the site's shared file systems and the script's, "
                   "submit and job directories.")
@click.option("--mount-rw", "mount_rw", multiple=True, metavar="PATH",
              help="As --mount, but the job may write there (its outputs); repeatable.")
@environment_options
@click.option("--dry-run", is_flag=True, help="Print the batch script; submit nothing.")
@click.option("--json", "as_json", is_flag=True, help='Print {"id": ..., "slurm_job_id": ...}.')
@click.option("--from-estimate", "from_estimate", default=None, metavar="ID",
              help="Submit a row of `dlsub estimate` ID (its script, arguments, partition; --mem/--time from the "
                   "profiles, with a margin, unless given).")
@click.option("--choice", type=int, default=None, metavar="N",
              help="The row of --from-estimate to submit [default: the recommended one].")
@click.option("--target-loss", type=float, default=None,
              help="Loss to train to: the script's run.should_finish() turns true there; status shows a loss ETA.")
@click.argument("script", type=click.Path(path_type=Path, dir_okay=True, exists=False), required=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@friendly_errors
def submit(from_estimate: str | None, choice: int | None, script: Path | None, args: tuple[str, ...],
           **given: Any) -> None:
    """Submit SCRIPT (a PyTorch training script) with ARGS to Slurm, in a container, under torchrun.

    dlsub's options go before SCRIPT; everything after it is the script's,
    as with sbatch (a `--` and a --json or --dry-run included). Options may
    also be written in the script itself, on `#DLSUB` lines in its first
    comment block (e.g. `#DLSUB --gpus 2 --time 1:00:00`); the command line wins.
    """
    ctx = click.get_current_context()
    options = SubmitOptions.from_params(given)  # every other option: one typed record from here on
    picked = chosen_row(load_settings().home, from_estimate, choice) if from_estimate is not None else None
    if picked is None and choice is not None:
        raise SubmitError("--choice N goes with --from-estimate ID")
    if picked is not None and script is None:
        script, args = Path(picked.script), picked.args
    if script is None:
        raise SubmitError("missing SCRIPT: give the training script to submit (or --from-estimate ID)")
    options = options.changed(options_from_directives(ctx, script))
    named_image = options.image  # the user's own (an estimate's row names the image it profiled, not theirs)
    if picked is not None:
        options = options.filled(submit_options(picked))
        click.echo(f"dlsub: {picked.note}", err=True)
    resources = options.resources()
    shape = options.shape()
    policy = site_policy()
    settings, client, store = _context(policy)
    request = SubmitRequest(
        script=script, args=tuple(args), gpus_per_node=shape.gpus_per_node, nodes=shape.nodes,
        max_members=shape.max_members,
        worker_gpus=shape.worker_gpus,
        cpus=resources.cpus, cpu_nodes=options.cpu_nodes or 0, cpu_partition=options.cpu_partition,
        mem_mb=resources.mem_mb, time_limit_min=resources.time_limit_min, partition=options.partition,
        image=policy.containers.image_for(options.image, os.environ), name=options.name, workdir=Path.cwd(),
        mode=options.mode or policy.default_mode,
        max_continuations=policy.time_limits.max_continuations if policy.time_limits.continue_jobs else 0,
        mounts=(*policy.containers.mount_requests(), *(MountRequest(p, True) for p in options.mount),
                *(MountRequest(p, False) for p in options.mount_rw)),
        runtime=policy.containers.runtime or None,
        socket_ifname=policy.containers.socket_ifname,
        plain_scripts=policy.moves.plain_scripts,
        restart_plain_max_s=policy.moves.restart_plain_max_s,
        gpu_type=options.gpu_type or _row_gpu_type(picked, options.partition, shape.gpus_per_node),
        site_paths=policy.site,
        exports=read_exports(options.export), site_env=policy.containers.environment, venv=options.venv,
        partition_images=policy.containers.partition_images_for(named_image, os.environ),
    )
    plan = plan_job(request, settings, client)
    for warning in plan.warnings:
        click.echo(f"dlsub: warning: {warning}", err=True)
    for note in plan.notes:
        click.echo(f"dlsub: note: {note}", err=True)
    extra_env = dict(picked.env) if picked is not None else {}
    if options.target_loss is not None:
        extra_env[ENV_TARGET_LOSS] = repr(float(options.target_loss))
    plan = with_env(plan, extra_env)
    if options.dry_run:
        click.echo(plan.script_text, nl=False)
        click.echo(f"# dlsub: would submit to partition {plan.choice.partition}: {plan.choice.reason}", err=True)
        return
    check_budget(policy, client, getpass.getuser(),
                 extra_for(policy, plan.choice.partition, request.nodes, request.time_limit_min,
                           request.gpus_per_node * request.nodes, plan.batch.gpu_type))
    submitted = submit_plan(plan, settings, client, store, agent_user=policy.agent_user)
    for warning in submitted.warnings:
        click.echo(f"dlsub: warning: {warning}", err=True)
    record = submitted.record
    if options.as_json:
        click.echo(json.dumps({"id": record.id, "slurm_job_id": record.slurm_job_id,
                               "partition": record.partition, "job_dir": record.job_dir,
                               "mode": plan.mode, "nodes": record.nodes, "max_nodes": record.max_nodes,
                               "gpus_per_node": record.gpus_per_node, "worker_array_id": record.worker_array_id,
                               "worker_gpus": record.gpus_per_worker, "mounts": record.mounts,
                               "ideal_partition": plan.choice.ideal_partition or record.partition}))
    else:
        click.echo(
            f"dlsub: submitted job {record.id} (Slurm job {record.slurm_job_id}) to partition "
            f"{record.partition}: {plan.choice.reason}\n"
            + (f"dlsub: elastic, {record.elastic_range}: {record.worker_tasks} held worker task(s) in Slurm job "
               f"array {record.worker_array_id}, released by the agent when GPUs are idle\n"
               if record.max_nodes else "")
            + f"dlsub: follow it with `dlsub status {record.id}` and `dlsub logs -f {record.id}`"
        )


def _row_gpu_type(picked: FromEstimate | None, partition: str | None, gpus_per_node: int) -> str:
    """The kind of GPU an estimate's row asks for, unless the user's own --partition or --gpus 0 asks for
    something else (the user's options win, as with the rest of the row)."""
    if picked is None or not picked.gpu_type:
        return ""
    if partition != picked.partition or gpus_per_node < 1:
        click.echo(f"dlsub: note: the row was profiled on {picked.gpu_type} GPUs of {picked.partition}; "
                   f"with your --partition/--gpus this job asks for no kind", err=True)
        return ""
    return picked.gpu_type


_SENTINEL = "dlsub-directive-placeholder-script"
#: Options that choose what to submit, not how: the command line's alone.
NOT_DIRECTIVES = ("--from-estimate", "--choice")


def _parse_directive(ctx: click.Context, script: Path, directive: Directive) -> dict[str, Any]:
    """The options one ``#DLSUB`` line sets, checked; DirectiveError naming the line otherwise."""
    where = f"{script.name} line {directive.line}: {directive.text!r}"
    options = sorted(o for p in submit.params if isinstance(p, click.Option) for o in p.opts
                     if o.startswith("--") and o not in NOT_DIRECTIVES)
    for word in directive.words:
        if word in ("-h", "--help", "--version") or word.split("=", 1)[0] in NOT_DIRECTIVES:
            raise DirectiveError(f"{where}: {word} does not belong on a #DLSUB line (give it on the command "
                                 "line); remove it")
    try:
        sub = submit.make_context(ctx.info_name, [*directive.words, "--", _SENTINEL], parent=ctx.parent)
    except click.ClickException as exc:
        raise DirectiveError(f"{where}: {exc.format_message()}; fix or remove the line") from exc
    if str(sub.params["script"]) != _SENTINEL:
        stray = str(sub.params["script"])
        what = (f"unknown option {stray}" if stray.startswith("-") else f"{stray!r} is not an option")
        raise DirectiveError(f"{where}: {what}; #DLSUB lines hold dlsub's submit options only "
                             f"({', '.join(options)}); fix or remove the line")
    given = {name: value for name, value in sub.params.items()
             if name not in ("script", "args")
             and sub.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE}
    try:
        SubmitOptions.from_params(given).resources()
        # --gpus-step may sit on another line than the --gpus MIN:MAX it steps.
        SubmitOptions.from_params({k: v for k, v in given.items() if k != "gpus_step" or "gpus" in given}).shape()
        for read_only, name in ((True, "mount"), (False, "mount_rw")):
            for path in given.get(name, ()):
                resolve_mount(MountRequest(path, read_only), Path.cwd())
        parse_exports(given.get("export"))
        if given.get("venv") is not None:
            resolve_mount(MountRequest(given["venv"], True), Path.cwd())
    except (SubmitError, TimeSpecError, MountError, ExportError) as exc:
        raise DirectiveError(f"{where}: {exc}; fix or remove the line") from exc
    return given


def options_from_directives(ctx: click.Context, script: Path) -> dict[str, Any]:
    """Options from the script's ``#DLSUB`` lines that the command line left at their defaults."""
    from_script: dict[str, Any] = {}
    for directive in read_directives(script):
        given = _parse_directive(ctx, script, directive)
        for name in set(SubmitOptions.ADDED_UP) & set(given):  # every line's mounts count
            given[name] = (*from_script.get(name, ()), *given[name])
        from_script.update(given)  # a later line wins, as a later option does
    taken = {name: value for name, value in from_script.items()
             if name in SubmitOptions.ADDED_UP
             or ctx.get_parameter_source(name) != click.core.ParameterSource.COMMANDLINE}
    for name in set(SubmitOptions.ADDED_UP) & set(taken):  # the script's mounts, and the command line's besides
        taken[name] = (*taken[name], *ctx.params.get(name, ()))
    return taken


def _statuses(client: SlurmClient, store: JobStore, records: list[JobRecord]) -> list[JobStatus]:
    """Each record's status, from one read of Slurm for all; each state seen recorded in the store."""
    view = SlurmView.read(client, records)
    return [view.status(record, store) for record in records]


@main.command()
@click.argument("job", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object (one job) or list.")
@click.option("--all", "show_all", is_flag=True, help="Every job you ever submitted, however long ago it ended.")
@click.option("--since", "since", default=None, metavar="DATE",
              help="Jobs alive or ended since DATE (2026-11-20, 2026-11-20T09:30, or an age: 12h, 2d) "
                   "[default: the last day].")
@friendly_errors
def status(job: str | None, as_json: bool, show_all: bool, since: str | None) -> None:
    """Your dlsub jobs that are alive or ended in the last day: state, partition, step, loss, ETA, attempts.

    A named JOB is always shown, however old; --all lists every job.
    """
    from dlsub.job.status_window import DEFAULT_WINDOW_S, SinceError, parse_since

    if show_all and since is not None:
        fail("give --all or --since, not both", 2)
    try:
        edge = None if show_all or job else (parse_since(since, time.time()) if since is not None
                                              else time.time() - DEFAULT_WINDOW_S)
    except SinceError as exc:
        fail(str(exc), 2)
        return
    _, client, store = _context()
    records = [store.get(job)] if job else store.all()
    rows = _statuses(client, store, window_records(records, edge))
    if edge is not None:
        rows = window_rows(store, rows, edge)
    if as_json:
        payload: Any = rows[0].to_json() if job else [r.to_json() for r in rows]
        click.echo(json.dumps(payload, indent=2))
    elif rows:
        click.echo(render_table(rows, bars=progress_bars(rows) if sys.stdout.isatty() else None))
        if job and describe_mounts(rows[0]):
            click.echo(describe_mounts(rows[0]))
    elif edge is not None and store.all():
        click.echo("no dlsub jobs alive or ended in that time; `dlsub status --all` lists every job")
    else:
        click.echo("no dlsub jobs yet; submit one with `dlsub train.py`")


def window_records(records: list[JobRecord], edge: float | None) -> list[JobRecord]:
    """The records worth asking Slurm about: not those the store knows ended before ``edge``."""
    from dlsub.job.status_window import maybe_in_window

    return records if edge is None else [r for r in records if maybe_in_window(r, edge)]


def window_rows(store: JobStore, rows: list[JobStatus], edge: float) -> list[JobStatus]:
    """The rows of jobs alive, or ended at or after ``edge``."""
    from dlsub.job.status_window import ended_at, is_ended
    from dlsub.job_progress import read_attempts

    kept = []
    for row in rows:
        if is_ended(row.state) and ended_at(store.get(row.id), read_attempts(Path(row.job_dir))) < edge:
            continue
        kept.append(row)
    return kept


def progress_bars(rows: list[JobStatus]) -> list[str]:
    """A one-line bar per running job (its declared total), for a terminal."""
    from dlsub.job.status_window import fraction_done, progress_bar
    from dlsub.job_progress import summarize_progress

    return [progress_bar(fraction_done(summarize_progress(Path(r.job_dir)))) if r.state == JobState.RUNNING.value
            else "" for r in rows]


@main.command()
@click.argument("job")
@click.option("-f", "--follow", is_flag=True, help="Keep printing until the job ends.")
@click.option("--rank", type=click.IntRange(min=0), help="Only this process's lines (its global rank, as labelled).")
@click.option("--node", help="Only the lines of processes on this node (a job on several nodes).")
@friendly_errors
def logs(job: str, follow: bool, rank: int | None, node: str | None) -> None:
    """Print the job's output (all attempts).

    With several training processes each line starts with where it came
    from: [RANK]: on one node, [NODE/RANK]: on several, [dlsub]: for dlsub's
    launcher. --rank and --node keep one process's (or node's) lines; the
    lines that mark each attempt then go to stderr. An elastic job's workers
    write their own files (slurm-ARRAY_TASK.out): they are printed after the
    main job's, each under a line that names it; with -f, lines are printed
    whole as each file grows.
    """
    _, client, store = _context()
    record = store.get(job)
    files = OutputFiles(Path(record.job_dir), record.slurm_job_id, record.worker_array_id, record.worker_tasks)
    printer = LogPrinter(None if rank is None and node is None else Selection(rank, node), sys.stdout, sys.stderr,
                         whole_lines=record.worker_array_id is not None)
    last_check = 0.0
    while True:
        read = files.read_new()
        for source, chunk, first in read:
            if first and source.worker is not None:
                printer.chunk(f"dlsub: job {record.id} worker task {source.worker}'s output "
                              f"({source.path.name}):\n".encode(), source.path.name)
            printer.chunk(chunk, source.path.name)
            if not follow:
                printer.close(source.path.name)
        if not follow:
            if not read:  # no file exists yet
                click.echo(f"dlsub: no output yet for job {record.id} (it has not started)", err=True)
            else:
                printer.end(record.id)
            return
        now = time.monotonic()
        if now - last_check > 3:
            last_check = now
            (state,) = _statuses(client, store, [record])
            if JobState(state.state).terminal or state.state == JobState.UNKNOWN.value:
                time.sleep(0.5)
                if files.grew():
                    continue
                printer.end(record.id)
                click.echo(f"dlsub: job {record.id} is {state.state}", err=True)
                return
        time.sleep(0.5)


def _lookup(job: str) -> tuple[SlurmClient, JobStore, JobRecord, JobStatus]:
    """One of the user's jobs by handle, with its current status."""
    _, client, store = _context()
    record = store.get(job)
    (current,) = _statuses(client, store, [record])
    return client, store, record, current


@main.command()
@click.argument("job")
@friendly_errors
def cancel(job: str) -> None:
    """Cancel the job; its container is stopped and removed."""
    client, store, record, current = _lookup(job)
    if JobState(current.state).terminal:
        click.echo(f"dlsub: job {record.id} already ended ({current.state}); nothing to cancel")
        return
    store.update(record.id, cancelled_at=time.time())
    if record.slurm_job_id is not None:
        client.cancel(record.slurm_job_id)
    if record.worker_array_id is not None:
        client.cancel(record.worker_array_id)  # an elastic job's workers, running or held
    click.echo(f"dlsub: cancelled job {record.id} (Slurm job {record.slurm_job_id})")


@main.command()
@click.argument("job")
@friendly_errors
def requeue(job: str) -> None:
    """Checkpoint the running job now and continue it in a new Slurm attempt."""
    client, _, record, current = _lookup(job)
    if current.state != JobState.RUNNING.value or record.slurm_job_id is None:
        raise SubmitError(f"job {record.id} is {current.state}, not RUNNING; only a running job can be requeued")
    # The batch script's trap forwards SIGUSR1 into the container: checkpoint, exit 85, requeue.
    client.cancel(record.slurm_job_id, signal=CHECKPOINT_SIGNAL, batch=True)
    click.echo(f"dlsub: asked job {record.id} to checkpoint and continue in a new attempt")


if __name__ == "__main__":
    main()
