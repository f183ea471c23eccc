"""Unit: the batch launcher (slurm_plugins/launcher/). Its pure parts (the requeue and continuation policy, the
rendezvous, GPUs, records) as functions; its roles in this process, with the fake Slurm behind the client's
``_run`` seam, a stand-in batch script whose ``container`` part plays the container, and a stand-in podman.
The rendered script under bash, with the launcher it execs, is tested in test_sbatch.py."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

import dlsub
from dlsub import contract
from dlsub.slurm_plugins.client import SlurmClient
from dlsub.slurm_plugins.fake import FakeJob, FakeSlurm
from dlsub.slurm_plugins.fake import testbed_cluster as cluster
from dlsub.slurm_plugins.launcher import gpus, host, policy, records
from dlsub.slurm_plugins.launcher.config import LaunchConfig, Role, SlurmStep, parse_args
from dlsub.slurm_plugins.launcher.container import Podman
from dlsub.slurm_plugins.launcher.policy import MainEnding, Stopped, WorkerEnding
from dlsub.slurm_plugins.launcher.roles import Launch, run_role
from dlsub.slurm_plugins.launcher.signals import Forwarder

RESUME = contract.RESUME_EXIT_CODE


# ---------------------------------------------------------------- the policy (pure)
@pytest.mark.parametrize(("run", "failed", "expected"), [
    (Stopped(0), (), MainEnding.END),
    (Stopped(3, "USR1"), (), MainEnding.END),
    (Stopped(RESUME, "USR1"), (), MainEnding.CONTINUE),
    (Stopped(RESUME, "USR1", move_requested=True), (), MainEnding.MOVE),
    (Stopped(RESUME, "USR1", move_requested=True), (MainEnding.MOVE,), MainEnding.CONTINUE),
    (Stopped(RESUME, "USR1", move_requested=True), (MainEnding.MOVE, MainEnding.CONTINUE), MainEnding.END),
    (Stopped(RESUME, "TERM", move_requested=True), (), MainEnding.END),  # a stop: Slurm decides
    (Stopped(0, "USR1", move_requested=True), (), MainEnding.END),  # ended before it checkpointed
])
def test_what_the_main_job_tries_after_its_container(run: Stopped, failed: tuple[MainEnding, ...],
                                                      expected: MainEnding) -> None:
    """Unit (pure): a move only after a checkpoint for it, a continuation after any other, nothing after a
    stop; a failed requeue falls through to the next."""
    assert policy.main_ending(run, failed) is expected


def test_continuations_are_bounded_and_a_stop_leaves_the_workers_to_the_agent() -> None:
    """Unit (pure)."""
    assert policy.may_continue(0, 1) and not policy.may_continue(1, 1) and not policy.may_continue(0, 0)
    assert policy.ends_workers(Stopped(0)) and policy.ends_workers(Stopped(RESUME, "USR1"))
    assert not policy.ends_workers(Stopped(143, "TERM"))


@pytest.mark.parametrize(("run", "expected"), [
    (Stopped(0), WorkerEnding.FINISHED),
    (Stopped(RESUME), WorkerEnding.LEAVE),  # the group re-formed without it
    (Stopped(1), WorkerEnding.LEAVE),
    (Stopped(0, "USR1", move_requested=True), WorkerEnding.LEAVE),  # asked to leave
    (Stopped(0, "USR1"), WorkerEnding.LEAVE),
    (Stopped(143, "TERM"), WorkerEnding.CANCELLED),
])
def test_a_worker_ends_only_when_its_group_finished(run: Stopped, expected: WorkerEnding) -> None:
    """Unit (pure)."""
    assert policy.worker_ending(run) is expected


@pytest.mark.parametrize(("head", "used"), [
    (None, 0), (b"3\n", 3), (b" 1 2\n", 12), (b"", 0), (b"$(touch x) 99x", 0), (b"-1", 0), (b"\xd9\xa3", 0)])
def test_the_requeue_count_is_digits_or_zero(head: bytes | None, used: int) -> None:
    """Unit (pure): the count file is the user's own."""
    assert policy.requeues_used(head) == used


