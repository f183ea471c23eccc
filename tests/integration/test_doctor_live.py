"""`dlsub doctor` on the live testbed: ok as it comes up, on the login side and on a GPU node, and each problem
introduced on purpose is named with its fix (the job_submit plugin removed, the agent stopped, a user's subuid
entry missing; on a compute node: its CDI spec moved away, the graph root in the shared home, the image missing
from a user's storage, a containers.conf that takes containers out of the job's cgroup). Live tests."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from livebed import SITE_IMAGE_STORE, USER, USER2, TestbedUser, agent_service, on_host


def doctor(user: str = USER, host: str | None = None,
           env: dict[str, str] | None = None) -> tuple[int, dict[str, dict[str, Any]]]:
    """`dlsub doctor --user USER --json` as root (an admin's run), here or on a testbed ``host`` (as
    testbed/on.sh runs it there), with ``env`` added to its environment; its checks by name."""
    argv = [*(on_host(host) if host else []), "env", *(f"{k}={v}" for k, v in (env or {}).items()),
            "dlsub", "doctor", "--user", user, "--json"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    assert result.stdout.strip(), f"doctor printed nothing (exit {result.returncode}): {result.stderr}"
    report = json.loads(result.stdout)
    assert report["ok"] == (result.returncode == 0), report
    return result.returncode, {c["check"]: c for c in report["checks"]}


@contextmanager
def moved_aside(path: Path) -> Iterator[None]:
    aside = path.with_name(path.name + ".doctor-test")
    shutil.move(path, aside)
    try:
        yield
    finally:
        shutil.move(aside, path)


def test_the_testbed_is_ok(user: TestbedUser) -> None:
    rc, checks = doctor()
    assert rc == 0, checks
    assert checks["slurm version"]["status"] == "ok"
    version = subprocess.run(["scontrol", "--version"], capture_output=True, text=True).stdout.split()[-1]
    assert version in checks["slurm version"]["detail"]
    for name in ("agent is a Slurm Operator", "job_submit.lua", "cred_expire", "GPU gres", "policy partitions exist",
                 "agent", "clocks", f"image of {USER}", f"subordinate ids of {USER}", "job cgroups",
                 f"container storage of {USER}", "dlsub package for containers", "shared mounts",
                 f"Podman cgroup settings of {USER}", "site images", f"job directories of {USER}"):
        assert checks[name]["status"] == "ok", checks[name]
    # The site's image, in the store every user reads (testbed/up.sh publishes it).
    assert "localhost/dlsub-torch:2.13.0-cpu" in checks["site images"]["detail"], checks["site images"]
    # Where the tests run is not a Slurm node: no GPUs to check a CDI spec for.
    assert checks["CDI spec"]["status"] == "skipped", checks["CDI spec"]


def test_the_job_submit_plugin_removed(user: TestbedUser) -> None:
    with moved_aside(Path("/etc/slurm/job_submit.lua")):
        rc, checks = doctor()
    assert rc == 1
    assert checks["job_submit.lua"]["status"] == "problem"
    assert "job_submit.lua" in checks["job_submit.lua"]["fix"]


def test_the_agent_stopped(user: TestbedUser) -> None:
    agent_service("stop")
    try:
        rc, checks = doctor()
    finally:
        agent_service("start")
    assert rc == 1
    assert checks["agent"]["status"] == "problem" and "start" in checks["agent"]["fix"]
    assert doctor()[0] == 0


def test_a_users_subuid_entry_missing(user2: TestbedUser) -> None:
    subuid = Path("/etc/subuid")
    original = subuid.read_text()
    subuid.write_text("".join(line for line in original.splitlines(keepends=True)
                              if not line.startswith(f"{USER2}:")))
    try:
        rc, checks = doctor(USER2)
    finally:
        subuid.write_text(original)
    assert rc == 1
    found = checks[f"subordinate ids of {USER2}"]
    # Through getsubids where the host has it (Debian's uidmap ships it; it reads /etc/subuid here), else the file.
    assert found["status"] == "problem" and ("getsubids gives 0 uids" in found["detail"]
                                             or "/etc/subuid has 0" in found["detail"])
    assert "usermod --add-subuids" in found["fix"]


# ---------------------------------------------------------------- on a compute node (issue 30, item 5)

#: The CDI spec testbed/hosts.sh writes for gpu1, as gpu1 sees it (its own /var/run/cdi).
GPU1_CDI_SPEC = "/var/run/cdi/nvidia.yaml"


def test_a_gpu_node_is_ok(user: TestbedUser) -> None:
    rc, checks = doctor(host="gpu1")
    assert rc == 0, checks
    assert checks["CDI spec"]["status"] == "ok" and GPU1_CDI_SPEC in checks["CDI spec"]["detail"]
    for name in (f"image of {USER}", f"container storage of {USER}", f"Podman cgroup settings of {USER}",
                 f"subordinate ids of {USER}", "dlsub package for containers", "job cgroups"):
        assert checks[name]["status"] == "ok", checks[name]
    assert "gpu1" in checks[f"image of {USER}"]["detail"]
    # The agent runs on the login host: from a compute node doctor reaches it over the network, as another
    # login host does (the testbed's policy names agent_address; munge says who asks).
    assert checks["agent"]["status"] == "ok" and "login1:6830" in checks["agent"]["detail"], checks["agent"]
    _, cpu_node = doctor(host="cpu1")
    assert cpu_node["CDI spec"]["status"] == "skipped" and "no GPU gres" in cpu_node["CDI spec"]["detail"]


@contextmanager
def moved_aside_on(host: str, path: str) -> Iterator[None]:
    """``path`` renamed on ``host`` (in its own mount namespace) to a name no one reads, then put back."""
    aside = path + ".doctor-test"
    subprocess.run([*on_host(host), "mv", path, aside], check=True, capture_output=True)
    try:
        yield
    finally:
        subprocess.run([*on_host(host), "mv", aside, path], check=True, capture_output=True)


def test_the_cdi_spec_moved_away_on_a_gpu_node(user: TestbedUser) -> None:
    with moved_aside_on("gpu1", GPU1_CDI_SPEC):
        rc, checks = doctor(host="gpu1")
    assert rc == 1
    found = checks["CDI spec"]
    assert found["status"] == "problem" and "gpu1 has 4 GPUs" in found["detail"], found
    assert found["fix"].startswith("nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml")
    assert doctor(host="gpu1")[1]["CDI spec"]["status"] == "ok"


def test_the_graph_root_in_the_shared_home_on_a_compute_node(user: TestbedUser, workdir: Path) -> None:
    """A storage.conf (through CONTAINERS_STORAGE_CONF, as a job's environment could give Podman) that puts the
    graph root in the home, the shared filesystem of the testbed, keeping the shared image store."""
    root = workdir / "storage"
    conf = workdir / "storage.conf"
    conf.write_text(f'[storage]\ndriver = "overlay"\ngraphroot = "{root}"\nrootless_storage_path = "{root}"\n'
                    f'[storage.options]\nadditionalimagestores = ["{SITE_IMAGE_STORE}"]\n'
                    '[storage.options.overlay]\nmount_program = "/usr/bin/fuse-overlayfs"\n')
    os.chown(conf, user.uid, user.gid)
    rc, checks = doctor(host="gpu1", env={"CONTAINERS_STORAGE_CONF": str(conf)})
    assert rc == 1
    found = checks[f"container storage of {USER}"]
    assert found["status"] == "problem" and str(root) in found["detail"] and "home" in found["detail"], found
    assert "rootless_storage_path" in found["fix"] and "node-local" in found["fix"]


def test_the_image_missing_from_a_users_storage_on_a_node(user2: TestbedUser) -> None:
    """A storage.conf without the site's image store (through CONTAINERS_STORAGE_CONF): dltest2 has no image
    of its own, so none at all on that node."""
    conf = Path(user2.home) / "dlsub-it-no-site-store.conf"
    conf.write_text('[storage]\ndriver = "overlay"\n'
                    f'rootless_storage_path = "/var/lib/dlsub-local/{USER2}/containers-no-site-store"\n')
    os.chown(conf, user2.uid, user2.gid)
    try:
        rc, checks = doctor(USER2, host="gpu1", env={"CONTAINERS_STORAGE_CONF": str(conf)})
    finally:
        conf.unlink()
    assert rc == 1
    found = checks[f"image of {USER2}"]
    assert found["status"] == "problem" and "on gpu1" in found["detail"], found
    assert "additionalimagestores" in found["fix"] and "The training image on every node" in found["fix"]


def test_a_containers_conf_that_leaves_the_jobs_cgroup(user: TestbedUser, workdir: Path) -> None:
    """Through CONTAINERS_CONF (which replaces every other containers.conf): what dlsub overrides is a warning
    naming the file, what breaks its containers a problem."""
    conf = workdir / "containers.conf"
    conf.write_text('[engine]\ncgroup_manager = "systemd"\nruntime = "runc"\nevents_logger = "file"\n')
    os.chown(conf, user.uid, user.gid)
    _, checks = doctor(host="gpu1", env={"CONTAINERS_CONF": str(conf)})
    found = checks[f"Podman cgroup settings of {USER}"]
    assert found["status"] == "warn" and str(conf) in found["detail"], found
    assert "--cgroup-manager cgroupfs" in found["detail"] and f"remove cgroup_manager from {conf}" in found["fix"]
    conf.write_text('[containers]\ncgroups = "disabled"\n[engine]\ncgroup_manager = "cgroupfs"\n'
                    'runtime = "runc"\nevents_logger = "file"\n')
    rc, checks = doctor(host="gpu1", env={"CONTAINERS_CONF": str(conf)})
    assert rc == 1
    found = checks[f"Podman cgroup settings of {USER}"]
    assert found["status"] == "problem" and found["fix"].startswith(f'remove cgroups = "disabled" from {conf}')
