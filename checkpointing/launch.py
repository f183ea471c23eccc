"""The container's first process: runs torchrun and turns stop signals into checkpoints.

``python3 -P -m dlsub.checkpointing.launch [--grace S] -- torchrun ... train.py ARGS``

Why it exists: the batch script forwards SIGUSR1 (time limit near,
``dlsub requeue``) and SIGTERM (scancel, preemption) into the container, but
torchrun itself dies on SIGUSR1 and answers SIGTERM by killing its workers.
This launcher, PID 1 of the container, keeps torchrun alive and delivers the
stop request to the training processes themselves, once each has installed
dlsub's handler (``checkpointing.init()``); they checkpoint and leave with
:data:`RESUME_EXIT_CODE`. If they have not left ``--grace`` seconds after a
SIGTERM, torchrun gets the SIGTERM. A signal nothing handles has its default
effect at once, as under plain sbatch: on SIGTERM with no training process
handling dlsub's signals, torchrun gets the SIGTERM immediately; a SIGUSR1
nobody handles is logged and otherwise ignored (the training runs on). Its exit code is the training's, or
RESUME_EXIT_CODE when an attempt asked to be resumed. It also reaps orphans,
as a container's PID 1 must. Standard library only: any image with Python works.

Fencing (issue 53): every ``FENCE_CHECK_S`` it looks whether a newer attempt of the job has begun (the
attempts file, :mod:`dlsub.checkpointing.fence`); if one has, this attempt's node was cut off or lost and
the job runs elsewhere now, so it kills the training at once (no checkpoint: it would not be the job's) and
exits with SUPERSEDED_EXIT_CODE.

With ``--nproc-per-node`` above 1, or in a gang (``$DLSUB_NNODES``), the
job's output is labelled: every line of a training process whole and
starting with its rank (``[rank]:``, ``[node/rank]:`` in a gang), the
launcher's and torchrun's with ``[dlsub]:`` (:mod:`dlsub.checkpointing.output_mux`;
torchrun runs each process through :mod:`dlsub.checkpointing.rank_output`).
A single process's output is left as it is.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from dlsub.checkpointing import fence
from dlsub.checkpointing.output_mux import OutputMux
from dlsub.checkpointing.run import STOP_PEER_RESTART, finished_in, resume_marker
from dlsub.contract import (
    CONTAINER_NAME_RE,
    ENV_ATTEMPT,
    ENV_CONTAINER,
    ENV_JOB_DIR,
    ENV_JOIN_IN_PROCESS,
    ENV_NNODES,
    ENV_OUTPUT_SOCKET,
    ENV_SAFE_PATH_SET,
    ENV_WATCH_NO_GPU,
    LEAVE_SIGNAL,
    RESUME_EXIT_CODE,
    STOP_SIGNUM_NAME,
    SUPERSEDED_EXIT_CODE,
    exit_record,
    reform_marker,
)

#: The leave request (contract.LEAVE_SIGNAL) as the launcher receives it: handed on as it is to a training that
#: re-forms in process (it catches it), as a checkpoint request (SIGUSR1) to any other.
LEAVE_SIGNUM_NAME = f"SIG{LEAVE_SIGNAL}"


def _log(message: str) -> None:
    print(f"dlsub: launch: {message}", file=sys.stderr, flush=True)


def node_name() -> str:
    """This node's name for output labels: Slurm's (several slurmds may share one host), else the host's."""
    name = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)[:64] or "node"


def _children_map() -> dict[int, list[int]]:
    """Parent pid -> child pids, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    return children


def _descendants(root: int) -> list[int]:
    tree = _children_map()
    out, todo = [], list(tree.get(root, []))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(tree.get(pid, []))
    return out


def _catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler for ``signum`` (its SigCgt mask)."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) & (1 << (signum - 1)))
    except OSError:
        pass
    return False


#: How the rendered torchrun command starts each process through dlsub's entry point (containers/podman.py).
ENTRY_POINT = ["-m", "dlsub.checkpointing.rank_output"]


def without_entry_point(command: list[str]) -> list[str]:
    """The command with torchrun starting the script itself: a process alone needs no entry point, and
    torchrun's reports then name the script, exactly as before dlsub labelled lines."""
    for i in range(len(command) - 1):
        if command[i:i + 2] == ENTRY_POINT:
            return command[:i] + command[i + 2:]
    return command


