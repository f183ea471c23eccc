"""Unit tests (pure, real bash and shellcheck; the CLI's over the fake Slurm behind the client's `_run` seam,
Podman's answers given): the site's image per partition (policy.toml ``[containers] partition_images``), so
that GPU partitions run a CUDA image and CPU partitions a CPU one. Submit checks each image as it checks the
job's own, records their IDs, and renders a batch script whose container part runs the image of the partition
each attempt runs on (``$SLURM_JOB_PARTITION``): a job moved from the CPUs onto its GPUs changes image with its
partition. A user who names an image runs theirs everywhere. Live: tests/integration/test_site_images_live.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from conftest import NO_HANG_S

import dlsub.job.submit as submit
from dlsub.cli.doctor import check_image, check_partitions, check_site_images
from dlsub.cli.main import main
from dlsub.containers.podman import ContainerSpec, ImageError
from dlsub.contract import BATCH_SCRIPT, Tags
from dlsub.site_config.policy_file import ContainerSite, PolicyFileError, load_policy
from dlsub.slurm_plugins.fake import FakeJob, FakeSlurm
from dlsub.slurm_plugins.sbatch import BatchSpec, render_sbatch

CPU_IMAGE = "localhost/dlsub-torch:2.13.0-cpu"
GPU_IMAGE = "localhost/site-torch:2.14.1-cu130"
IDS = {CPU_IMAGE: "1" * 64, GPU_IMAGE: "c" * 64}


def _policy(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(body)
    return path


# ---------------------------------------------------------------- the policy file (pure)


def test_partition_images_are_read_checked_and_give_way_to_the_users_own_image(tmp_path: Path) -> None:
    site = load_policy(_policy(tmp_path, f'[containers]\nimage = "{CPU_IMAGE}"\n'
                                         f'partition_images = {{ gpu = "{GPU_IMAGE}", gpu-dev = "{GPU_IMAGE}" }}\n'
                                         )).containers
    assert site.partition_images == (("gpu", GPU_IMAGE), ("gpu-dev", GPU_IMAGE))
    assert site.partition_images_for(None, {}) == site.partition_images
    # The user's image (--image, $DLSUB_IMAGE) runs on every partition.
    assert site.partition_images_for("localhost/mine:1", {}) == ()
    assert site.partition_images_for(None, {"DLSUB_IMAGE": "localhost/mine:1"}) == ()
    assert ContainerSite().partition_images_for(None, {}) == ()


@pytest.mark.parametrize(("body", "said"), [
    ('partition_images = { "gpu;rm" = "a/b:1" }', "'gpu;rm' is not a partition's name"),
    ('partition_images = { gpu = 3 }', "partition_images.gpu: expected an image's name"),
    ('partition_images = { gpu = "a b" }', "partition_images.gpu: 'a b'; name an image as Podman does"),
    ('partition_images = "a/b:1"', "expected a table of partition = \"image\""),
    ("partition_images = { " + ", ".join(f'p{i} = "img:{i}"' for i in range(6)) + " }",
     "6 images; at most 5"),
])
def test_a_wrong_partition_images_table_names_what_is_wrong(tmp_path: Path, body: str, said: str) -> None:
    with pytest.raises(PolicyFileError) as refused:
        load_policy(_policy(tmp_path, f"[containers]\n{body}\n"))
    assert said in str(refused.value)


# ---------------------------------------------------------------- the tags (pure)


def test_the_images_tag_carries_up_to_five_ids_or_the_comment_is_refused() -> None:
    tags = Tags("0123abcd", image="1" * 12, images=("c" * 12, "d" * 12))
    assert tags.comment().endswith(";image=111111111111;images=cccccccccccc.dddddddddddd")
    assert Tags.parse(tags.comment()) == tags
    assert Tags.parse("dlsub:0123abcd;gpus=0;images=cccccccccccc..dddddddddddd") is None
    assert Tags.parse("dlsub:0123abcd;gpus=0;images=" + ".".join(["c" * 12] * 6)) is None
    assert Tags.parse("dlsub:0123abcd;gpus=0;images=../etc") is None


# ---------------------------------------------------------------- the batch script (real bash)


def _spec(tmp_path: Path, partition_images: tuple[tuple[str, str, str | None], ...]) -> BatchSpec:
    script = tmp_path / "train.py"
    script.write_text("")
    container = ContainerSpec(image=CPU_IMAGE, image_id=IDS[CPU_IMAGE], script=script, script_args=(),
                              job_dir=tmp_path / "job", workdir=tmp_path, library_dir=tmp_path / "lib",
                              nproc_per_node=1, partition_images=partition_images)
    return BatchSpec(dlsub_id="0123abcd", job_name="train", partition="cpu", container=container, gpus_per_node=0,
                     cpus_per_task=1, mem_mb=1024, time_limit_min=10, signal_grace_s=30, python=sys.executable)


def _podman_run_of(tmp_path: Path, text: str, partition: str | None) -> list[str]:
    """The ``podman run`` argv the rendered script's container part execs on ``partition`` (a stand-in podman
    records it)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "argv.json"
    stub = bin_dir / "podman"
    stub.write_text(f"#!/bin/sh\nexec python3 -c 'import json,sys; print(json.dumps(sys.argv[1:]))' \"$@\" > {log}\n")
    stub.chmod(0o755)
    batch = tmp_path / "job.sbatch"
    batch.write_text(text)
    env = {k: v for k, v in os.environ.items() if k != "SLURM_JOB_PARTITION"}
    env.update(PATH=f"{bin_dir}:{os.environ['PATH']}", DLSUB_CONTAINER="dlsub-0123abcd-77", SLURM_JOB_ID="77")
    if partition is not None:
        env["SLURM_JOB_PARTITION"] = partition
    done = subprocess.run(["bash", str(batch), "container", "1", "", ""], env=env, capture_output=True, text=True,
                          timeout=NO_HANG_S, check=False)
    assert done.returncode == 0, done.stderr
    argv: list[str] = json.loads(log.read_text())
    return argv


