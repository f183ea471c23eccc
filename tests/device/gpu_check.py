"""The device check: dlsub's training-side library on a real GPU, with CUDA tensors and NCCL.

    python tests/device/gpu_check.py [--out DIR] [--allow-cpu]

For a machine with one CUDA GPU and torch, Lightning and transformers (no
Slurm, no Podman needed): what the testbed's CPU-only image cannot show.
Each check prints one line and goes into ``DIR/gpu_check.json``; the exit
status is 0 only when every check passed.

* ``save_restore``: ``run.save``/``run.restore`` of a CUDA model and its
  Adam state, restored to CPU (the default) and to CUDA, bit for bit.
* ``dcp``: under an NCCL group (torchrun, world size 1) an FSDP2 model of
  about 256 MB saved with ``run.save_sharded`` synchronously and
  asynchronously (the training blocked for how long, the checkpoint
  complete how much later), restored under the group and, resharded, into
  one process with no group at all.
* ``sharded`` / ``lightning`` / ``hf_trainer``: each trains under dlsub's
  own launcher and torchrun with the NCCL backend; a stop signal is sent to
  the launcher in the middle of a step (where a batch script forwards
  Slurm's); the attempt must exit "resume me" (85) with a checkpoint at the
  step it stopped, and the next attempt restore exactly there and run to
  the end, its loss going on from where it was. The Lightning one gets
  SIGTERM (preemption, ``scancel``), the others SIGUSR1 (a time limit, a
  move, a resize).
* ``memory``: the ``cuda_peak_mb`` the library reports, set against
  ``torch.cuda.max_memory_allocated`` read in the training, and what
  ``dlsub estimate``'s profile reader takes from a profiling run
  (``DLSUB_PROFILE_STEPS``) of the sharded example.
* ``examples``: the Lightning and Trainer examples, run as they are, train
  on the GPU.

``--allow-cpu`` runs the same checks on gloo and CPU (to try the script on
a machine without a GPU); a report made so says ``"device": "cpu"``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # dlsub from this checkout (dlsub/__init__ finds the top-level packages)
sys.path.insert(0, str(REPO / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from device_checks import expect, run_check  # noqa: E402

from dlsub.contract import ENV_ATTEMPT, ENV_JOB_DIR, ENV_PROFILE_STEPS, PROGRESS_FILE, RESUME_EXIT_CODE  # noqa: E402

#: Where a worker writes its own reading of the CUDA peak, beside the library's progress records.
SELF_PEAK = "gpu_check_peak.json"
STOP_AT = 30  # the step during which the stop signal is sent
TOTAL = 60  # the steps of a whole training


def on_gpu() -> bool:
    return torch.cuda.is_available()


def backend() -> str:
    return "nccl" if on_gpu() else "gloo"


def device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if on_gpu() else torch.device("cpu")


# ------------------------------------------------------------------ the workers (under torchrun)
def launcher_pid() -> int:
    """The worker's parent is torchrun; torchrun's parent is dlsub's launcher."""
    torchrun = os.getppid()
    for line in Path(f"/proc/{torchrun}/status").read_text().splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    raise RuntimeError("no launcher above torchrun")


def stop_signal() -> signal.Signals:
    return signal.Signals[os.environ.get("GPU_CHECK_SIGNAL", "SIGUSR1")]


def send_stop(step: int) -> None:
    """Sent as a batch script forwards Slurm's signal: to the launcher, which tells the training.

    The steps after it last 50 ms: the launcher looks for signals every 0.2 s, and the tiny models here take
    a few ms a step on a GPU, so they would otherwise finish before the request reaches them."""
    if os.environ.get(ENV_ATTEMPT) != "1" or step < STOP_AT:
        return
    if step > STOP_AT:
        time.sleep(0.05)
        return
    os.kill(launcher_pid(), stop_signal())
    Path(os.environ[ENV_JOB_DIR], "signal_sent.json").write_text(json.dumps({"step": step, "time": time.time()}))


