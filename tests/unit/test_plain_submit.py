"""Unit tests: submit tells a script that uses no dlsub library (issue 34 item 4). The detection itself is
pure (job/script_library.py reads the text, never runs it); the submits run the CLI against the fake Slurm
behind the client's `_run` seam (tests/unit/conftest.py's cli_env), with a policy file of the test's own."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from dlsub.cli.main import main
from dlsub.job.script_library import script_uses_library, uses_library
from dlsub.job.status import PLAIN_NOTE
from dlsub.slurm_plugins.fake import FakeSlurm

REPO = Path(__file__).resolve().parents[2]
PLAIN = "import torch\nfor step in range(10):\n    print('step', step)\n"


@pytest.mark.parametrize("text", [
    "from dlsub import checkpointing\n",
    "from dlsub import batch_split, checkpointing as ckpt\n",
    "import dlsub.checkpointing\n",
    "import dlsub.checkpointing as ckpt\n",
    "from dlsub.checkpointing import init, save\n",
    "from dlsub.checkpointing.lightning import DlsubCallback\n",
    "from dlsub.checkpointing.hf_trainer import DlsubCallback\n",
    "def main():\n    from dlsub import checkpointing\n",
    "import importlib\nckpt = importlib.import_module('dlsub.checkpointing')\n",
    "from dlsub import checkpointing\nprint('unclosed'\n",  # does not parse: its text still names the library
])
def test_the_documented_imports_use_the_library(text: str) -> None:
    assert uses_library(text)


@pytest.mark.parametrize("text", [
    PLAIN,
    "import dlsub\n",  # the package alone is not its checkpointing library
    "from dlsub import contract\n",
    "# from dlsub import checkpointing  (commented out)\nimport torch\n",
    "text = 'we could use dlsub checkpointing here'\n",
    "from .dlsub.checkpointing import init\n",  # a relative import: the user's own package
    "",
])
def test_scripts_without_those_imports_use_none(text: str) -> None:
    assert not uses_library(text)


@pytest.mark.parametrize("example", sorted(p.name for p in (REPO / "examples").glob("*.py")))
def test_every_example_uses_the_library(example: str) -> None:
    assert script_uses_library(REPO / "examples" / example)


# ---------------------------------------------------------------- dlsub submit, fake Slurm


def submit(policy: Path, *args: str) -> Result:
    return CliRunner().invoke(main, ["--json", *args], catch_exceptions=False, env={"DLSUB_POLICY": str(policy)})


@pytest.fixture
def gpus_busy(cli_env: FakeSlurm) -> FakeSlurm:
    for node in ("gpu1", "gpu2"):
        cli_env.nodes[node].gpus_used = cli_env.nodes[node].gpus
    return cli_env


def policy_file(tmp_path: Path, moves: str = "") -> Path:
    path = tmp_path / "policy.toml"
    path.write_text('default_mode = "immediate"\n[partitions.gpu]\nrole = "gpu"\n[partitions.cpu]\nrole = "cpu"\n'
                    "speed = 0.1\n[moves]\n" + moves)
    return path


def notes(result: Result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("dlsub: note:")]


def test_a_plain_script_started_on_cpus_is_told_what_dlsub_can_do(gpus_busy: FakeSlurm, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(PLAIN)
    result = submit(policy_file(tmp_path), "--gpus", "1", str(script))
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["partition"] == "cpu" and out["ideal_partition"] == "gpu" and out["mode"] == "immediate"
    note, cpus_note = notes(result)
    assert "starts on cpu now (immediate mode)" in cpus_note
    assert note.startswith("dlsub: note: train.py uses no dlsub library (no `from dlsub import checkpointing`")
    assert "no move, continuation past a time limit or resize keeps its progress" in note
    assert "restarted from scratch on gpu if GPUs free up within 10 min of its start" in note
    assert note.endswith("or submit with --mode ideal to wait for gpu's GPUs")
    comment = gpus_busy.jobs[out["slurm_job_id"]].options["comment"]
    assert comment == f"dlsub:{out['id']};mode=immediate;ideal=gpu;gpus=1;script=plain", \
        "the tag the agent's restart needs (it restarts no job without it)"


def test_a_library_script_gets_no_note(gpus_busy: FakeSlurm, tmp_path: Path) -> None:
    result = submit(policy_file(tmp_path), "--gpus", "1", str(REPO / "examples" / "train_digits.py"))
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["partition"] == "cpu" and [n for n in notes(result) if "dlsub library" in n] == []
    assert "script=" not in gpus_busy.jobs[out["slurm_job_id"]].options["comment"]


def test_with_plain_scripts_wait_a_plain_script_waits_for_the_gpu_and_says_why(gpus_busy: FakeSlurm,
                                                                              tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(PLAIN)
    result = submit(policy_file(tmp_path, 'plain_scripts = "wait"\n'), "--gpus", "1", str(script))
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["partition"] == "gpu" and out["mode"] == "ideal"
    job = gpus_busy.submitted()[0]
    assert job.options["partition"] == "gpu" and job.options["gres"] == "gpu:1"
    assert job.options["comment"] == f"dlsub:{out['id']};mode=ideal;ideal=gpu;gpus=1;script=plain"
    [note] = notes(result)
    assert "it waits for GPUs on gpu rather than start on CPUs" in note and "--mode ideal" not in note
    # The same policy leaves a library script to immediate mode, and the human line says why the GPU.
    library = submit(policy_file(tmp_path, 'plain_scripts = "wait"\n'), "--gpus", "1",
                     str(REPO / "examples" / "train_digits.py"))
    assert json.loads(library.stdout)["partition"] == "cpu"
    human = CliRunner().invoke(main, ["--gpus", "1", str(script)], catch_exceptions=False,
                               env={"DLSUB_POLICY": str(policy_file(tmp_path, 'plain_scripts = "wait"\n'))})
    assert "to partition gpu: its script uses no dlsub library, so it waits for GPUs rather than start on CPUs " \
           "(the site's policy.toml [moves] plain_scripts = \"wait\")" in human.stdout


def test_status_says_a_running_plain_script_never_checkpoints(gpus_busy: FakeSlurm, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(PLAIN)
    plain = json.loads(submit(policy_file(tmp_path), "--gpus", "1", str(script)).stdout)
    library = json.loads(submit(policy_file(tmp_path), "--gpus", "1", str(script)).stdout)
    fresh = json.loads(submit(policy_file(tmp_path), "--gpus", "1", str(script)).stdout)
    for out, ran in ((plain, 300), (library, 300), (fresh, 10)):
        gpus_busy.start(out["slurm_job_id"], "cpu1", int(time.time() - ran))
    # The library's start event, as checkpointing.init() writes it in the job directory.
    with open(Path(library["job_dir"]) / "progress.jsonl", "a") as f:
        f.write(json.dumps({"event": "start", "time": time.time() - 290, "attempt": "1-0"}) + "\n")
    status = {s["id"]: s for s in json.loads(CliRunner().invoke(main, ["status", "--json"]).stdout)}
    assert status[plain["id"]]["uses_library"] is False
    assert status[library["id"]]["uses_library"] is True
    assert status[fresh["id"]]["uses_library"] is None, "10 s in, not known yet"
    table = CliRunner().invoke(main, ["status"]).stdout
    said = [line for line in table.splitlines() if "uses no dlsub library" in line]
    assert said == [f"{plain['id']}: {PLAIN_NOTE}"]


def test_a_gpu_job_started_on_cpus_is_told_in_one_line_what_it_gets_there(gpus_busy: FakeSlurm,
                                                                         tmp_path: Path) -> None:
    """Immediate mode (issue 49 item 5): processes, CPUs, memory on the CPU partition, and no CUDA there."""
    result = submit(policy_file(tmp_path), "--gpus", "2", "--cpus", "3", "--mem", "6G",
                    str(REPO / "examples" / "train_digits.py"))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["partition"] == "cpu"
    assert notes(result) == [
        "dlsub: note: --gpus 2 starts on cpu now (immediate mode) as 1 training process with 3 CPUs, 6 GB and no "
        "GPU, until the agent moves it to gpu: the script must run without CUDA there (torch.cuda.is_available() "
        "is False, .cuda() fails; if it dies of that, it is sent back once to wait for gpu's GPUs); --mode ideal "
        "waits for them from the start"]
    ideal = submit(policy_file(tmp_path), "--mode", "ideal", "--gpus", "1", str(REPO / "examples" / "train_digits.py"))
    assert json.loads(ideal.stdout)["partition"] == "gpu" and notes(ideal) == []
