"""Integration (live Slurm testbed + rootless Podman): a multi-node gang.

`dlsub --nodes 2 --gpus-per-node 2` runs one container per node, torchrun on
each joined through one c10d rendezvous: the training sees world size 4 on
two nodes, and a cancelled gang leaves no container on either node.
"""

from __future__ import annotations

import json
from pathlib import Path

from livebed import TestbedUser, put, wait_for

GANG_PROBE = """
import json, os, socket, time
import torch.distributed as dist
from dlsub import checkpointing
dist.init_process_group("gloo")
run = checkpointing.init()
# Every rank says where it runs; rank 0 gathers them, so the file proves all four joined one group.
mine = {"rank": run.rank, "node": os.environ.get("SLURMD_NODENAME") or os.environ.get("SLURM_NODEID"),
        "slurm_nodeid": os.environ.get("SLURM_NODEID"), "world_size": run.world_size, "nodes": run.nodes,
        "hostname": socket.gethostname(), "address": socket.gethostbyname(socket.gethostname()),
        "master_addr": os.environ.get("MASTER_ADDR"), "gloo_ifname": os.environ.get("GLOO_SOCKET_IFNAME")}
everyone = [None] * run.world_size
dist.all_gather_object(everyone, mine)
if run.is_main:
    with open(os.path.join(os.environ["DLSUB_JOB_DIR"], "gang.json"), "w") as f:
        json.dump(everyone, f)
hold = float(os.environ.get("HOLD_S", "0"))
while hold and not run.should_stop():
    time.sleep(0.5)
run.finish()
dist.destroy_process_group()
"""


def test_a_two_node_gang_forms_world_size_four_and_completes(user: TestbedUser, workdir: Path) -> None:
    probe = put(user, workdir / "gang probe.py", GANG_PROBE)
    job = user.submit("--nodes", "2", "--gpus-per-node", "2", str(probe), cwd=workdir)
    done = user.wait_until_ended(job["id"], "the gang to finish")
    assert done["state"] == "COMPLETED", user.dlsub("logs", job["id"]).stdout
    ranks = json.loads((Path(job["job_dir"]) / "gang.json").read_text())
    assert sorted(r["rank"] for r in ranks) == [0, 1, 2, 3]
    assert {r["world_size"] for r in ranks} == {4}
    assert {r["nodes"] for r in ranks} == {2}, "torchrun's group spans two nodes"
    assert sorted({r["slurm_nodeid"] for r in ranks}) == ["0", "1"], "one container on each node"
    # Two hosts of their own (testbed/hosts.sh): each container has its node's name and address, the group
    # met at rank 0's node, and gloo talks over the interface of each node's address.
    by_node = {r["slurm_nodeid"]: r for r in ranks}
    assert by_node["0"]["hostname"] != by_node["1"]["hostname"], ranks
    assert by_node["0"]["address"] != by_node["1"]["address"] and not by_node["0"]["address"].startswith("127."), ranks
    assert {r["hostname"] for r in ranks} == {r["node"] for r in ranks}, "the container's name is its node's"
    rank0 = next(r for r in ranks if r["rank"] == 0)
    assert {r["master_addr"] for r in ranks} == {rank0["hostname"]}, ranks
    assert {r["gloo_ifname"] for r in ranks} == {"eth0"}, ranks


def test_cancelling_a_gang_leaves_no_container_on_any_node(user: TestbedUser, workdir: Path) -> None:
    probe = put(user, workdir / "gang_probe.py", "import os\nos.environ['HOLD_S'] = '300'\n" + GANG_PROBE)
    job = user.submit("--nodes", "2", "--gpus-per-node", "1", str(probe), cwd=workdir)
    label = f"dlsub.slurm_job_id={job['slurm_job_id']}"
    wait_for("a container on each node", lambda: len(user.containers(label)) == 2, timeout=180)
    user.dlsub("cancel", job["id"])
    wait_for("Slurm to end the gang",
             lambda: (s := user.status(job["id"])) and s["state"] == "CANCELLED", timeout=90)
    wait_for("no container left on either node", lambda: not user.containers(label), timeout=90)
