"""Unit (files in a temporary folder; no Slurm, no testbed): how the live tests read a job's JSON-lines files
(testbed/livebed.py's jsonl_records) while the job may still be writing them. CI's rehearsal failed when a test
read progress.jsonl on the testbed's network home (sshfs) as the training wrote a line: it saw the line's first
half and json.loads raised, failing a test whose job was fine.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from conftest import REPO

sys.path.insert(0, str(REPO / "testbed"))
from livebed import attempts, jsonl_records, progress_events


def test_a_line_still_being_written_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "progress.jsonl"
    whole = [{"event": "start", "world_size": 4}, {"event": "progress", "step": 64}]
    half = '{"event": "progress", "time": 1796460030.711, "step": 65, "steps_per_epoch'
    path.write_text("".join(json.dumps(r) + "\n" for r in whole) + half)
    assert jsonl_records(path) == whole
    # The writer ends the line: the next read has it.
    with path.open("a") as f:
        f.write('": 22}\n')
    assert jsonl_records(path)[-1] == {"event": "progress", "time": 1796460030.711, "step": 65,
                                       "steps_per_epoch": 22}


def test_a_file_not_yet_written_has_no_records(tmp_path: Path) -> None:
    assert jsonl_records(tmp_path / "progress.jsonl") == []
    assert progress_events(str(tmp_path), "start") == [] and attempts(str(tmp_path)) == []
    (tmp_path / "attempts.jsonl").write_text('{"event": "sta')
    assert attempts(str(tmp_path)) == []


def test_progress_events_picks_one_kind_in_order(tmp_path: Path) -> None:
    records = [{"event": "start", "world_size": 1}, {"event": "progress", "step": 1},
               {"event": "start", "world_size": 2}]
    (tmp_path / "progress.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    assert progress_events(str(tmp_path), "start") == [records[0], records[2]]
    assert progress_events(str(tmp_path)) == records
