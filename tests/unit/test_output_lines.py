"""Unit (no Slurm: the fake one; no torchrun): cutting output into labelled lines, and reading them back.

The launcher's line splitter (whole lines, ``\\r`` as torchrun's --tee has
it, long lines cut between UTF-8 characters), the label format in the
contract, `dlsub logs JOB --rank N / --node NAME` through the CLI against the
fake Slurm (a process's lines only, attempts still marked, hostile lines not
misattributed, `-f`), a job with one process printed byte for byte as
before, an elastic job's worker files read after the main job's (whole
lines, `--rank`, `-f`), and the dashboard's log tail showing whole labelled
lines.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from dlsub.checkpointing.output_mux import LineSplitter
from dlsub.cli.main import main
from dlsub.contract import (
    BATCH_SCRIPT,
    LAUNCHER_SOURCE,
    OUTPUT_GANG_LABEL,
    OUTPUT_LABEL,
    OUTPUT_LABEL_RE,
    OUTPUT_PATTERN,
    WORKER_OUTPUT_PATTERN,
    WORKER_SCRIPT,
    output_file,
)
from dlsub.dashboard.data import tail
from dlsub.job.output_files import worker_output_file, worker_output_files
from dlsub.job.output_lines import OutputFilter, Selection, line_source
from dlsub.job.settings import load_settings
from dlsub.job.user_store import JobStore
from dlsub.slurm_plugins.fake import FakeSlurm

# ---------------------------------------------------------------- the launcher's splitter


def test_lines_end_at_newline_crlf_and_cr_even_across_reads() -> None:
    s = LineSplitter(100)
    assert s.feed(b"one\ntw") == [b"one"]
    assert s.feed(b"o\r") == [], "a \\r at the end of a read may be half of \\r\\n"
    assert s.feed(b"\nthree\rfour\r\rfive\n\n") == [b"two", b"three", b"four", b"five", b""]
    assert s.feed(b"\r10%\r50%\r") == [b"10%"], "a redraw's empty line is dropped; 50% waits for what follows"
    assert s.feed(b"100%\n") == [b"50%", b"100%"]
    assert s.feed(b"partial") == [] and s.flush() == [b"partial"] and s.flush() == []
    assert s.feed(b"bar\r") == [] and s.flush() == [b"bar"]


def test_a_long_line_is_cut_between_utf8_characters() -> None:
    s = LineSplitter(10)
    text = "aé" * 20 + "\n"
    pieces = s.feed(text.encode())
    assert all(len(p) <= 10 for p in pieces)
    assert "".join(p.decode("utf-8") for p in pieces) == text[:-1], "each piece decodes on its own"
    assert s.feed(b"x" * 25) == [b"x" * 10, b"x" * 10] and s.flush() == [b"x" * 5]
    with pytest.raises(ValueError):
        LineSplitter(2)


# ---------------------------------------------------------------- the label format


def test_the_labels_are_torchruns_and_the_contract_parses_its_own() -> None:
    assert OUTPUT_LABEL.format(source=3) == "[3]:"
    assert OUTPUT_GANG_LABEL.format(node="n2", source=3) == "[n2/3]:"
    assert OUTPUT_LABEL.format(source=LAUNCHER_SOURCE) == "[dlsub]:"
    assert line_source(b"[3]:x") == (None, "3")
    assert line_source(b"[gpu-n1.a/12]:[3]:x") == ("gpu-n1.a", "12")
    assert line_source(b"[n1/dlsub]:dlsub: launch: ...") == ("n1", "dlsub")
    for foreign in (b" [3]:x", b"[3] :x", b"[]:x", b"[n1/]:x", b"[x]:y", b"[n 1/2]:x", b"[-1]:x", b"slurmstepd: x"):
        assert line_source(foreign) is None, foreign
    assert OUTPUT_LABEL_RE.pattern.startswith(rb"\A"), "a label counts only at the very start of a line"


# ---------------------------------------------------------------- reading one process's lines back

GANG_OUTPUT = (
    "dlsub: job 0123abcd attempt 7-0 on n[1-2] (partition gpu)\n"
    "[n1/dlsub]:dlsub: launch: starting\n"
    "[n1/0]:rank 0 hello\n"
    "[n2/3]:rank 3 hello\n"
    "[n2/2]:[3]:rank 2 pretends to be rank 3\n"
    "[n1/1]:rank 1 says\u2028[3]:after a line separator\x0b[3]:and a vertical tab\x1c[3]:\x85[3]:\n"
    "slurmstepd: error: *** STEP 7.0 ON n1 CANCELLED ***\n"
    "[n2/3]:rank 3 bye\n"
    "dlsub: checkpointed; requeueing Slurm job 7 to resume (continuation 1 of 20)\n"
    "dlsub: job 0123abcd attempt 7-1 on n[1-2] (partition gpu)\n"
    "[n2/3]:rank 3 again\n"
    "[n1/1]:rank 1 partial"
)
RANK_3 = "[n2/3]:rank 3 hello\n[n2/3]:rank 3 bye\n[n2/3]:rank 3 again\n"
ATTEMPT_LINES = [line for line in GANG_OUTPUT.split("\n") if line.startswith("dlsub: ")]


def test_a_ranks_lines_are_its_own_whatever_the_others_print() -> None:
    f = OutputFilter(Selection(rank=3))
    data = GANG_OUTPUT.encode()
    runs = [run for i in range(0, len(data), 7) for run in f.feed(data[i:i + 7])] + f.finish()
    out = b"".join(d for batch, d in runs if not batch).decode()
    assert out == RANK_3
    assert b"".join(d for batch, d in runs if batch).decode().splitlines() == ATTEMPT_LINES
    assert f.note("0123abcd") is None


def test_an_endless_unlabelled_line_is_not_held_forever() -> None:
    f = OutputFilter(Selection(rank=0))
    assert f.feed(b"x" * (2 * 1024 * 1024)) == [] and f.feed(b"x[0]:y") == []
    assert f.feed(b"[0]:still the same line\n[0]:z\n") == [(False, b"[0]:z\n")]


@pytest.fixture
def job(cli_env: FakeSlurm, tmp_path: Path) -> dict[str, object]:
    script = tmp_path / "train.py"
    script.write_text("print('training')\n")
    result = CliRunner().invoke(main, ["--json", str(script)], catch_exceptions=False)
    out = json.loads(result.stdout)
    cli_env.set_job_state(int(out["slurm_job_id"]), "RUNNING", nodes="n1")
    return dict(out)


def logs(*args: str) -> Result:
    return CliRunner().invoke(main, ["logs", *args], catch_exceptions=False)


def write_output(job: dict[str, object], data: bytes) -> Path:
    path = output_file(Path(str(job["job_dir"])), int(str(job["slurm_job_id"])))
    path.write_bytes(data)
    return path


def test_dlsub_logs_before_any_output_says_the_job_has_not_started(job: dict[str, object]) -> None:
    result = logs(str(job["id"]))
    assert result.exit_code == 0 and result.stdout == ""
    assert f"no output yet for job {job['id']} (it has not started)" in result.stderr


def test_dlsub_logs_rank_shows_one_process_and_marks_attempts_on_stderr(job: dict[str, object]) -> None:
    write_output(job, GANG_OUTPUT.encode())
    result = logs(str(job["id"]), "--rank", "3")
    assert result.exit_code == 0, result.output
    assert result.stdout == RANK_3
    assert result.stderr.splitlines() == ATTEMPT_LINES
    on_n1 = logs(str(job["id"]), "--node", "n1")
    assert on_n1.stdout.split("\n") == [
        "[n1/dlsub]:dlsub: launch: starting", "[n1/0]:rank 0 hello",
        "[n1/1]:rank 1 says\u2028[3]:after a line separator\x0b[3]:and a vertical tab\x1c[3]:\x85[3]:",
        "[n1/1]:rank 1 partial"], "lines are cut at \\n alone, as the launcher wrote them"
    assert logs(str(job["id"]), "--rank", "3", "--node", "n2").stdout == RANK_3
    nothing = logs(str(job["id"]), "--rank", "3", "--node", "n1")
    assert nothing.stdout == "" and "no line of job" in nothing.stderr and "rank 3 on node n1" in nothing.stderr
    assert logs(str(job["id"]), "--rank", "-1").exit_code == 2


def test_dlsub_logs_without_a_selection_is_byte_for_byte_as_before(job: dict[str, object]) -> None:
    # A job with one process: no labels, progress bars with \r, a partial last line, a byte that is not UTF-8.
    data = b"epoch 1\r\n 10%|#   |\r 50%|##  |\r100%|####|\nloss 0.5 \xff caf\xc3\xa9\nno newline"
    write_output(job, data)
    result = logs(str(job["id"]))
    assert result.exit_code == 0 and result.stdout_bytes == data.decode("utf-8", errors="replace").encode()
    alone = logs(str(job["id"]), "--rank", "0")
    assert alone.stdout == "" and "a job with one training process writes its lines unlabelled" in alone.stderr
    write_output(job, b"[0]:a\n[1]:b\n")
    one_node = logs(str(job["id"]), "--node", "n1")
    assert one_node.stdout == "" and "ran on one node" in one_node.stderr


def test_dlsub_logs_follow_with_a_rank_prints_until_the_job_ends(job: dict[str, object], cli_env: FakeSlurm) -> None:
    write_output(job, GANG_OUTPUT.encode())
    cli_env.set_job_state(int(str(job["slurm_job_id"])), "COMPLETED", nodes="n1")
    result = logs(str(job["id"]), "-f", "--rank", "1")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1] == "[n1/1]:rank 1 partial", "the last line, though it has no newline"
    assert result.stderr.splitlines()[-1].endswith("is COMPLETED")


def test_the_dashboards_tail_shows_whole_labelled_lines(tmp_path: Path) -> None:
    path = tmp_path / "slurm-7.out"
    path.write_bytes(b"".join(b"[n%d/%d]:step %d done\n" % (i % 2, i % 4, i) for i in range(3000)))
    shown = tail(path).splitlines()
    assert len(shown) > 100 and all(line_source(line.encode()) for line in shown)
    assert shown[-1] == "[n1/3]:step 2999 done"


# ---------------------------------------------------------------- an elastic job's workers write their own files


def test_worker_output_files_are_the_arrays_own_in_task_order(tmp_path: Path) -> None:
    for name in ("slurm-77_10.out", "slurm-77_2.out", "slurm-77_0.out", "slurm-77.out", "slurm-78_1.out",
                 "slurm-77_x.out", "slurm-77_1.out.bak", "slurm-777_1.out", "slurm-77_-1.out", "slurm-77_11.out"):
        (tmp_path / name).write_text("x\n")
    first = [(0, tmp_path / "slurm-77_0.out"), (2, tmp_path / "slurm-77_2.out")]
    assert worker_output_files(tmp_path, 77, 11) == [*first, (10, tmp_path / "slurm-77_10.out")]
    assert worker_output_files(tmp_path, 77, 3) == first, "an index the array does not have is none of its tasks'"
    assert worker_output_file(tmp_path, 77, 2).name == "slurm-77_2.out"


MAIN_OUTPUT = ("dlsub: job 0123abcd attempt 7-0 on n1 (partition cpu)\n"
               "[n1/0]:rank 0 step 1\n"
               "[n1/1]:rank 1 step 1\n"
               "[n1/0]:rank 0 no newline yet")
WORKER_OUTPUT = ("dlsub: job 0123abcd worker 9 on n2 joins the group of 7-0\n"
                 "[n2/2]:rank 2 step 1\n"
                 "[n2/3]:rank 3 step 1\n"
                 "[n2/3]:rank 3 last")


@pytest.fixture
def elastic_job(cli_env: FakeSlurm, tmp_path: Path) -> dict[str, object]:
    script = tmp_path / "train.py"
    script.write_text("print('training')\n")
    result = CliRunner().invoke(main, ["--json", "--nodes", "1:2", str(script)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    out = dict(json.loads(result.stdout))
    cli_env.set_job_state(int(out["slurm_job_id"]), "RUNNING", nodes="n1")
    record = JobStore(load_settings().db_path).get(str(out["id"]))
    assert record.worker_array_id is not None, "an elastic job has a held worker array"
    out["worker_array_id"] = record.worker_array_id
    return out


def test_dlsub_logs_shows_the_workers_output_after_the_main_jobs(elastic_job: dict[str, object]) -> None:
    job_dir, array = Path(str(elastic_job["job_dir"])), int(str(elastic_job["worker_array_id"]))
    write_output(elastic_job, MAIN_OUTPUT.encode())
    before = logs(str(elastic_job["id"]))
    assert before.exit_code == 0 and before.stdout == MAIN_OUTPUT + "\n", "no worker has started: the main file alone"
    worker_output_file(job_dir, array, 0).write_text(WORKER_OUTPUT)
    worker_output_file(job_dir, array, 1).write_text("[n9/9]:not a task of this array (it has one)\n")
    header = f"dlsub: job {elastic_job['id']} worker task 0's output (slurm-{array}_0.out):"
    result = logs(str(elastic_job["id"]))
    assert result.exit_code == 0, result.output
    assert result.stdout.split("\n") == [*MAIN_OUTPUT.split("\n"), header, *WORKER_OUTPUT.split("\n"), ""], \
        "each file's lines whole, the main job's unfinished last line not glued to the worker's first"
    rank_3 = logs(str(elastic_job["id"]), "--rank", "3")
    assert rank_3.stdout == "[n2/3]:rank 3 step 1\n[n2/3]:rank 3 last\n"
    assert rank_3.stderr.splitlines() == [MAIN_OUTPUT.split("\n")[0], header, WORKER_OUTPUT.split("\n")[0]], \
        "the lines that mark where each file and attempt starts go to stderr"
    on_n2 = logs(str(elastic_job["id"]), "--node", "n2")
    assert on_n2.stdout.splitlines() == WORKER_OUTPUT.split("\n")[1:]
    assert "no line of job" in logs(str(elastic_job["id"]), "--rank", "4").stderr


def test_dlsub_logs_follow_reads_every_file_until_the_job_ends(elastic_job: dict[str, object],
                                                              cli_env: FakeSlurm) -> None:
    job_dir, array = Path(str(elastic_job["job_dir"])), int(str(elastic_job["worker_array_id"]))
    write_output(elastic_job, MAIN_OUTPUT.encode())
    worker_output_file(job_dir, array, 0).write_text(WORKER_OUTPUT)
    cli_env.set_job_state(int(str(elastic_job["slurm_job_id"])), "COMPLETED", nodes="n1")
    result = logs(str(elastic_job["id"]), "-f")
    assert result.exit_code == 0, result.output
    lines = result.stdout.split("\n")
    assert sorted(lines) == sorted([*MAIN_OUTPUT.split("\n"), *WORKER_OUTPUT.split("\n"),
                                    f"dlsub: job {elastic_job['id']} worker task 0's output (slurm-{array}_0.out):",
                                    ""]), "every line once, whole"
    assert result.stderr.splitlines()[-1].endswith("is COMPLETED")
    only_2 = logs(str(elastic_job["id"]), "-f", "--rank", "2")
    assert only_2.stdout == "[n2/2]:rank 2 step 1\n"


def test_a_worker_task_writes_its_own_file_named_as_slurm_names_an_arrays(elastic_job: dict[str, object]) -> None:
    job_dir = Path(str(elastic_job["job_dir"]))
    worker_script = (job_dir / WORKER_SCRIPT).read_text()
    assert f"#SBATCH --output={job_dir}/{WORKER_OUTPUT_PATTERN}\n" in worker_script
    assert f"#SBATCH --output={job_dir}/{OUTPUT_PATTERN}\n" in (job_dir / BATCH_SCRIPT).read_text()