def via_torchrun_main(command: list[str]) -> list[str]:
    """``torchrun ARGS`` as :mod:`dlsub.checkpointing.torchrun_main` runs it (faster to leave), when this
    Python has torch (the image's ``torchrun`` is its script); any other command as it is."""
    if not command or os.path.basename(command[0]) != "torchrun" or importlib.util.find_spec("torch") is None:
        return command
    return [sys.executable, "-P", "-m", TORCHRUN_MAIN, *command[1:]]


def _job_attempt() -> tuple[Path, str] | None:
    """The job directory and the group's attempt the batch script gave the container (None: not under dlsub)."""
    job_dir, attempt = os.environ.get(ENV_JOB_DIR), os.environ.get(ENV_ATTEMPT)
    return (Path(job_dir), attempt) if job_dir and attempt else None


#: The module that runs torchrun for the launcher (``--from-stdin``: started ahead, told its arguments later).
TORCHRUN_MAIN = "dlsub.checkpointing.torchrun_main"
#: Most times an elastic group re-forms within one attempt by starting torchrun again.
MAX_REFORMS = 100
#: How long a worker whose group stopped waits for its main job to say it re-forms.
FOLLOW_WAIT_S = 20.0
#: How often the launcher looks whether a newer attempt of the job has begun (a stat of the attempts file).
FENCE_CHECK_S = 2.0


