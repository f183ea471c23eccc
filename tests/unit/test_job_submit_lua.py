"""Unit tests (no Slurm): slurm_plugins/job_submit.lua writes what contract.SubmitRecord.parse reads.

The plugin itself runs under the stand-alone ``lua5.1`` interpreter (the one
Slurm 22.05's job_submit/lua links) with a stand-in ``slurm`` table; the
testbed installs it (testbed/up.sh). tests/integration/test_submit_record.py
checks the same record through the real slurmctld.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import NO_HANG_S

from dlsub.contract import SubmitRecord, Tags

PLUGIN = Path(__file__).resolve().parents[2] / "slurm_plugins" / "job_submit.lua"
NO_VAL = 4294967294
COMMENT = "dlsub:0123abcd;mode=immediate;ideal=gpu;gpus=1"


def test_a_record_as_the_plugin_writes_it_parses() -> None:
    record = SubmitRecord.parse(f"dlsub-submit:v1;uid=1001;partition=cpu;time=60;tres=gres:gpu:1|{COMMENT}")
    assert record == SubmitRecord(1001, "cpu", 60, 1, Tags("0123abcd", "immediate", "gpu", 1))
    bare = SubmitRecord.parse(f"dlsub-submit:v1;uid=1001;partition=;time=;tres=|{COMMENT}")
    assert bare is not None and (bare.partition, bare.time_limit_min, bare.gpus_per_node) == (None, None, 0)


def _lua(value: Any) -> str:
    if value is None:
        return "nil"
    if isinstance(value, (int, float)):
        return repr(value)
    return '"' + "".join(f"\\{b}" for b in str(value).encode()) + '"'  # every byte escaped: no injection


def submit(**job_desc: Any) -> str | None:
    """Run the plugin's slurm_job_submit on one job description; the admin_comment it leaves."""
    lua = shutil.which("lua5.1")
    if lua is None:
        pytest.skip("lua5.1 is not installed (testbed/up.sh installs it)")
    fields = ", ".join(f"{k} = {_lua(v)}" for k, v in job_desc.items())
    script = f"""
slurm = {{ SUCCESS = 0, ERROR = -1, log_info = function(...) end }}
dofile({_lua(str(PLUGIN))})
local job_desc = {{ {fields} }}
assert(slurm_job_submit(job_desc, {{}}, 0) == slurm.SUCCESS)
assert(slurm_job_modify(job_desc, {{}}, {{}}, 0) == slurm.SUCCESS)
if job_desc.admin_comment == nil then io.write("<nil>") else io.write(job_desc.admin_comment) end
"""
    out = subprocess.run([lua, "-"], input=script, capture_output=True, text=True, timeout=NO_HANG_S)
    assert out.returncode == 0, out.stderr
    return None if out.stdout == "<nil>" else out.stdout


def test_plugin_records_the_request_of_a_dlsub_job() -> None:
    text = submit(comment=COMMENT, user_id=1001, partition="cpu", time_limit=60, tres_per_node="gres:gpu:1")
    assert text == f"dlsub-submit:v1;uid=1001;partition=cpu;time=60;tres=gres:gpu:1|{COMMENT}"
    assert SubmitRecord.parse(text) == SubmitRecord(1001, "cpu", 60, 1, Tags("0123abcd", "immediate", "gpu", 1))


def test_no_time_partition_or_gres_is_written_empty() -> None:
    text = submit(comment=COMMENT, user_id=1001, time_limit=NO_VAL)
    assert text == f"dlsub-submit:v1;uid=1001;partition=;time=;tres=|{COMMENT}"
    record = SubmitRecord.parse(text)
    assert record is not None and (record.partition, record.time_limit_min, record.gpus_per_node) == (None, None, 0)


def test_a_forged_record_is_replaced_by_the_real_one() -> None:
    forged = "dlsub-submit:v1;uid=0;partition=gpu;time=;tres=gres:gpu:8|dlsub:0123abcd;gpus=8"
    text = submit(comment=COMMENT, user_id=1001, partition="cpu", time_limit=30, admin_comment=forged)
    record = SubmitRecord.parse(text)
    assert record is not None and (record.uid, record.gpus_per_node, record.partition) == (1001, 0, "cpu")


@pytest.mark.parametrize("partition", ["cpu;uid=0", "cpu|dlsub:feedbeef", "cpu\nx", "a" * 200])
def test_a_field_that_could_forge_another_gets_no_record(partition: str) -> None:
    text = submit(comment=COMMENT, user_id=1001, partition=partition, time_limit=60)
    assert text == "" and SubmitRecord.parse(text) is None


def test_a_comment_that_is_not_a_valid_tag_set_is_recorded_but_not_trusted() -> None:
    text = submit(comment="dlsub:0123abcd;gpus=1|uid=0", user_id=1001, time_limit=NO_VAL)
    assert text is not None and SubmitRecord.parse(text) is None


def test_other_jobs_keep_their_admin_comment_unless_it_claims_to_be_a_record() -> None:
    assert submit(comment="my run", user_id=1001, admin_comment="site note") == "site note"
    assert submit(user_id=1001) is None
    forged = f"dlsub-submit:v1;uid=1001;partition=gpu;time=;tres=gres:gpu:4|{COMMENT}"
    assert submit(comment="plain job", user_id=1001, admin_comment=forged) == ""