def record_peak() -> None:
    if on_gpu() and int(os.environ.get("RANK", "0")) == 0:
        Path(os.environ[ENV_JOB_DIR], SELF_PEAK).write_text(json.dumps({
            "max_memory_allocated_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1),
            "backend": dist.get_backend() if dist.is_initialized() else None,
            "world_size": dist.get_world_size() if dist.is_initialized() else 1}))


def ensure_group() -> None:
    if "RANK" in os.environ and not dist.is_initialized():
        if on_gpu():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend())


def worker_sharded() -> None:
    ensure_group()
    import sharded_train

    def hook(step: int) -> None:
        if on_gpu():
            torch.cuda.synchronize()
        send_stop(step)

    try:
        sharded_train.main(["--steps", str(TOTAL), "--every", "10"], on_step=hook)
    finally:
        record_peak()


def worker_lightning() -> None:
    ensure_group()
    import lightning as L
    import lightning_train
    from lightning.pytorch.strategies import DDPStrategy

    from dlsub.checkpointing.lightning import DlsubCallback, trainer_args

    class SignalMidStep(L.Callback):
        def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
            send_stop(trainer.global_step + 1)  # during step N's backward (NCCL all-reduce still to come)

    class Peak(L.Callback):
        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            record_peak()

        def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
            record_peak()

    torch.manual_seed(0)
    trainer = L.Trainer(max_steps=TOTAL, accelerator="gpu" if on_gpu() else "cpu",
                        strategy=DDPStrategy(process_group_backend=backend()), logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[SignalMidStep(), Peak(), DlsubCallback(every_n_steps=10)], **trainer_args())
    trainer.fit(lightning_train.Regression(), lightning_train.data(samples=4096))
    record_peak()


def worker_hf_trainer() -> None:
    ensure_group()
    from hf_trainer_train import Sequences
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    from dlsub.checkpointing.hf_trainer import DlsubCallback

    class SignalMidStep(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            send_stop(state.global_step + 1)

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2))
    output = os.path.join(os.environ[ENV_JOB_DIR], "hf")
    training = TrainingArguments(output_dir=output, max_steps=TOTAL, per_device_train_batch_size=16,
                                 learning_rate=3e-3, save_steps=10, save_total_limit=2, logging_steps=1,
                                 report_to=[], disable_tqdm=True, use_cpu=not on_gpu(), seed=0,
                                 ddp_backend=backend())
    dlsub = DlsubCallback()
    trainer = Trainer(model=model, args=training, train_dataset=Sequences(count=2048),
                      callbacks=[SignalMidStep(), dlsub])
    try:
        trainer.train(resume_from_checkpoint=dlsub.resume_checkpoint(output))
    finally:
        record_peak()
    placed = next(model.parameters()).device.type
    Path(os.environ[ENV_JOB_DIR], "hf_device.json").write_text(json.dumps({"device": placed}))