@pytest.mark.parametrize(("rc", "record", "status"), [
    (127, b"85\n", 85), (140, b"0\n", 0), (125, b"85; rm -rf ~", None), (127, None, None), (3, b"85\n", None),
    (1, b"0\n", None)])
def test_the_launchers_record_counts_only_where_podman_may_have_lost_the_status(
        rc: int, record: bytes | None, status: int | None) -> None:
    """Unit (pure)."""
    assert policy.recorded_status(rc, record) == status


@pytest.mark.parametrize(("line", "valid"), [
    ("gpu1:29500 900-0 900\n", True),
    ("  gpu1:29500\t900-0   900  \n", True),  # as bash's `read` splits it
    ("gpu1:29500 900-0 900 extra\n", False),  # the last field takes the rest of the line
    ("gpu1:29500 900-0\n", False),
    ("gpu 1:29500 900-0 900\n", False),
    ("gpu1:29500 900-0 9x\n", False),
    ("", False),
])
def test_a_workers_rendezvous_is_read_word_by_word(line: str, valid: bool) -> None:
    """Unit (pure): the main job's rendezvous file, hostile ground to a worker as to anyone."""
    found = policy.read_rendezvous(line)
    assert (found is not None) == valid
    if found is not None:
        assert found.line() == "gpu1:29500 900-0 900\n"


# ---------------------------------------------------------------- GPUs, the node, records (pure, or real files)
def test_slurms_gpu_ids_and_types() -> None:
    """Unit (pure)."""
    assert gpus.slurm_gpu_ids({"SLURM_STEP_GPUS": "1,3", "SLURM_JOB_GPUS": "0,1,2,3"}) == "1,3"
    assert gpus.slurm_gpu_ids({"SLURM_STEP_GPUS": "", "SLURM_JOB_GPUS": "2"}) == "2"
    assert gpus.slurm_gpu_ids({"SLURM_JOB_GPUS": "3;x", "CUDA_VISIBLE_DEVICES": "3"}) == "3"
    assert gpus.split_list("a,b,") == ["a", "b"] and gpus.split_list("a,b,,") == ["a", "b", ""]
    assert gpus.split_list("") == [] and gpus.split_list(",a") == ["", "a"]
    line = "NodeName=gpu7 Arch=x86_64 Gres=gpu:a100:2(S:0),gpu:v100:2(S:1),gpu:a100:1 State=IDLE\n"
    assert gpus.gpu_types_in_gres(gpus.gres_of(line)) == "a100,v100"
    assert gpus.gpu_types_in_gres("gpu:4") == "" and gpus.gpu_types_in_gres('gpu:a"1:4') == ""
    assert gpus.gres_of("NodeName=cpu1 State=IDLE\n") == ""


def test_cdi_devices_come_from_slurms_ids_and_the_container_counts_from_zero(tmp_path: Path) -> None:
    """Unit (pure, and a CDI spec directory of real files)."""
    env = {"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_JOB_GPUS": "2,3"}
    assert gpus.gpu_setup(env, lambda: True) == gpus.GpuSetup(
        2, ("--device", "nvidia.com/gpu=2", "--device", "nvidia.com/gpu=3"), "0,1")
    assert gpus.gpu_setup(env, lambda: False) == gpus.GpuSetup(2, (), "0,1")
    assert gpus.gpu_setup({}, lambda: pytest.fail("no GPUs: no CDI look-up")) == gpus.GpuSetup()
    (tmp_path / "other.yaml").write_text("kind: vendor.com/fpga\n")
    (tmp_path / ".hidden.yaml").write_text("kind: nvidia.com/gpu\n")  # as the shell's glob: not read
    assert not gpus.node_has_cdi_gpus([str(tmp_path), str(tmp_path / "absent")])
    (tmp_path / "nvidia.json").write_text('{"kind": "nvidia.com/gpu"}')
    assert gpus.node_has_cdi_gpus([str(tmp_path)])


