"""Unit (a stand-in for torch's CUDA queries, and the real entry point in a subprocess; no GPU, no Slurm): dlsub's
torchrun forks its training processes only where torchrun's own questions about GPUs leave CUDA uninitialized in
it (checkpointing/torchrun_main.py, cuda_checks_fork_safe). On an H200 with torch 2.11 every GPU job through
dlsub's launcher failed at its first CUDA call ("Cannot re-initialize CUDA in forked subprocess"): torchrun's
launch configuration asks torch.cuda.is_available() in the process that forks. torch asks NVML instead where
PYTORCH_NVML_BASED_CUDA_CHECK=1; dlsub sets it for torchrun's process only, and the entry point takes it away
before the user's script runs. The device check (tests/device, make gpu-check) runs the real thing on a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import NO_HANG_S, REPO

from dlsub import contract
from dlsub.checkpointing.torchrun_main import cuda_checks_fork_safe
from dlsub.contract import NVML_CUDA_CHECK


def _torch(built: bool, nvml_count: int | None) -> SimpleNamespace:
    cuda = SimpleNamespace() if nvml_count is None else SimpleNamespace(_device_count_nvml=lambda: nvml_count)
    return SimpleNamespace(backends=SimpleNamespace(cuda=SimpleNamespace(is_built=lambda: built)), cuda=cuda)


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(NVML_CUDA_CHECK, raising=False)
    monkeypatch.delenv(contract.ENV_NVML_CHECK_SET, raising=False)


def test_a_cpu_build_forks_and_its_environment_is_left_alone() -> None:
    assert cuda_checks_fork_safe(_torch(built=False, nvml_count=None))
    assert NVML_CUDA_CHECK not in os.environ and contract.ENV_NVML_CHECK_SET not in os.environ


@pytest.mark.parametrize("gpus", [0, 1, 8])
def test_a_cuda_build_whose_nvml_answers_forks_with_torch_asking_nvml(gpus: int) -> None:
    assert cuda_checks_fork_safe(_torch(built=True, nvml_count=gpus))
    assert os.environ[NVML_CUDA_CHECK] == "1" and os.environ[contract.ENV_NVML_CHECK_SET] == "1"


@pytest.mark.parametrize("nvml_count", [-1, None], ids=["nvml does not answer", "torch without the nvml count"])
def test_a_cuda_build_without_nvml_starts_each_process_itself(nvml_count: int | None) -> None:
    assert not cuda_checks_fork_safe(_torch(built=True, nvml_count=nvml_count))
    assert NVML_CUDA_CHECK not in os.environ and contract.ENV_NVML_CHECK_SET not in os.environ


def test_the_users_own_setting_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NVML_CUDA_CHECK, "1")
    assert cuda_checks_fork_safe(_torch(built=True, nvml_count=1))
    assert contract.ENV_NVML_CHECK_SET not in os.environ, "theirs: the script keeps it"
    monkeypatch.setenv(NVML_CUDA_CHECK, "0")  # they asked torch for CUDA's own check: no fork
    assert not cuda_checks_fork_safe(_torch(built=True, nvml_count=1))
    assert os.environ[NVML_CUDA_CHECK] == "0" and contract.ENV_NVML_CHECK_SET not in os.environ


@pytest.mark.parametrize(("given", "seen"), [({NVML_CUDA_CHECK: "1", contract.ENV_NVML_CHECK_SET: "1"}, None),
                                             ({NVML_CUDA_CHECK: "1"}, "1")],
                         ids=["set by dlsub", "set by the user"])
def test_the_script_sees_the_environment_it_was_given(tmp_path: Path, given: dict[str, str],
                                                      seen: str | None) -> None:
    script = tmp_path / "train.py"
    script.write_text("import json, os\n"
                      f"print(json.dumps([os.environ.get({NVML_CUDA_CHECK!r}), "
                      f"os.environ.get({contract.ENV_NVML_CHECK_SET!r})]))\n")
    env = {k: v for k, v in os.environ.items() if k not in (NVML_CUDA_CHECK, contract.ENV_NVML_CHECK_SET)}
    done = subprocess.run([sys.executable, "-m", "dlsub.checkpointing.rank_output", str(script)],
                          env={**env, **given, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                          timeout=NO_HANG_S)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == [seen, None]
