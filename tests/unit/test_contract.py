"""Unit tests (no Slurm, no files): the one contract module, dlsub.contract."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from dlsub import contract
from dlsub.contract import (
    FINAL_STATES,
    IllegalTransition,
    JobState,
    StateSource,
    SubmitRecord,
    Tags,
    check_transition,
    gpus_in_tres,
)


def test_final_states_stand_and_preempted_is_one_of_them() -> None:
    """A final state is never followed by UNKNOWN (Slurm forgot the job), nor by what only lags it; only
    slurmctld shows an ended job live again (a requeue). The whole sampling model: test_sampled_states."""
    assert {s.value for s in FINAL_STATES} == {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED"}
    for final in FINAL_STATES:
        assert final.terminal and not final.live
        with pytest.raises(IllegalTransition, match="final states stand"):
            check_transition(final, JobState.UNKNOWN)
        for live in (JobState.PENDING, JobState.RUNNING, JobState.REQUEUED):
            assert check_transition(final, live) == live
            with pytest.raises(IllegalTransition, match="lags"):
                check_transition(final, live, StateSource.ACCOUNTING)
        assert check_transition(final, final) == final


def test_any_live_state_may_be_followed_by_any_state() -> None:
    """States are samples: a job may run and end between two looks."""
    for old in (None, "PENDING", "RUNNING", "REQUEUED", "UNKNOWN"):
        for new in JobState:
            assert check_transition(old, new) == new


def test_slurm_states_map_onto_one_model() -> None:
    assert JobState.from_slurm("PREEMPTED") is JobState.PREEMPTED
    assert JobState.from_slurm("CANCELLED by 1001") is JobState.CANCELLED
    assert JobState.from_slurm("REQUEUE_HOLD") is JobState.REQUEUED
    assert JobState.from_slurm("NODE_FAIL") is JobState.FAILED
    assert JobState.from_slurm("COMPLETING") is JobState.RUNNING
    assert JobState.from_slurm("") is JobState.UNKNOWN and JobState.from_slurm("WEIRD") is JobState.UNKNOWN


def test_tags_round_trip_and_reject_anything_odd() -> None:
    tags = Tags("0123abcd", "immediate", "gpu", 2)
    assert Tags.parse(tags.comment()) == tags
    assert Tags.parse("dlsub:0123abcd") == Tags("0123abcd")
    plain = Tags("0123abcd", "immediate", "gpu", 1, plain=True)
    assert plain.comment() == "dlsub:0123abcd;mode=immediate;ideal=gpu;gpus=1;script=plain"
    assert Tags.parse(plain.comment()) == plain and not Tags.parse("dlsub:0123abcd;gpus=1").plain  # type: ignore[union-attr]
    pinned = Tags("0123abcd", "ideal", "gpu", 1, nodes=(1, 2), pinned=True)
    assert pinned.comment() == "dlsub:0123abcd;mode=ideal;ideal=gpu;gpus=1;nodes=1-2;pin=partition"
    assert Tags.parse(pinned.comment()) == pinned and not Tags.parse("dlsub:0123abcd;gpus=1").pinned  # type: ignore[union-attr]
    for bad in ("dlsub:0123abcd;pin=yes", "dlsub:0123abcd;pin=",
                "dlsub:0123abcd;script=library", "dlsub:0123abcd;script=", "dlsub:0123abcd;script=plain;script=plain",
                "dlsub:0123ABCD", "dlsub:0123abc", "dlsub:0123abcd;mode=fast", "dlsub:0123abcd;ideal=g p u",
                "dlsub:0123abcd;gpus=-1", "dlsub:0123abcd;role=boss", "dlsub:0123abcd;;gpus=1",
                "dlsub:0123abcd;gpus=1\n", "dlsub:0123abcd\n", "x" * 600, "", None):
        assert Tags.parse(bad) is None, bad


def test_the_submit_record_is_read_exactly_as_job_submit_lua_writes_it() -> None:
    text = "dlsub-submit:v1;uid=1001;partition=cpu;time=60;tres=gres:gpu:0|dlsub:0123abcd;mode=immediate;gpus=1"
    record = SubmitRecord.parse(text)
    assert record == SubmitRecord(1001, "cpu", 60, 0, Tags("0123abcd", "immediate", None, 1))
    assert SubmitRecord.parse("dlsub-submit:v1;uid=1001;partition=;time=;tres=|dlsub:0123abcd") == SubmitRecord(
        1001, None, None, 0, Tags("0123abcd"))
    for bad in (text.replace("uid=1001", "uid=x"), text.replace("v1", "v2"), text.split("|")[0],
                text.replace("time=60", "time=60;time=61"), text.replace("partition=cpu", "partition=c;u")):
        assert SubmitRecord.parse(bad) is None, bad


def test_gpus_in_every_spelling_slurm_uses() -> None:
    assert gpus_in_tres("gres:gpu:2") == 2
    assert gpus_in_tres("gres/gpu=3") == 3
    assert gpus_in_tres("gpu:a100:2(S:0),gpu:1") == 3
    assert gpus_in_tres("cpu=4,mem=8G") == 0 and gpus_in_tres(None) == 0


def test_the_contract_imports_nothing_but_the_standard_library() -> None:
    """It is imported inside containers that have only Python and torch."""
    tree = ast.parse(Path(contract.__file__).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= {"__future__", "collections", "dataclasses", "enum", "hashlib", "pathlib", "re"}, imported


# ---------------------------------------------------------------- the bash side of the contract
# The batch script and the TaskEpilog are bash: they cannot import the contract, so their literals are
# checked against it here. (The batch launcher they exec, slurm_plugins/launcher/, imports it.)

_REPO = Path(__file__).resolve().parents[2]
_BASH = (_REPO / "slurm_plugins" / "batch.sh", _REPO / "etc" / "slurm" / "taskepilog.sh")


def test_every_dlsub_variable_the_bash_templates_use_is_the_contracts() -> None:
    for path in _BASH:
        text = path.read_text()
        # @NAME@ are the template's placeholders, filled in by sbatch.py (checked both ways elsewhere).
        names = set(re.findall(r"(?<![@\w])(DLSUB_[A-Z_]+)", re.sub(r"@[A-Z_]+@", "", text)))
        unknown = names - set(contract.CONTAINER_ENV)
        assert not unknown, f"{path.name} uses DLSUB_ variables the contract does not name: {sorted(unknown)}"
    batch = _BASH[0].read_text()
    assert {contract.ENV_CONTAINER, contract.ENV_ROLE} <= set(re.findall(r"DLSUB_[A-Z_]+", batch))


def test_the_bash_templates_use_the_contracts_roles_label_and_runtime_directory() -> None:
    batch, epilog = (p.read_text() for p in _BASH)
    assert f'"${{DLSUB_ROLE:-{contract.ROLE_TRAINER}}}" = {contract.ROLE_CPU}' in batch
    fallback = '"' + contract.RUNTIME_DIR_FALLBACK.format(uid="$(id -u)") + '"'
    assert fallback in epilog
    assert f'"label={contract.LABEL_SLURM_JOB_ID}=${{SLURM_JOB_ID}}"' in epilog
    assert str(contract.runtime_dir_fallback(1234)) == "/tmp/dlsub-xdg-1234"
