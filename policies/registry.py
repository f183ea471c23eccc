"""Policies by name. An unknown name is an error that lists the valid ones."""

from __future__ import annotations

from collections.abc import Callable

from dlsub.policies.api import Policy, PolicyError
from dlsub.policies.efifo import ElasticFifoPolicy
from dlsub.policies.fifo import FifoPolicy
from dlsub.policies.gang import GangPolicy
from dlsub.policies.goodput_types import TypedGoodputPolicy
from dlsub.policies.optimus import OptimusPolicy
from dlsub.policies.pollux import PolluxPolicy
from dlsub.policies.rr import RoundRobinPolicy
from dlsub.policies.sia import SiaPolicy
from dlsub.policies.tiresias import TiresiasPolicy
from dlsub.policies.worker_greedy import WorkerGreedyPolicy

POLICIES: dict[str, Callable[[], Policy]] = {
    cls.name: cls
    for cls in (
        FifoPolicy,
        RoundRobinPolicy,
        ElasticFifoPolicy,
        GangPolicy,
        TiresiasPolicy,
        OptimusPolicy,
        TypedGoodputPolicy,  # goodput: GoodputPolicy itself on one GPU type
        PolluxPolicy,
        SiaPolicy,
        WorkerGreedyPolicy,
    )
}


def policy_names() -> list[str]:
    return sorted(POLICIES)


def get_policy(name: str) -> Policy:
    try:
        factory = POLICIES[name]
    except KeyError:
        raise PolicyError(f"unknown policy {name!r}; valid policies: {', '.join(policy_names())}") from None
    return factory()