def square_model(mb: int) -> torch.nn.Sequential:
    layers = max(1, mb * 2**20 // (4 * 2048 * 2048))
    return torch.nn.Sequential(*(torch.nn.Linear(2048, 2048, bias=False) for _ in range(layers)))


def digests(tensors: dict[str, torch.Tensor]) -> dict[str, str]:
    """Each tensor's bytes, hashed on the CPU (a sum on the GPU would add in another order)."""
    import hashlib

    return {k: hashlib.sha256(v.detach().cpu().contiguous().numpy().tobytes()).hexdigest()
            for k, v in tensors.items()}


def worker_dcp() -> None:
    """Under torchrun: an FSDP2 model saved sync and async, restored under the group; figures to results.json."""
    from torch.distributed.fsdp import fully_shard

    from dlsub import checkpointing
    from dlsub.checkpointing.sharded import ModelState

    ensure_group()
    torch.manual_seed(0)
    model = square_model(256).to(device())
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    run = checkpointing.init(handle_signals=False)
    state = {"app": ModelState(model, optimizer), "step": 0}
    x = torch.randn(64, 2048, device=device())

    def step() -> float:
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if on_gpu():
            torch.cuda.synchronize()
        return float(loss)

    step_times = []
    for _ in range(5):
        started = time.perf_counter()
        step()
        step_times.append(time.perf_counter() - started)
    step_s = sorted(step_times)[2]
    started = time.perf_counter()
    run.save_sharded({**state, "step": 5})
    sync_blocked = time.perf_counter() - started
    step()
    started = time.perf_counter()
    run.save_sharded({**state, "step": 6}, asynchronous=True)
    async_blocked = time.perf_counter() - started
    step()  # the training goes on while the write thread works
    run.wait_for_checkpoint()
    async_complete = time.perf_counter() - started
    full = {k: v.full_tensor().cpu() if hasattr(v, "full_tensor") else v.cpu()
            for k, v in model.state_dict().items()}
    # the parameters as saved at step 6 are not these (one more step ran): take them from the restore
    fresh = square_model(256).to(device())
    for layer in fresh:
        fully_shard(layer)
    fully_shard(fresh)
    restored = {"app": ModelState(fresh, torch.optim.SGD(fresh.parameters(), lr=0.01)), "step": 0}
    started = time.perf_counter()
    ok = run.restore_sharded(restored)
    restore_s = time.perf_counter() - started
    got = {k: v.full_tensor().cpu() if hasattr(v, "full_tensor") else v.cpu() for k, v in fresh.state_dict().items()}
    sums = digests(got)
    one_step_apart = any(not torch.equal(got[k], full[k]) for k in got)
    if dist.get_rank() == 0:
        Path(os.environ[ENV_JOB_DIR], "results.json").write_text(json.dumps({
            "backend": dist.get_backend(), "world_size": dist.get_world_size(),
            "param_device": str(next(model.parameters()).device),
            "param_type": type(next(model.parameters())).__name__,
            "model_mb": sum(v.numel() * v.element_size() for v in full.values()) / 2**20,
            "step_s": step_s, "sync_blocked_s": sync_blocked, "async_blocked_s": async_blocked,
            "async_complete_s": async_complete, "restore_under_group_s": restore_s, "restored": bool(ok),
            "restored_step": restored["step"], "restored_sums": sums,
            "restored_differs_from_one_step_later": one_step_apart}))


def worker_dcp_plain() -> None:
    """No process group, plain tensors: the sharded checkpoint restored resharded into one whole model."""
    from dlsub import checkpointing
    from dlsub.checkpointing.sharded import ModelState

    model = square_model(256).to(device())
    run = checkpointing.init(handle_signals=False)
    state = {"app": ModelState(model, torch.optim.SGD(model.parameters(), lr=0.01)), "step": 0}
    started = time.perf_counter()
    ok = run.restore_sharded(state)
    print(json.dumps({"restored": bool(ok), "step": state["step"], "seconds": time.perf_counter() - started,
                      "sums": digests(model.state_dict()),
                      "device": str(next(model.parameters()).device)}))


WORKERS: dict[str, Callable[[], None]] = {
    "sharded": worker_sharded, "lightning": worker_lightning, "hf_trainer": worker_hf_trainer,
    "dcp": worker_dcp, "dcp_plain": worker_dcp_plain}


# ------------------------------------------------------------------ the driver
def launch(phase: str, job_dir: Path, attempt: int, extra_env: dict[str, str] | None = None,
           timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """One attempt as dlsub's container runs it: the launcher, torchrun (1 process), this file's worker."""
    env = {**os.environ, ENV_JOB_DIR: str(job_dir), ENV_ATTEMPT: str(attempt), "PYTHONPATH": str(REPO),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **(extra_env or {})}
    command = [sys.executable, "-m", "dlsub.checkpointing.launch", "--grace", "60", "--",
               "torchrun", "--standalone", "--nproc-per-node", "1", __file__, "--worker", phase]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, cwd=job_dir)


def events(job_dir: Path) -> list[dict[str, Any]]:
    path = job_dir / PROGRESS_FILE
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def tail(process: subprocess.CompletedProcess[str]) -> str:
    return (process.stdout + process.stderr)[-3000:]


def check_environment() -> dict[str, Any]:
    import importlib.metadata as md

    versions = {}
    for name in ("torch", "lightning", "transformers", "accelerate"):
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            versions[name] = None
    info: dict[str, Any] = {"versions": versions, "cuda": on_gpu(), "python": sys.version.split()[0]}
    if on_gpu():
        info.update(gpu=torch.cuda.get_device_name(0), cuda_version=torch.version.cuda,
                    nccl=".".join(map(str, torch.cuda.nccl.version())),
                    gpu_memory_gb=round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1))
    return info


