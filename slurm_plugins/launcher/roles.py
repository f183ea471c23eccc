"""The three roles of the batch launcher, and the dispatch to them (the package's docstring says what each
does). Each takes the job's settings, Slurm's view of the step, the environment it hands its children, and
the one Slurm client; each returns the launcher's exit status."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass, field

import dlsub
from dlsub import contract
from dlsub.job_progress import read_attempts
from dlsub.slurm_plugins.client import SlurmClient, SlurmError
from dlsub.slurm_plugins.launcher import policy
from dlsub.slurm_plugins.launcher.config import LaunchConfig, Role, SlurmStep, parse_args, short_hostname
from dlsub.slurm_plugins.launcher.container import (
    ContainerRun,
    Podman,
    RuntimeDirRefused,
    container_name,
    run_container,
)
from dlsub.slurm_plugins.launcher.gpus import gpu_types_in_gres, gres_of, slurm_gpu_ids
from dlsub.slurm_plugins.launcher.host import free_port, socket_env, socket_ifname
from dlsub.slurm_plugins.launcher.policy import MainEnding, Rendezvous, Stopped, WorkerEnding
from dlsub.slurm_plugins.launcher.records import (
    AttemptLog,
    read_first_line,
    read_head,
    say,
    write_rendezvous,
    write_requeue_count,
)
from dlsub.slurm_plugins.launcher.signals import STOP, Forwarder, LauncherExit


@dataclass
class Launch:
    """One run of the launcher: what it was told, what it hands its children, and what it holds."""

    config: LaunchConfig
    step: SlurmStep
    env: MutableMapping[str, str]
    slurm: SlurmClient
    podman: Podman
    forwarder: Forwarder
    #: The container to remove when the launcher ends (set once it may have started).
    started: list[str] = field(default_factory=list)
    #: A worker's main job (its Slurm id, from the rendezvous file).
    main_job: str = ""

    @property
    def log(self) -> AttemptLog:
        return AttemptLog(self.config.attempts_file, self.step, self.config.role)

    def export(self, **values: str) -> None:
        self.env.update(values)

    def slurm_call(self, call: Callable[[], None], what: str) -> bool:
        """A Slurm write (a requeue); whether it succeeded. Its error goes to the job's output, as scontrol's
        own would; a stop that arrives meanwhile waits for it."""
        with self.forwarder.deferring_exit():
            try:
                call()
                return True
            except (SlurmError, ValueError) as exc:
                detail = (exc.stderr or exc.stdout).strip() if isinstance(exc, SlurmError) else str(exc)
                say(detail or f"dlsub: {what} failed")
                return False


# ------------------------------------------------------------------ before the roles: the node's setup
def node_gpu_type(launch: Launch) -> str:
    """The type Slurm gives this node's GPUs, as its GRES names them (gpu:a100:4); "" for untyped GPUs or none.
    The attempt's start record keeps it and the training sees it as DLSUB_GPU_TYPE."""
    if not slurm_gpu_ids(launch.env):
        return ""
    return gpu_types_in_gres(gres_of(launch.slurm.node_show(launch.step.node_name)))


def join_rendezvous(launch: Launch) -> Rendezvous | None:
    """A worker's way into the group: the main job's rendezvous, if the main job is running (None: it is
    not, or the file is not one)."""
    found = policy.read_rendezvous(read_first_line(launch.config.rendezvous_file))
    if found is None or launch.slurm.job_state(int(found.main_job_id)) != "RUNNING":
        return None
    return found