def test_the_nodes_own_interface_and_the_users_own_names() -> None:
    """Unit (pure)."""
    ip = ("1: lo    inet 127.0.0.1/8 scope host lo\n3: ib0    inet 10.9.8.7/24 brd 10.9.8.255 scope global ib0\n"
          "4: eth0    inet 192.168.1.7/24 scope global eth0\n")
    assert host.interface_of(host.first_address("10.9.8.7      STREAM node7\n10.9.8.7 DGRAM\n"), ip) == "ib0"
    assert host.interface_of("10.0.0.1", ip) == "" and host.first_address("") == ""
    assert host.socket_env("ib0", {"GLOO_SOCKET_IFNAME": "lo"}) == {"GLOO_SOCKET_IFNAME": "lo",
                                                                      "NCCL_SOCKET_IFNAME": "ib0"}
    assert host.socket_env("", {}) == {}
    assert host.socket_ifname("eth0,eth1", {}) == "eth0,eth1"


def test_an_attempt_record_is_the_batch_shells_line() -> None:
    """Unit (pure): byte for byte what the batch shell's printf wrote, nanoseconds included."""
    step = SlurmStep(job_id="77", restart="2", node_name="gpu7", partition="gpu")
    line = records.attempt_line(contract.EVENT_END, step, Role.MAIN, [("rc", 85), ("action", "move")],
                                now=records.timestamp(1_700_000_000_012_345_678))
    assert line == ('{"event":"end","time":1700000000.012345678,"slurm_job_id":77,"restart":2,"node":"gpu7",'
                    '"partition":"gpu","role":"main","rc":85,"action":"move"}\n')
    assert json.loads(line)["time"] == pytest.approx(1_700_000_000.012345678)


def test_the_command_line_is_typed_and_strict(tmp_path: Path) -> None:
    """Unit (pure)."""
    config = parse_args(["worker", "--script", "job.sbatch", "--dlsub-id", "0123abcd", "--job-dir", str(tmp_path),
                         "--library-dir", "/lib/dlsub", "--gang", "1", "--worker-array", "", "--max-continuations",
                         "3"])
    assert config.role is Role.WORKER and config.gang and config.worker_array is None
    assert config.script.is_absolute() and config.rendezvous_file == tmp_path / "attempts" / "rendezvous"
    with pytest.raises(SystemExit):
        parse_args(["main", "--script", "x", "--dlsub-id", "i", "--job-dir", "d", "--library-dir", "l",
                    "--worker-array", "1; id"])


# ---------------------------------------------------------------- the roles, in this process
MAIN_ID, ARRAY_ID, TASK_ID = 77, 950, 951


class World:
    """A job directory, the fake Slurm with the main job running (and an elastic job's worker task), a
    stand-in podman on PATH that records its calls, and dlsub's package where the container mounts it."""

    def __init__(self, tmp_path: Path, *, worker_array: bool = False) -> None:
        self.tmp = tmp_path
        self.job_dir = tmp_path / "jobs" / "0123abcd"
        self.job_dir.mkdir(parents=True)
        self.fake: FakeSlurm = cluster()
        self.fake.jobs[MAIN_ID] = FakeJob(MAIN_ID, "job.sbatch", {}, state="RUNNING", nodes="cpu1")
        if worker_array:
            for task, job_id in ((0, ARRAY_ID), (1, TASK_ID)):
                self.fake.jobs[job_id] = FakeJob(job_id, "worker.sbatch", {}, state="RUNNING", nodes="cpu2",
                                                 array_job_id=ARRAY_ID, array_task_id=task)
        self.library = tmp_path / "site-packages" / "dlsub"
        (self.library / "checkpointing").mkdir(parents=True)
        (self.library / "checkpointing" / "launch.py").touch()
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        self.podman_log = tmp_path / "podman.jsonl"
        _executable(bin_dir / "podman", f"#!/bin/bash\npython3 -c 'import json,sys; print(json.dumps("
                                        f"sys.argv[1:]))' \"$@\" >> {self.podman_log}\n")
        (tmp_path / "xdg").mkdir(mode=0o700)
        self.env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": str(MAIN_ID),
                    "SLURM_RESTART_COUNT": "0", "SLURM_JOB_PARTITION": "cpu", "SLURMD_NODENAME": "cpu1",
                    "SLURM_JOB_NODELIST": "cpu1", "XDG_RUNTIME_DIR": str(tmp_path / "xdg"), "HOME": str(tmp_path)}

    def run(self, role: Role, container: str, *, max_continuations: int = 20, env: dict[str, str] | None = None,
            slurm: FakeSlurm | None = None, gpus_wanted: int = 0) -> int:
        """The launcher in ``role``; ``container``: bash run as this node's container (its status counts)."""
        script = self.tmp / "job.sbatch"
        _executable(script, f'#!/bin/bash\n[ "$1" = container ] || exit 99\necho "$@" > {self.tmp / "args"}\n'
                            f"{container}\n")
        config = LaunchConfig(role, script, "0123abcd", self.job_dir, self.library,
                              worker_array=ARRAY_ID if role is Role.MAIN and self.fake.jobs.get(ARRAY_ID) else None,
                              max_continuations=max_continuations, socket_ifname="lo", gpus_wanted=gpus_wanted)
        child_env = {**self.env, **(env or {})}
        podman = Podman(child_env)
        launch = Launch(config, SlurmStep.from_env(child_env), child_env, SlurmClient(slurm or self.fake), podman,
                        Forwarder(podman.kill))
        try:
            return run_role(launch)
        finally:
            launch.forwarder.restore()

    def attempts(self) -> list[dict[str, object]]:
        path = self.job_dir / contract.ATTEMPTS_FILE
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def podman_calls(self) -> list[list[str]]:
        return [json.loads(line) for line in self.podman_log.read_text().splitlines()] if self.podman_log.exists() \
            else []

    def slurm_calls(self, command: str) -> list[list[str]]:
        return [c for c in self.fake.calls if c[:2] == ["scontrol", command] or c[:1] == [command]]


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


