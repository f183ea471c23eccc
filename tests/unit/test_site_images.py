"""Unit tests (the fake Slurm behind the client's `_run` seam; Podman's answers given): the site's image, as
submit records it and doctor reports it. Submit runs a job's image by the ID it had at submit, so a requeue
or a move after the site updated the image under the same name runs the same one; the tags name it (12 hex
digits) so that doctor can tell which versions in the site's store jobs still run. The store itself, its
update and the users' Podman reading it: tests/integration/test_site_images_live.py."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest
from click.testing import CliRunner

import dlsub.containers.podman as podman
import dlsub.job.submit as submit
from dlsub.cli.doctor import check_site_images
from dlsub.cli.main import main
from dlsub.containers.podman import ImageError, check_image
from dlsub.contract import BATCH_SCRIPT, Tags
from dlsub.job.user_store import JobStore
from dlsub.slurm_plugins.client import SlurmClient
from dlsub.slurm_plugins.fake import FakeJob, FakeSlurm

OLD = "1673d281b98a84a45d2cabb0bd4b22269e03e305a3faee31864f24e6a96b83f7"
NEW = "9a8b7c6d5e4f" + "0" * 52
IMAGE = "localhost/dlsub-torch:2.13.0-cpu"


def _answers(table: dict[tuple[str, ...], tuple[int, str]]):  # type: ignore[no-untyped-def]
    def run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        for prefix, (rc, out) in table.items():
            if tuple(argv[:len(prefix)]) == prefix:
                return subprocess.CompletedProcess(list(argv), rc, out, "")
        return subprocess.CompletedProcess(list(argv), 1, "", "")
    return run


def test_check_image_gives_the_id_and_says_where_it_looked(monkeypatch: pytest.MonkeyPatch) -> None:
    info = json.dumps({"store": {"graphRoot": "/var/lib/dlsub-local/alice/containers",
                                 "graphOptions": {"overlay.imagestore": "/var/lib/dlsub-images"}}})
    monkeypatch.setattr(podman, "_podman", _answers({("image", "inspect"): (0, OLD + "\n")}))
    assert check_image(IMAGE) == OLD
    monkeypatch.setattr(podman, "_podman", _answers({("info",): (0, info), ("images",): (0, "")}))
    with pytest.raises(ImageError) as refused:
        check_image("localhost/mine:1")
    said = str(refused.value)
    assert "/var/lib/dlsub-local/alice/containers" in said and "site's read-only store /var/lib/dlsub-images" in said
    bare = json.dumps({"store": {"graphRoot": "/x", "graphOptions": {}}})
    monkeypatch.setattr(podman, "_podman", _answers({("info",): (0, bare), ("images",): (0, "")}))
    with pytest.raises(ImageError, match="no site image store is configured"):
        check_image(IMAGE)


def test_a_job_runs_its_image_by_the_id_it_had_at_submit(cli_env: FakeSlurm, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake Slurm: the batch script runs the ID (the name only as a label), the record keeps it, and the
    comment's tags name it for doctor."""
    monkeypatch.setattr(submit, "check_image", lambda image: OLD)
    script = tmp_path / "train.py"
    script.write_text("print('training')\n")
    result = CliRunner().invoke(main, ["--json", str(script)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    job = json.loads(result.stdout)
    rendered = (Path(job["job_dir"]) / BATCH_SCRIPT).read_text()
    assert OLD in rendered, rendered
    assert f"dlsub.image={IMAGE}" in rendered
    assert JobStore(tmp_path / "dlsub-home" / "dlsub.db").get(job["id"]).image_id == OLD
    comment = cli_env.jobs[job["slurm_job_id"]].options["comment"]
    tags = Tags.parse(comment)
    assert tags is not None and tags.image == OLD[:12], comment


def test_the_image_tag_is_twelve_hex_digits_or_the_comment_is_refused() -> None:
    good = Tags("0123abcd", image=OLD[:12])
    assert Tags.parse(good.comment()) == good
    assert Tags.parse("dlsub:0123abcd;gpus=0;image=1673d281b98a;image=1673d281b98a") is None
    assert Tags.parse("dlsub:0123abcd;gpus=0;image=../../etc") is None
    assert Tags.parse("dlsub:0123abcd;gpus=0;image=" + OLD) is None


def test_doctor_lists_each_site_image_with_the_jobs_that_run_it(fake_slurm: FakeSlurm) -> None:
    """Fake Slurm: two jobs submitted with the old version (one still queued), one with the new; an ended job
    counts for nothing; an older version no job runs any more is named in the fix, to remove."""
    client = SlurmClient(runner=fake_slurm)
    for i, (image, state) in enumerate([(OLD, "RUNNING"), (OLD, "PENDING"), (NEW, "RUNNING"), (NEW, "COMPLETED")]):
        script = Path(f"/nonexistent/job{i}.sbatch")
        fake_slurm.jobs[1000 + i] = FakeJob(1000 + i, str(script), {"comment": Tags(f"0123abc{i}", image=image[:12])
                                                                       .comment()}, state=state)
    listing = json.dumps([{"Id": NEW, "Names": [IMAGE], "ReadOnly": True, "Created": 2},
                          {"Id": OLD, "Names": [], "ReadOnly": True, "Created": 1},
                          {"Id": "f" * 64, "Names": [], "ReadOnly": True, "Created": 0},
                          {"Id": "e" * 64, "Names": ["localhost/mine:1"], "ReadOnly": False, "Created": 3}])
    found = check_site_images(subprocess.CompletedProcess([], 0, listing, ""), client.jobs())
    assert found.detail.startswith(f"{NEW[:12]} {IMAGE}: 1 job in Slurm run it"), found
    assert f"{OLD[:12]} (an older version, untagged): 2 jobs in Slurm run it" in found.detail
    assert "mine" not in found.detail  # the user's own images are not the site's
    assert found.fix.endswith(f"site-image-store.sh remove {'f' * 12}"), found.fix
    none = check_site_images(subprocess.CompletedProcess([], 0, "[]", ""), [])
    assert none.status == "skipped" and "no read-only (site) image store" in none.detail
