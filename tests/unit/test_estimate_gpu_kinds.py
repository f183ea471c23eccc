"""Unit: ``dlsub estimate`` per kind of GPU (issue 33, part 4), and ``dlsub submit --from-estimate`` of a typed
row. The pure parts directly; the rest through the stateful fake Slurm (:mod:`dlsub.slurm_plugins.fake`) behind
the client's one ``_run`` seam, whose profiling jobs leave records as a real run on that kind would."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from dlsub.cli.estimate_commands import render_estimate
from dlsub.cli.main import main
from dlsub.contract import Tags
from dlsub.estimate.apply_choice import from_estimate
from dlsub.estimate.estimator import EstimateRequest, Estimator
from dlsub.estimate.gpu_kinds import Target, parse_gpu_types, partition_targets
from dlsub.estimate.partition_fit import FitError, ProfileRun, fit_partition, profile_from_events
from dlsub.estimate.profile_cache import EstimateCache, profile_key
from dlsub.estimate.recommend import Horizon, Knobs, PartitionFacts, build_rows
from dlsub.job.settings import Settings
from dlsub.job.submit import SubmitError
from dlsub.job.user_store import JobStore
from dlsub.site_config.policy_file import AgentPolicy, parse_policy
from dlsub.slurm_plugins import fake as fake_module
from dlsub.slurm_plugins.client import SlurmClient, parse_start_time
from dlsub.slurm_plugins.fake import FakeNode, FakePartition, FakeSlurm

GOLDEN = Path(__file__).parent / "golden" / "estimate_untyped.json"
#: What the fake's ``sbatch --test-only`` answers: the estimator's clock is set to it, so every start is "now".
NOW = parse_start_time("to start at 2026-01-01T00:00:00")
#: How much slower each kind trains the test's model (a100 the fastest), as train_digits.py --gpu-slowdown.
SLOWDOWN = {"": 1.0, "a100": 1.0, "v100": 4.0, "t4": 6.0}


def typed_cluster() -> FakeSlurm:
    """The testbed's shape: gpu1 has a100s, gpu2 v100s (Gres=gpu:a100:4, gpu:v100:4), both in gpu and gpu-dev."""
    fake = fake_module.testbed_cluster()
    fake.nodes["gpu1"].gpu_type, fake.nodes["gpu2"].gpu_type = "a100", "v100"
    return fake


def events(bs: int, kind: str, rng: np.random.Generator) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A profiling run's records on GPUs of ``kind`` ("": untyped), its steps ``SLOWDOWN[kind]`` times slower."""
    t, step_s = 1004.0, (0.002 + 0.00004 * bs) * SLOWDOWN.get(kind, 1.0)
    progress: list[dict[str, Any]] = [{"event": "start", "time": 1002.0}]
    for step in range(5, 61, 5):
        t += 5 * step_s * (3.0 if step == 5 else 1.0) * (1 + rng.normal(0, 0.01))
        progress.append({"event": "progress", "time": t, "step": step, "peak_rss_mb": 300.0 + 0.08 * bs,
                         "steps_per_epoch": 40, "total_epochs": 30})
    start = {"event": "start", "time": 1000.0, "slurm_job_id": 7, "restart": 0, "partition": "gpu"}
    if kind:
        start["gpu_type"] = kind
    return progress, [start, {"event": "end", "time": t + 1.5, "slurm_job_id": 7, "restart": 0, "rc": 0}]


