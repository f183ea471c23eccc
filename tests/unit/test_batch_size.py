"""Unit tests (no Slurm, real files in tmp_path): the training library's side of dlsub choosing the batch size.

A script declares ``BatchSizes``; at each ``init()`` the library takes
``$DLSUB_BATCH_SIZE``, else the agent's mailbox within the limits, else the
declared initial batch, and splits it over the replicas by the rule the
goodput policy predicts with. Scripts that do not declare keep their own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import REPO, run_ranks

from dlsub import checkpointing
from dlsub.agent.job_mailbox import publish_batch
from dlsub.checkpointing import BatchSizes
from dlsub.checkpointing.batch import split
from dlsub.contract import AGENT_MAILBOX_DIR, batch_file
from dlsub.jobdir import check_progress_event
from dlsub.policies.perf_models.fitted_model import BatchLimits, split_batch

SIZES = BatchSizes(init=128, max=4096, local_max=256)


@pytest.fixture(autouse=True)
def _no_batch_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DLSUB_BATCH_SIZE", "WORLD_SIZE", "RANK", "DLSUB_JOB_DIR"):
        monkeypatch.delenv(name, raising=False)


def events(job_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (job_dir / "progress.jsonl").read_text().splitlines()]


def mail(job_dir: Path, text: str) -> None:
    batch_file(job_dir).parent.mkdir(parents=True, exist_ok=True)
    batch_file(job_dir).write_text(text)


def start(job_dir: Path, sizes: BatchSizes | None = SIZES) -> checkpointing.Run:
    return checkpointing.init(job_dir, batch_size=sizes, handle_signals=False)


# ---------------------------------------------------------------- the declaration


@pytest.mark.parametrize("kwargs, words", [
    ({"init": 0, "max": 4096, "local_max": 256}, "init=0 is outside"),
    ({"init": 128, "max": 64, "local_max": 256}, "init=128 is above max=64"),
    ({"init": 128, "max": 4096, "local_max": 16, "local_min": 32}, "local_min=32 is above local_max=16"),
    ({"init": 16, "max": 4096, "local_max": 256, "local_min": 32}, "local_min=32 is above init=16"),
    ({"init": 128.0, "max": 4096, "local_max": 256}, "init=128.0 is not a whole number"),
    ({"init": 128, "max": True, "local_max": 256}, "max=True is not a whole number"),
    ({"init": 128, "max": 10**10, "local_max": 256}, "is outside 1..1000000000"),
])
def test_a_bad_declaration_says_what_is_wrong(kwargs: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(".", r"\.")):
        BatchSizes(**kwargs)


def test_init_takes_only_a_declaration(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="BatchSizes"):
        checkpointing.init(tmp_path, batch_size=128, handle_signals=False)  # type: ignore[arg-type]


# ---------------------------------------------------------------- where the batch comes from


def test_declared_initial_batch_without_env_or_mailbox(tmp_path: Path) -> None:
    run = start(tmp_path)
    assert (run.batch_size, run.accumulation_steps, run.micro_batch_size, run.batch_from) == (128, 1, 128, "declared")


def test_the_agents_choice_from_the_mailbox_it_wrote(tmp_path: Path) -> None:
    (tmp_path / AGENT_MAILBOX_DIR).mkdir()
    publish_batch(tmp_path, os.getuid(), 1024, 4, "grew to 4 nodes")
    run = start(tmp_path)
    # One replica: 1024 over micro-steps of at most 256.
    assert (run.batch_size, run.accumulation_steps, run.micro_batch_size, run.batch_from) == (1024, 4, 256, "agent")


def test_the_environment_wins_over_the_mailbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mail(tmp_path, json.dumps({"batch_size": 1024}))
    monkeypatch.setenv("DLSUB_BATCH_SIZE", "64")  # dlsub estimate's profiling run asks for 64
    run = start(tmp_path)
    assert (run.batch_size, run.accumulation_steps, run.batch_from) == (64, 1, "environment")


@pytest.mark.parametrize("text", [
    json.dumps({"batch_size": 8192}),  # above the declared max
    json.dumps({"batch_size": 64}),  # below the declared initial batch
    json.dumps({"batch_size": "1024"}),
    json.dumps({"batch_size": True}),
    json.dumps({"batch_size": 1024.0}),
    json.dumps([1024]),
    "{not json",
    json.dumps({"batch_size": 1024, "reason": "x" * 5000}),  # longer than any message the agent writes
])
def test_a_mailbox_outside_the_limits_or_malformed_gives_the_declared_batch(tmp_path: Path, text: str) -> None:
    mail(tmp_path, text)
    run = start(tmp_path)
    assert (run.batch_size, run.batch_from) == (128, "declared")


def test_a_mailbox_that_is_a_fifo_does_not_hang_the_start(tmp_path: Path) -> None:
    batch_file(tmp_path).parent.mkdir()
    os.mkfifo(batch_file(tmp_path))
    assert start(tmp_path).batch_from == "declared"


def test_each_init_reads_the_mailbox_afresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A grow or shrink re-runs init() in every re-formed process: each sees the newest choice and its size."""
    mail(tmp_path, json.dumps({"batch_size": 512}))
    first = start(tmp_path)
    mail(tmp_path, json.dumps({"batch_size": 2048}))
    monkeypatch.setenv("WORLD_SIZE", "4")
    second = start(tmp_path)
    assert (first.batch_size, first.accumulation_steps, first.micro_batch_size) == (512, 2, 256)
    assert (second.batch_size, second.accumulation_steps, second.micro_batch_size) == (2048, 2, 256)


