"""Slurm's compressed host lists (``gpu[1-2],cpu1``) as node names, pure.

A sibling of the contract: the training side reads ``SLURM_JOB_NODELIST``
with it (no scontrol in a container), the agent reads Slurm's records with it.
"""

from __future__ import annotations

import re

#: Most node names one host list may expand to (a cluster's worth; more is not Slurm's).
MAX_HOSTLIST = 65536


def expand_nodes(hostlist: str) -> list[str]:
    """Slurm's compressed host list (``gpu[1-2],cpu1``) as names, without calling scontrol."""
    names: list[str] = []
    for m in re.finditer(r"([^,\[]+)(?:\[([^\]]*)\])?", hostlist or ""):
        prefix, ranges = m.group(1), m.group(2)
        if ranges is None:
            names.append(prefix)
            continue
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            if not low.isdigit() or (high and not high.isdigit()):
                continue
            first, last = int(low), int(high or low)
            if last - first + len(names) >= MAX_HOSTLIST:
                raise ValueError(f"host list {hostlist[:80]!r} names more than {MAX_HOSTLIST} nodes")
            for i in range(first, last + 1):
                names.append(f"{prefix}{i:0{len(low)}d}")
    return names