def set_up(launch: Launch) -> int | None:
    """What every role does first; an exit status where the launcher ends here (a worker with no group)."""
    config, step = launch.config, launch.step
    launch.export(**{contract.ENV_JOB_ID: config.dlsub_id, contract.ENV_JOB_DIR: str(config.job_dir)})
    # The container's launcher records its exit status in the markers directory (podman can lose it).
    launch.export(**{contract.ENV_CONTAINER: container_name(config.dlsub_id, launch.env, step.node_index)})
    try:
        os.makedirs(config.markers_dir, exist_ok=True)
    except OSError as exc:
        say(f"dlsub: cannot make {config.markers_dir}: {exc.strerror}")
    # The gang's attempt (resume markers are the group's, not one node's) and its rendezvous. The main job
    # picks a free port on its first node and writes both for late joiners; its srun tasks inherit them.
    if config.role is Role.MAIN:
        launch.export(**{contract.ENV_ATTEMPT: step.attempt})
        if config.gang:
            endpoint = f"{socket.gethostname()}:{free_port()}"
            launch.export(**{contract.ENV_RDZV_ENDPOINT: endpoint})
            write_rendezvous(config.rendezvous_file, Rendezvous(endpoint, step.attempt, step.job_id))
    elif config.role is Role.WORKER:
        group = join_rendezvous(launch)
        if group is None:
            say(f"dlsub: worker {step.job_id}: the main job of {config.dlsub_id} is not running; back to the "
                "held pool")
            launch.slurm_call(lambda: launch.slurm.requeue_held(step.array_task), "scontrol requeuehold")
            return 0
        launch.export(**{contract.ENV_RDZV_ENDPOINT: group.endpoint, contract.ENV_ATTEMPT: group.attempt})
        launch.main_job = group.main_job_id
    launch.export(**socket_env(socket_ifname(config.socket_ifname, launch.env), launch.env))
    launch.export(**{contract.ENV_GPU_TYPE: node_gpu_type(launch)})
    if config.gpus_wanted > 0 and not slurm_gpu_ids(launch.env):
        launch.export(**{contract.ENV_WATCH_NO_GPU: "1"})  # a CPU attempt of a GPU job: torch's error is noted
    return None


def container_run(launch: Launch) -> ContainerRun:
    config, step = launch.config, launch.step
    # The c10d store lives with the main job's first node, which stays for the whole attempt: nodes that
    # leave (workers) never take the group down.
    is_host = int(config.role is not Role.WORKER and step.node_index == "0")
    name = launch.env[contract.ENV_CONTAINER]
    return ContainerRun(config.script, name, contract.exit_record(config.job_dir, name), config.library_dir,
                        f"is_host={is_host},join_timeout=600,last_call_timeout=3")


def this_container(launch: Launch) -> int:
    """Run this node's container; its exit status."""
    run = container_run(launch)
    return run_container(run, launch.env, launch.forwarder, launch.step.node_name,
                         on_started=lambda: launch.started.append(run.name))


def _start_fields(launch: Launch) -> list[tuple[str, str | int]]:
    # The installation's version that runs this attempt: after an upgrade in place, a job queued before it
    # runs its next attempt on the new one (docs/admin-guide.md, "Upgrade").
    return [("nodes", launch.step.nodelist), ("gpus", slurm_gpu_ids(launch.env)),
            ("gpu_type", launch.env.get(contract.ENV_GPU_TYPE, "")), ("dlsub_version", dlsub.__version__)]


def _stopped(launch: Launch, rc: int, needs_gpu: bool = False) -> Stopped:
    return Stopped(rc, launch.forwarder.signal, launch.forwarder.move_requested, needs_gpu,
                   superseded=rc == contract.SUPERSEDED_EXIT_CODE or _newer_attempt(launch) is not None)


def _newer_attempt(launch: Launch) -> str | None:
    """The attempt of this job that began after this one, if one has (fencing: contract.superseded_since)."""
    newer = contract.superseded_since(launch.step.attempt, read_attempts(launch.config.job_dir))
    return newer[0] if newer else None


def _requeue_held(launch: Launch) -> bool:
    """``scontrol requeuehold`` of this job, for the agent; whether it worked. The requeue ends this attempt,
    so nothing is left to forward."""
    launch.forwarder.stop_ends_launcher()
    return launch.slurm_call(lambda: launch.slurm.requeue_held(int(launch.step.job_id)), "scontrol requeuehold")


def _no_gpu_error(launch: Launch) -> str:
    """torch's no-GPU error a training process of this attempt died of (its first line), if the attempt has
    no GPUs while the job asked for them and was never sent back for them; "" otherwise."""
    config = launch.config
    if config.gpus_wanted <= 0 or slurm_gpu_ids(launch.env) or config.needs_gpu_sent_file.exists():
        return ""
    text = read_head(contract.no_gpu_error_marker(config.job_dir, launch.step.attempt), 512)
    return text.decode("utf-8", "replace").strip().splitlines()[0] if text and text.strip() else ""


# ------------------------------------------------------------------ node: one node of a gang
def run_node(launch: Launch) -> int:
    return this_container(launch)