# ---------------------------------------------------------------- how a batch is split over replicas


@pytest.mark.parametrize("world, batch, expected", [
    (1, 128, (128, 1, 128)),
    (1, 256, (256, 2, 128)),  # one replica above init still takes two micro-steps (the policy's rule)
    (4, 1024, (1024, 1, 256)),
    (4, 4096, (4096, 4, 256)),
    (3, 128, (129, 1, 43)),  # rounded up so every replica does the same work
    (2, 1000, (1000, 2, 250)),
])
def test_accumulation_steps_count_micro_steps_per_optimiser_step(world: int, batch: int,
                                                                 expected: tuple[int, int, int]) -> None:
    chosen = split(SIZES, world, batch, "agent")
    assert (chosen.batch_size, chosen.accumulation_steps, chosen.micro_batch_size) == expected


def test_the_library_runs_the_split_the_policy_predicts() -> None:
    limits = BatchLimits(init_batch=128, max_batch=4096, min_local=1, max_local=256)
    for world in (1, 2, 3, 4, 7, 16, 64):
        for batch in (128, 129, 300, 1000, 1024, 2048, 3333, 4096):
            chosen = split(SIZES, world, batch, "agent")
            atomic, extra = split_batch(limits, world, batch)
            assert (chosen.micro_batch_size, chosen.accumulation_steps) == (atomic, extra + 1)
            assert chosen.batch_size == world * chosen.micro_batch_size * chosen.accumulation_steps
            assert chosen.micro_batch_size <= 256 and chosen.batch_size <= 4096


# ---------------------------------------------------------------- what the run tells the agent


def test_start_event_carries_the_limits_and_the_agent_accepts_it(tmp_path: Path) -> None:
    mail(tmp_path, json.dumps({"batch_size": 512}))
    run = start(tmp_path)
    run.report(step=1, loss=1.0, grad_sqr=0.25, grad_var=float("nan"))
    run.report(step=2, loss=1.0, batch_size=256, accumulation_steps=1, grad_var=-1.0)
    first, report, second = events(tmp_path)
    assert first["batch_limits"] == {"init": 128, "max": 4096, "local_min": 1, "local_max": 256}
    assert (first["batch_size"], first["accumulation_steps"], first["batch_from"]) == (512, 2, "agent")
    assert (report["batch_size"], report["accumulation_steps"], report["grad_sqr"]) == (512, 2, 0.25)
    assert "grad_var" not in report and "grad_var" not in second  # NaN and negative are left out
    assert (second["batch_size"], second["accumulation_steps"]) == (256, 1)
    for event in events(tmp_path):
        assert check_progress_event(event) is not None


def test_a_script_that_does_not_declare_keeps_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mail(tmp_path, json.dumps({"batch_size": 1024}))  # ignored: the script did not opt in
    run = start(tmp_path, None)
    assert (run.batch_size, run.accumulation_steps, run.micro_batch_size, run.batch_from) == (None, 1, None, None)
    monkeypatch.setenv("DLSUB_BATCH_SIZE", "96")
    assert run.batch_size == 96  # read when asked, as before
    run.report(step=1, loss=1.0)
    first, report = events(tmp_path)
    assert "batch_limits" not in first and "batch_size" not in first
    assert report["batch_size"] == 96 and "accumulation_steps" not in report


