"""Horovod scripts under dlsub's torchrun, unchanged: ``hvd.init()`` finds the group torchrun formed.

dlsub starts every training process with torchrun (``python -m dlsub.checkpointing.rank_output SCRIPT``), which
sets RANK, WORLD_SIZE, LOCAL_RANK, ... for ``torch.distributed``. Horovod's gloo controller reads its own
variables instead (HOROVOD_RANK, ...) and finds its peers through an HTTP rendezvous server that ``horovodrun``
would have started. For a script that imports Horovod, the rank entry point (:func:`prepare`) maps torchrun's
variables onto Horovod's (:func:`horovod_environment`, pure) and has rank 0 start that server
(:mod:`dlsub.checkpointing.horovod_rendezvous`, a child process), whose port every rank learns through a
``torch.distributed.TCPStore`` at torchrun's MASTER_ADDR:MASTER_PORT. Each re-formed group (an elastic job
resized, moved) gets its own server and its own store.

The plan the server holds names the members ``node0`` .. ``node{N-1}`` (torchrun's GROUP_RANK), each with the
same number of processes: Horovod's own host names play no other part. Members with different numbers of
processes are refused with a clear error (Horovod's ranks would not follow torchrun's).

Standard library at import; torch (and Horovod, in the server's process) only for a script that imports Horovod.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

#: How much of a script is searched for its Horovod import.
SCRIPT_HEAD_BYTES = 1 << 20
#: How long a rank waits for rank 0's rendezvous port (rank 0 for the others to have read it).
PORT_TIMEOUT_S = 300.0
#: How long rank 0 waits for its rendezvous server to say its port.
SERVER_START_TIMEOUT_S = 60.0
#: The module rank 0 runs as its rendezvous server.
RENDEZVOUS_MODULE = "dlsub.checkpointing.horovod_rendezvous"

# ``import horovod.torch as hvd``, ``from horovod import torch``, ``import os, horovod.torch``: at any indentation.
_IMPORTS_HOROVOD = re.compile(
    rb"^[ \t]*(?:from[ \t]+horovod[ \t.]|import[ \t]+(?:[\w.]+(?:[ \t]+as[ \t]+\w+)?[ \t]*,[ \t]*)*horovod\b)",
    re.MULTILINE)


class HorovodSetupError(RuntimeError):
    """torchrun's group cannot be given to Horovod as it is (said in words a user can act on)."""


def uses_horovod(script_text: str | bytes) -> bool:
    """Whether the script imports Horovod (``import horovod...`` / ``from horovod...``), in its first MB."""
    head = script_text.encode("utf-8", "replace") if isinstance(script_text, str) else script_text
    return _IMPORTS_HOROVOD.search(head[:SCRIPT_HEAD_BYTES]) is not None


def script_uses_horovod(script: str | os.PathLike[str]) -> bool:
    """:func:`uses_horovod` of the file's first MB; False when it cannot be read."""
    try:
        with open(script, "rb") as f:
            return uses_horovod(f.read(SCRIPT_HEAD_BYTES))
    except OSError:
        return False


def _int(env: Mapping[str, str], name: str, default: str | None = None) -> int:
    value = env.get(name, default)
    try:
        number = int(value) if value is not None else -1
    except ValueError:
        number = -1
    if number < 0:
        raise HorovodSetupError(f"torchrun's {name} is {value!r}, not a whole number")
    return number


