"""Unit (real Lightning on CPU, no Slurm): examples/lightning_train.py with dlsub's one callback, checkpointing
every 4 steps and stopped by a SIGUSR1 at step 5 as dlsub stops it, exits "resume me" with a sealed Lightning
checkpoint, and the next run resumes there without being given a path; with pytorch_lightning and Lightning's
own SLURMEnvironment, whose auto-requeue the callback turns off so that the one requeue is dlsub's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import REPO

from dlsub.contract import RESUME_EXIT_CODE

pytest.importorskip("lightning")

# The example, with a callback ahead of dlsub's that sends this process SIGUSR1 (what dlsub's launcher sends
# for a time limit, a move or a resize) at the end of step argv[1] (0: never).
_DRIVE = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, os.path.join(os.environ["REPO"], "examples"))
    import lightning as L
    import lightning_train

    class SignalAt(L.Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == int(sys.argv[1]):
                os.kill(os.getpid(), signal.SIGUSR1)

    lightning_train.main(["--max-steps", "12", "--save-every", "4"], callbacks=[SignalAt()])
""")


def _run(script: str, job: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO), "REPO": str(REPO), "DLSUB_JOB_DIR": str(job),
                               **env})


def _events(job: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in (job / "progress.jsonl").read_text().splitlines()]


def test_stopped_lightning_run_checkpoints_and_the_next_resumes_at_its_step(tmp_path: Path) -> None:
    job = tmp_path / "job"
    first = _run(_DRIVE, job, "5")
    assert first.returncode == RESUME_EXIT_CODE, first.stderr[-3000:]
    saved = job / "checkpoints" / "lightning" / "step-00000005.ckpt"
    assert json.loads(saved.with_name(saved.name + ".dlsub.json").read_text())["step"] == 5, "sealed"
    second = _run(_DRIVE, job, "0")
    assert second.returncode == 0, second.stderr[-3000:]
    events = _events(job)
    kinds = [e["event"] for e in events if e["event"] != "progress"]
    assert kinds == ["start", "checkpoint", "checkpoint", "exit_for_resume", "start", "restore", "checkpoint",
                     "checkpoint", "finished"], kinds
    # Every 4 steps, and at dlsub's stop; the newest two kept (keep=2), the stop's checkpoint pruned by then.
    assert [e["step"] for e in events if e["event"] == "checkpoint"] == [4, 5, 8, 12]
    # Each start tells the agent the job saves whenever asked (it may be moved before its first checkpoint).
    assert [e.get("saves") for e in events if e["event"] == "start"] == ["on_request", "on_request"]
    assert sorted(p.name for p in saved.parent.glob("*.ckpt")) == ["step-00000008.ckpt", "step-00000012.ckpt"]
    restore = next(e for e in events if e["event"] == "restore")
    assert restore["step"] == 5 and restore["path"] == str(saved)
    progress = [e for e in events if e["event"] == "progress"]
    assert [e["step"] for e in progress] == list(range(1, 13)), "each step once: the second run began at 6"
    assert [e["samples"] for e in progress] == [32 * s for s in range(1, 13)], "samples seen carry over"
    # Lightning restarts a plain DataLoader's epoch on a mid-epoch resume: step 6 sees step 1's batch, with
    # the trained weights (a fresh model's loss on it would be step 1's).
    assert progress[5]["loss"] < 0.8 * progress[0]["loss"], "the loss curve continues: the model was restored"


_PL = textwrap.dedent("""
    import os, signal, sys
    import torch
    import pytorch_lightning as pl
    from pytorch_lightning.plugins.environments import SLURMEnvironment
    from torch.utils.data import DataLoader, TensorDataset
    from dlsub.checkpointing.lightning import DlsubCallback

    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)
        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).pow(2).mean()
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Check(pl.Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 2:
                env = trainer._accelerator_connector.cluster_environment
                assert isinstance(env, SLURMEnvironment) and not env.auto_requeue, env
                handler = signal.getsignal(signal.SIGUSR1)
                assert getattr(handler, "__self__", None) is dlsub.run, f"SIGUSR1 goes to {handler}, not dlsub"
                os.kill(os.getpid(), signal.SIGUSR1)

    dlsub = DlsubCallback()
    data = DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=8)
    trainer = pl.Trainer(max_steps=6, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, plugins=[SLURMEnvironment(auto_requeue=True)],
                         callbacks=[Check(), dlsub])
    trainer.fit(Model(), data)
""")