# ------------------------------------------------------------------ worker: joins, leaves, returns to the pool
def run_worker(launch: Launch) -> int:
    step, env = launch.step, launch.env
    launch.forwarder.move_forwards = contract.LEAVE_SIGNAL  # to a worker the agent's MOVE_SIGNAL means: leave
    launch.log.start([*_start_fields(launch), ("main", launch.main_job)])
    say(f"dlsub: job {launch.config.dlsub_id} worker {step.job_id} on {step.node_name} joins the group of "
        f"attempt {env.get(contract.ENV_ATTEMPT, '')} at {env.get(contract.ENV_RDZV_ENDPOINT, '')}")
    run = _stopped(launch, this_container(launch))
    ending = policy.worker_ending(run)
    if ending is WorkerEnding.CANCELLED:
        launch.log.end(run.rc, signal=run.signal)
        return run.rc  # cancelled (the job, or this worker): Slurm ends it
    if ending is WorkerEnding.FINISHED:
        launch.log.end(0)
        return 0  # training finished with the group
    # Asked to leave (shrink), or the group stopped or broke: back to the held pool, whence the agent may
    # release it again.
    launch.log.end(run.rc, action=contract.ACTION_LEAVE)
    say(f"dlsub: worker {step.job_id} left the group (exit {run.rc}); requeued held, back in the pool")
    launch.forwarder.stop_ends_launcher()
    if not launch.slurm_call(lambda: launch.slurm.requeue_held(step.array_task), "scontrol requeuehold"):
        return run.rc
    return 0


