"""The signals the batch step receives, and the wait on its child.

* CHECKPOINT_SIGNAL (USR1; Slurm's ``--signal=B:USR1@GRACE`` before the time
  limit, ``dlsub requeue``): forwarded to the child, and said to the container
  directly too (``podman kill --signal``): podman run's signal proxy can lose
  a signal when scancel's SIGTERM also hits its helper processes.
* MOVE_SIGNAL (USR2, the agent's): the training checkpoints (USR1 forwarded)
  and the job is requeued held (policy.py); to a worker it means: leave.
* STOP_SIGNAL (TERM; scancel, preemption): forwarded; Slurm decides what
  follows. Once the attempt is being requeued it ends the launcher with 0
  (the requeue ends the attempt; nothing is left to forward).

Handlers only record what arrived and signal the child (a system call); the
wait loop sleeps on the wakeup fd (``signal.set_wakeup_fd``, SIGCHLD
included), so a signal is handled as soon as it arrives and a child's end
as soon as it ends: no polling. Once the child has ended, checkpoint and move
requests are ignored (the agent asking again after a restart): there is
nothing left to checkpoint, and children started after that (scontrol)
inherit the ignoring, as ``scancel --batch`` signals them too.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from dlsub import contract
from dlsub.slurm_plugins.launcher.records import say

CHECKPOINT = signal.Signals[f"SIG{contract.CHECKPOINT_SIGNAL}"]
MOVE = signal.Signals[f"SIG{contract.MOVE_SIGNAL}"]
STOP = signal.Signals[contract.STOP_SIGNUM_NAME]


class LauncherExit(Exception):
    """End the launcher now with ``code`` (a stop while the attempt is being requeued)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def exit_status(returncode: int) -> int:
    """A child's status as the shell reports it: 128 + N for a child killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


class Forwarder:
    """The batch shell's traps: what arrived (``signal``, ``move_requested``) and the forwarding to the child.

    ``podman_kill(signal_name, container)`` says a signal to a container directly.
    """

    def __init__(self, podman_kill: Callable[[str, str], None]) -> None:
        self._podman_kill = podman_kill
        #: The last signal forwarded (contract.CHECKPOINT_SIGNAL, LEAVE_SIGNAL or STOP_SIGNAL), "" for none.
        self.signal = ""
        self.move_requested = False
        #: What MOVE_SIGNAL becomes for the child: a checkpoint (a move), or for a worker LEAVE_SIGNAL (a shrink).
        self.move_forwards = contract.CHECKPOINT_SIGNAL
        self._child: subprocess.Popen[bytes] | None = None
        self._container: str | None = None  # the child's container, to say signals to directly; None: srun
        self._kills: list[str] = []  # signals to say to the container, in the order they came
        self._starting = False
        self._early: list[str] = []  # signals that came while the child was being started
        self._stop_ends = False  # a stop ends the launcher (with 0) instead of being forwarded
        self._exit_requested = False
        self._deferring = 0
        self._saved: dict[int, Any] = {}
        self._wakeup: tuple[int, int] | None = None
        self._saved_wakeup = -1

    # ---------------------------------------------------------------- set up and take down
    def install(self) -> None:
        """Trap the three signals and wake the wait loop on each (and on a child's end)."""
        read, write = os.pipe()
        os.set_blocking(write, False)
        self._wakeup = (read, write)
        self._saved_wakeup = signal.set_wakeup_fd(write)
        for signum, handler in ((CHECKPOINT, self._on_checkpoint), (MOVE, self._on_move), (STOP, self._on_stop),
                                (signal.SIGCHLD, _wake_only)):
            self._saved[signum] = signal.signal(signum, handler)

    def restore(self) -> None:
        """Put back the handlers and wakeup fd found at :meth:`install` (for tests in one process)."""
        for signum, previous in self._saved.items():
            signal.signal(signum, previous)
        self._saved.clear()
        if self._wakeup is not None:
            signal.set_wakeup_fd(self._saved_wakeup)
            for fd in self._wakeup:
                os.close(fd)
            self._wakeup = None

    # ---------------------------------------------------------------- handlers
    def _on_checkpoint(self, signum: int, frame: FrameType | None) -> None:
        self._forward(contract.CHECKPOINT_SIGNAL)

    def _on_move(self, signum: int, frame: FrameType | None) -> None:
        self.move_requested = True
        self._forward(self.move_forwards)

    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
        if not self._stop_ends:
            self._forward(contract.STOP_SIGNAL)
            return
        self._exit_requested = True
        if not self._deferring:
            raise LauncherExit(0)

    def _forward(self, name: str) -> None:
        self.signal = name
        asked = "leave its group" if name == contract.LEAVE_SIGNAL else "checkpoint and stop"
        say(f"dlsub: received SIG{name}: asking the training to {asked}")
        self._send(name)

    def _send(self, name: str) -> None:
        child = self._child
        if child is None:
            if self._starting:  # the child is being started: it gets the signal once it is
                self._early.append(name)
            return
        try:
            # srun hands the signal on to the task on every node.
            child.send_signal(signal.Signals[f"SIG{name}"])
        except OSError:
            pass
        if self._container is not None:
            self._kills.append(name)

    # ---------------------------------------------------------------- the wait
    def run(self, start: Callable[[], subprocess.Popen[bytes]], container: str | None) -> int:
        """Start the child (the container's ``podman run``, or srun) and wait for it, forwarding what arrives;
        its exit status. ``container``: the child's container, said each signal directly too (None for srun's).
        A signal that arrives while the child starts is forwarded once it has."""
        self._starting = True
        try:
            child = start()
        finally:
            self._starting = False
        self._child, self._container = child, container
        early, self._early = self._early, []
        for name in early:
            self._send(name)
        return self._wait(child)

    def _wait(self, child: subprocess.Popen[bytes]) -> int:
        try:
            while True:
                while self._kills and self._container is not None:
                    self._podman_kill(self._kills.pop(0), self._container)
                returncode = child.poll()
                if returncode is not None:
                    return exit_status(returncode)
                self._sleep()
        finally:
            self._child, self._container = None, None
            self._kills.clear()
            # Nothing is left to checkpoint: a checkpoint or move request from now on is ignored.
            signal.signal(CHECKPOINT, signal.SIG_IGN)
            signal.signal(MOVE, signal.SIG_IGN)

    def wait_or_signal(self, child: subprocess.Popen[bytes]) -> int | None:
        """Wait for ``child`` until it ends (its status) or a trapped signal arrives (None), as the shell's
        ``wait`` does."""
        while True:
            returncode = child.poll()
            if returncode is not None:
                return exit_status(returncode)
            if any(signum != signal.SIGCHLD for signum in self._sleep()):
                return None

    def _sleep(self) -> bytes:
        """Block until a signal arrives; the numbers of those that did."""
        assert self._wakeup is not None, "install() first"
        return os.read(self._wakeup[0], 64)

    # ---------------------------------------------------------------- the requeue
    def stop_ends_launcher(self) -> None:
        """From now on a stop ends the launcher with 0: the requeue ends this attempt (Slurm's SIGTERM)."""
        self._stop_ends = True

    @property
    def exit_requested(self) -> bool:
        return self._exit_requested

    @contextmanager
    def deferring_exit(self) -> Iterator[None]:
        """A stop that ends the launcher waits for this block (a Slurm call, the cleanup) to finish, as the
        shell runs a trap only after its foreground command."""
        self._deferring += 1
        try:
            yield
        finally:
            self._deferring -= 1
        if self._exit_requested and not self._deferring:
            raise LauncherExit(0)


def _wake_only(signum: int, frame: FrameType | None) -> None:
    """SIGCHLD: nothing to do but wake the wait (the wakeup fd does)."""