def check_save_restore(work: Path) -> dict[str, Any]:
    from dlsub import checkpointing

    torch.manual_seed(0)
    model = square_model(64).to(device())
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(8, 2048, device=device())).sum().backward()
    optimizer.step()
    run = checkpointing.init(work / "plain", handle_signals=False)
    started = time.perf_counter()
    run.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 7})
    save_s = time.perf_counter() - started
    on_cpu = checkpointing.init(work / "plain", handle_signals=False).restore()
    on_device = checkpointing.init(work / "plain", handle_signals=False).restore(map_location=device())
    expect(on_cpu is not None and on_device is not None, "restore() found no checkpoint after save()")
    assert on_cpu is not None and on_device is not None
    weights = model.state_dict()
    expect(on_cpu["step"] == 7 and on_device["step"] == 7, f"restored step {on_cpu['step']}, saved 7")
    expect(all(v.device.type == "cpu" for v in on_cpu["model"].values()), "restore() did not map to the CPU")
    expect(all(v.device == device() for v in on_device["model"].values()),
           f"restore(map_location={device()}) gave tensors elsewhere")
    expect(all(torch.equal(on_cpu["model"][k], v.cpu()) and torch.equal(on_device["model"][k], v)
               for k, v in weights.items()), "restored weights differ from the saved ones")
    moments = [s["exp_avg"] for s in on_device["optimizer"]["state"].values()]
    expect(bool(moments) and all(m.device == device() for m in moments), "Adam's moments not restored on the GPU")
    fresh = square_model(64).to(device())
    fresh.load_state_dict(on_device["model"])
    probe = torch.randn(4, 2048, device=device())
    expect(torch.equal(fresh(probe), model(probe)), "a model loaded from the restore computes otherwise")
    return {"save_s": round(save_s, 3), "mb": round(sum(v.numel() * 4 for v in weights.values()) / 2**20, 1),
            "tensors": len(weights)}


def check_dcp(work: Path) -> dict[str, Any]:
    job = work / "dcp"
    job.mkdir()
    first = launch("dcp", job, 1)
    expect(first.returncode == 0, f"the DCP worker exited {first.returncode}: {tail(first)}")
    results = json.loads((job / "results.json").read_text())
    expect(results["backend"] == backend(), f"process group backend {results['backend']}")
    expect(results["restored"] and results["restored_step"] == 6,
           f"restore under the group: {results['restored']}, step {results['restored_step']} (saved 6)")
    expect(results["restored_differs_from_one_step_later"], "the restore gave the weights of a later step")
    plain = subprocess.run([sys.executable, __file__, "--worker", "dcp_plain"], capture_output=True, text=True,
                           env={**os.environ, ENV_JOB_DIR: str(job), "PYTHONPATH": str(REPO)}, timeout=120)
    expect(plain.returncode == 0, f"the resharded restore exited {plain.returncode}: {tail(plain)}")
    whole = json.loads(plain.stdout.strip().splitlines()[-1])
    expect(whole["restored"] and whole["step"] == 6, f"resharded restore: {whole}")
    expect(whole["sums"] == results["restored_sums"],
           "the checkpoint restored into one whole model differs from the one restored under the group")
    results["restore_into_one_process_s"] = whole["seconds"]
    del results["restored_sums"]
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in results.items()}


