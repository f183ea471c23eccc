"""Integration (live testbed: Slurm, the agent service, rootless Podman): every user runs the site's image from
its one read-only store (containers/site-image-store.sh; etc/testbed/storage.conf names it on every host), with
no image and no Podman file of their own. A user who never ran Podman is moved cpu -> gpu on it; the nodes'
per-user storage stays small however many users run; and the site updating its image while a job runs
leaves that job on the image it was submitted with, through a move, while new jobs get the new one. A site
that names an image per partition (policy.toml [containers] partition_images) has each attempt run the image
of the partition it runs on: a job moved from cpu to gpu changes image with its partition."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from livebed import (
    NODE_LOCAL,
    POLICY_FILE,
    SITE_IMAGE_STORE,
    USER,
    USER2,
    USER3,
    TestbedUser,
    attempts,
    blockers,
    job_output,
    on_host,
    put,
    wait_for,
)

REPO = Path(__file__).resolve().parents[2]
IMAGE = "localhost/dlsub-torch:2.13.0-cpu"
BUILD_CONF = Path("/var/lib/dlsub-testbed/hosts/build-storage.conf")  # testbed/up.sh: the builder's store
STORE_TOOL = REPO / "containers" / "site-image-store.sh"

#: Says which version of the site's image each attempt runs (the update below sets the variable), then trains
#: a few checkpointed steps, slowly on CPUs, so that a move has something to carry.
VERSION_TRAIN = """
import os, sys, time
from dlsub import checkpointing
print("image version", os.environ.get("DLSUB_SITE_IMAGE_VERSION", "1"), flush=True)
run = checkpointing.init(saves_on_request=True)
state = run.restore() or {"step": 0}
slow = float(sys.argv[1]) if not os.path.exists("/dev/nvidia0") else 0.01
for step in range(state["step"], 60):
    time.sleep(slow)
    run.report(step=step + 1, loss=1.0 / (step + 1))
    if run.should_stop():
        run.save({"step": step + 1})
        run.exit_for_resume()
run.finish()
"""


@pytest.fixture(scope="module")
def user3() -> TestbedUser:
    try:
        return TestbedUser(USER3)
    except KeyError:
        pytest.fail(f"user {USER3} does not exist: bring the testbed up with `sudo make testbed`")


def _on(host: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*on_host(host), *argv], capture_output=True, text=True, check=False)


def _kib(host: str, path: Path) -> int:
    out = _on(host, "du", "-sk", str(path)).stdout.split()
    return int(out[0]) if out else 0


@pytest.fixture
def gpus_held(user: TestbedUser) -> Iterator[list[int]]:
    ids = blockers(user)
    yield ids
    subprocess.run(["scancel", *map(str, ids)], check=False)


def _started_on_cpu(user: TestbedUser, job: dict) -> None:
    wait_for("a checkpoint-ready start on cpu", lambda: (s := user.status(job["id"]))["state"] == "RUNNING"
             and (s["step"] or 0) >= 3, timeout=180)


def _moved_and_completed(user: TestbedUser, job: dict, gpus_held: list[int]) -> dict:
    _started_on_cpu(user, job)
    subprocess.run(["scancel", *map(str, gpus_held)], check=True)
    return _completed_on_gpu(user, job)


def _completed_on_gpu(user: TestbedUser, job: dict) -> dict:
    done = user.wait_until_ended(job["id"], "the job to move to gpu and complete", timeout=240)
    assert done["state"] == "COMPLETED" and done["partition"] == "gpu", done
    starts = [a["partition"] for a in attempts(job["job_dir"]) if a["event"] == "start"]
    assert starts[0] == "cpu" and starts[-1] == "gpu", starts
    return done


def _never_ran_podman(user: TestbedUser) -> Path:
    """No Podman storage of the user's anywhere: none in the home, none on any host (an earlier run's is
    removed); only the site's storage.conf, as its provisioning gives every user. A directory to submit from."""
    for host in ("login1", "cpu1", "cpu2", "gpu1", "gpu2"):
        _on(host, "rm", "-rf", str(NODE_LOCAL / user.name / "containers"))
    assert not (Path(user.home) / ".local" / "share" / "containers").exists()
    workdir = Path(user.home) / f"dlsub-it-site-{uuid.uuid4().hex[:8]}"
    workdir.mkdir()
    os.chown(workdir, user.uid, user.gid)
    return workdir


