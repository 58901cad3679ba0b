"""Reproduction registry: `dare_bench/reproductions/<algorithm>-<backbone>-<task>.yaml`, validated into
ReproductionSpecs.

    from dare_bench.registry import get, load_registry
    spec = get("bgpo-llada-sudoku")
    cfg = spec.resolve("tiny")

See `loader.py` for where files are looked up and how `_defaults/` layers merge.
"""

from dare_bench.registry.loader import (
    Registry,
    default_directory,
    get,
    load_file,
    load_registry,
    parse_yaml,
    split_names,
)

__all__ = ["Registry", "default_directory", "get", "load_file", "load_registry", "parse_yaml", "split_names"]
