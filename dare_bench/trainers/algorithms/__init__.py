"""RL algorithm plug-ins, one file each plus a torch-free `<name>_config.py` (see `base.py` for the contract).

The names below load `base.py` (and torch) on first use, so that the config modules, which the catalogue imports
to validate reproductions, can be imported without torch.
"""

import importlib

_BASE_NAMES = ("ALGORITHMS", "Algorithm", "AlgorithmState", "RolloutBatch", "get_algorithm", "list_algorithms",
               "register_algorithm")


def __getattr__(name: str):
    if name == "AlgorithmConfig":
        return importlib.import_module("dare_bench.trainers.algorithms.settings").AlgorithmConfig
    if name in _BASE_NAMES:
        return getattr(importlib.import_module("dare_bench.trainers.algorithms.base"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["AlgorithmConfig", *_BASE_NAMES]