CONTAINER = "dlsub-0123abcd-77-0-trainer0"
# Asks for a move (the agent's signal to the batch step), then checkpoints when the launcher forwards USR1.
MOVES = "trap 'exit 85' USR1\nkill -s USR2 $PPID\nsleep 20 &\nwait $!\nexit 0"


def test_main_requeues_a_checkpointed_attempt_and_counts_it(tmp_path: Path) -> None:
    """Unit with the fake Slurm: exit 85 requeues the job (scontrol requeue), counted in the job directory;
    the attempt's records say so, and its container is removed."""
    world = World(tmp_path)
    assert world.run(Role.MAIN, f"exit {RESUME}") == 0
    assert world.fake.jobs[MAIN_ID].restart_cnt == 1 and world.slurm_calls("requeue") == [
        ["scontrol", "requeue", str(MAIN_ID)]]
    assert (world.job_dir / contract.MARKERS_DIR / contract.REQUEUE_COUNT_FILE).read_text() == "1\n"
    start, end = world.attempts()
    assert start["event"] == "start" and start["nnodes"] == 1 and start["gpus"] == "" and start["role"] == "main"
    assert start["dlsub_version"] == dlsub.__version__, "which installation ran the attempt"
    assert end == {**end, "event": "end", "rc": RESUME, "action": contract.ACTION_REQUEUE}
    assert world.podman_calls() == [["rm", "-f", "-t", "5", "--ignore", CONTAINER]]
    args = (tmp_path / "args").read_text().split()
    assert args == ["container", "1", "is_host=1,join_timeout=600,last_call_timeout=3"]


def test_main_past_its_continuations_ends_with_the_resume_code_and_its_workers(tmp_path: Path) -> None:
    """Unit with the fake Slurm: the bound reached, the job ends with 85 and cancels its worker array."""
    world = World(tmp_path, worker_array=True)
    (world.job_dir / contract.MARKERS_DIR).mkdir()
    (world.job_dir / contract.MARKERS_DIR / contract.REQUEUE_COUNT_FILE).write_text("2\n")
    assert world.run(Role.MAIN, f"exit {RESUME}", max_continuations=2) == RESUME
    assert not world.slurm_calls("requeue") and world.fake.jobs[TASK_ID].state == "CANCELLED"
    assert world.attempts()[-1] == {**world.attempts()[-1], "rc": RESUME, "signal": ""}


