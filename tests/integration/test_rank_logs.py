"""Integration (live Slurm testbed + rootless Podman): readable logs of a 2-node x 2-GPU gang (issue 23).

Four ranks on two nodes print at the same moment (a barrier in the job
directory), the way the issue's report had them garble each other's lines.
`dlsub logs JOB`, run as the user exactly as typed, must give whole lines,
each one of the lines a rank printed with that rank's label
(``[node/rank]:``), or one of dlsub's (the batch script's ``dlsub: ...``,
the launcher's and torchrun's ``[node/dlsub]:``); a partial last line is
there too; a fake label a rank prints does not make its line another's;
`dlsub logs JOB --rank 3` gives rank 3's lines alone, the attempt marked on
stderr.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

from livebed import TestbedUser, put

LINES = 300
PRINTER = f"""
import os, sys, time
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
barrier = os.path.join(os.environ["DLSUB_JOB_DIR"], "barrier-" + os.environ["DLSUB_ATTEMPT"])
os.makedirs(barrier, exist_ok=True)
open(os.path.join(barrier, str(rank)), "w").close()
deadline = time.time() + 120
while len(os.listdir(barrier)) < world and time.time() < deadline:
    time.sleep(0.001)
for i in range({LINES}):
    print("WORLD", world, "RANK", rank, "LINE", i)  # unbuffered: one write per word, as in the report
    if i % 100 == 0:
        print("WORLD", world, "RANK", rank, "STDERR", i, file=sys.stderr)
print(f"[{{(rank + 1) % world}}]:FAKE LABEL BY RANK {{rank}}")
sys.stdout.write(f"FINAL RANK {{rank}} NO NEWLINE")
"""
LABEL = re.compile(r"\[(?P<node>[A-Za-z0-9._-]+)/(?P<source>[0-9]+|dlsub)\]:(?P<text>.*)\Z", re.S)


def expected_lines(rank: int) -> list[str]:
    return [f"WORLD 4 RANK {rank} LINE {i}" for i in range(LINES)]


def test_a_gangs_four_ranks_print_at_once_and_every_line_is_whole_with_its_rank(user: TestbedUser,
                                                                                workdir: Path) -> None:
    printer = put(user, workdir / "print at once.py", PRINTER)
    job = user.submit("--nodes", "2", "--gpus-per-node", "2", str(printer), cwd=workdir)
    done = user.wait_until_ended(job["id"], "the gang to finish")
    log = user.dlsub("logs", job["id"])
    assert done["state"] == "COMPLETED", log.stdout
    assert log.stdout.endswith("\n"), "the output ends with a whole line"

    by_rank: dict[int, list[str]] = defaultdict(list)
    nodes: dict[int, set[str]] = defaultdict(set)
    stray = []
    for line in log.stdout[:-1].split("\n"):
        match = LABEL.match(line)
        if match is None:
            if not line.startswith("dlsub: "):  # the batch script's own lines, outside any container
                stray.append(line)
            continue
        if match["source"] == "dlsub":
            continue
        rank, text = int(match["source"]), match["text"]
        nodes[rank].add(match["node"])
        mine = (text.startswith((f"WORLD 4 RANK {rank} ", f"FINAL RANK {rank} "))
                or text == f"[{(rank + 1) % 4}]:FAKE LABEL BY RANK {rank}")
        if not mine:
            stray.append(line)
        by_rank[rank].append(text)
    assert not stray, "lines that are not whole, or carry another's label:\n" + "\n".join(stray[:20])
    assert sorted(by_rank) == [0, 1, 2, 3]
    for rank, texts in by_rank.items():
        assert [t for t in texts if " LINE " in t] == expected_lines(rank), f"rank {rank}'s lines, whole, in order"
        assert [t for t in texts if " STDERR " in t] == [f"WORLD 4 RANK {rank} STDERR {i}" for i in (0, 100, 200)]
        assert f"FINAL RANK {rank} NO NEWLINE" in texts, "a partial last line is kept"
    assert all(len(n) == 1 for n in nodes.values()), "a rank's lines all name its node"
    per_node = sorted(n for names in nodes.values() for n in names)
    assert len(set(per_node)) == 2 and per_node.count(per_node[0]) == 2, "two ranks on each of two nodes"

    only_3 = user.dlsub("logs", job["id"], "--rank", "3")
    shown = [LABEL.match(line) for line in only_3.stdout[:-1].split("\n")]
    assert all(m is not None and m["source"] == "3" for m in shown), only_3.stdout[:2000]
    assert [m["text"] for m in shown if m is not None and " LINE " in m["text"]] == expected_lines(3)
    assert "[0]:FAKE LABEL BY RANK 3" in only_3.stdout and "BY RANK 2" not in only_3.stdout
    assert f"dlsub: job {job['id']} attempt" in only_3.stderr, "the attempt is still marked (on stderr)"
