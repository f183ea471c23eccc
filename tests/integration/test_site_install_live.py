"""Integration (live testbed): what a queued job meets when the site has removed or upgraded dlsub on its nodes
(issue 50 item 4). Every attempt of a dlsub job runs dlsub's batch launcher and mounts its package from the
installation, so:

* after an uninstall ("Uninstall" in the admin guide), one that starts fails at its start, and says why;
* after an upgrade in place ("Upgrade"), one queued before it runs on the new version and completes.

The installation is changed on the compute nodes only, in their own mount namespaces: taken away by an empty tmpfs
mounted over it, or upgraded by a newer package directory bound over the installed one (the login host, where the
tests and the agent run, keeps its own, so nothing beside the test sees a change); and put back after, whatever
happens.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from dlsub.job_progress import read_attempts
from livebed import EXAMPLES, TestbedUser, cancel_leftovers, on_host, slurm_job, wait_for

PREFIX = Path(os.environ.get("DLSUB_PREFIX", "/opt/dlsub"))
CPU_NODES = ("cpu1", "cpu2")
COMPUTE_NODES = ("cpu1", "cpu2", "gpu1", "gpu2")


@contextmanager
def mounted_over(nodes: tuple[str, ...], target: Path, *mount_args: str) -> Iterator[None]:
    """``mount MOUNT_ARGS TARGET`` on each of ``nodes``, in its own mount namespace; unmounted after, whatever
    happens."""
    covered: list[str] = []
    try:
        for node in nodes:
            subprocess.run([*on_host(node), "mount", *mount_args, str(target)], check=True, capture_output=True,
                           text=True)
            covered.append(node)
        yield
    finally:
        for node in covered:
            subprocess.run([*on_host(node), "umount", str(target)], check=False, capture_output=True)


def uninstalled_from(nodes: tuple[str, ...]) -> AbstractContextManager[None]:
    return mounted_over(nodes, PREFIX, "-t", "tmpfs", "-o", "size=1m,mode=755", "uninstalled")


def test_a_job_that_starts_after_dlsub_left_its_nodes_fails_at_its_start_and_says_why(
        user: TestbedUser, workdir: Path) -> None:
    with uninstalled_from(CPU_NODES):
        job = user.submit("-p", "cpu", "--cpus", "1", "--mem", "1G", str(EXAMPLES / "train_digits.py"), "--epochs",
                          "1", cwd=workdir)
        ended = user.wait_until_ended(job["id"], "the job to end", timeout=120)
    assert ended["state"] == "FAILED", ended
    assert f"{PREFIX}/venv/bin/python" in ended["reason"] and "is not on node cpu" in ended["reason"], ended
    assert "the site installs dlsub on a shared software path" in ended["reason"], ended
    # The node has it back: the next job there runs.
    assert subprocess.run([*on_host("cpu1"), "test", "-x", f"{PREFIX}/venv/bin/python"]).returncode == 0


def _installed_package() -> Path:
    """The installed package's directory (site-packages/dlsub of the installation's Python)."""
    where = "import dlsub, os; print(os.path.dirname(dlsub.__file__))"
    out = subprocess.run([str(PREFIX / "venv/bin/python"), "-c", where], cwd="/", check=True, capture_output=True,
                         text=True)
    return Path(out.stdout.strip())


@contextmanager
def upgraded_on(nodes: tuple[str, ...], version: str) -> Iterator[None]:
    """The installed package replaced on ``nodes`` by a copy whose version is ``version``, as an upgrade in place
    replaces its files (the copy on the shared file system, bound over the package in each node's namespace)."""
    installed = _installed_package()
    newer = PREFIX.parent / "dlsub-upgrade-test" / "dlsub"
    shutil.rmtree(newer.parent, ignore_errors=True)
    shutil.copytree(installed, newer, ignore=shutil.ignore_patterns("__pycache__"))
    init = newer / "__init__.py"
    text, count = re.subn(r'^__version__ = ".*"$', f'__version__ = "{version}"', init.read_text(), flags=re.M)
    assert count == 1, "the package's __init__.py names its version once"
    init.write_text(text)
    os.chmod(newer.parent, 0o755)
    try:
        with mounted_over(nodes, installed, "--bind", str(newer)):
            yield
    finally:
        shutil.rmtree(newer.parent, ignore_errors=True)


def _hold_node(user: TestbedUser, node: str) -> int:
    out = user.run("sbatch", "--parsable", "-p", "cpu", "-w", node, "--exclusive", "-J", "blocker", "--mem=200",
                   "--time=10", "--wrap", "sleep 600", check=True)
    return int(out.stdout.strip().split(";")[0])


def test_an_upgrade_in_place_reaches_a_job_queued_before_it(user: TestbedUser, user2: TestbedUser,
                                                            workdir: Path) -> None:
    """A job queued behind another user's jobs while the site upgrades dlsub in place starts on the new version
    (its attempt's record names it) and completes."""
    version = "0.1.0+upgraded.test"
    held: list[int] = []
    try:
        held = [_hold_node(user2, node) for node in CPU_NODES]
        wait_for("both CPU nodes held", lambda: all((slurm_job(i) or {}).get("job_state") == "RUNNING"
                                                     for i in held), timeout=60)
        job = user.submit("-p", "cpu", "--cpus", "1", "--mem", "1G", str(EXAMPLES / "train_digits.py"), "--epochs",
                          "1", cwd=workdir)
        assert (slurm_job(job["slurm_job_id"]) or {}).get("job_state") == "PENDING", "queued behind the others"
        with upgraded_on(COMPUTE_NODES, version):
            cancel_leftovers(*held)
            ended = user.wait_until_ended(job["id"], "the queued job to run and end", timeout=180)
        assert ended["state"] == "COMPLETED", ended
        starts = [a for a in read_attempts(Path(job["job_dir"])) if a["event"] == "start"]
        assert starts and {s["dlsub_version"] for s in starts} == {version}, starts
    finally:
        cancel_leftovers(*held)