# ------------------------------------------------------------------ main
def _srun(launch: Launch, argv: Sequence[str], env: MutableMapping[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, env=dict(env))


def run_parts(launch: Launch) -> int:
    """The attempt's containers: a heterogeneous job's two parts, a gang's nodes (srun), or this node's."""
    config, step, env = launch.config, launch.step, launch.env
    node_part = ["bash", str(config.job_script), Role.NODE.value]
    if config.het:
        # Both parts were allocated together (one heterogeneous job). The CPU component runs beside the
        # trainers and is stopped when they end.
        launch.export(**{contract.ENV_TRAINER_NODES: step.het_nodelists[0],
                         contract.ENV_CPU_NODES: step.het_nodelists[1]})
        # The batch step runs in the GPU component: its GPU variables are not the CPU part's.
        cpu_env = {k: v for k, v in env.items() if k not in ("CUDA_VISIBLE_DEVICES", "SLURM_JOB_GPUS",
                                                             "GPU_DEVICE_ORDINAL")}
        cpu_env[contract.ENV_ROLE] = contract.ROLE_CPU
        cpu_part = _srun(launch, ["srun", "--het-group=1", "--kill-on-bad-exit=0", *node_part], cpu_env)
        trainers_env = {**env, contract.ENV_ROLE: contract.ROLE_TRAINER}
        rc = launch.forwarder.run(lambda: _srun(launch, ["srun", "--het-group=0", "--kill-on-bad-exit=0",
                                                          *node_part], trainers_env), None)
        try:
            cpu_part.send_signal(STOP)
        except OSError:
            pass
        launch.forwarder.wait_or_signal(cpu_part)
        return rc
    if step.node_count > 1:
        # One task per node, each running this script's node part; a node whose task fails does not kill the
        # others (an elastic group re-forms). srun forwards each node's output a line at a time (its default;
        # never --unbuffered), so the nodes' labelled lines do not cut into each other.
        argv = ["srun", f"--nodes={step.nnodes}", f"--ntasks={step.nnodes}", "--ntasks-per-node=1",
                "--kill-on-bad-exit=0", *node_part]
        return launch.forwarder.run(lambda: _srun(launch, argv, env), None)
    return this_container(launch)


def end_workers(launch: Launch) -> None:
    """The job has ended for good: its worker array ends with it."""
    if launch.config.worker_array is not None:
        try:
            launch.slurm.cancel(launch.config.worker_array)
        except SlurmError:
            pass


def run_main(launch: Launch) -> int:
    config, step = launch.config, launch.step
    launch.log.start([*_start_fields(launch), ("nnodes", int(step.nnodes) if step.nnodes.isdigit() else step.nnodes)])
    say(f"dlsub: job {config.dlsub_id} attempt {step.attempt} on {step.nodelist or short_hostname()} "
        f"(partition {step.partition or '?'})")
    rc = run_parts(launch)
    # Read once: only the needs-gpu step below changes what it depends on, and then it returns or ends.
    no_gpu_error = _no_gpu_error(launch)
    failed: list[MainEnding] = []
    while True:
        # What happened is read afresh before each step, as the shell's traps changed it between them.
        run = _stopped(launch, rc, needs_gpu=bool(no_gpu_error))
        ending = policy.main_ending(run, failed)
        if ending is MainEnding.SUPERSEDED:
            launch.log.end(rc, action=contract.ACTION_SUPERSEDED)
            say(f"dlsub: attempt {_newer_attempt(launch) or 'a newer one'} of job {config.dlsub_id} began while "
                f"this attempt ({step.attempt}) ran: this one ends here and leaves Slurm job {step.job_id} to it")
            return rc
        if ending is MainEnding.MOVE:
            launch.log.end(rc, action=contract.ACTION_MOVE)
            say(f"dlsub: checkpointed for a move; requeueing Slurm job {step.job_id} held for the agent")
            if _requeue_held(launch):
                return 0
            say("dlsub: scontrol requeuehold failed; requeueing where it was")
        elif ending is MainEnding.NEEDS_GPU:
            config.needs_gpu_sent_file.parent.mkdir(parents=True, exist_ok=True)
            config.needs_gpu_sent_file.write_text(f"{step.attempt}\n")  # once per job: never sent back twice
            launch.log.end(rc, action=contract.ACTION_NEEDS_GPU)
            say(f"dlsub: the training needs a GPU ({no_gpu_error}) and this attempt on {step.partition or '?'} has "
                f"none; requeueing Slurm job {step.job_id} held for the agent to send it to wait for its "
                f"{config.gpus_wanted} GPU(s) (once)")
            if _requeue_held(launch):
                return 0
            say("dlsub: scontrol requeuehold failed; the job ends here")
        elif ending is MainEnding.CONTINUE:
            used = policy.requeues_used(read_head(config.requeue_count_file, 20))
            if not policy.may_continue(used, config.max_continuations):
                launch.log.end(rc, signal=run.signal)
                say(f"dlsub: the training checkpointed and asked to be resumed, but job {config.dlsub_id} used its "
                    f"{config.max_continuations} continuations (the site's time_limits.max_continuations); it "
                    f"ends here, and its checkpoint stays in {config.job_dir}")
                end_workers(launch)
                return rc
            write_requeue_count(config.requeue_count_file, used + 1)
            launch.log.end(rc, action=contract.ACTION_REQUEUE)
            say(f"dlsub: checkpointed; requeueing Slurm job {step.job_id} to resume (continuation {used + 1} of "
                f"{config.max_continuations})")
            launch.forwarder.stop_ends_launcher()
            if launch.slurm_call(lambda: launch.slurm.requeue(int(step.job_id)), "scontrol requeue"):
                return 0
            say(f"dlsub: scontrol requeue failed; the job ends here and its checkpoint stays in {config.job_dir}")
        else:
            launch.log.end(rc, signal=run.signal)
            # After a stop Slurm decides (a cancel ends the job, a preemption may requeue it): the workers
            # leave the broken group and wait held; the agent cancels them once the job has ended. Any other
            # end here is final.
            if policy.ends_workers(run):
                end_workers(launch)
            return rc
        failed.append(ending)


ROLES: dict[Role, Callable[[Launch], int]] = {Role.MAIN: run_main, Role.NODE: run_node, Role.WORKER: run_worker}


def run_role(launch: Launch) -> int:
    """Set up, run the role, and remove this node's container however the launcher ends (as the shell's EXIT
    trap did)."""
    code = 1
    try:
        code = _set_up_and_run(launch)
    finally:
        if _remove_containers(launch):
            code = 0
    return code


def _set_up_and_run(launch: Launch) -> int:
    try:
        early = set_up(launch)
        if early is not None:
            return early
        # Trapped from here, as the batch shell trapped them after its setup.
        launch.forwarder.install()
        return ROLES[launch.config.role](launch)
    except RuntimeDirRefused as refused:
        say(f"dlsub: error: {refused}")
        return 1
    except LauncherExit as stop:
        return stop.code


def _remove_containers(launch: Launch) -> bool:
    """Remove the containers this launcher started; whether a stop meanwhile ended the launcher (with 0)."""
    try:
        with launch.forwarder.deferring_exit():
            for name in launch.started:
                launch.podman.remove(name)
    except LauncherExit:
        return True
    return False


def main(argv: Sequence[str]) -> int:
    """The launcher as the batch script execs it: this process's environment, Slurm's real client."""
    config = parse_args(argv)
    env = dict(os.environ)
    launch = Launch(config, SlurmStep.from_env(env), env, SlurmClient(), Podman(env),
                    Forwarder(lambda name, container: Podman(env).kill(name, container)))
    return run_role(launch)