def test_main_moves_held_when_the_agent_asks_and_the_training_checkpoints(tmp_path: Path) -> None:
    """Unit with the fake Slurm: the move signal is forwarded as USR1 to the container's process and said to
    the container by podman; its checkpoint (85) requeues the job held, uncounted."""
    world = World(tmp_path)
    assert world.run(Role.MAIN, MOVES, max_continuations=0) == 0
    job = world.fake.jobs[MAIN_ID]
    assert job.state == "PENDING" and job.reason == contract.HELD_BY_USER
    assert ["kill", "--signal", "USR1", CONTAINER] in world.podman_calls()
    assert world.attempts()[-1] == {**world.attempts()[-1], "rc": RESUME, "action": contract.ACTION_MOVE}
    assert not (world.job_dir / contract.MARKERS_DIR / contract.REQUEUE_COUNT_FILE).exists()


def dies_needing_a_gpu(world: World, attempt: str = f"{MAIN_ID}-0") -> str:
    """A container whose training dies of torch's no-GPU error, as dlsub's entry point records it; it notes
    whether the launcher told it to watch for that error."""
    marker = contract.no_gpu_error_marker(world.job_dir, attempt)
    return (f'echo "${{{contract.ENV_WATCH_NO_GPU}:-}}" > {world.tmp / "watch"}\n'
            f"echo 'AssertionError: Torch not compiled with CUDA enabled' > {marker}\nexit 1")


def test_a_cpu_attempt_of_a_gpu_job_dying_for_want_of_a_gpu_is_requeued_held_once(tmp_path: Path) -> None:
    """Unit with the fake Slurm: on CPUs (no GPU ids) a job that asked for GPUs and died of torch's no-GPU
    error is requeued held for the agent, saying needs-gpu; its next attempt dying so ends the job."""
    world = World(tmp_path, worker_array=True)
    assert world.run(Role.MAIN, dies_needing_a_gpu(world), gpus_wanted=1) == 0
    job = world.fake.jobs[MAIN_ID]
    assert job.state == "PENDING" and job.reason == contract.HELD_BY_USER and job.restart_cnt == 1
    assert (tmp_path / "watch").read_text() == "1\n", "the container was told to watch for the error"
    assert world.attempts()[-1] == {**world.attempts()[-1], "rc": 1, "action": contract.ACTION_NEEDS_GPU}
    assert world.fake.jobs[TASK_ID].state == "RUNNING", "its workers wait, as for a move"
    # Released onto CPUs again (by hand, say) and dying the same way: never sent back twice.
    job.state, job.reason = "RUNNING", "None"
    assert world.run(Role.MAIN, dies_needing_a_gpu(world, f"{MAIN_ID}-1"), gpus_wanted=1,
                     env={"SLURM_RESTART_COUNT": "1"}) == 1
    assert job.state == "RUNNING" and world.attempts()[-1].get("action") is None


@pytest.mark.parametrize(("gpus_wanted", "env", "container"), [
    (0, {}, "marker"),  # a job that asked for no GPUs
    (1, {"SLURM_JOB_GPUS": "0"}, "marker"),  # an attempt with GPUs: the error is the script's own
    (1, {}, "exit 1"),  # another error
])
def test_nothing_else_is_sent_back_for_a_gpu(tmp_path: Path, gpus_wanted: int, env: dict[str, str],
                                             container: str) -> None:
    """Unit with the fake Slurm: the attempt ends with the container's status, and no requeue."""
    world = World(tmp_path)
    script = dies_needing_a_gpu(world) if container == "marker" else container
    assert world.run(Role.MAIN, script, gpus_wanted=gpus_wanted, env=env) == 1
    assert not world.slurm_calls("requeuehold") and world.attempts()[-1].get("action") is None
    if (tmp_path / "watch").exists():
        assert (tmp_path / "watch").read_text() == "\n", "told to watch only on a CPU attempt of a GPU job"


def test_a_failed_move_requeues_where_it_was(tmp_path: Path) -> None:
    """Unit with the fake Slurm: requeuehold refused, the job resumes where it is (counted as a continuation)."""
    world = World(tmp_path)
    world.fake.jobs[MAIN_ID].state = "COMPLETING"  # requeuehold refuses a job that is not running
    assert world.run(Role.MAIN, MOVES) == 0
    assert [c[1] for c in world.fake.calls if c[0] == "scontrol"] == ["requeuehold", "requeue"]
    assert [a.get("action") for a in world.attempts()] == [None, contract.ACTION_MOVE, contract.ACTION_REQUEUE]