def test_pytorch_lightning_with_slurm_auto_requeue_leaves_the_requeue_to_dlsub(tmp_path: Path) -> None:
    pytest.importorskip("pytorch_lightning")
    job = tmp_path / "job"
    slurm = {"SLURM_NTASKS": "1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
             "SLURM_JOB_NAME": "train", "SLURM_JOB_ID": "77", "SLURM_NODELIST": "localhost"}
    done = _run(_PL, job, **slurm)
    assert done.returncode == RESUME_EXIT_CODE, done.stderr[-3000:]
    assert "scontrol" not in done.stderr and "requeue" not in done.stderr.lower(), "Lightning did not requeue"
    assert [e["step"] for e in _events(job) if e["event"] == "checkpoint"] == [2]


@pytest.mark.parametrize("every", [0, -3, 2.5, True, "10"])
def test_a_periodic_checkpoint_that_is_not_a_whole_number_of_steps_is_refused(every: object) -> None:
    from dlsub.checkpointing.lightning import DlsubCallback

    with pytest.raises(ValueError, match="every_n_steps"):
        DlsubCallback(every_n_steps=every)  # type: ignore[arg-type]


# A Trainer left at one process while torchrun says there are two (what a script without trainer_args() gets).
_ONE_OF_TWO = textwrap.dedent("""
    import lightning as L
    from dlsub.checkpointing.lightning import DlsubCallback
    import sys
    sys.path.insert(0, __import__("os").environ["REPO"] + "/examples")
    import lightning_train
    L.Trainer(max_steps=2, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
              callbacks=[DlsubCallback()]).fit(lightning_train.Regression(), lightning_train.data())
""")


def test_a_trainer_running_fewer_processes_than_torchrun_started_is_refused(tmp_path: Path) -> None:
    """Each of torchrun's processes would otherwise train a model of its own under Lightning's single-device
    strategy, writing one checkpoint over the others'. trainer_args() gives the Trainer torchrun's world."""
    refused = _run(_ONE_OF_TWO, tmp_path / "job", LOCAL_WORLD_SIZE="1", WORLD_SIZE="2", RANK="0", LOCAL_RANK="0",
                   GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29599", TORCHELASTIC_RUN_ID="unit")
    assert refused.returncode != 0
    assert "torchrun started 2 training processes but the Trainer runs as 1" in refused.stderr, refused.stderr[-3000:]
    assert "trainer_args()" in refused.stderr
    assert not (tmp_path / "job" / "checkpoints").exists() or not list((tmp_path / "job").rglob("*.ckpt"))


def test_trainer_args_are_torchrun_s_world(monkeypatch: pytest.MonkeyPatch) -> None:
    from dlsub.checkpointing.lightning import trainer_args

    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert trainer_args() == {}, "outside torchrun: the Trainer's own defaults"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert trainer_args() == {"devices": 2, "num_nodes": 2}
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE=2, WORLD_SIZE=3"):
        trainer_args()


def test_trainer_args_merge_with_the_devices_and_num_nodes_a_script_sets(monkeypatch: pytest.MonkeyPatch) -> None:
    """A script that sets devices or num_nodes passes them to trainer_args() (beside **trainer_args() Python
    refuses the keyword twice): outside torchrun they stand; under it, what says the same stands and a clash is
    an error naming it."""
    from dlsub.checkpointing.lightning import trainer_args

    for name in ("LOCAL_WORLD_SIZE", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    given = {"devices": 4, "num_nodes": 1, "max_steps": 5}
    assert trainer_args(**given) == given, "outside torchrun: what the script set"
    import lightning as L

    trainer = L.Trainer(**trainer_args(devices=1, accelerator="cpu", max_steps=1, logger=False))
    assert trainer.num_devices == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert trainer_args(devices="auto", max_steps=5) == {"devices": 2, "num_nodes": 2, "max_steps": 5}
    assert trainer_args(devices=-1)["devices"] == 2
    assert trainer_args(devices=[0, 1], num_nodes=2) == {"devices": [0, 1], "num_nodes": 2}
    assert trainer_args(devices="0,1")["devices"] == "0,1"
    with pytest.raises(ValueError, match=r"Trainer\(devices=4\) clashes with the 2 process\(es\) dlsub started"):
        trainer_args(devices=4)
    with pytest.raises(ValueError, match=r"Trainer\(num_nodes=1\) clashes with the 2 node\(s\)"):
        trainer_args(devices=2, num_nodes=1)
