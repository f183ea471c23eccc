"""Integration (live Slurm testbed + rootless Podman, as the testbed user): data on a shared file system
reaches the container only through a mount.

- `dlsub submit --mount DATA`: the job reads its data there; a write is refused by the read-only mount
  (EROFS, though the user owns the directory); a sibling directory not mounted is not seen.
- `#DLSUB --mount-rw DATA` in the script: the job writes there, and the file is the user's on the host.
- A --mount of a path that does not exist is refused at submit, and nothing is submitted.

The data lives in the user's home (the testbed's shared file system), beside but outside the script's,
submit and job directories, which dlsub mounts anyway; its name has a space, a quote and a `;`.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from livebed import TestbedUser, put

READER = """
import errno, json, os, sys
data, hidden = sys.argv[1], sys.argv[2]
with open(os.path.join(data, "numbers.txt")) as f:
    found = {"sum": sum(int(x) for x in f.read().split())}
try:
    with open(os.path.join(data, "written.txt"), "w") as f:
        f.write("from the container\\n")
    found["write"] = "ok"
except OSError as exc:
    found["write"] = errno.errorcode.get(exc.errno, str(exc.errno))
found["hidden_seen"] = os.path.exists(hidden)
with open(os.path.join(os.environ["DLSUB_JOB_DIR"], "mounts.json"), "w") as f:
    json.dump(found, f)
"""


@pytest.fixture
def shared_data(user: TestbedUser) -> Iterator[tuple[Path, Path]]:
    """A data directory of the user's on the shared home (1..100 in numbers.txt), and an unmounted sibling."""
    base = user.home / f"dlsub-it-mounts-{os.getpid()}"
    data, hidden = base / "data set; it's", base / "not mounted"
    for path in (base, data, hidden):
        path.mkdir()
        os.chown(path, user.uid, user.gid)
        path.chmod(0o755)
    put(user, data / "numbers.txt", " ".join(str(i) for i in range(1, 101)) + "\n")
    yield data, hidden
    shutil.rmtree(base, ignore_errors=True)


def _result(user: TestbedUser, job: dict[str, object]) -> dict[str, object]:
    done = user.wait_until_ended(str(job["id"]), "the job that reads its data", timeout=240)
    assert done["state"] == "COMPLETED", user.dlsub("logs", str(job["id"])).stdout
    return json.loads((Path(str(done["job_dir"])) / "mounts.json").read_text())


def test_a_read_only_mount_gives_the_job_its_data_and_refuses_a_write(user: TestbedUser, workdir: Path,
                                                                       shared_data: tuple[Path, Path]) -> None:
    data, hidden = shared_data
    script = put(user, workdir / "reader.py", READER)
    job = user.submit("--cpus", "1", "--mount", str(data), str(script), str(data), str(hidden), cwd=workdir)
    found = _result(user, job)
    assert found["sum"] == 5050, "the job read its data through the mount"
    assert found["write"] == "EROFS", "the mount is read-only, though the user owns the directory"
    assert not (data / "written.txt").exists()
    assert found["hidden_seen"] is False, "a directory not mounted stays out of the container"
    mounts = user.status(str(job["id"]))["mounts"]
    assert [(m["path"], m["read_only"], m["origin"]) for m in mounts] == [(str(data), True, "user")]


def test_a_read_write_mount_on_a_dlsub_line_takes_the_jobs_output(user: TestbedUser, workdir: Path,
                                                                   shared_data: tuple[Path, Path]) -> None:
    data, hidden = shared_data
    # #DLSUB lines are split as a shell would: the quotes keep the path one word.
    header = f"#DLSUB --cpus 1\n#DLSUB --mount-rw \"{data}\"\n"
    script = put(user, workdir / "writer.py", header + READER)
    job = user.submit(str(script), str(data), str(hidden), cwd=workdir)
    found = _result(user, job)
    assert found["sum"] == 5050 and found["write"] == "ok"
    written = data / "written.txt"
    assert written.read_text() == "from the container\n"
    assert written.stat().st_uid == user.uid, "the file is the user's on the host (--userns keep-id)"


def test_a_mount_that_does_not_exist_submits_nothing(user: TestbedUser, workdir: Path) -> None:
    script = put(user, workdir / "reader.py", READER)
    def jobs() -> set[str]:
        return {j["id"] for j in json.loads(user.dlsub("status", "--all", "--json").stdout)}

    before = jobs()
    refused = user.dlsub("--mount", str(user.home / "no such data"), str(script), cwd=workdir, check=False)
    assert refused.returncode == 2 and "does not exist on this host" in refused.stderr, refused.stderr
    assert jobs() == before
