"""Average JCT (seconds) published in the Pollux paper, per workload (pollux/README.md)."""

from __future__ import annotations

PUBLISHED_AVG_JCT_S: dict[str, dict[str, list[int]]] = {
    "1.0": {
        "pollux": [2089, 3323, 2189, 2721, 2674, 2446, 3616, 2952],
        "optimus": [4087, 6914, 3944, 5968, 5656, 5302, 7291, 6294],
        "tiresias": [2474, 5145, 3876, 3280, 3501, 3470, 5480, 5080],
    },
    "0.5": {
        "pollux": [1060, 1826, 1311, 1498, 977, 1288, 2881, 1432],
        "optimus": [1310, 3125, 1987, 2174, 1325, 1958, 5314, 1972],
        "tiresias": [1451, 2333, 1870, 1947, 1425, 1827, 3979, 1900],
    },
}
LOAD_DIRS = {"1.0": "workloads", "0.5": "workloads-0.5"}
