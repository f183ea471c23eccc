"""Horovod's rendezvous server for one torchrun group: ``python -m dlsub.checkpointing.horovod_rendezvous NODES P``.

Rank 0 of a Horovod script's group starts it (:func:`dlsub.checkpointing.horovod_env.prepare`). It serves
Horovod's HTTP rendezvous (what ``horovodrun`` would have run) with the plan ``node0:P,...,node{NODES-1}:P``,
prints its port on stdout, and leaves when the process that started it is gone. Horovod is imported only here
(in ``main``), so the module itself imports anywhere.
"""

from __future__ import annotations

import os
import sys
import time

from dlsub.checkpointing.horovod_env import rendezvous_plan

#: How often the server looks whether its parent is still there (seconds).
PARENT_POLL_S = 1.0


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not all(a.isdigit() and int(a) >= 1 for a in argv):
        print("usage: python -m dlsub.checkpointing.horovod_rendezvous NODES PROCESSES_PER_NODE", file=sys.stderr)
        return 2
    nodes, per_node = int(argv[0]), int(argv[1])
    parent = os.getppid()
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.http.http_server import RendezvousServer

    server = RendezvousServer()
    port = server.start()
    server.init(get_host_assignments(parse_hosts(rendezvous_plan(nodes, per_node)), nodes * per_node))
    print(port, flush=True)
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
