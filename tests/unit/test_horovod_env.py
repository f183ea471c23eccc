"""Unit (no Slurm, no Podman): a Horovod script under dlsub's torchrun, the pure part.

Which scripts count as Horovod's (:func:`uses_horovod`), how torchrun's variables become Horovod's
(:func:`horovod_environment`), the server's plan, and that nothing happens for any other script.
The runs with Horovod itself are in test_horovod_runs.py (skipped where Horovod is not installed).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import NO_HANG_S

from dlsub.checkpointing import horovod_env
from dlsub.checkpointing.horovod_env import (
    HorovodSetupError,
    horovod_environment,
    rendezvous_plan,
    script_uses_horovod,
    store_key,
    uses_horovod,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("text", [
    "import horovod.torch as hvd\n",
    "import horovod\n",
    "from horovod import torch as hvd\n",
    "from horovod.torch import DistributedOptimizer\n",
    "try:\n    import horovod.torch as hvd\nexcept ImportError:\n    hvd = None\n",
    "def main():\n\timport horovod.torch as hvd\n",
    "import os, horovod.torch as hvd\n",
    "import numpy as np, horovod\n",
    "#!/usr/bin/env python\n\"\"\"doc\"\"\"\nimport torch\nimport horovod.torch as hvd\n",
])
def test_a_script_that_imports_horovod_is_seen(text: str) -> None:
    """Unit (no Slurm, no Podman): every way a script imports Horovod, at any indentation, is seen."""
    assert uses_horovod(text)
    assert uses_horovod(text.encode())


@pytest.mark.parametrize("text", [
    "import torch\nimport torch.distributed as dist\n",
    "# import horovod.torch as hvd\n",
    "print('import horovod')\n",
    "import horovodx\n",
    "from horovodx import y\n",
    "import my_horovod\n",
    "x = 'from horovod import torch'\n",
    "",
])
def test_a_script_that_does_not_import_horovod_is_not(text: str) -> None:
    """Unit (no Slurm, no Podman): comments, strings, other modules named like it are not Horovod imports."""
    assert not uses_horovod(text)


def test_only_the_first_megabyte_is_searched(tmp_path: Path) -> None:
    """Unit (no Slurm, no Podman): an import past the first MB is not read (the file is never read whole)."""
    near, far = tmp_path / "near.py", tmp_path / "far.py"
    padding = "#" * 100 + "\n"
    lines = horovod_env.SCRIPT_HEAD_BYTES // len(padding)
    near.write_text(padding * (lines - 2) + "import horovod.torch as hvd\n")
    far.write_text(padding * (lines + 2) + "import horovod.torch as hvd\n")
    assert script_uses_horovod(near)
    assert not script_uses_horovod(far)
    assert not script_uses_horovod(tmp_path / "missing.py")


def torchrun_env(rank: int, world: int, local_world: int, **extra: str) -> dict[str, str]:
    """What torchrun sets for global ``rank`` when every node runs ``local_world`` processes."""
    group_rank, local_rank = divmod(rank, local_world)
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(local_world), "GROUP_RANK": str(group_rank),
            "GROUP_WORLD_SIZE": str(world // local_world), "MASTER_ADDR": "node-a.example", **extra}


def test_torchrun_ranks_become_horovod_ranks() -> None:
    """Unit (no Slurm, no Podman): 3 nodes of 2 processes: every process's Horovod rank, local and cross
    rank are torchrun's, its host is its node, and the rendezvous is on the master's address over gloo."""
    seen = []
    for rank in range(6):
        mapped = horovod_environment(torchrun_env(rank, 6, 2))
        seen.append((mapped["HOROVOD_RANK"], mapped["HOROVOD_LOCAL_RANK"], mapped["HOROVOD_CROSS_RANK"],
                     mapped["HOROVOD_HOSTNAME"]))
        assert mapped["HOROVOD_SIZE"] == "6" and mapped["HOROVOD_LOCAL_SIZE"] == "2"
        assert mapped["HOROVOD_CROSS_SIZE"] == "3"
        assert mapped["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == "node-a.example"
        assert mapped["HOROVOD_CONTROLLER"] == mapped["HOROVOD_CPU_OPERATIONS"] == "gloo"
        assert "HOROVOD_GLOO_IFACE" not in mapped and "HOROVOD_GLOO_RENDEZVOUS_PORT" not in mapped
    assert seen == [(str(r), str(r % 2), str(r // 2), f"node{r // 2}") for r in range(6)]


def test_the_nodes_count_without_group_world_size() -> None:
    """Unit (no Slurm, no Podman): without GROUP_WORLD_SIZE the nodes are WORLD_SIZE // LOCAL_WORLD_SIZE."""
    env = torchrun_env(5, 8, 4)
    del env["GROUP_WORLD_SIZE"]
    assert horovod_environment(env)["HOROVOD_CROSS_SIZE"] == "2"
    assert horovod_environment(env)["HOROVOD_CROSS_RANK"] == "1"


def test_gloo_takes_the_interface_dlsub_chose() -> None:
    """Unit (no Slurm, no Podman): HOROVOD_GLOO_IFACE is GLOO_SOCKET_IFNAME's (its first, when a list)."""
    assert horovod_environment(torchrun_env(0, 2, 2, GLOO_SOCKET_IFNAME="ib0"))["HOROVOD_GLOO_IFACE"] == "ib0"
    assert horovod_environment(torchrun_env(0, 2, 2, GLOO_SOCKET_IFNAME="eth1,eth2"))["HOROVOD_GLOO_IFACE"] == "eth1"