def _builder(*argv: str) -> subprocess.CompletedProcess[str]:
    """The site's image builder (the testbed user, on the login host, in its build store)."""
    uid = TestbedUser(USER).uid
    env = [f"HOME=/home/{USER}", f"XDG_RUNTIME_DIR=/run/user/{uid}/dlsub-image-store",
           f"CONTAINERS_STORAGE_CONF={BUILD_CONF}"]
    return subprocess.run([*on_host("login1"), "runuser", "-u", USER, "--", "env", *env, "podman", *argv],
                          capture_output=True, text=True, check=True)


def _build_from(base: str, name: str, version: str) -> str:
    """A new image ``name`` (its ID): ``base`` that says it is ``version`` (DLSUB_SITE_IMAGE_VERSION), built by the
    site's builder; one layer of metadata, no RUN, so it takes a second."""
    context = Path(f"/home/{USER}") / f"dlsub-it-image-{uuid.uuid4().hex[:8]}"
    context.mkdir()
    try:
        (context / "Containerfile").write_text(f"FROM {base}\nENV DLSUB_SITE_IMAGE_VERSION={version}\n")
        subprocess.run(["chown", "-R", f"{USER}:{USER}", str(context)], check=True)
        _builder("build", "--quiet", "-t", name, str(context))
        return _builder("image", "inspect", "--format", "{{.Id}}", name).stdout.strip()
    finally:
        subprocess.run(["rm", "-rf", str(context)], check=False)


def _publish(name: str) -> None:
    """The builder's image ``name`` into the site's read-only store, as an admin publishes one."""
    subprocess.run([*on_host("login1"), "env", f"DLSUB_IMAGE_STORE_CONF={BUILD_CONF}",
                    f"DLSUB_SITE_IMAGE_STORE={SITE_IMAGE_STORE}", str(REPO / "containers" / "build-image.sh"),
                    "--publish", USER, name], check=True, capture_output=True, text=True)


def test_the_site_image_updated_while_a_job_runs(user: TestbedUser, workdir: Path, gpus_held: list[int],
                                                 service_agent: None) -> None:
    """Version 2 of the image, published under the same name while a job runs on version 1: the job's attempt
    after its move to gpu still runs version 1 (submit recorded its ID); a job submitted after runs version 2;
    doctor lists both, each with the jobs that run it. Then version 1 is the name's again (what a rollback
    does), version 2 removed."""
    old = _builder("image", "inspect", "--format", "{{.Id}}", IMAGE).stdout.strip()
    script = put(user, workdir / "train.py", VERSION_TRAIN)
    job = user.submit("--mode", "immediate", "--gpus", "1", str(script), "3", cwd=workdir)
    new = ""
    try:
        new = _build_from(old, IMAGE, "2")
        assert new != old
        _publish(IMAGE)
        fresh = user.submit("-p", "cpu", str(script), "0.01", cwd=workdir)
        report = subprocess.run(["dlsub", "doctor", "--user", USER, "--json"], capture_output=True, text=True)
        sites = [c for c in json.loads(report.stdout)["checks"] if c["check"] == "site images"]
        assert sites and f"{old[:12]} (an older version, untagged): 1 job" in sites[0]["detail"], sites
        assert f"{new[:12]} {IMAGE}" in sites[0]["detail"], sites
        _moved_and_completed(user, job, gpus_held)
        assert user.wait_until_ended(fresh["id"], timeout=180)["state"] == "COMPLETED"
        assert job_output(job["job_dir"]).count("image version 1") == 2, job_output(job["job_dir"])
        assert "image version 2" in job_output(fresh["job_dir"]), job_output(fresh["job_dir"])
    finally:
        subprocess.run(["bash", str(STORE_TOOL), "--store", str(SITE_IMAGE_STORE), "tag", old, IMAGE], check=False)
        if new:
            subprocess.run(["bash", str(STORE_TOOL), "--store", str(SITE_IMAGE_STORE), "remove", new], check=False)
            _builder("tag", old, IMAGE)
            _builder("rmi", new)


#: A second site image, as a site's CUDA image for its GPU partition stands here: the CPU image with one more
#: variable (the testbed's torch is CPU-only, its GPUs fake), built and published as the site publishes one.
PARTITION_IMAGE = "localhost/dlsub-test-gpu-partition:1"