def _image_run(argv: list[str]) -> tuple[str, str]:
    """(the image podman runs, the dlsub.image label) of a recorded ``podman run``."""
    label = next(v for k, v in zip(argv, argv[1:], strict=False) if k == "--label" and v.startswith("dlsub.image="))
    return argv[argv.index("python3") - 1], label.removeprefix("dlsub.image=")


def test_each_attempt_runs_the_image_of_its_partition_and_the_jobs_own_elsewhere(tmp_path: Path) -> None:
    text = render_sbatch(_spec(tmp_path, (("gpu", GPU_IMAGE, IDS[GPU_IMAGE]), ("gpu-dev.a_1", "o'dd:1", "e" * 64))))
    assert _image_run(_podman_run_of(tmp_path, text, "gpu")) == (IDS[GPU_IMAGE], GPU_IMAGE)
    assert _image_run(_podman_run_of(tmp_path, text, "gpu-dev.a_1")) == ("e" * 64, "o'dd:1")
    assert _image_run(_podman_run_of(tmp_path, text, "cpu")) == (IDS[CPU_IMAGE], CPU_IMAGE)
    # A partition whose name merely starts like one named is not it (case patterns match whole words).
    assert _image_run(_podman_run_of(tmp_path, text, "gpux")) == (IDS[CPU_IMAGE], CPU_IMAGE)
    assert _image_run(_podman_run_of(tmp_path, text, None)) == (IDS[CPU_IMAGE], CPU_IMAGE)
    # A dry run (no IDs) runs the names.
    dry = render_sbatch(_spec(tmp_path, (("gpu", GPU_IMAGE, None),)))
    assert _image_run(_podman_run_of(tmp_path, dry, "gpu")) == (GPU_IMAGE, GPU_IMAGE)


def test_without_partition_images_the_podman_line_names_the_one_image(tmp_path: Path) -> None:
    text = render_sbatch(_spec(tmp_path, ()))
    assert "case \"${SLURM_JOB_PARTITION" not in text
    assert _image_run(_podman_run_of(tmp_path, text, "gpu")) == (IDS[CPU_IMAGE], CPU_IMAGE)


def test_a_partition_name_that_is_not_a_plain_word_is_never_rendered(tmp_path: Path) -> None:
    for name in ("gpu) rm -rf ~;;", "gpu\n", "*"):
        with pytest.raises(ValueError, match="partition_images"):
            render_sbatch(_spec(tmp_path, ((name, GPU_IMAGE, IDS[GPU_IMAGE]),)))


def test_the_rendered_choice_passes_shellcheck(tmp_path: Path, shellcheck: str) -> None:
    rendered = tmp_path / "job.sbatch"
    rendered.write_text(render_sbatch(_spec(tmp_path, (("gpu", GPU_IMAGE, IDS[GPU_IMAGE]),))))
    result = subprocess.run([shellcheck, str(rendered)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


# ---------------------------------------------------------------- submit (fake Slurm)


@pytest.fixture
def site_with_partition_images(cli_env: FakeSlurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DLSUB_POLICY", str(_policy(tmp_path, f'[containers]\npartition_images = {{ gpu = '
                                                              f'"{GPU_IMAGE}" }}\n')))
    monkeypatch.delenv("DLSUB_IMAGE", raising=False)

    def check_image(image: str) -> str:
        if image not in IDS:
            raise ImageError(f"image {image!r} is not in your Podman storage")
        return IDS[image]

    monkeypatch.setattr(submit, "check_image", check_image)
    script = tmp_path / "train.py"
    script.write_text("print('training')\n")
    monkeypatch.chdir(tmp_path)
    return script