def check_stop_and_resume(work: Path, phase: str, sig: str) -> dict[str, Any]:
    job = work / phase
    job.mkdir()
    env = {"GPU_CHECK_SIGNAL": sig}
    first = launch(phase, job, 1, env)
    expect(first.returncode == RESUME_EXIT_CODE,
           f"attempt 1 after {sig} exited {first.returncode}, not {RESUME_EXIT_CODE}: {tail(first)}")
    sent = json.loads((job / "signal_sent.json").read_text())
    before = events(job)
    stops = [e for e in before if e.get("event") == "exit_for_resume"]
    checkpoints = [e for e in before if e.get("event") == "checkpoint"]
    expect(bool(stops) and bool(checkpoints), f"attempt 1 recorded no stop or no checkpoint: {before[-5:]}")
    saved = checkpoints[-1]["step"]
    reported = max(e["step"] for e in before if e.get("event") == "progress")
    expect(saved == reported, f"the stop's checkpoint is at step {saved}, the last step reported {reported}")
    expect(saved < TOTAL, "attempt 1 ran to the end: the signal came too late to test anything")
    last_loss = [e["loss"] for e in before if e.get("event") == "progress" and e.get("loss") is not None]
    second = launch(phase, job, 2, env)
    expect(second.returncode == 0, f"attempt 2 exited {second.returncode}: {tail(second)}")
    after = events(job)[len(before):]
    restores = [e for e in after if e.get("event") == "restore"]
    expect(bool(restores) and restores[0]["step"] == saved,
           f"attempt 2 restored {restores[:1]}, expected step {saved}")
    steps = [e["step"] for e in after if e.get("event") == "progress"]
    expect(bool(steps) and steps[0] == saved + 1 and steps[-1] == TOTAL,
           f"attempt 2 reported steps {steps[:3]}..{steps[-1:]}, expected {saved + 1}..{TOTAL}")
    losses = [e["loss"] for e in after if e.get("event") == "progress" and e.get("loss") is not None]
    peak_self = json.loads((job / SELF_PEAK).read_text()) if (job / SELF_PEAK).exists() else None
    reported_peak = [e["cuda_peak_mb"] for e in after if e.get("cuda_peak_mb") is not None]
    result: dict[str, Any] = {
        "signal": sig, "sent_during_step": sent["step"], "stopped_at_step": saved,
        "resumed_at_step": restores[0]["step"], "loss_before_stop": last_loss[-1] if last_loss else None,
        "first_loss": last_loss[0] if last_loss else None, "loss_after_resume": losses[0] if losses else None,
        "final_loss": losses[-1] if losses else None}
    if last_loss and losses:
        # going on from where it was: nearer the loss it stopped at than the loss it began with
        expect(abs(losses[0] - last_loss[-1]) < abs(losses[0] - last_loss[0]) or last_loss[0] == last_loss[-1],
               f"the loss restarted: began {last_loss[0]}, stopped at {last_loss[-1]}, resumed at {losses[0]}")
    if on_gpu():
        expect(peak_self is not None and peak_self["backend"] == "nccl",
               f"the training's process group is {peak_self and peak_self['backend']}, not nccl")
        expect(bool(reported_peak), "no progress record carries cuda_peak_mb on the GPU")
        assert peak_self is not None
        result.update(backend=peak_self["backend"], cuda_peak_mb_reported=max(reported_peak),
                      max_memory_allocated_mb=peak_self["max_memory_allocated_mb"])
        expect(max(reported_peak) <= peak_self["max_memory_allocated_mb"] + 0.1,
               "the library reported a CUDA peak above torch's own at the end")
    if phase == "hf_trainer":
        placed = json.loads((job / "hf_device.json").read_text())["device"]
        expect(placed == device().type, f"the Trainer's model ended on {placed}")
    return result


def check_memory(work: Path) -> dict[str, Any]:
    from dlsub.estimate.partition_fit import profile_from_events

    job = work / "profile"
    job.mkdir()
    done = launch("sharded", job, 3, {ENV_PROFILE_STEPS: "20"})
    expect(done.returncode == 0, f"the profiling run exited {done.returncode}: {tail(done)}")
    records = events(job)
    finished = [e for e in records if e.get("event") == "finished" and e.get("profile")]
    expect(bool(finished), "the profiling run recorded no profile end")
    profile = profile_from_events("gpu", 64, records, [])
    result: dict[str, Any] = {"profile_steps": profile.steps, "step_s": round(profile.step_s, 5),
                              "peak_rss_mb": profile.memory_mb, "cuda_memory_mb": profile.cuda_memory_mb}
    if on_gpu():
        own = json.loads((job / SELF_PEAK).read_text())["max_memory_allocated_mb"]
        expect(profile.cuda_memory_mb is not None and profile.cuda_memory_mb > 0,
               f"estimate's profile has no CUDA memory: {profile.cuda_memory_mb}")
        expect(abs(profile.cuda_memory_mb - own) <= max(1.0, 0.05 * own),
               f"estimate read {profile.cuda_memory_mb} MB, torch.cuda.max_memory_allocated {own} MB at the end")
        result["max_memory_allocated_mb"] = own
    return result


