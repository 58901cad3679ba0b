"""Layers point down (docs/ARCHITECTURE.md, "Rules of the house"), checked statically over every module of dare_bench/.

cli → pipeline → trainers / evaluators → diffusion → models; tasks, store, config (and errors, fileio, registry,
sandbox) at the ground floor. Every import of a dare_bench module — at the top, inside a function (lazy), under
`if TYPE_CHECKING:`, or `importlib.import_module("dare_bench....")` with a literal name — counts. A module may import
its own floor and the floors below it, never one above; trainers and evaluators (one floor) never import each other
(the trainer gets evaluation as a callback); only the pipeline and what sits above it import the store. A new
top-level module or package must be given a floor in `FLOORS` before this test passes.

The models package itself: the registry (`families.py`), `presets.py`, `io.py` and `base.py` import each other only
at module top (no cycle hidden in function-level imports), and each imports on its own in a fresh interpreter.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "dare_bench"

GROUND, MODELS, DIFFUSION, TRAIN_EVAL, PIPELINE, CLI = range(6)
FLOOR_NAMES = {GROUND: "ground floor", MODELS: "models", DIFFUSION: "diffusion", TRAIN_EVAL: "trainers / evaluators",
               PIPELINE: "pipeline", CLI: "cli"}
# floor of each top-level module / package of dare_bench ("" = dare_bench/__init__.py)
FLOORS = {
    "": GROUND, "errors": GROUND, "fileio": GROUND, "config": GROUND, "tasks": GROUND, "store": GROUND,
    "registry": GROUND, "sandbox": GROUND, "catalogue": GROUND,
    "models": MODELS,
    "diffusion": DIFFUSION,
    "trainers": TRAIN_EVAL, "evaluators": TRAIN_EVAL,
    "pipeline": PIPELINE,
    # entry points: the CLI, its command modules, `dare-bench check`, the bench ratios, the leaderboard
    "cli": CLI, "check": CLI, "bench": CLI, "leaderboard": CLI,
}
SIBLINGS_APART = {("trainers", "evaluators"), ("evaluators", "trainers")}
MODELS_CORE = ("families", "presets", "io", "base")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(path: Path, module: str):
    """(imported dare_bench module, line, is_function_level) of every import in the file."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                out.extend((a.name, child.lineno, in_function) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                out.append((target, child.lineno, in_function))
                # `from dare_bench.x import y` where y is a submodule imports dare_bench.x.y
                out.extend((f"{target}.{a.name}", child.lineno, in_function) for a in child.names)
            elif (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute)
                  and child.func.attr == "import_module" and child.args
                  and isinstance(child.args[0], ast.Constant) and isinstance(child.args[0].value, str)):
                out.append((child.args[0].value, child.lineno, in_function))
            visit(child, nested)

    visit(tree, False)
    return [(t, line, lazy) for t, line, lazy in out if t == "dare_bench" or t.startswith("dare_bench.")]


def _area(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _floor(module: str) -> int:
    if module.rpartition(".")[2] in ("commands",):  # registry/commands.py, store/commands.py, ...: CLI wiring
        return CLI
    area = _area(module)
    if area not in FLOORS:
        raise KeyError(area)
    return FLOORS[area]


def _resolve(target: str, known: dict[str, Path]) -> str | None:
    """The dare_bench module an import names (a `from a.b import name` of a non-module resolves to a.b)."""
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target or None


def test_every_area_has_a_floor():
    unknown = sorted({_area(m) for m in _modules()} - set(FLOORS))
    assert not unknown, f"give these top-level modules / packages a floor in FLOORS: {unknown}"


def test_layers_point_down():
    known = _modules()
    violations = []
    for module, path in known.items():
        src_area, src_floor = _area(module), _floor(module)
        seen = set()
        for target, line, lazy in _imports(path, module):
            dst = _resolve(target, known)
            if dst is None or (dst, line) in seen:
                continue
            seen.add((dst, line))
            dst_area, dst_floor = _area(dst), _floor(dst)
            where = f"{path.relative_to(REPO)}:{line} imports {dst}{' (lazily)' if lazy else ''}"
            if dst_floor > src_floor:
                violations.append(f"{where}: {FLOOR_NAMES[src_floor]} must not import {FLOOR_NAMES[dst_floor]}")
            elif (src_area, dst_area) in SIBLINGS_APART:
                violations.append(f"{where}: {src_area} and {dst_area} never import each other")
            elif dst_area == "store" and src_area != "store" and src_floor < PIPELINE:
                violations.append(f"{where}: only the pipeline, the CLI and the leaderboard import the store")
    assert not violations, "layer rule broken:\n" + "\n".join(violations)


def test_the_layer_check_sees_upward_and_lazy_imports(tmp_path):
    """The checker itself: an upward import inside a function is found and named."""
    fake = tmp_path / "dare_bench" / "tasks" / "x.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("import os\n\ndef f():\n    from dare_bench.evaluators.evaluator import evaluate\n"
                    "    import importlib\n    importlib.import_module('dare_bench.pipeline')\n")
    found = _imports(fake, "dare_bench.tasks.x")
    targets = {(t, lazy) for t, _, lazy in found}
    assert ("dare_bench.evaluators.evaluator", True) in targets and ("dare_bench.pipeline", True) in targets
    assert _floor("dare_bench.evaluators.evaluator") > _floor("dare_bench.tasks.x")
    assert _floor("dare_bench.store.commands") == CLI


def test_models_core_has_no_function_level_imports_of_the_package():
    known = _modules()
    lazy = []
    for name in MODELS_CORE:
        module = f"dare_bench.models.{name}"
        lazy += sorted({f"{module}:{line} imports {_resolve(t, known)} inside a function"
                        for t, line, is_lazy in _imports(known[module], module) if is_lazy})
    assert not lazy, "\n".join(lazy)


@pytest.mark.parametrize("name", MODELS_CORE)
def test_models_core_module_imports_alone_in_a_fresh_interpreter(name):
    code = (f"import dare_bench.models.{name}\n"
            "from dare_bench.models.families import FAMILIES\n"
            "from dare_bench.models.presets import PRESETS\n"
            "assert sorted(FAMILIES) == ['dream', 'llada', 'llada2', 'sdar'], sorted(FAMILIES)\n"
            "assert {'tiny-llada', 'tiny-dream', 'tiny-sdar', 'tiny-llada2'} <= set(PRESETS), sorted(PRESETS)\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
