"""Integration fixtures: the live local Slurm testbed and rootless Podman.

Tests run dlsub as the unprivileged testbed user, as a researcher would on a
login node. They fail (not skip) when the testbed is down: `make testbed`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

# The testbed helpers the integration tests share with benchmarks/ live in testbed/livebed.py.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "testbed"))
from livebed import LDAP_USER, USER, USER2, WAITS, TestbedUser, agent_service, blockers, wait_for


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The longest waits of the run, each with its test: --durations says which tests are slow, this says on
    what (a Slurm requeue, a checkpoint, a completion), which is where a shorter CI is found."""
    longest = sorted(WAITS, key=lambda w: w[2], reverse=True)[:30]
    if longest:
        total = sum(w[2] for w in WAITS)
        terminalreporter.write_sep("=", f"longest {len(longest)} waits (of {len(WAITS)}, {total:.0f} s in all)")
        for test, what, seconds in longest:
            terminalreporter.write_line(f"{seconds:7.1f}s {what[:70]:70}  {test.split('::')[-1][:60]}")


@pytest.fixture(scope="session")
def user() -> TestbedUser:
    if os.geteuid() != 0:
        pytest.fail("integration tests run as root (they act as the testbed user through runuser): sudo make test")
    try:
        u = TestbedUser(USER)
    except KeyError:
        pytest.fail(f"user {USER} does not exist: bring the testbed up with `sudo make testbed`")
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True)
    if "UP" not in ping.stdout:
        pytest.fail(f"slurmctld is not up ({ping.stdout.strip()} {ping.stderr.strip()}): `sudo make testbed`")
    return u


@pytest.fixture(scope="session", autouse=True)
def _no_jobs_of_an_earlier_run(user: TestbedUser) -> None:
    """The tests need the testbed's nodes to themselves. A run killed without `make testbed-down` (a session's
    processes ended, the machine's state kept, as before CI on the same machine) leaves its jobs in slurmctld's
    saved state, and Slurm starts them again once its daemons are back: they would hold nodes the tests wait for."""
    queue = subprocess.run(["squeue", "-h", "-o", "%i %u %j %T"], capture_output=True, text=True, check=True)
    left = [line for line in queue.stdout.splitlines() if line.strip()]
    if not left:
        return
    print(f"conftest: cancelling {len(left)} job(s) an earlier run left on the testbed: {left}", file=sys.stderr)
    subprocess.run(["scancel", *(line.split()[0] for line in left)], check=False)
    wait_for(f"the jobs an earlier run left to end: {left}",
             lambda: not subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.strip(),
             timeout=120, interval=0.5)


@pytest.fixture(scope="session")
def user2(user: TestbedUser) -> TestbedUser:
    """Another unprivileged user, for tests of what one user can do to another's jobs."""
    try:
        return TestbedUser(USER2)
    except KeyError:
        pytest.fail(f"user {USER2} does not exist: bring the testbed up with `sudo make testbed`")


@pytest.fixture(scope="session")
def directory_user(user: TestbedUser) -> TestbedUser:
    """The user who exists only in the site's LDAP directory (testbed/ldap.sh): no /etc/passwd line on any host,
    its subordinate ids from etc/subid-ranges.sh, its home 0700 (tests/integration/test_directory_user_live.py)."""
    try:
        return TestbedUser(LDAP_USER)
    except KeyError:
        pytest.fail(f"{LDAP_USER} does not resolve here: the testbed's directory is not up (`make testbed`, "
                    "testbed/ldap.sh)")


def _fresh_dir(owner: TestbedUser) -> Iterator[Path]:
    """A fresh directory ``owner`` owns (CI's clone may be unreadable to it), on the shared filesystem (its
    home): the login host's /tmp is its own, as on a cluster, and a job's node would not see it."""
    # Made and removed by its owner: root may not write in a home on the testbed's network file system (root
    # squashed: testbed/nethome.sh).
    made = owner.run("mktemp", "-d", "-p", str(owner.home), "dlsub-it-XXXXXXXX", check=True)
    path = Path(made.stdout.strip())
    owner.run("chmod", "755", str(path), check=True)
    yield path
    owner.run("rm", "-rf", "--", str(path))


@pytest.fixture
def workdir(user: TestbedUser) -> Iterator[Path]:
    """A fresh directory of the testbed user's, in its home."""
    yield from _fresh_dir(user)


@pytest.fixture
def directory_workdir(directory_user: TestbedUser) -> Iterator[Path]:
    """A fresh directory of the directory user's, in its 0700 home."""
    yield from _fresh_dir(directory_user)


@pytest.fixture
def submitted() -> Iterator[list[int]]:
    """Slurm job ids a test submits itself (plain sbatch); cancelled after it, whatever happened."""
    ids: list[int] = []
    yield ids
    if ids:
        subprocess.run(["scancel", *map(str, ids)], check=False)


@pytest.fixture
def gpus_busy(user: TestbedUser) -> Iterator[list[int]]:
    ids = blockers(user)
    yield ids
    subprocess.run(["scancel", *map(str, ids)], check=False)


def _agent_running() -> Iterator[None]:
    agent_service("start")
    yield
    agent_service("start")  # whatever a test did to it, leave it running


#: The agent service running for the test (``service_agent``) or for a whole module
#: (``pytestmark = pytest.mark.usefixtures("service_agent_for_module")``).
service_agent = pytest.fixture(_agent_running, name="service_agent")
service_agent_for_module = pytest.fixture(_agent_running, scope="module", name="service_agent_for_module")


@pytest.fixture
def manual_agent(tmp_path: Path) -> Iterator[Path]:
    """The service stopped; the test ticks an agent of its own (own state database) by hand."""
    agent_service("stop")
    db = Path(f"/var/lib/dlsub/it-{os.getpid()}-{time.monotonic_ns()}.db")
    yield db
    agent_service("start")
    # ".policy.toml": the policy file a test may give its agent (window_policy, the GPU-limit test).
    for suffix in ("", "-wal", "-shm", ".lock", ".policy.toml"):
        Path(str(db) + suffix).unlink(missing_ok=True)
