"""Unit-test fixtures: a stateful fake Slurm behind the client's _run seam."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlsub.job.settings import Settings
from dlsub.slurm_plugins.client import SlurmClient
from dlsub.slurm_plugins.fake import FakeSlurm, testbed_cluster


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
    monkeypatch.setattr(cli, "SlurmClient", lambda: SlurmClient(runner=fake_slurm))

    def check_image(image: str) -> None:
        if image != "localhost/dlsub-torch:2.13.0-cpu":
            raise ImageError(
                f"image {image!r} is not in your Podman storage (images you have: localhost/dlsub-torch:2.13.0-cpu)"
            )

    monkeypatch.setattr(submit, "check_image", check_image)
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
