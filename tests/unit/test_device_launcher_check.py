"""Unit (no Slurm, no Podman, no GPU): the device check's container command is dlsub's own.

``tests/device/launcher_check.py`` runs on a GPU machine without Podman the words that dlsub's batch script
runs under ``podman run``. If the container lines change shape (a new shell variable, the launcher's module
moved), the device check must fail loudly, not run something else: these tests hold that here, where CI runs.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from conftest import REPO

from dlsub import contract
from dlsub.containers.podman import ContainerSpec


def load_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("launcher_check", REPO / "tests" / "device" / "launcher_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check = load_check()
VALUES = {"nproc": "1", "DLSUB_RDZV_ENDPOINT": "127.0.0.1:29999", "rdzv_conf": "is_host=0,join_timeout=600",
          "container_cuda_devices": "0"}


def spec(tmp_path: Path, **fields: object) -> ContainerSpec:
    return ContainerSpec(image="img", script=check.TRAIN, script_args=("--steps", "5"), job_dir=tmp_path,
                         workdir=tmp_path, library_dir=REPO / "dlsub", **fields)  # type: ignore[arg-type]


def test_the_standalone_job_runs_the_launcher_then_torchrun_then_the_script(tmp_path: Path) -> None:
    argv, env = check.container_command(spec(tmp_path), VALUES, tmp_path / "lib",
                                        {contract.ENV_JOB_DIR: str(tmp_path), "GLOO_SOCKET_IFNAME": "lo"})
    assert argv[:4] == [sys.executable, "-P", "-m", "dlsub.checkpointing.launch"]
    torchrun = argv.index("torchrun")
    assert argv[torchrun:torchrun + 5] == ["torchrun", "--standalone", "--nnodes", "1", "--nproc-per-node"]
    assert argv[-3:] == [str(check.TRAIN), "--steps", "5"]
    assert not any("$" in word for word in argv)
    assert env["PYTHONPATH"] == str(tmp_path / "lib")  # the library's mount path, as the container sees it
    assert env[contract.ENV_JOB_DIR] == str(tmp_path) and env["GLOO_SOCKET_IFNAME"] == "lo"
    assert env["CUDA_VISIBLE_DEVICES"] == "0"
    assert contract.ENV_NNODES not in env


def test_an_elastic_worker_follows_its_main_through_the_rendezvous_it_is_given(tmp_path: Path) -> None:
    argv, env = check.container_command(spec(tmp_path, nnodes="1:2", rendezvous_id="r", follow=True), VALUES,
                                        tmp_path / "lib", {})
    assert "--elastic" in argv and "--follow" in argv
    assert argv[argv.index("--rdzv-endpoint") + 1] == "127.0.0.1:29999"
    assert argv[argv.index("--rdzv-conf") + 1] == "is_host=0,join_timeout=600"
    assert argv[argv.index("--nnodes") + 1] == "1:2"
    assert env[contract.ENV_NNODES] == "1:2" and env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"


def test_a_shell_variable_the_check_does_not_fill_fails_the_check(tmp_path: Path) -> None:
    with pytest.raises(KeyError):
        check.container_command(spec(tmp_path), {k: v for k, v in VALUES.items() if k != "nproc"},
                                tmp_path / "lib", {})
