"""Unit (a real Hugging Face Trainer on CPU, a tiny GPT-2 built from a config, nothing downloaded; no Slurm):
examples/hf_trainer_train.py, stopped by SIGUSR1 at step 5 as dlsub stops it, saves the Trainer's own
checkpoint-5 and exits "resume me"; the next run resumes there and its losses are those of a run never
stopped; a checkpoint folder never sealed (a save killed midway) or corrupt is not resumed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import REPO

from dlsub.contract import RESUME_EXIT_CODE

pytest.importorskip("transformers")

_DRIVE = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, os.path.join(os.environ["REPO"], "examples"))
    from transformers import TrainerCallback
    import hf_trainer_train

    class SignalAt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == int(sys.argv[1]):
                os.kill(os.getpid(), signal.SIGUSR1)

    hf_trainer_train.main(["--max-steps", "8"], callbacks=[SignalAt()])
""")


def _run(job: Path, stop_at: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _DRIVE, str(stop_at)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO), "REPO": str(REPO), "DLSUB_JOB_DIR": str(job),
                               "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})


def _losses(job: Path) -> dict[int, float]:
    events = [json.loads(line) for line in (job / "progress.jsonl").read_text().splitlines()]
    return {e["step"]: e["loss"] for e in events if e["event"] == "progress"}


def test_stopped_trainer_resumes_at_its_step_on_the_same_loss_curve(tmp_path: Path) -> None:
    stopped, straight = tmp_path / "stopped", tmp_path / "straight"
    first = _run(stopped, 5)
    assert first.returncode == RESUME_EXIT_CODE, first.stderr[-3000:]
    assert sorted(p.name for p in (stopped / "hf").iterdir()) == ["checkpoint-5"]
    second = _run(stopped, 0)
    assert second.returncode == 0, second.stderr[-3000:]
    events = [json.loads(line) for line in (stopped / "progress.jsonl").read_text().splitlines()]
    kinds = [e["event"] for e in events if e["event"] != "progress"]
    assert kinds == ["start", "checkpoint", "exit_for_resume", "start", "restore", "checkpoint", "finished"], kinds
    assert [e.get("saves") for e in events if e["event"] == "start"] == ["on_request", "on_request"]
    assert next(e for e in events if e["event"] == "restore")["path"] == str(stopped / "hf" / "checkpoint-5")
    assert [e["samples"] for e in events if e["event"] == "progress"] == [16 * s for s in range(1, 9)]
    assert _run(straight, 0).returncode == 0
    resumed, reference = _losses(stopped), _losses(straight)
    assert list(resumed) == list(range(1, 9))
    assert resumed == pytest.approx(reference, rel=1e-5), "the resumed run continues the same loss curve"

    # A folder never sealed (its save was killed) and one that no longer matches its seal are passed over.
    from dlsub.checkpointing.hf_trainer import DlsubCallback

    output = stopped / "hf"
    shutil.copytree(output / "checkpoint-8", output / "checkpoint-9")
    (output / "checkpoint-9" / "dlsub-manifest.json").unlink()
    with open(output / "checkpoint-8" / "model.safetensors", "r+b") as f:
        f.seek(-1, os.SEEK_END)
        f.write(b"\0" if f.read(1) != b"\0" else b"\1")
    callback = DlsubCallback(job_dir=stopped, handle_signals=False)
    assert callback.resume_checkpoint(output) == str(output / "checkpoint-5")


_SHARED_OUTPUT = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, os.path.join(os.environ["REPO"], "examples"))
    from transformers import TrainerCallback
    import hf_trainer_train

    class SignalAt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 5:
                os.kill(os.getpid(), signal.SIGUSR1)

    hf_trainer_train.main(["--max-steps", "8", "--output-dir", sys.argv[1]], callbacks=[SignalAt()])
""")
_RESUME = "import sys\nfrom dlsub.checkpointing.hf_trainer import DlsubCallback\n" \
          "print(DlsubCallback().resume_checkpoint(sys.argv[1]))\n"


def test_an_output_dir_two_jobs_share_never_hands_one_the_others_checkpoint(tmp_path: Path) -> None:
    """Two jobs submitted from one folder with the example's relative output_dir: job A's sealed checkpoint-5
    is resumed by A's next attempt, never by B (which starts afresh and says why)."""
    shared = tmp_path / "hf-out"
    env = {**os.environ, "PYTHONPATH": str(REPO), "REPO": str(REPO), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    first = subprocess.run([sys.executable, "-c", _SHARED_OUTPUT, str(shared)], capture_output=True, text=True,
                           timeout=120, env={**env, "DLSUB_JOB_DIR": str(tmp_path / "job-a")})
    assert first.returncode == RESUME_EXIT_CODE, first.stderr[-3000:]
    assert (shared / "checkpoint-5").is_dir()

    def resume(job: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", _RESUME, str(shared)], capture_output=True, text=True,
                              timeout=120, env={**env, "DLSUB_JOB_DIR": str(tmp_path / job)})

    other = resume("job-b")
    assert other.stdout.strip() == "None", other.stderr[-3000:]
    assert "passed over" in other.stderr and "not this job's" in other.stderr, other.stderr
    own = resume("job-a")
    assert own.stdout.strip() == str(shared / "checkpoint-5"), own.stderr[-3000:]
