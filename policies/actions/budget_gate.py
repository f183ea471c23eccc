"""Budget gate for the move planner (pure): may a move's remaining work fit in what the owner has left?

Rule: a move to a partition priced ``cost_per_node_hour`` is allowed only
when the job's remaining time there (its ETA), times its nodes, fits in the
owner's node-hours left, and that at the price fits in the cost left. An
unknown remaining time counts as nothing more than what is left allows:
such a move is allowed only while something is left. ``None`` for a left
amount means no budget bounds it.
"""

from __future__ import annotations


def move_fits_budget(remaining_s: float | None, nodes: int, cost_per_node_hour: float,
                     node_hours_left: float | None, cost_left: float | None) -> bool:
    if remaining_s is None:
        return (node_hours_left is None or node_hours_left > 0) and (cost_left is None or cost_left > 0)
    hours = max(0.0, remaining_s) / 3600.0 * max(1, nodes)
    if node_hours_left is not None and hours > node_hours_left + 1e-9:
        return False
    return cost_left is None or hours * cost_per_node_hour <= cost_left + 1e-9