# ---------------------------------------------------------------- every rank takes rank 0's choice

_RANK = textwrap.dedent("""
    import json, sys
    import torch.distributed as dist
    from dlsub import checkpointing
    dist.init_process_group("gloo")
    run = checkpointing.init(sys.argv[1], batch_size=checkpointing.BatchSizes(init=128, max=4096, local_max=256),
                             handle_signals=False)
    print(json.dumps([run.rank, run.batch_size, run.accumulation_steps, run.batch_from]))
    dist.destroy_process_group()
""")


def test_under_torch_distributed_every_rank_takes_rank_0s_batch(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DLSUB_BATCH_SIZE", raising=False)
    # Rank 0 is asked for 512 by name; rank 1 would otherwise fall back to the declared 128.
    outs = [json.loads(line) for line in run_ranks(_RANK, [str(tmp_path)], [{"DLSUB_BATCH_SIZE": "512"}, {}])]
    assert sorted(outs) == [[0, 512, 1, "environment"], [1, 512, 1, "environment"]]


# ---------------------------------------------------------------- the user guide's example runs


def test_the_user_guide_snippet_runs_and_follows_the_mailbox(tmp_path: Path) -> None:
    text = (REPO / "docs" / "user-guide.md").read_text()
    section = text[text.index("### Letting dlsub choose the batch size"):]
    begin = section.index("```python\n") + len("```python\n")
    code = section[begin:section.index("\n```", begin)]
    (tmp_path / "train.py").write_text(code)
    env = {k: v for k, v in os.environ.items() if k not in ("DLSUB_BATCH_SIZE", "WORLD_SIZE", "RANK", "DLSUB_JOB_DIR")}
    mail(tmp_path / "dlsub-run", json.dumps({"batch_size": 1024, "reason": "test"}))
    done = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, env={**env, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    reports = [e for e in events(tmp_path / "dlsub-run") if e["event"] == "progress"]
    assert (reports[-1]["batch_size"], reports[-1]["accumulation_steps"]) == (1024, 4)
    assert reports[-1]["samples"] == 5 * 8192 and len(reports) == 40


def test_the_example_continues_at_the_right_sample_when_the_agent_changes_its_batch(tmp_path: Path) -> None:
    """examples/train_digits.py --adaptive-batch: one epoch at the declared 64, then the agent's 512 on resume."""
    env = {k: v for k, v in os.environ.items() if k not in ("DLSUB_BATCH_SIZE", "WORLD_SIZE", "RANK", "DLSUB_JOB_DIR")}
    env["PYTHONPATH"] = str(REPO)

    def train(epochs: int) -> None:
        done = subprocess.run([sys.executable, str(REPO / "examples" / "train_digits.py"), "--adaptive-batch",
                               "--epochs", str(epochs)], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr

    train(1)
    job_dir = tmp_path / "dlsub-run"
    (job_dir / AGENT_MAILBOX_DIR).mkdir()
    publish_batch(job_dir, os.getuid(), 512, 8, "grew")
    train(2)
    starts = [e for e in events(job_dir) if e["event"] == "start"]
    assert [(s["batch_size"], s["accumulation_steps"], s["batch_from"]) for s in starts] == [
        (64, 1, "declared"), (512, 8, "agent")]
    last = [e for e in events(job_dir) if e["event"] == "progress"][-1]
    train_samples = int(0.8 * 1797)  # the shipped optdigits set, its first 80% for training
    per_epoch = train_samples // 64
    # Epoch 0 at 64 a step; epoch 1 at 512 a step, from its first sample (the checkpoint at the epoch's end).
    assert last["step"] == per_epoch + train_samples // 512
    assert last["samples"] == per_epoch * 64 + (train_samples // 512) * 512
    measured = [e for e in events(job_dir) if e["event"] == "progress" and e["batch_size"] == 512 and "grad_var" in e]
    assert measured and all(e["grad_sqr"] >= 0 and e["grad_var"] > 0 for e in measured)