class Launcher:
    def __init__(self, command: list[str], grace_s: float, elastic: bool = False,
                 output: OutputMux | None = None, follow: bool = False) -> None:
        self.command = command
        self.grace_s = grace_s
        # An elastic gang: when the whole group checkpoints and stops because
        # another node asked to leave (a shrink), and this node was asked
        # nothing, torchrun is started again and the group re-forms smaller.
        self.elastic = elastic
        # A worker: it re-forms only when the main job does (it marks it), so that a worker whose main job
        # stopped for good, or requeued itself, goes back to the pool instead of waiting for a group.
        self.follow = follow
        self.stop_signal: str | None = None
        self.stop_since = 0.0
        self.notified: set[int] = set()
        self.child: subprocess.Popen[bytes] | None = None
        # Several training processes: their lines, torchrun's and ours go out whole and labelled.
        self.output = output
        self.announce: str | None = None
        # The next torchrun, started while the group stops for a member that left: it imports torch while
        # the old group exits, and is told its arguments if the group re-forms (else it is killed).
        self.standby: subprocess.Popen[bytes] | None = None
        self._marker_seen = 0.0
        # The newer attempt that superseded this one, once seen (fencing), and when it was last looked for.
        self.superseded: str | None = None
        self._fence_checked = 0.0
        # Decided once: find_spec looks through sys.path, and the loop asks every 0.2 s.
        self.argv = via_torchrun_main(command)

    def _announce_signal(self) -> None:
        if self.announce:
            asked = ("leave the group (in process where they can, else checkpoint and stop)"
                     if self.announce == LEAVE_SIGNUM_NAME else "checkpoint and stop")
            self._log(f"received {self.announce}: asking the training processes to {asked}")
            self.announce = None

    def _log(self, message: str) -> None:
        if self.output is not None:
            self.output.log(f"dlsub: launch: {message}")
        else:
            _log(message)

    def _on_signal(self, signum: int, _frame: object) -> None:
        name = signal.Signals(signum).name
        if self.stop_signal is None or name == STOP_SIGNUM_NAME:
            if self.stop_signal != name:
                self.announce = name  # said by the loop: a handler only sets flags (it may interrupt a write)
            self.stop_signal = name
            self.stop_since = self.stop_since or time.monotonic()

    def _deliver_stop(self) -> bool:
        """Send SIGUSR1 to every training process that handles it and has not been told yet (a leave request:
        SIGUSR2 to those that handle that, which leave their group in process).

        Returns whether any process handles it (dlsub's handler, installed by
        ``checkpointing.init()``), told now or earlier.
        """
        assert self.child is not None
        targets = _descendants(self.child.pid)
        if not targets:  # the command is the training process itself (no torchrun)
            targets = [self.child.pid]
        handled = False
        for pid in targets:
            leaves = self.stop_signal == LEAVE_SIGNUM_NAME and _catches(pid, signal.SIGUSR2)
            if not leaves and not _catches(pid, signal.SIGUSR1):
                continue
            handled = True
            if pid not in self.notified:
                try:
                    os.kill(pid, signal.SIGUSR2 if leaves else signal.SIGUSR1)
                    self.notified.add(pid)
                except ProcessLookupError:
                    pass
        # A process told earlier may have checkpointed and left already.
        return handled or bool(self.notified)

    def run(self) -> int:
        for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        reforms = 0
        try:
            while True:
                started = time.time()
                status = self.run_once(started)
                if not (self.elastic and status == 0 and self.stop_signal is None and self.superseded is None
                        and reforms < MAX_REFORMS
                        and self._resume_requested(since=started)):
                    return self.exit_code(status)
                if self.follow and not self._main_reforms(since=started):
                    return self.exit_code(status)
                if not self.follow:
                    self._mark_reform()
                reforms += 1
                self._log("the group checkpointed and stopped for a node that left; re-forming it "
                          f"(torchrun again, {reforms} time(s) this attempt)")
        finally:
            self._drop_standby()

    def _spawn(self, argv: list[str], stdin: int | None = None) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        if self.follow:  # a worker's torchrun may join its group in process (issue 52), where the group allows it
            env[ENV_JOIN_IN_PROCESS] = "1"
        if without_entry_point(self.command) != self.command and "PYTHONSAFEPATH" not in env:
            # torchrun starts each rank as ``python -m dlsub.checkpointing.rank_output`` in the submit directory,
            # where a folder named dlsub would be imported instead of dlsub: the working directory does not go
            # first on their sys.path (the entry point puts the script's folder first, and takes this away before
            # the script runs). Never without the entry point: torchrun then runs the script itself, which must
            # find its own folder's modules, as ``python SCRIPT`` does.
            env.update({"PYTHONSAFEPATH": "1", ENV_SAFE_PATH_SET: "1"})
        if self.output is None:
            return subprocess.Popen(argv, env=env, stdin=stdin)
        env[ENV_OUTPUT_SOCKET] = self.output.socket_path
        return subprocess.Popen(argv, env=env, stdin=stdin, stdout=self.output.child_output,
                                stderr=self.output.child_output)

    def _start_child(self) -> subprocess.Popen[bytes]:
        """The command, through the standby when one is ready (its arguments go to it now), else anew."""
        standby, self.standby = self.standby, None
        if standby is not None and standby.stdin is not None and standby.poll() is None:
            try:
                standby.stdin.write(json.dumps(self.command[1:]).encode() + b"\n")
                standby.stdin.close()
                return standby
            except OSError:  # it died meanwhile: start afresh
                pass
        if standby is not None:
            self._kill(standby)
        return self._spawn(self.argv)

    def _maybe_start_standby(self, started: float) -> None:
        """Once the group is stopping for a member that left (its rank 0 wrote the resume marker for a
        reason other than torchrun's own SIGTERM, here or on a peer, which is a re-rendezvous torchrun
        does itself), start the next torchrun so that its import overlaps the old group's exit."""
        if (not self.elastic or self.standby is not None or self.stop_signal is not None
                or self.argv == self.command):
            return
        marker = self._resume_marker_path()
        if marker is None:
            return
        try:
            written = marker.stat().st_mtime
        except OSError:
            return
        if written < started - 1.0 or written == self._marker_seen:
            return
        self._marker_seen = written
        try:
            reason = json.loads(marker.read_text(encoding="utf-8")[:4096]).get("reason")
        except (OSError, ValueError, AttributeError):  # the user's file: anything but the library's JSON
            return
        if reason in ("SIGTERM", STOP_PEER_RESTART):
            return
        self.standby = self._spawn([sys.executable, "-P", "-m", TORCHRUN_MAIN, "--from-stdin"], stdin=subprocess.PIPE)

    @staticmethod
    def _resume_marker_path() -> Path | None:
        job_dir = os.environ.get(ENV_JOB_DIR)
        return resume_marker(Path(job_dir)) if job_dir else None

    @staticmethod
    def _kill(process: subprocess.Popen[bytes]) -> None:
        try:
            process.kill()
        except OSError:
            pass
        try:
            process.wait(timeout=10)
        except (subprocess.TimeoutExpired, ChildProcessError):
            pass

    def _drop_standby(self) -> None:
        if self.standby is not None:
            self._kill(self.standby)
            self.standby = None

    @staticmethod
    def _reform_marker() -> Path | None:
        where = _job_attempt()
        return reform_marker(*where) if where else None

    def _mark_reform(self) -> None:
        """The main job's group re-forms: its workers are told (the mark they wait for)."""
        marker = self._reform_marker()
        if marker is None:
            return
        try:
            marker.touch()
        except OSError as exc:
            self._log(f"could not tell the workers that the group re-forms ({exc}); they go back to the pool")

    def _main_reforms(self, since: float) -> bool:
        """A worker waits (a while) for its main job's mark that the group re-forms."""
        marker = self._reform_marker()
        if marker is None:
            return False
        deadline = time.monotonic() + FOLLOW_WAIT_S
        while time.monotonic() < deadline and self.stop_signal is None:
            try:
                if marker.stat().st_mtime >= since - 1.0:
                    return True
            except OSError:
                pass
            time.sleep(0.2)
        return False

    @staticmethod
    def _resume_requested(since: float | None = None) -> bool:
        """Whether the training asked to be resumed (its marker), since ``since`` when given."""
        marker = Launcher._resume_marker_path()
        if marker is None:
            return False
        try:
            written = marker.stat().st_mtime
        except OSError:
            return False
        return since is None or written >= since - 1.0

    def run_once(self, started: float | None = None) -> int:
        """Run the command to its end, handing stop signals on; its exit status."""
        started = time.time() if started is None else started
        self.child = self._start_child()
        self.notified = set()
        status: int | None = None
        terminated = False
        unhandled_logged = False
        while status is None:
            # Reap everything (PID 1 duty); notice our own child among them.
            try:
                while True:
                    pid, raw = os.waitpid(-1, os.WNOHANG)
                    if pid == 0:
                        break
                    if pid == self.child.pid:
                        status = os.waitstatus_to_exitcode(raw)
                    elif self.standby is not None and pid == self.standby.pid:
                        self.standby.returncode = os.waitstatus_to_exitcode(raw)  # it died unused
            except ChildProcessError:
                pass
            if status is not None:
                break
            if self._superseded_now():
                self._kill_training()
                continue  # reaped above on the next pass
            self._maybe_start_standby(started)
            self._announce_signal()
            if self.stop_signal:
                handled = self._deliver_stop()
                overdue = time.monotonic() - self.stop_since > self.grace_s
                if self.stop_signal == STOP_SIGNUM_NAME and not terminated and (not handled or overdue):
                    # Nothing in the container will checkpoint: SIGTERM has its
                    # default effect at once, as under plain sbatch. A training
                    # that handles it gets the grace to checkpoint first.
                    why = (f"training did not stop within {self.grace_s:.0f} s" if handled
                           else "no training process handles it (checkpointing.init() not called)")
                    self._log(f"{why}: sending SIGTERM to {self.command[0]}")
                    self.child.send_signal(signal.SIGTERM)
                    terminated = True
                elif self.stop_signal != STOP_SIGNUM_NAME and not handled and not unhandled_logged:
                    # A checkpoint request nothing handles changes nothing (plain
                    # sbatch sends none): the training runs on to its time limit.
                    self._log(f"no training process handles {self.stop_signal} (checkpointing.init() not called yet); "
                         "the training runs on, and gets it if it installs the handler later")
                    unhandled_logged = True
            time.sleep(0.2)
        return status

    def _superseded_now(self) -> bool:
        """Whether a newer attempt of the job has begun (looked for every FENCE_CHECK_S, once seen kept)."""
        now = time.monotonic()
        if self.superseded is None and now - self._fence_checked >= FENCE_CHECK_S:
            self._fence_checked = now
            newer = fence.newer_attempt()
            if newer is not None:
                self.superseded = newer[0]
                self._log(f"attempt {newer[0]} of this job began elsewhere (this one was requeued while it ran): "
                          "stopping this attempt's training now, without a checkpoint (it would not be the job's)")
        return self.superseded is not None

    def _kill_training(self) -> None:
        """SIGKILL the training processes and torchrun (the descendants first: torchrun would restart them)."""
        assert self.child is not None
        for pid in [*_descendants(self.child.pid), self.child.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)

    def exit_code(self, status: int) -> int:
        self._announce_signal()
        if self.superseded is not None:
            return SUPERSEDED_EXIT_CODE
        if status == RESUME_EXIT_CODE or self._resume_requested():
            self._log(f"training checkpointed and asked to be resumed (exit {RESUME_EXIT_CODE})")
            return RESUME_EXIT_CODE
        if self.follow and status == 0 and self.stop_signal is None and not self._group_finished():
            # A worker's torchrun also exits 0 when its group ended without it (it re-formed smaller, or the
            # main job stopped): done only when the training says so, else back to the pool like a resume.
            self._log("the group ended without this worker and its training has not finished: leaving "
                      f"(exit {RESUME_EXIT_CODE})")
            return RESUME_EXIT_CODE
        return 128 - status if status < 0 else status

    @staticmethod
    def _group_finished() -> bool:
        """Whether this attempt's training finished: its group's rank 0 recorded it (the progress file)."""
        where = _job_attempt()
        return where is not None and finished_in(*where)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m dlsub.checkpointing.launch")
    parser.add_argument("--grace", type=float, default=30.0, help="seconds between SIGTERM and stopping torchrun")
    parser.add_argument("--elastic", action="store_true",
                        help="re-form the group (run the command again) when it stops for a node that left")
    parser.add_argument("--follow", action="store_true",
                        help="with --elastic: re-form only when the group's main job does (an elastic job's worker)")
    parser.add_argument("--nproc-per-node", type=int, default=1, metavar="N",
                        help="training processes per node (torchrun's): with more than one, or in a gang "
                             f"(${ENV_NNODES}), every output line is whole and labelled with where it came from")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    gang = bool(os.environ.get(ENV_NNODES))
    # A script rendered before dlsub labelled lines runs no entry point: its processes would write into
    # torchrun's output, and their lines pass for the launcher's. It runs as it did. A process alone keeps it
    # only where it may die for want of a GPU (the entry point notes torch's error for the batch launcher).
    if (args.nproc_per_node <= 1 and not gang) or without_entry_point(command) == command:
        alone = command if os.environ.get(ENV_WATCH_NO_GPU) == "1" else without_entry_point(command)
        return Launcher(alone, args.grace, args.elastic, follow=args.follow).run()
    try:
        output = OutputMux(sys.stdout.fileno(), node_name() if gang else None).start()
    except OSError as exc:  # no private temporary directory for its socket: the training still runs
        _log(f"the output goes unlabelled: cannot set up the labelling of lines ({exc})")
        # Still through the entry point (it hands over nothing without the socket): a group's processes need
        # it for more than labels (a Horovod script's hvd.init() joins torchrun's group there).
        return Launcher(command, args.grace, args.elastic, follow=args.follow).run()
    try:
        return Launcher(command, args.grace, args.elastic, output, follow=args.follow).run()
    finally:
        output.close()


def record_exit(code: int) -> int:
    """Write the launcher's exit status where the batch script reads it if Podman loses it (contract.exit_record);
    ``code`` unchanged. Written whole (a temporary file renamed), and never in the way of the exit itself."""
    job_dir, name = os.environ.get(ENV_JOB_DIR), os.environ.get(ENV_CONTAINER, "")
    if job_dir and CONTAINER_NAME_RE.fullmatch(name):
        path = exit_record(Path(job_dir), name)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(path.name + ".partial")
            partial.write_text(f"{code}\n")
            partial.replace(path)
        except OSError as exc:
            _log(f"could not record the exit status {code} in {path} ({exc})")
    return code


if __name__ == "__main__":
    sys.exit(record_exit(main()))
