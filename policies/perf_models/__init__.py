"""The models the scheduling policies use: throughput fits, the fitted performance model, speedup, scaling history."""
