"""RL algorithm plug-ins, one file each; each one's torch-free Config is `dare_bench/catalogue/knobs/<name>.py`
(see `base.py` for the contract).

The names below load `base.py` (and torch) on first use, so importing this package stays cheap.
"""

import importlib

_BASE_NAMES = ("ALGORITHMS", "Algorithm", "AlgorithmState", "PluginRollout", "RolloutBatch", "get_algorithm",
               "list_algorithms", "register_algorithm")


def __getattr__(name: str):
    if name == "AlgorithmConfig":
        return importlib.import_module("dare_bench.catalogue.settings").AlgorithmConfig
    if name in _BASE_NAMES:
        return getattr(importlib.import_module("dare_bench.trainers.algorithms.base"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["AlgorithmConfig", "ALGORITHMS", "Algorithm", "AlgorithmState", "PluginRollout", "RolloutBatch",
           "get_algorithm", "list_algorithms", "register_algorithm"]  # = _BASE_NAMES, spelled out for static tools
