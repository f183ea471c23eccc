"""The agent's action rules, pure: which jobs to move, resize (rigid and goodput) and the budget gate for a move."""
