"""Unit-test fixtures: a stateful fake Slurm behind the client's _run seam; ranks of a real torch.distributed
group on loopback (the checkpointing library's collective calls)."""

from __future__ import annotations

import getpass
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlsub.job.settings import Settings
from dlsub.site_config import policy_file
from dlsub.slurm_plugins.client import SlurmClient
from dlsub.slurm_plugins.fake import FakeSlurm, testbed_cluster

REPO = Path(__file__).resolve().parents[2]

#: How long a unit test waits on a process of its own before calling it hung: a guard, not a bound on time.
#: make test runs the unit tests beside the live tests on idle CPU only (SCHED_IDLE), where a process may wait
#: minutes for a core (a 5-second save once took over 60 in CI). A test that bounds elapsed seconds is marked
#: ``wall_clock`` instead, and make test runs those at normal priority after the live tests.
NO_HANG_S = 600.0


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now (a group's store, a rendezvous, an endpoint)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def json_records(out: Path) -> list[dict[str, object]]:
    """The lines of a process's output that are JSON records (those that start with ``{``), parsed."""
    return [json.loads(line) for line in out.read_text().splitlines() if line.startswith("{")]


def ranks_ended(script: str, args: list[str], env_by_rank: list[dict[str, str]],
                timeout: float = 120, agent_store: bool = False) -> list[tuple[int, str]]:
    """Run ``script`` (``python -c``) as the ranks of one torch.distributed group (gloo, on loopback), rank r
    with ``env_by_rank[r]`` added; each rank's exit code and last line of output, once every rank has ended.
    ``agent_store``: the group's store is held here, as torchrun's agent holds it, not by rank 0 (which may then
    leave its group and exit while the others use the store)."""
    port = free_port()
    base = {**os.environ, "PYTHONPATH": str(REPO), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "WORLD_SIZE": str(len(env_by_rank))}
    held = None
    if agent_store:
        from datetime import timedelta

        import torch.distributed as dist

        held = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=timeout),
                             wait_for_workers=False)
        base["TORCHELASTIC_USE_AGENT_STORE"] = "True"
    procs = [subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, text=True,
                              env={**base, "RANK": str(rank), **extra}) for rank, extra in enumerate(env_by_rank)]
    try:
        outs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
        del held
    return [(p.returncode, (out.strip().splitlines() or [""])[-1]) for p, out in zip(procs, outs, strict=True)]


def run_ranks(script: str, args: list[str], env_by_rank: list[dict[str, str]], timeout: float = 120,
              agent_store: bool = False) -> list[str]:
    """:func:`ranks_ended` where every rank must exit 0: each rank's last line of output."""
    ends = ranks_ended(script, args, env_by_rank, timeout, agent_store)
    assert [code for code, _ in ends] == [0] * len(ends), ends
    return [line for _, line in ends]


#: dlsub's node-local folders, as it ships them (before the fixture below takes /tmp out).
NODE_LOCAL_AS_SHIPPED = policy_file.NODE_LOCAL_PATHS


@pytest.fixture(autouse=True, scope="session")
def temporary_files_removed_after_the_run() -> Iterator[None]:
    """TMPDIR for the whole run, the processes the tests start included: a folder in /tmp made as /tmp is
    (1777: tests that run a process as another uid put sockets there), removed with all in it at the end.
    torchrun makes a ``torchelastic_*`` log folder in the temporary folder each time it starts and never removes
    it, and the tests start it dozens of times."""
    folder = Path(tempfile.mkdtemp(prefix="dlsub-unit-tests-"))
    folder.chmod(0o1777)
    before = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(folder)
    tempfile.tempdir = None  # read again from TMPDIR
    yield
    if before is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = before
    tempfile.tempdir = None
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(autouse=True)
def tmp_is_seen_by_the_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    """pytest's tmp_path lies in /tmp, which dlsub takes as each host's own and submit refuses (a job's node
    would not see it); here the fake Slurm's nodes are this host, and they do. test_shared_paths.py puts
    NODE_LOCAL_AS_SHIPPED back to test that refusal."""
    monkeypatch.setattr(policy_file, "NODE_LOCAL_PATHS", tuple(p for p in NODE_LOCAL_AS_SHIPPED if p != "/tmp"))


@pytest.fixture
def fake_slurm() -> FakeSlurm:
    return testbed_cluster()


@pytest.fixture
def client(fake_slurm: FakeSlurm) -> SlurmClient:
    return SlurmClient(runner=fake_slurm)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(home=tmp_path / "dlsub-home")


@pytest.fixture
def cli_env(tmp_path: Path, fake_slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    """The CLI wired to the fake Slurm, a temp DLSUB_HOME, and a fake image store."""
    import dlsub.cli.main as cli
    import dlsub.job.submit as submit
    from dlsub.containers.podman import ImageError

    monkeypatch.setenv("DLSUB_HOME", str(tmp_path / "dlsub-home"))
    # dlsub's default policy, not the host's /etc/dlsub/policy.toml (the testbed's, where CI runs these tests,
    # sets variables in every job's container); a test that needs one sets its own.
    monkeypatch.setenv("DLSUB_POLICY", str(tmp_path / "no-policy.toml"))
    monkeypatch.setattr(cli, "SlurmClient", lambda: SlurmClient(runner=fake_slurm))
    # sbatch runs as the caller: Slurm's job is the caller's (`dlsub status` takes no other user's job for it).
    fake_slurm.submit_uid, fake_slurm.submit_user = os.getuid(), getpass.getuser()

    def check_image(image: str) -> None:
        if image != "localhost/dlsub-torch:2.13.0-cpu":
            raise ImageError(
                f"image {image!r} is not in your Podman storage (images you have: localhost/dlsub-torch:2.13.0-cpu)"
            )

    monkeypatch.setattr(submit, "check_image", check_image)
    # A test that gives the image an ID gets an image whose Python passes: no real podman runs in a unit test
    # (CI's root has no rootless Podman configuration, and the probe would answer for the machine, not the test).
    monkeypatch.setattr(submit, "check_image_contents", lambda image, image_id, checked, runtime=None: ("3.11.2", ""))
    return fake_slurm


#: A folder name with what a shell or a template may mishandle: a leading dash, spaces, both quotes, `;`, `$`,
#: a command substitution, non-ASCII letters and a line break.
WEIRD_NAME = "-my dir; it's \"quoted\" $HOME $(id) é ü\nsecond line"


@pytest.fixture
def weird_dir(tmp_path: Path) -> Path:
    """An existing folder called WEIRD_NAME: scripts and job directories in it must work as in any other."""
    path = tmp_path / WEIRD_NAME
    path.mkdir()
    return path


@pytest.fixture
def shellcheck() -> str:
    """shellcheck's path; CI must have it (it checks the batch script), elsewhere a test without it is skipped."""
    checker = shutil.which("shellcheck")
    if checker is None:
        if os.environ.get("CI") == "true":
            pytest.fail("shellcheck is not installed; CI checks the batch script with it (apt-get install shellcheck)")
        pytest.skip("shellcheck is not installed")
    return checker