def _submit(*args: str) -> Result:
    return CliRunner().invoke(main, ["--json", *args], catch_exceptions=False)


def test_submit_records_each_partition_image_and_renders_the_choice(
        cli_env: FakeSlurm, site_with_partition_images: Path) -> None:
    result = _submit("--gpus", "1", str(site_with_partition_images))
    assert result.exit_code == 0, result.output
    job = json.loads(result.stdout)
    rendered = (Path(job["job_dir"]) / BATCH_SCRIPT).read_text()
    assert f"gpu) image={IDS[GPU_IMAGE]} image_name={GPU_IMAGE} ;;" in rendered, rendered
    assert f"*) image={IDS[CPU_IMAGE]} image_name={CPU_IMAGE} ;;" in rendered
    tags = Tags.parse(cli_env.jobs[job["slurm_job_id"]].options["comment"])
    assert tags is not None and tags.image == IDS[CPU_IMAGE][:12] and tags.images == (IDS[GPU_IMAGE][:12],)


def test_a_users_own_image_runs_on_every_partition(cli_env: FakeSlurm, site_with_partition_images: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    result = _submit("--image", GPU_IMAGE, str(site_with_partition_images))
    assert result.exit_code == 0, result.output
    rendered = (Path(json.loads(result.stdout)["job_dir"]) / BATCH_SCRIPT).read_text()
    assert "SLURM_JOB_PARTITION:-}\" in" not in rendered and IDS[GPU_IMAGE] in rendered


def test_a_partition_image_missing_here_refuses_the_job_naming_its_partition(
        cli_env: FakeSlurm, site_with_partition_images: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = dict(IDS)
    del ids[GPU_IMAGE]
    monkeypatch.setattr(submit, "check_image", lambda image: ids[image] if image in ids else (_ for _ in ()).throw(
        ImageError(f"image {image!r} is not in your Podman storage")))
    before = set(cli_env.jobs)
    result = _submit(str(site_with_partition_images))
    assert result.exit_code == 2, result.output
    assert "the site's image for partition gpu (policy.toml [containers] partition_images)" in result.stderr
    assert f"image {GPU_IMAGE!r} is not in your Podman storage" in result.stderr
    assert set(cli_env.jobs) == before, "nothing reached Slurm"


# ---------------------------------------------------------------- doctor (pure; fake Slurm's jobs)


def test_doctor_counts_the_partition_images_jobs_run_and_checks_their_names(fake_slurm: FakeSlurm) -> None:
    from dlsub.slurm_plugins.client import SlurmClient

    fake_slurm.jobs[1000] = FakeJob(1000, "/nonexistent/a.sbatch", {"comment": Tags(
        "0123abcd", image=IDS[CPU_IMAGE][:12], images=(IDS[GPU_IMAGE][:12],)).comment()}, state="PENDING")
    listing = json.dumps([{"Id": IDS[GPU_IMAGE], "Names": [GPU_IMAGE], "ReadOnly": True, "Created": 2},
                          {"Id": IDS[CPU_IMAGE], "Names": [CPU_IMAGE], "ReadOnly": True, "Created": 1}])
    found = check_site_images(subprocess.CompletedProcess([], 0, listing, ""), SlurmClient(runner=fake_slurm).jobs())
    assert f"{IDS[GPU_IMAGE][:12]} {GPU_IMAGE}: 1 job in Slurm run it" in found.detail, found
    assert f"{IDS[CPU_IMAGE][:12]} {CPU_IMAGE}: 1 job in Slurm run it" in found.detail, found
    typo = check_partitions(["cpu", "gpu", "gpus"], ["cpu", "gpu"])
    assert typo.status == "problem" and "gpus" in typo.detail
    import pwd

    me = pwd.getpwuid(os.getuid())
    missing = check_image(me, GPU_IMAGE, subprocess.CompletedProcess([], 1, "", ""), "gpu1", "gpu")
    assert missing.check == f"image of {me.pw_name} on partition gpu" and missing.status == "problem"
    assert dataclasses.asdict(missing)["detail"].startswith(f"{GPU_IMAGE} is not in")


def test_an_estimates_runs_and_profiles_are_of_each_partitions_image(tmp_path: Path) -> None:
    """Pure: a profiling run on a partition uses (and its cached profile is keyed by) that partition's image."""
    from dlsub.estimate.estimator import EstimateRequest, Horizon

    req = EstimateRequest(script=tmp_path / "train.py", args=(), batch_sizes=(32,), horizon=Horizon(epochs=1),
                          workdir=tmp_path, partition_images=(("gpu", GPU_IMAGE),))
    assert req.image_on("gpu", CPU_IMAGE) == GPU_IMAGE
    assert req.image_on("cpu", CPU_IMAGE) == CPU_IMAGE