class Runner:
    """The fake Slurm, where every profiling job has run by the next squeue, on the kind its --gres asked for
    (any kind: the first node's). It keeps each sbatch's #SBATCH lines as sbatch read them."""

    def __init__(self, fake: FakeSlurm, ran_on: dict[str, str] | None = None) -> None:
        self.fake, self.ran_on = fake, ran_on or {}  # ran_on: the kind a job that asked for KIND really got
        self.sbatch: list[tuple[bool, list[str]]] = []  # (test-only, its #SBATCH lines)
        self.rng = np.random.default_rng(3)

    def __call__(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        if argv[0] == "sbatch":
            lines = re.findall(r"^#SBATCH (.*)$", Path(argv[-1]).read_text(), flags=re.MULTILINE)
            self.sbatch.append(("--test-only" in argv, lines))
        result = self.fake(argv)
        if argv[0] == "squeue":
            for job in self.fake.submitted():
                if job.state != "PENDING":
                    continue
                bs = int(re.search(r"DLSUB_BATCH_SIZE=(\d+)", Path(job.script).read_text()).group(1))  # type: ignore[union-attr]
                asked = re.fullmatch(r"gpu:(?:([^:]+):)?\d+", job.options.get("gres", ""))
                node = next(n for n in self.fake.partitions[job.options["partition"]].nodes
                            if asked is None or asked.group(1) in (None, self.fake.nodes[n].gpu_type))
                kind = self.ran_on.get(asked.group(1) or "", self.fake.nodes[node].gpu_type) if asked else ""
                progress, attempts = events(bs, kind, self.rng)
                job_dir = Path(job.options["output"]).parent
                (job_dir / "progress.jsonl").write_text("".join(json.dumps(e) + "\n" for e in progress))
                (job_dir / "attempts.jsonl").write_text("".join(json.dumps(e) + "\n" for e in attempts))
                self.fake.set_job_state(job.job_id, "COMPLETED", nodes=node)
            result = self.fake(argv)
        return result

    def profiling_gres(self) -> list[str]:
        return sorted(next((x for x in lines if x.startswith("--gres=")), "-") for test, lines in self.sbatch
                      if not test)

    def probe_gres(self) -> list[str]:
        return sorted(next((x for x in lines if x.startswith("--gres=")), "-") for test, lines in self.sbatch if test)


def estimator(tmp_path: Path, runner: Runner, policy: AgentPolicy | None = None) -> Estimator:
    settings = Settings(home=tmp_path / "home")
    return Estimator(settings, SlurmClient(runner=runner), JobStore(settings.db_path), policy or AgentPolicy(),
                     clock=lambda: NOW, poll_s=0)


def request(tmp_path: Path, **changes: Any) -> EstimateRequest:
    script = tmp_path / "train.py"
    if not script.exists():
        script.write_text("print('train')\n")
    return EstimateRequest(**{"script": script, "args": ("--lr", "0.1"), "batch_sizes": (32, 128),
                              "horizon": Horizon(epochs=2), "workdir": tmp_path, "gpus": 1, **changes})


@pytest.fixture(autouse=True)
def no_image_check(monkeypatch: pytest.MonkeyPatch) -> None:
    import dlsub.job.submit as submit

    monkeypatch.setattr(submit, "check_image", lambda image: None)


# ---------------------------------------------------------------- an untyped cluster: as before


def _rounded(value: Any) -> Any:
    """Floats to 6 significant digits (numpy's fits may differ in the last bits between versions)."""
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def untyped_fingerprint(tmp_path: Path) -> dict[str, Any]:
    """Everything an estimate on the untyped testbed asks Slurm and answers, less what differs by run (ids,
    temporary paths, elapsed time)."""
    runner = Runner(fake_module.testbed_cluster())
    # Prices, a kind's among them: with no kind in the GRES nor declared, the node-hour prices as before.
    policy = parse_policy({"gpu_types": {"a100": {"cost_per_gpu_hour": 3.0}},
                           "partitions": {"gpu": {"role": "gpu", "cost_per_node_hour": 2.0},
                                          "gpu-dev": {"role": "dev", "cost_per_node_hour": 1.0},
                                          "cpu": {"role": "cpu", "cost_per_node_hour": 0.5}}})
    # One queue, the default when the golden file was written (partitions of separate nodes now profile at once).
    payload = estimator(tmp_path, runner, policy).run(request(tmp_path, horizon=Horizon(epochs=500), queues="one"))
    calls = [[a for a in argv if not a.startswith("/")] for argv in runner.fake.calls]
    sbatch = [(test, [re.sub(r"[0-9a-f]{8}", "ID", x) for x in lines if not x.startswith(("--output", "--comment"))])
              for test, lines in runner.sbatch]
    shown = {k: v for k, v in payload.items() if k not in ("id", "created", "elapsed_s", "script")}
    table = render_estimate({**payload, "elapsed_s": 0.0}).replace(payload["id"], "ID")
    return _rounded(json.loads(json.dumps({"calls": calls, "sbatch": sbatch, "payload": shown,
                                           "table": table.splitlines()})))


def test_an_untyped_cluster_estimates_and_asks_slurm_exactly_as_before(tmp_path: Path) -> None:
    """Through the fake Slurm with untyped GPUs (gpu:4) and --gpus 1: every Slurm call, every #SBATCH line, the
    JSON and the table are the golden file's, which the code before GPU kinds wrote (DLSUB_WRITE_GOLDEN=1
    writes it again: only ever from that code)."""
    got = untyped_fingerprint(tmp_path)
    if os.environ.get("DLSUB_WRITE_GOLDEN"):
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    assert got == json.loads(GOLDEN.read_text())
    assert not any("gpu_type" in r for r in got["payload"]["rows"]) and "profiling" not in got["payload"]
    assert {g for test, lines in got["sbatch"] for g in lines if g.startswith("--gres")} == {"--gres=gpu:1"}


# ---------------------------------------------------------------- a partition with two kinds


def test_each_kind_is_profiled_on_its_own_gpus_and_gets_its_own_rows(tmp_path: Path) -> None:
    """Through the fake Slurm shaped like the testbed (gpu1 a100, gpu2 v100 in gpu and gpu-dev)."""
    runner = Runner(typed_cluster())
    policy = parse_policy({"gpu_types": {"a100": {"cost_per_gpu_hour": 3.0}},
                           "partitions": {"gpu": {"role": "gpu", "cost_per_node_hour": 1.0},
                                          "gpu-dev": {"role": "dev"}, "cpu": {"role": "cpu"}}})
    payload = estimator(tmp_path, runner, policy).run(request(tmp_path, horizon=Horizon(epochs=500)))
    # One profile per (role, kind) and batch size: cpu, gpu's a100s and v100s, gpu-dev's a100s and v100s.
    assert runner.profiling_gres() == ["-"] * 2 + ["--gres=gpu:a100:1"] * 4 + ["--gres=gpu:v100:1"] * 4
    assert runner.probe_gres() == ["-"] + ["--gres=gpu:a100:1"] * 2 + ["--gres=gpu:v100:1"] * 2
    rows = {(r["partition"], r.get("gpu_type"), r["batch_size"]): r for r in payload["rows"]}
    assert set(rows) == {(p, k, b) for p, k in (("cpu", None), ("gpu", "a100"), ("gpu", "v100"),
                                                 ("gpu-dev", "a100"), ("gpu-dev", "v100")) for b in (32, 128)}
    assert all(r["feasible"] for r in rows.values()), payload["rows"]
    assert "gpu_type" not in rows[("cpu", None, 32)] and rows[("gpu", "v100", 32)]["gpu_type_from"] == "gres"
    for bs in (32, 128):  # each kind from its own profiles: v100 four times a100's step time
        ratio = rows[("gpu", "v100", bs)]["step_s"] / rows[("gpu", "a100", bs)]["step_s"]
        assert 3.6 < ratio < 4.4, ratio
    # The a100s at their price per GPU-hour; the v100s, which the policy does not price, at the node-hour.
    a100 = rows[("gpu", "a100", 128)]
    assert a100["cost"] == pytest.approx(a100["walltime_s"] / 3600 * 3.0, rel=1e-3, abs=1e-4)
    v100 = rows[("gpu", "v100", 128)]
    assert v100["cost"] == pytest.approx(v100["walltime_s"] / 3600 * 1.0, rel=1e-3, abs=1e-4)
    assert payload["recommendation"]["ideal"]["gpu_type"] == "a100"
    assert payload["gpu_types"] == ["a100", "v100"]
    spent = {(s["partition"], s["gpu_type"]): s for s in payload["profiling"]}
    assert set(spent) == {("gpu", "a100"), ("gpu", "v100"), ("gpu-dev", "a100"), ("gpu-dev", "v100")}
    assert spent[("gpu", "a100")]["measured"] == 2 and spent[("gpu", "a100")]["cost"] == pytest.approx(
        spent[("gpu", "a100")]["seconds"] / 3600 * 3.0, abs=1e-4) and spent[("gpu", "a100")]["cost"] > 0
    assert spent[("gpu", "v100")]["seconds"] > spent[("gpu", "a100")]["seconds"]
    table = render_estimate(payload)
    assert table.splitlines()[0].split()[:4] == ["#", "PARTITION", "GPU", "BATCH"]
    assert "profiling a100 (on gpu, for gpu (a100))" in table and "wait for gpu (a100)" in table
    saved = EstimateCache(tmp_path / "home").load_estimate(payload["id"])
    assert saved["profiles"]["gpu/v100"][0]["gpu_type"] == "v100" and "gpu_type" not in saved["profiles"]["cpu"][0]

    again = estimator(tmp_path, runner, policy).run(request(tmp_path, horizon=Horizon(epochs=500)))
    assert len(runner.profiling_gres()) == 10 and again["from_cache"] == 10
    assert all(s["measured"] == 0 and s["cost"] == 0 for s in again["profiling"])


def test_the_same_kind_stands_in_across_partitions_of_a_role_never_another_kind(tmp_path: Path) -> None:
    """Through the fake Slurm, without roles in the policy: gpu and gpu-dev share a role, so gpu-dev's a100s
    are predicted from gpu's a100 profiles and its v100s from gpu's v100 ones."""
    runner = Runner(typed_cluster())
    payload = estimator(tmp_path, runner).run(request(tmp_path, batch_sizes=(64,)))
    assert runner.profiling_gres() == ["-", "--gres=gpu:a100:1", "--gres=gpu:v100:1"]
    step = {(r["partition"], r.get("gpu_type")): r["step_s"] for r in payload["rows"]}
    assert step[("gpu-dev", "a100")] == step[("gpu", "a100")] != step[("gpu-dev", "v100")] == step[("gpu", "v100")]
    stands = {s["gpu_type"]: s["stands_for"] for s in payload["profiling"]}
    assert stands == {"a100": ["gpu (a100)", "gpu-dev (a100)"], "v100": ["gpu (v100)", "gpu-dev (v100)"]}


def test_a_profile_that_ran_on_another_kind_predicts_nothing(tmp_path: Path) -> None:
    """Through the fake Slurm: the job that asked for a100s reports v100s in its start record; its rows say so."""
    runner = Runner(typed_cluster(), ran_on={"a100": "v100"})
    payload = estimator(tmp_path, runner).run(request(tmp_path, partition="gpu", batch_sizes=(32,)))
    rows = {r.get("gpu_type"): r for r in payload["rows"]}
    assert not rows["a100"]["feasible"] and "ran on v100 GPUs, not a100" in rows["a100"]["why"]
    assert rows["a100"]["walltime_s"] is None and rows["v100"]["feasible"]


def test_without_gpus_kinds_do_not_matter(tmp_path: Path) -> None:
    """Through the fake Slurm, --gpus 0 on the typed cluster: one untyped profile per role, no --gres at all."""
    runner = Runner(typed_cluster())
    payload = estimator(tmp_path, runner).run(request(tmp_path, gpus=0, batch_sizes=(32,)))
    assert runner.profiling_gres() == ["-", "-"] and "profiling" not in payload
    assert not any("gpu_type" in r for r in payload["rows"])


def test_kinds_named_as_partitions_each_get_their_own_profile(tmp_path: Path) -> None:
    """Through the fake Slurm: gpu-a100 (GRES-typed) and gpu-v100 (untyped GRES; policy.toml declares v100)
    share the gpu role; each kind is profiled, the declared one without a GRES type Slurm would refuse."""
    fake = FakeSlurm(nodes=[FakeNode("c1", ["cpu"]), FakeNode("a1", ["gpu-a100"], gpus=4, gpu_type="a100"),
                            FakeNode("v1", ["gpu-v100"], gpus=4)],
                     partitions=[FakePartition("cpu", ["c1"], default=True), FakePartition("gpu-a100", ["a1"]),
                                 FakePartition("gpu-v100", ["v1"])])
    runner = Runner(fake, ran_on={"": "v100"})
    policy = parse_policy({"gpu_types": {"v100": {"cost_per_gpu_hour": 2.0}},
                           "partitions": {"gpu-a100": {"role": "gpu"}, "cpu": {"role": "cpu"},
                                          "gpu-v100": {"role": "gpu", "gpu_type": "v100"}}})
    payload = estimator(tmp_path, runner, policy).run(request(tmp_path, batch_sizes=(32,),
                                                              horizon=Horizon(epochs=500)))
    assert runner.profiling_gres() == ["-", "--gres=gpu:1", "--gres=gpu:a100:1"]
    rows = {r["partition"]: r for r in payload["rows"]}
    assert rows["gpu-v100"]["gpu_type"] == "v100" and rows["gpu-v100"]["gpu_type_from"] == "policy"
    assert rows["gpu-a100"]["gpu_type_from"] == "gres" and rows["gpu-v100"]["step_s"] > 3 * rows["gpu-a100"]["step_s"]
    assert rows["gpu-v100"]["cost"] == pytest.approx(rows["gpu-v100"]["walltime_s"] / 3600 * 2.0, rel=1e-3, abs=1e-4)


# ---------------------------------------------------------------- bad input: a clear error, nothing submitted


def test_gpu_type_restricts_the_kinds_and_refuses_unknown_ones(tmp_path: Path) -> None:
    """Through the fake Slurm: --gpu-type v100 profiles the v100s (and cpu); an unknown kind submits nothing."""
    runner = Runner(typed_cluster())
    payload = estimator(tmp_path, runner).run(request(tmp_path, batch_sizes=(32,), gpu_types=frozenset({"v100"})))
    assert runner.profiling_gres() == ["-", "--gres=gpu:v100:1"]
    assert {(r["partition"], r.get("gpu_type")) for r in payload["rows"]} == {
        ("cpu", None), ("gpu", "v100"), ("gpu-dev", "v100")}
    before = len(runner.fake.submitted())
    with pytest.raises(SubmitError, match=r"--gpu-type h100: no partition .* a100 on gpu, gpu-dev; v100 on gpu"):
        estimator(tmp_path, runner).run(request(tmp_path, gpu_types=frozenset({"h100"})))
    with pytest.raises(SubmitError, match="goes with --gpus N"):
        estimator(tmp_path, runner).run(request(tmp_path, gpus=0, gpu_types=frozenset({"a100"})))
    assert len(runner.fake.submitted()) == before
    for bad in ("a100;rm", "", ",", "a" * 65):
        with pytest.raises(SubmitError, match="as Slurm's GRES names them"):
            parse_gpu_types(bad)
    assert parse_gpu_types("a100, v100") == {"a100", "v100"} and parse_gpu_types(None) == frozenset()


def test_the_cli_refuses_a_bad_gpu_type_export_or_venv_with_exit_2(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI against the fake Slurm: exit 2, the reason, and no job."""
    import dlsub.cli.estimate_commands as commands
    import dlsub.job.submit as submit

    monkeypatch.setattr(submit, "check_image", lambda image: None)

    fake = typed_cluster()
    monkeypatch.setenv("DLSUB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DLSUB_POLICY", str(tmp_path / "none.toml"))
    monkeypatch.setattr(commands, "SlurmClient", lambda: SlurmClient(runner=fake))
    script = tmp_path / "train.py"
    script.write_text("print('x')\n")
    for args, says in ((["--gpus", "1", "--gpu-type", "h100"], "no partition profiled here has GPUs of that kind"),
                       (["--gpus", "1", "--gpu-type", "a100:4"], "as Slurm's GRES names them"),
                       (["--gpu-type", "a100"], "goes with --gpus N"),
                       # submit's --export and --venv, checked as submit checks them
                       (["--export", "TOKEN=a\nb"], "holds a line break"),
                       (["--venv", str(tmp_path / "no env")], f"--venv {tmp_path / 'no env'}")):
        result = CliRunner().invoke(main, ["estimate", *args, str(script)])
        assert result.exit_code == 2 and says in result.output, result.output
    assert fake.submitted() == []


# ---------------------------------------------------------------- submitting a typed row


def _saved_estimate(tmp_path: Path, gpu_type: str | None, gpu_type_from: str = "gres") -> dict[str, Any]:
    profiles = [profile_from_events("gpu", bs, *events(bs, gpu_type or "", np.random.default_rng(1)))
                for bs in (32, 64)]
    fact = PartitionFacts("gpu", "gpu", None, 8000, 4, 1.0, 0.0, gpu_type, gpu_type_from if gpu_type else "")
    key = "gpu" if gpu_type is None else f"gpu/{gpu_type}"
    rows = build_rows({key: fit_partition(profiles)}, {key: fact}, (32,), Horizon(epochs=2), Knobs(gpus=1))
    script = tmp_path / "train.py"
    script.write_text("print('x')\n")
    est = {"id": "0123abcd", "script": str(script), "args": [], "batch_arg": "--batch-size", "image": None,
           "gpus": 1, "nodes": 1, "rows": rows, "recommendation": {"choice": 1}}
    EstimateCache(tmp_path / "dlsub-home").save_estimate(est["id"], est)
    return est


def test_submit_from_a_typed_row_asks_slurm_for_that_kind(cli_env: FakeSlurm, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI against the fake Slurm (typed like the testbed): --gres=gpu:v100:1, and the job is submitted."""
    monkeypatch.setenv("DLSUB_POLICY", str(tmp_path / "none.toml"))
    cli_env.nodes["gpu1"].gpu_type, cli_env.nodes["gpu2"].gpu_type = "a100", "v100"
    est = _saved_estimate(tmp_path, "v100")
    assert from_estimate(est, 1).gpu_type == "v100"
    result = CliRunner().invoke(main, ["submit", "--from-estimate", "0123abcd", "--choice", "1", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "#SBATCH --gres=gpu:v100:1" in result.output and "on v100 GPUs (--gres=gpu:v100:1)" in result.output
    result = CliRunner().invoke(main, ["submit", "--from-estimate", "0123abcd", "--json"])
    assert result.exit_code == 0, result.output
    (job,) = cli_env.submitted()
    assert job.options["gres"] == "gpu:v100:1" and job.options["partition"] == "gpu"
    tags = Tags.parse(job.options["comment"])
    assert tags is not None and tags.gpu_type == "v100", "the kind is in its tags: a move onto GPUs asks for it"
    # The user's own --partition wins over the row's, and then no kind is asked for.
    result = CliRunner().invoke(main, ["submit", "--from-estimate", "0123abcd", "-p", "gpu-dev", "--dry-run"])
    assert result.exit_code == 0 and "#SBATCH --gres=gpu:1" in result.output and "asks for no kind" in result.output


def test_submit_from_an_untyped_or_declared_row_names_no_kind(cli_env: FakeSlurm, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI against the fake Slurm (untyped GRES): an untyped row as before; a kind only policy.toml declares
    is not asked of Slurm (its GRES has no such type)."""
    monkeypatch.setenv("DLSUB_POLICY", str(tmp_path / "none.toml"))
    for kind, source in ((None, ""), ("v100", "policy")):
        _saved_estimate(tmp_path, kind, source)
        result = CliRunner().invoke(main, ["submit", "--from-estimate", "0123abcd", "--dry-run"])
        assert result.exit_code == 0 and "#SBATCH --gres=gpu:1\n" in result.output, result.output


def test_submit_from_a_row_whose_kind_the_partition_lacks_fails_clearly(cli_env: FakeSlurm, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI against the fake Slurm: the cluster has no h100s (any more): exit 2, the kinds there, no job."""
    monkeypatch.setenv("DLSUB_POLICY", str(tmp_path / "none.toml"))
    cli_env.nodes["gpu1"].gpu_type = "a100"
    _saved_estimate(tmp_path, "h100")
    result = CliRunner().invoke(main, ["submit", "--from-estimate", "0123abcd"])
    assert result.exit_code == 2 and "gpu has no node with 1 h100 GPU(s)" in result.output, result.output
    assert "GPU types there: a100" in result.output and cli_env.submitted() == []
    est = json.loads((tmp_path / "dlsub-home" / "estimates" / "0123abcd.json").read_text())
    est["rows"][0]["gpu_type"] = "h100 --wrap=x"
    EstimateCache(tmp_path / "dlsub-home").save_estimate("0123abcd", est)
    result = CliRunner().invoke(main, ["submit", "--from-estimate", "0123abcd"])
    assert result.exit_code == 2 and "not a GRES type's name" in result.output and cli_env.submitted() == []


# ---------------------------------------------------------------- the pure parts


def test_one_kinds_profiles_are_never_fitted_with_anothers() -> None:
    rng = np.random.default_rng(2)
    a100 = profile_from_events("gpu", 32, *events(32, "a100", rng))
    v100 = profile_from_events("gpu", 64, *events(64, "v100", rng))
    assert (a100.gpu_type, v100.gpu_type) == ("a100", "v100")
    with pytest.raises(FitError, match="several GPU types"):
        fit_partition([a100, v100])
    progress, attempts = events(32, "a100", rng)
    with pytest.raises(FitError, match="several kinds"):
        profile_from_events("gpu", 32, progress, [*attempts, {**attempts[0], "gpu_type": "v100", "time": 1001.0}])
    assert ProfileRun.from_json(a100.to_json()) == a100
    untyped = profile_from_events("gpu", 32, *events(32, "", rng))
    assert untyped.gpu_type is None and "gpu_type" not in untyped.to_json()
    assert ProfileRun.from_json({**a100.to_json(), "gpu_type": "a 100"}).gpu_type is None


def test_cache_keys_keep_untyped_profiles_and_part_the_kinds() -> None:
    args = (b"print(1)\n", ["--batch-size", "32"], "img", "gpu", 32)
    assert profile_key(*args, gpus=1) == profile_key(*args, gpus=1, gpu_type="")
    assert len({profile_key(*args, gpus=1), profile_key(*args, gpus=1, gpu_type="a100"),
                profile_key(*args, gpus=1, gpu_type="v100")}) == 3


def test_partition_targets() -> None:
    from dlsub.slurm_plugins.models import Partition, SlurmNode

    def node(name: str, gpus: int, kind: str | None) -> SlurmNode:
        return SlurmNode(name, "idle", ("p",), 4, 0, 8000, 0, gpus, 0, gpu_type=kind)

    mixed = Partition("p", (node("a", 4, "a100"), node("b", 4, "v100"), node("c", 4, None), node("d", 0, None)),
                      None, None)
    assert partition_targets(mixed, "", 1) == [Target("p", "a100", True), Target("p", "v100", True)]
    assert partition_targets(mixed, "", 0) == [Target("p")]
    untyped = Partition("p", (node("c", 4, None),), None, None)
    assert partition_targets(untyped, "", 2) == [Target("p")]
    assert partition_targets(untyped, "t4", 2) == [Target("p", "t4")]
    assert partition_targets(untyped, "bad kind", 2) == [Target("p")]
    assert Target("p", "t4").gres_type == "" and Target("p", "a100", True).gres_type == "a100"
    assert Target("p").key == "p" and Target("p", "a100", True).key == "p/a100"


def test_a_priced_kind_costs_its_gpus_per_hour_and_an_unpriced_one_its_nodes() -> None:
    profiles = [profile_from_events("gpu", bs, *events(bs, "a100", np.random.default_rng(4))) for bs in (32, 64)]
    fit = fit_partition(profiles)
    facts = {"gpu/a100": PartitionFacts("gpu", "gpu", None, 8000, 4, 1.5, 0.0, "a100", "gres", 3.0),
             "gpu": PartitionFacts("gpu", "gpu", None, 8000, 4, 1.5, 0.0)}
    rows = build_rows({"gpu/a100": fit, "gpu": fit}, facts, (32,), Horizon(epochs=300), Knobs(gpus=2, nodes=2))
    typed, untyped = rows
    assert typed["cost"] == pytest.approx(typed["walltime_s"] / 3600 * 2 * 2 * 3.0, rel=1e-3, abs=1e-4)
    assert untyped["cost"] == pytest.approx(untyped["walltime_s"] / 3600 * 2 * 1.5, rel=1e-3, abs=1e-4)
    assert (typed["gpu_type"], typed["gpu_type_from"]) == ("a100", "gres") and "gpu_type" not in untyped
    assert math.isclose(typed["walltime_s"], untyped["walltime_s"])


def test_a_submit_of_a_named_kind_is_checked_against_the_budget_at_that_kinds_price() -> None:
    from dlsub.job.budget_check import extra_for

    policy = parse_policy({"gpu_types": {"a100": {"cost_per_gpu_hour": 3.0}, "t4": {"cost_per_gpu_hour": 0.5}}})
    assert extra_for(policy, "gpu", 1, 60, 2, "t4").cost == pytest.approx(1.0)
    assert extra_for(policy, "gpu", 1, 60, 2).cost == pytest.approx(6.0)  # any kind: the dearest