@contextmanager
def partition_images(table: str) -> Iterator[None]:
    """policy.toml's ``[containers]`` with ``partition_images = TABLE`` (submit and doctor read it each run; the
    agent does not use it); the file restored after."""
    original = POLICY_FILE.read_text()
    assert original.count("\n[containers]\n") == 1, f"{POLICY_FILE} has not one [containers] table"
    POLICY_FILE.write_text(original.replace("\n[containers]\n", f"\n[containers]\npartition_images = {table}\n", 1))
    try:
        yield
    finally:
        POLICY_FILE.write_text(original)


def test_users_who_never_ran_podman_are_moved_each_attempt_on_the_image_of_its_partition(
        user2: TestbedUser, user3: TestbedUser, gpus_held: list[int], service_agent: None) -> None:
    """Two users with no Podman storage anywhere (the third user, and the second, who submits nothing else
    through dlsub in this suite), each with a job that starts on cpu and moves to gpu, beside the first user,
    whose jobs ran all along: the site's store is the one copy of the image however many users run it.

    The site names an image for its gpu partition (partition_images = { gpu = PARTITION_IMAGE }): the third
    user's job, which names no image, runs the site's image on cpu and the gpu partition's after its move (it
    says which: the variable its image sets), and doctor checks the partition's image for that user; the
    second's names the site's image with --image, as a user picking one of the site's images would, and runs it
    on both partitions."""
    old = _builder("image", "inspect", "--format", "{{.Id}}", IMAGE).stdout.strip()
    new = ""
    try:
        new = _build_from(old, PARTITION_IMAGE, "gpu-partition")
        _publish(PARTITION_IMAGE)
        store_kib = _kib("login1", SITE_IMAGE_STORE / "overlay")
        # The store is root's, read-only to every user.
        assert SITE_IMAGE_STORE.stat().st_uid == 0
        denied = user3.run("touch", str(SITE_IMAGE_STORE / "overlay" / "written-by-a-user"))
        assert denied.returncode != 0 and "Permission denied" in denied.stderr, denied
        jobs = {}
        with partition_images(f'{{ gpu = "{PARTITION_IMAGE}" }}'):
            for newcomer, image in ((user3, ()), (user2, ("--image", IMAGE))):
                workdir = _never_ran_podman(newcomer)
                script = put(newcomer, workdir / "train.py", VERSION_TRAIN)
                os.chown(script, newcomer.uid, newcomer.gid)
                jobs[newcomer.name] = (newcomer, workdir, newcomer.submit(
                    "--mode", "immediate", "--gpus", "1", *image, str(script), "1.5", cwd=workdir))
                assert jobs[newcomer.name][2]["partition"] == "cpu", jobs[newcomer.name]
            report = subprocess.run(["dlsub", "doctor", "--user", USER3, "--json"], capture_output=True, text=True)
            checks = {c["check"]: c for c in json.loads(report.stdout)["checks"]}
            assert checks[f"image of {USER3} on partition gpu"]["status"] == "ok", checks
            assert f"{new[:12]} {PARTITION_IMAGE}: 1 job in Slurm run it" in checks["site images"]["detail"], checks
            for newcomer, _, job in jobs.values():
                _started_on_cpu(newcomer, job)
            subprocess.run(["scancel", *map(str, gpus_held)], check=True)
            for newcomer, _, job in jobs.values():
                _completed_on_gpu(newcomer, job)
        for newcomer, workdir, job in jobs.values():
            text = job_output(job["job_dir"])
            if newcomer is user3:
                assert text.count("image version 1") == 1 and text.count("image version gpu-partition") == 1, text
            else:
                assert text.count("image version 1") == 2 and "gpu-partition" not in text, text
            subprocess.run(["rm", "-rf", str(workdir)], check=False)
        # What each user keeps per node is their containers, not the image: the site store holds the one copy,
        # the same size after two more users ran it on every node.
        for host in ("cpu1", "cpu2", "gpu1", "gpu2"):
            for name in (USER, USER2, USER3):
                kept = _kib(host, NODE_LOCAL / name / "containers")
                assert kept < 50 * 1024, (host, name, kept, store_kib)
        assert store_kib > 500 * 1024 and _kib("login1", SITE_IMAGE_STORE / "overlay") == store_kib, store_kib
    finally:
        if new:
            subprocess.run(["bash", str(STORE_TOOL), "--store", str(SITE_IMAGE_STORE), "remove", new], check=False)
            _builder("rmi", new)
