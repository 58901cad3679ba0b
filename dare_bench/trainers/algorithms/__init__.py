"""RL algorithm plug-ins, one file each, registered by name (see `base.py` for the contract)."""

from dare_bench.trainers.algorithms.base import (  # noqa: F401
    ALGORITHMS,
    Algorithm,
    AlgorithmConfig,
    AlgorithmState,
    RolloutBatch,
    get_algorithm,
    list_algorithms,
    register_algorithm,
)
