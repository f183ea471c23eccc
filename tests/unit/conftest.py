"""Unit-test fixtures: a stateful fake Slurm behind the client's _run seam."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlsub.agent.config import Settings
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
    import dlsub.agent.cli as cli
    import dlsub.agent.submit as submit
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