def horovod_environment(env: Mapping[str, str]) -> dict[str, str]:
    """Horovod's gloo variables for the process torchrun describes in ``env`` (all but the rendezvous port).

    HOROVOD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE are torchrun's RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE; the
    member (node) is torchrun's GROUP_RANK (Horovod's CROSS_RANK, host ``node{GROUP_RANK}``) of
    GROUP_WORLD_SIZE (else WORLD_SIZE // LOCAL_WORLD_SIZE). Raises :class:`HorovodSetupError` when the
    members do not all run LOCAL_WORLD_SIZE processes ranked member by member, as Horovod's plan has them.
    """
    rank, size = _int(env, "RANK"), _int(env, "WORLD_SIZE")
    local_rank, local_size = _int(env, "LOCAL_RANK"), _int(env, "LOCAL_WORLD_SIZE")
    group_rank = _int(env, "GROUP_RANK", "0")
    if local_size < 1 or size < 1 or rank >= size or local_rank >= local_size:
        raise HorovodSetupError(f"torchrun's ranks do not add up: RANK {rank} of WORLD_SIZE {size}, "
                                f"LOCAL_RANK {local_rank} of LOCAL_WORLD_SIZE {local_size}")
    if size % local_size:
        raise HorovodSetupError(
            f"a Horovod job needs the same number of processes on every node: {size} processes in all is "
            f"not a multiple of this node's {local_size}")
    nodes = _int(env, "GROUP_WORLD_SIZE", str(size // local_size))
    if nodes * local_size != size or group_rank >= nodes:
        raise HorovodSetupError(
            f"a Horovod job needs the same number of processes on every node: {nodes} node(s) hold "
            f"{size} processes, this one {local_size} (node {group_rank})")
    if rank != group_rank * local_size + local_rank:
        raise HorovodSetupError(f"torchrun's RANK {rank} is not node {group_rank} x {local_size} + local rank "
                                f"{local_rank}, as Horovod's plan numbers them")
    mapped = {
        "HOROVOD_RANK": str(rank), "HOROVOD_SIZE": str(size),
        "HOROVOD_LOCAL_RANK": str(local_rank), "HOROVOD_LOCAL_SIZE": str(local_size),
        "HOROVOD_CROSS_RANK": str(group_rank), "HOROVOD_CROSS_SIZE": str(nodes),
        "HOROVOD_HOSTNAME": f"node{group_rank}",
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": env.get("MASTER_ADDR") or "127.0.0.1",
        "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
    }
    iface = env.get("GLOO_SOCKET_IFNAME", "").split(",")[0].strip()
    if iface:
        mapped["HOROVOD_GLOO_IFACE"] = iface
    return mapped


def rendezvous_plan(nodes: int, per_node: int) -> str:
    """The hosts string of the server's plan (Horovod's ``parse_hosts``): ``node0:P,node1:P,...``."""
    return ",".join(f"node{i}:{per_node}" for i in range(nodes))


def store_key(env: Mapping[str, str]) -> str:
    """Where this group's rendezvous port is kept in torchrun's store: one key per run and restart."""
    return f"dlsub/horovod/{env.get('TORCHELASTIC_RUN_ID', '')}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def start_rendezvous_server(nodes: int, per_node: int) -> tuple[subprocess.Popen[bytes], int]:
    """Start :mod:`dlsub.checkpointing.horovod_rendezvous` (it leaves with this process) and read its port."""
    import selectors

    server = subprocess.Popen([sys.executable, "-m", RENDEZVOUS_MODULE, str(nodes), str(per_node)],
                              stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert server.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(server.stdout, selectors.EVENT_READ)
        line = server.stdout.readline() if sel.select(SERVER_START_TIMEOUT_S) else b""
    try:
        port = int(line)
    except ValueError:
        server.kill()
        raise HorovodSetupError(f"Horovod's rendezvous server did not start (it said {line[:200]!r})") from None
    return server, port


def share_port(env: Mapping[str, str], port: int | None) -> int:
    """Rank 0's rendezvous ``port`` on every rank, through a TCPStore at torchrun's MASTER_ADDR:MASTER_PORT.

    Where torchrun's agent shares its store with the workers (TORCHELASTIC_USE_AGENT_STORE=True: one node),
    every rank is its client. Where it does not (dlsub's gangs run torchrun with
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1), MASTER_PORT is the port that rank 0's ``init_process_group`` would
    serve a store on: rank 0 serves one there until every rank has read the port, then closes it, so a script
    that also sets up torch.distributed finds the port free."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    rank, size = int(env["RANK"]), int(env["WORLD_SIZE"])
    serves = rank == 0 and env.get("TORCHELASTIC_USE_AGENT_STORE") != str(True)
    store = TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=serves,
                     timeout=timedelta(seconds=PORT_TIMEOUT_S), wait_for_workers=False)
    key = store_key(env)
    try:
        if rank == 0:
            assert port is not None
            store.set(f"{key}/port", str(port))
            if serves and size > 1:
                store.wait([f"{key}/read/{r}" for r in range(1, size)])
            return port
        shared = int(store.get(f"{key}/port"))
        store.set(f"{key}/read/{rank}", "1")
        return shared
    finally:
        del store


_server: subprocess.Popen[bytes] | None = None  # rank 0's rendezvous server, alive as long as this process


def prepare(script: str) -> None:
    """In torchrun's process for ``script``: when it imports Horovod (and this Python has it), set Horovod's
    variables so that ``hvd.init()`` joins torchrun's group. Nothing for any other script, for a process alone
    (Horovod is then one process of its own), or where HOROVOD_RANK is set already (set up by someone else)."""
    global _server
    env = os.environ
    if "HOROVOD_RANK" in env or "RANK" not in env or env.get("WORLD_SIZE", "1") == "1":
        return
    if not script_uses_horovod(Path(script)) or importlib.util.find_spec("horovod") is None:
        return
    mapped = horovod_environment(env)
    port = None
    if env["RANK"] == "0":
        _server, port = start_rendezvous_server(int(mapped["HOROVOD_CROSS_SIZE"]), int(mapped["HOROVOD_LOCAL_SIZE"]))
    env.update(mapped, HOROVOD_GLOO_RENDEZVOUS_PORT=str(share_port(env, port)))
