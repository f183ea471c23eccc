"""Unit (the example's own argument parsing, no training): examples/train_digits.py emulates a GPU type's speed
on the testbed's fake GPUs with --gpu-slowdown TYPE=FACTOR, read against DLSUB_GPU_TYPE."""

from __future__ import annotations

import sys

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "examples"))
import train_digits  # the example, not a package: from its folder


def parse(monkeypatch: pytest.MonkeyPatch, *argv: str) -> object:
    monkeypatch.setattr(sys, "argv", ["train_digits.py", *argv])
    return train_digits.parse_args()


@pytest.mark.parametrize(("visible", "gpu_type", "factor"), [
    ("", "", 3.0),  # no GPU: --cpu-slowdown
    ("0", "v100", 2.5),  # a GPU of a type given a factor
    ("0", "a100", 1.0),  # a type given none
    ("0", "", 1.0),  # untyped GPUs
])
def test_the_throttle_is_slowed_by_the_gpu_types_factor(monkeypatch: pytest.MonkeyPatch, visible: str,
                                                        gpu_type: str, factor: float) -> None:
    args = parse(monkeypatch, "--cpu-slowdown", "3", "--gpu-slowdown", "v100=2.5", "--gpu-slowdown", "t4=4")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.setenv("DLSUB_GPU_TYPE", gpu_type)
    assert train_digits.slowdown(args) == factor  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["v100", "v100=fast", "=2", "v100=0", "v100=-1"])
def test_a_malformed_gpu_slowdown_is_refused_saying_what_to_write(monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str], bad: str) -> None:
    with pytest.raises(SystemExit) as exited:
        parse(monkeypatch, "--gpu-slowdown", bad)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--gpu-slowdown takes TYPE=FACTOR, a positive factor, e.g. --gpu-slowdown v100=2.5" in err