@pytest.mark.parametrize("env, words", [
    ({**torchrun_env(0, 3, 2), "GROUP_WORLD_SIZE": "2"}, "same number of processes on every node"),
    ({**torchrun_env(2, 3, 1), "GROUP_WORLD_SIZE": "2"}, "same number of processes on every node"),
    ({**torchrun_env(1, 4, 2), "GROUP_RANK": "1"}, "as Horovod's plan numbers them"),
    ({**torchrun_env(0, 4, 2), "RANK": "x"}, "RANK is 'x'"),
    ({k: v for k, v in torchrun_env(0, 4, 2).items() if k != "LOCAL_RANK"}, "LOCAL_RANK is None"),
    ({**torchrun_env(0, 4, 2), "RANK": "4"}, "do not add up"),
])
def test_a_group_horovod_cannot_number_is_refused_in_words(env: dict[str, str], words: str) -> None:
    """Unit (no Slurm, no Podman): members with different numbers of processes, or ranks not numbered member by
    member, raise an error that says so (Horovod's ranks would not be torchrun's)."""
    with pytest.raises(HorovodSetupError, match=words):
        horovod_environment(env)


def test_the_plan_names_each_node_with_its_processes() -> None:
    """Unit (no Slurm, no Podman): the server's plan holds node0..node{N-1}, each its processes."""
    assert rendezvous_plan(3, 4) == "node0:4,node1:4,node2:4"
    assert rendezvous_plan(1, 1) == "node0:1"


def test_each_restart_of_the_group_has_its_own_key() -> None:
    """Unit (no Slurm, no Podman): a re-formed group (torchrun's restart count) never reads the last one's port."""
    first = store_key({"TORCHELASTIC_RUN_ID": "42", "TORCHELASTIC_RESTART_COUNT": "0"})
    assert first != store_key({"TORCHELASTIC_RUN_ID": "42", "TORCHELASTIC_RESTART_COUNT": "1"})
    assert first != store_key({"TORCHELASTIC_RUN_ID": "43", "TORCHELASTIC_RESTART_COUNT": "0"})


def test_other_scripts_and_single_processes_are_left_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unit (no Slurm, no Podman): prepare() sets nothing (and starts nothing) for a script without Horovod, for
    a process alone, or where Horovod's variables are set already; it does for a Horovod script of a group."""
    plain, hvd_script = tmp_path / "plain.py", tmp_path / "hvd.py"
    plain.write_text("import torch\n")
    hvd_script.write_text("import horovod.torch as hvd\n")
    started: list[tuple[int, int]] = []

    def fake_server(nodes: int, per_node: int) -> tuple[None, int]:
        started.append((nodes, per_node))
        return None, 12345

    monkeypatch.setattr(horovod_env, "start_rendezvous_server", fake_server)
    monkeypatch.setattr(horovod_env, "share_port", lambda env, port: port)
    monkeypatch.setattr(horovod_env.importlib.util, "find_spec", lambda name: object())
    for key in [k for k in os.environ if k.startswith("HOROVOD_")]:
        monkeypatch.delenv(key)
    cases = [(plain, torchrun_env(0, 4, 2)), (hvd_script, torchrun_env(0, 1, 1)),
             (hvd_script, {**torchrun_env(0, 4, 2), "HOROVOD_RANK": "0"})]
    for script, env in cases:
        with monkeypatch.context() as m:
            for key, value in env.items():
                m.setenv(key, value)
            horovod_env.prepare(str(script))
            assert "HOROVOD_SIZE" not in os.environ
    assert started == []
    with monkeypatch.context() as m:
        for key, value in torchrun_env(0, 4, 2).items():
            m.setenv(key, value)
        horovod_env.prepare(str(hvd_script))
        assert os.environ["HOROVOD_SIZE"] == "4" and os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"] == "12345"
        m.delenv("HOROVOD_RANK")
        m.setenv("RANK", "1")
        m.setenv("LOCAL_RANK", "1")
        horovod_env.prepare(str(hvd_script))
    assert started == [(2, 2)], "only rank 0 starts the server"


def test_without_horovod_installed_a_horovod_script_is_left_alone(tmp_path: Path) -> None:
    """Unit (no Slurm, no Podman): where this Python has no Horovod the script runs as before (its own import
    error says what is missing); and the entry point never imports torch for it."""
    script = tmp_path / "hvd.py"
    script.write_text("import horovod.torch as hvd\n")
    probe = (
        "import importlib.util, os, sys\n"
        "importlib.util.find_spec = lambda name, *a: None if name == 'horovod' else _find(name, *a)\n"
        "from dlsub.checkpointing import horovod_env\n"
        f"horovod_env.prepare({str(script)!r})\n"
        "print(sorted(k for k in os.environ if k.startswith('HOROVOD_')), 'torch' in sys.modules)\n"
    ).replace("importlib.util.find_spec = ", "_find = importlib.util.find_spec\nimportlib.util.find_spec = ")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    env.update(torchrun_env(0, 4, 2), PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=NO_HANG_S)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[] False"


def test_the_rendezvous_module_imports_without_horovod() -> None:
    """Unit (no Slurm, no Podman): the server's module imports Horovod only when run, and refuses bad arguments."""
    from dlsub.checkpointing import horovod_rendezvous

    assert horovod_rendezvous.main(["0", "2"]) == 2
    assert horovod_rendezvous.main(["2"]) == 2
    assert horovod_rendezvous.main(["x", "2"]) == 2
