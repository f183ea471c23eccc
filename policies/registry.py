"""Policies by name. An unknown name is an error that lists the valid ones.

Each policy's module is imported when it is asked for: naming the valid policies (policy.toml's check, every
`dlsub` command that reads the site's policy) costs no import of the models behind them (goodput's and Sia's
pull in SciPy, about half a second of a login node's CPU).
"""

from __future__ import annotations

import importlib

from dlsub.policies.api import Policy, PolicyError

#: Policy name -> (module, class). A class's own ``name`` is its key (tests/unit/test_policies.py holds that).
POLICY_CLASSES: dict[str, tuple[str, str]] = {
    "fifo": ("dlsub.policies.fifo", "FifoPolicy"),
    "rr": ("dlsub.policies.rr", "RoundRobinPolicy"),
    "efifo": ("dlsub.policies.efifo", "ElasticFifoPolicy"),
    "gang": ("dlsub.policies.gang", "GangPolicy"),
    "tiresias": ("dlsub.policies.tiresias", "TiresiasPolicy"),
    "optimus": ("dlsub.policies.optimus", "OptimusPolicy"),
    "goodput": ("dlsub.policies.goodput_types", "TypedGoodputPolicy"),  # GoodputPolicy itself on one GPU type
    "pollux": ("dlsub.policies.pollux", "PolluxPolicy"),
    "sia": ("dlsub.policies.sia", "SiaPolicy"),
    "worker-greedy": ("dlsub.policies.worker_greedy", "WorkerGreedyPolicy"),
}


def policy_names() -> list[str]:
    return sorted(POLICY_CLASSES)


def policy_class(name: str) -> type[Policy]:
    try:
        module, attribute = POLICY_CLASSES[name]
    except KeyError:
        raise PolicyError(f"unknown policy {name!r}; valid policies: {', '.join(policy_names())}") from None
    cls: type[Policy] = getattr(importlib.import_module(module), attribute)
    return cls


def get_policy(name: str) -> Policy:
    return policy_class(name)()
