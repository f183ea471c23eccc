"""Unit (real processes on CPU, no Slurm): the plain-PyTorch sharded example stops at dlsub's SIGUSR1 and resumes
at its step; the user guide's snippets (docs/user-guide.md) for sharded models, Lightning and the Hugging Face
Trainer run exactly as written (each to its end; a few seconds apiece)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import REPO

from dlsub.contract import RESUME_EXIT_CODE

_DRIVE = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, os.path.join(os.environ["REPO"], "examples"))
    import sharded_train

    def on_step(step):
        if step == int(sys.argv[1]):
            os.kill(os.getpid(), signal.SIGUSR1)

    print(sharded_train.main(["--steps", "12", "--every", "4"], on_step=on_step))
""")


def _env(job: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "REPO": str(REPO), "DLSUB_JOB_DIR": str(job),
            "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def test_the_sharded_example_stops_at_dlsubs_signal_and_resumes_at_its_step(tmp_path: Path) -> None:
    job = tmp_path / "job"
    first = subprocess.run([sys.executable, "-c", _DRIVE, "6"], env=_env(job), capture_output=True, text=True,
                           timeout=120)
    assert first.returncode == RESUME_EXIT_CODE, first.stderr[-3000:]
    second = subprocess.run([sys.executable, "-c", _DRIVE, "0"], env=_env(job), capture_output=True, text=True,
                            timeout=120)
    assert second.returncode == 0, second.stderr[-3000:]
    events = [json.loads(line) for line in (job / "progress.jsonl").read_text().splitlines()]
    saves = [(e["step"], Path(e["path"]).name) for e in events if e["event"] == "checkpoint"]
    # Step 4: the periodic asynchronous one; 6: dlsub's stop; 8 and 12 after the resume (named in sequence).
    assert saves == [(4, "dcp-00000001"), (6, "dcp-00000002"), (8, "dcp-00000003"), (12, "dcp-00000004")], saves
    assert [e["step"] for e in events if e["event"] == "restore"] == [6]
    assert [e["step"] for e in events if e["event"] == "progress"] == list(range(1, 13))


def _guide_snippet(heading: str) -> str:
    text = (REPO / "docs" / "user-guide.md").read_text()
    section = text.split(f"### {heading}", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, heading
    return match.group(1)


@pytest.mark.parametrize("heading, needs", [("Sharded models", "torch"), ("Lightning", "lightning"),
                                            ("Hugging Face Trainer", "transformers")])
def test_the_user_guide_snippet_runs_as_written(tmp_path: Path, heading: str, needs: str) -> None:
    pytest.importorskip(needs)
    job = tmp_path / "job"
    done = subprocess.run([sys.executable, "-c", _guide_snippet(heading)], env=_env(job), cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    events = [json.loads(line) for line in (job / "progress.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events if e["event"] == "progress"][-1] == 100
    assert events[-1]["event"] == "finished"