def check_examples(work: Path) -> dict[str, Any]:
    """The examples as users copy them train on the GPU by themselves (read during training: Lightning moves
    the model back to the CPU when fit() ends)."""
    probes = {
        "lightning_train": ("import lightning as L\n"
                            "class Where(L.Callback):\n"
                            "    def on_train_batch_end(self, trainer, module, *rest):\n"
                            "        seen.add(str(module.device))\n"
                            "lightning_train.main(['--max-steps', '5'], callbacks=[Where()])\n"),
        "hf_trainer_train": ("from transformers import TrainerCallback\n"
                             "class Where(TrainerCallback):\n"
                             "    def on_step_end(self, args, state, control, model=None, **kw):\n"
                             "        seen.add(str(next(model.parameters()).device))\n"
                             f"hf_trainer_train.main(['--max-steps', '5', '--output-dir', {str(work / 'hf')!r}],"
                             " callbacks=[Where()])\n"),
    }
    out: dict[str, Any] = {}
    for mod, body in probes.items():
        code = (f"import sys, json\nsys.path.insert(0, 'examples')\nimport {mod}\nseen = set()\n{body}"
                "print(json.dumps(sorted(seen)))\n")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=180,
                              env={**os.environ, "PYTHONPATH": str(REPO), ENV_JOB_DIR: str(work / mod),
                                   "HF_HUB_OFFLINE": "1"})
        expect(done.returncode == 0, f"{mod} exited {done.returncode}: {tail(done)}")
        placed = json.loads(done.stdout.strip().splitlines()[-1])
        expect(bool(placed) and all(p.startswith(device().type) for p in placed), f"{mod} trained on {placed}")
        out[mod] = placed
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT") or ".", help="where gpu_check.json goes")
    parser.add_argument("--allow-cpu", action="store_true", help="run on CPU and gloo where there is no GPU")
    parser.add_argument("--only", action="append", help="run only this check (repeatable)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        WORKERS[args.worker]()
        return 0
    if not on_gpu() and not args.allow_cpu:
        parser.error("no CUDA GPU here (torch.cuda.is_available() is False); --allow-cpu runs on CPU and gloo")
    report: dict[str, Any] = {"device": "cuda" if on_gpu() else "cpu", "checks": {}}
    checks: dict[str, Callable[[Path], dict[str, Any]]] = {
        "environment": lambda _: check_environment(),
        "save_restore": check_save_restore,
        "dcp": check_dcp,
        "sharded": lambda w: check_stop_and_resume(w, "sharded", "SIGUSR1"),
        "lightning": lambda w: check_stop_and_resume(w, "lightning", "SIGTERM"),
        "hf_trainer": lambda w: check_stop_and_resume(w, "hf_trainer", "SIGUSR1"),
        "memory": check_memory,
        "examples": check_examples,
    }
    failed = 0
    with tempfile.TemporaryDirectory(prefix="dlsub-gpu-check.") as tmp:
        for name, check in checks.items():
            if args.only and name not in args.only:
                continue
            work = Path(tmp, name)
            work.mkdir()
            result = run_check(check, work)
            failed += not result["passed"]
            report["checks"][name] = result
            shown = {k: v for k, v in result.items() if k not in ("traceback",)}
            print(f"{'PASS' if result['passed'] else 'FAIL'} {name}: {json.dumps(shown, default=str)[:1500]}",
                  flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    print(f"{len(report['checks']) - failed} passed, {failed} failed; report in {Path(args.out, 'gpu_check.json')}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
