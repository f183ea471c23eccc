"""Integration (live testbed): what a queued job meets when the site has removed dlsub from its nodes (the admin
guide's "Uninstall": every attempt of a dlsub job runs dlsub's batch launcher from the installation, so one that
starts after the package is gone fails at its start, and says why; issue 50 item 4).

The installation is taken from the CPU nodes only, by an empty tmpfs mounted over it in their own mount
namespaces (the login host, where the test and the agent run, keeps it), and put back after, whatever happens.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from livebed import EXAMPLES, TestbedUser, on_host

PREFIX = Path(os.environ.get("DLSUB_PREFIX", "/opt/dlsub"))
CPU_NODES = ("cpu1", "cpu2")


@contextmanager
def uninstalled_from(nodes: tuple[str, ...]) -> Iterator[None]:
    covered: list[str] = []
    try:
        for node in nodes:
            subprocess.run([*on_host(node), "mount", "-t", "tmpfs", "-o", "size=1m,mode=755", "uninstalled",
                            str(PREFIX)], check=True, capture_output=True, text=True)
            covered.append(node)
        yield
    finally:
        for node in covered:
            subprocess.run([*on_host(node), "umount", str(PREFIX)], check=False, capture_output=True)


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