@pytest.mark.parametrize("requeue_works", [True, False])
def test_a_stop_during_the_requeue_ends_the_launcher_with_0_once_the_call_returns(
        tmp_path: Path, requeue_works: bool) -> None:
    """Unit with the fake Slurm, whose requeuehold sends the launcher SIGTERM (as Slurm does when it requeues
    a job): the launcher ends with 0 after the call, without falling through to a continuation."""
    world = World(tmp_path)
    if not requeue_works:
        world.fake.jobs[MAIN_ID].state = "COMPLETING"

    def slurm(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        result = world.fake(argv)
        if list(argv[:2]) == ["scontrol", "requeuehold"]:
            os.kill(os.getpid(), signal.SIGTERM)
        return result

    assert world.run(Role.MAIN, MOVES, slurm=slurm) == 0  # type: ignore[arg-type]
    assert not world.slurm_calls("requeue")
    assert world.podman_calls()[-1][0] == "rm", "its container is removed all the same"


def test_a_stop_is_forwarded_and_leaves_the_workers_waiting(tmp_path: Path) -> None:
    """Unit with the fake Slurm: scancel's SIGTERM reaches the container; its status ends the attempt, and
    the worker array is left for the agent (a preemption may requeue the job)."""
    world = World(tmp_path, worker_array=True)
    stops = "trap 'exit 143' TERM\nkill -s TERM $PPID\nsleep 20 &\nwait $!\nexit 0"
    assert world.run(Role.MAIN, stops) == 143
    assert world.attempts()[-1] == {**world.attempts()[-1], "rc": 143, "signal": "TERM"}
    assert world.fake.jobs[TASK_ID].state == "RUNNING" and not world.slurm_calls("scancel")
    assert ["kill", "--signal", "TERM", CONTAINER] in world.podman_calls()


def test_a_node_of_a_gang_runs_its_container_and_says_its_status(tmp_path: Path) -> None:
    """Unit with the fake Slurm: the node role runs its container, no more (no records, no Slurm call)."""
    world = World(tmp_path)
    assert world.run(Role.NODE, "exit 3", env={"SLURM_NODEID": "1"}) == 3
    assert world.attempts() == [] and world.fake.calls == []
    assert world.podman_calls() == [["rm", "-f", "-t", "5", "--ignore", "dlsub-0123abcd-77-0-trainer1"]]
    assert (tmp_path / "args").read_text().split()[2].startswith("is_host=0,"), "the store lives with node 0"


def _worker_env(world: World) -> dict[str, str]:
    markers = world.job_dir / contract.MARKERS_DIR
    markers.mkdir(exist_ok=True)
    (markers / contract.RENDEZVOUS_FILE).write_text(f"cpu1:29500 {MAIN_ID}-0 {MAIN_ID}\n")
    return {"SLURM_JOB_ID": str(TASK_ID), "SLURM_ARRAY_JOB_ID": str(ARRAY_ID), "SLURM_ARRAY_TASK_ID": "1",
            "SLURMD_NODENAME": "cpu2"}


@pytest.mark.parametrize(("launcher_rc", "leaves"), [(0, False), (RESUME, True), (1, True)])
def test_a_worker_joins_the_running_group_and_leaves_back_to_the_held_pool(
        tmp_path: Path, launcher_rc: int, leaves: bool) -> None:
    """Unit with the fake Slurm: a worker reads the main job's rendezvous, checks the main job runs, joins
    (its records name the main job); it ends with the group's finish, else requeues its own task held."""
    world = World(tmp_path, worker_array=True)
    env = _worker_env(world)
    check = f'[ "$DLSUB_RDZV_ENDPOINT $DLSUB_ATTEMPT" = "cpu1:29500 {MAIN_ID}-0" ] || exit 7\nexit {launcher_rc}'
    assert world.run(Role.WORKER, check, env=env) == 0
    assert world.fake.calls[0] == ["squeue", "-h", "-j", str(MAIN_ID), "-o", "%T"]
    assert (world.slurm_calls("requeuehold") == [["scontrol", "requeuehold", f"{ARRAY_ID}_1"]]) == leaves
    assert (world.fake.jobs[TASK_ID].reason == contract.HELD_BY_USER) == leaves
    start, end = world.attempts()
    assert start["main"] == str(MAIN_ID) and start["role"] == "worker" and start["slurm_job_id"] == TASK_ID
    assert end.get("action") == (contract.ACTION_LEAVE if leaves else None)
    assert (tmp_path / "args").read_text().split()[2].startswith("is_host=0,"), "a worker never hosts the store"


def test_a_worker_whose_main_job_is_not_running_goes_back_to_the_pool_untried(tmp_path: Path) -> None:
    """Unit with the fake Slurm: no container, no record; its own task requeued held."""
    world = World(tmp_path, worker_array=True)
    env = _worker_env(world)
    world.fake.jobs[MAIN_ID].state = "PENDING"
    assert world.run(Role.WORKER, "exit 0", env=env) == 0
    assert world.slurm_calls("requeuehold") == [["scontrol", "requeuehold", f"{ARRAY_ID}_1"]]
    assert world.attempts() == [] and not (tmp_path / "args").exists() and world.podman_calls() == []


def test_the_gpu_type_is_slurms_and_reaches_the_container_and_the_record(tmp_path: Path) -> None:
    """Unit with the fake Slurm (`scontrol -o show node`): a node with GPUs asks Slurm their type."""
    world = World(tmp_path)
    world.fake.nodes["gpu1"].gpu_type = "a100"
    seen = tmp_path / "seen"
    env = {"SLURMD_NODENAME": "gpu1", "CUDA_VISIBLE_DEVICES": "0,1", "SLURM_JOB_GPUS": "0,1"}
    assert world.run(Role.MAIN, f'echo "$DLSUB_GPU_TYPE" > {seen}\nexit 0', env=env) == 0
    assert seen.read_text() == "a100\n" and world.attempts()[0]["gpu_type"] == "a100"
    assert world.attempts()[0]["gpus"] == "0,1"
    assert (tmp_path / "args").read_text().split()[1] == "2", "one process per GPU"


def test_a_superseded_main_attempt_touches_nothing_in_slurm(tmp_path: Path) -> None:
    """Unit with the fake Slurm (fencing, issue 53): while this attempt ran, a newer one of the job started (its
    start record, as a cut-off node's attempt finds when the link returns); the training then checkpointed and
    asked to be resumed. The Slurm job is the newer attempt's: no requeue, its workers left running, and the
    attempt's end says it was superseded. The container launcher's own exit 86 is read so too."""
    for container in (f"exit {RESUME}", f"exit {contract.SUPERSEDED_EXIT_CODE}"):
        world = World(tmp_path / container.split()[1], worker_array=True)
        newer = {"event": "start", "time": 2e9, "slurm_job_id": MAIN_ID, "restart": 1, "node": "cpu2",
                 "partition": "cpu", "role": "main"}
        script = f"echo '{json.dumps(newer)}' >> {world.job_dir / contract.ATTEMPTS_FILE}\n{container}"
        code = world.run(Role.MAIN, script if container.endswith(str(RESUME)) else container)
        assert code == int(container.split()[1])
        assert not world.slurm_calls("requeue") and not world.slurm_calls("scancel")
        assert world.fake.jobs[TASK_ID].state == "RUNNING" and world.fake.jobs[MAIN_ID].restart_cnt == 0
        assert world.attempts()[-1] == {**world.attempts()[-1], "event": "end", "action": contract.ACTION_SUPERSEDED}


@pytest.mark.parametrize(("run", "expected"), [
    (Stopped(RESUME, "USR1", move_requested=True, superseded=True), MainEnding.SUPERSEDED),
    (Stopped(0, superseded=True), MainEnding.SUPERSEDED),
    (Stopped(RESUME, "USR1", move_requested=True), MainEnding.MOVE),
])
def test_a_superseded_attempt_ends_before_anything_else_is_tried(run: Stopped, expected: MainEnding) -> None:
    """Unit (pure)."""
    assert policy.main_ending(run) is expected
