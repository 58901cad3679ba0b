"""The shipped registry covers DARE's comparison tables, its BDLM recipes and JustGRPO's table, with the numbers
of the research notes (parsed from tests/fixtures/docs/algorithms.md, a copy of the shared research notes, not
retyped here)."""

import re

import pytest

from dare_bench import catalogue
from dare_bench.registry import load_registry

from testpaths import RESEARCH_NOTES

DOC = RESEARCH_NOTES
COLUMN = {"Baseline": "baseline", "d1": "d1", "Coupled-GRPO": "coupled-grpo", "VRPO": "vrpo", "CJ-GRPO": "cj-grpo",
          "SPG": "spg", "BGPO": "bgpo"}
ROW = {"GSM8K": "gsm8k", "MATH": "math500", "HumanEval": "humaneval", "MBPP": "mbpp", "Countdown": "countdown",
       "Sudoku": "sudoku"}


def _table(text: str, title: str) -> list[list[str]]:
    block = text.split(title, 1)[1]
    out, started = [], False
    for ln in block.splitlines():
        if ln.startswith("|"):
            started = True
            out.append([c.strip() for c in ln.strip("|").split("|")])
        elif started:
            break
    assert out, title
    return [out[0]] + out[2:]


@pytest.fixture(scope="module")
def doc() -> str:
    return DOC.read_text()


@pytest.fixture(scope="module")
def reg():
    return load_registry()


def _value(spec, table: str, **settings) -> float:
    hits = [r.value for r in spec.reported
            if r.table == table and all(r.settings.get(k) == v for k, v in settings.items())]
    assert len(hits) == 1, (spec.name, table, settings, spec.reported)
    return hits[0]


@pytest.mark.parametrize("title, backbone", [
    ('"Algorithm Comparison (LLaDA-8B-Instruct)"', "llada"),
    ('"Algorithm Comparison (Dream-7B-Instruct)"', "dream"),
])
def test_every_cell_of_dares_algorithm_comparison(doc, reg, title, backbone):
    header, *rows = _table(doc, title)
    n = 0
    for row in rows:
        task = ROW[row[0]]
        for col, cell in zip(header[1:], row[1:]):
            spec = reg.get(f"{COLUMN[col]}-{backbone}-{task}")
            assert _value(spec, "dare-algorithm-comparison") == float(cell)
            n += 1
    assert n == (42 if backbone == "llada" else 24)


EVAL_COLUMNS = {"LLaDA-8B": "llada", "Dream-7B": "dream", "SDAR-8B-Chat": "sdar", "SDAR-30B-A3B": "sdar30b",
                "LLaDA2.0-mini": "llada2", "LLaDA2.1-mini": "llada2.1"}
EVAL_ROWS = {"MMLU": "mmlu", "MMLU-Pro": "mmlupro", "Hellaswag": "hellaswag", "ARC-C": "arcc", "GSM8K": "gsm8k",
             "MATH": "math", "GPQA": "gpqa", "AIME24": "aime2024", "AIME25": "aime2025",
             "OlympiadBench": "olympiadbench", "HumanEval": "humaneval", "MBPP": "mbpp"}


def _eval_task(backbone: str, row: str) -> str:
    # SDAR-8B's MATH row is MATH-500 (DARE's config reads test_prm800k_500.json); the others score the full test set
    return "math500" if (backbone, row) == ("sdar", "MATH") else EVAL_ROWS[row]


def test_every_cell_of_dares_evaluation_table(doc, reg):
    """DARE's Evaluation Result Reproduction table: one released-<backbone>-<benchmark> entry per cell, its value,
    and the OpenCompass settings file it came from."""
    header, *rows = _table(doc, '"Evaluation Result Reproduction" (base')
    n = 0
    for row in rows:
        for col, cell in zip(header[1:], row[1:]):
            backbone = EVAL_COLUMNS[col]
            spec = reg.get(f"released-{backbone}-{_eval_task(backbone, row[0])}")
            assert _value(spec, "dare-eval-reproduction") == float(cell)
            assert {r.table for r in spec.reported} == {"dare-eval-reproduction"}
            assert spec.reported[0].settings["config"].endswith(".py") and list(spec.scales) == ["paper"]
            protocol = spec.scales["paper"].task_options["protocol"]  # the cell's OpenCompass dataset config
            assert protocol == spec.reported[0].settings["opencompass_dataset"] and spec.grader == "opencompass"
            n += 1
    assert n == 72


def test_the_two_protocols_of_one_checkpoint_stay_apart(reg):
    """The algorithm comparison's Baseline column and the evaluation table score LLaDA-8B on GSM8K under different
    settings (76.5 vs 79.68): two entries, never one."""
    base, released = reg.get("baseline-llada-gsm8k"), reg.get("released-llada-gsm8k")
    assert {r.table for r in base.reported} == {"dare-algorithm-comparison"}
    assert _value(base, "dare-algorithm-comparison") != _value(released, "dare-eval-reproduction")
    assert base.resolve("paper").profile.eval != released.resolve("paper").profile.eval
    for spec in reg.select(algorithm="baseline"):
        assert all(r.table != "dare-eval-reproduction" for r in spec.reported), spec.name


def test_justgrpo_table(doc, reg):
    line = next(ln for ln in doc.splitlines() if ln.startswith("- JustGRPO"))
    line += doc.split(line, 1)[1].splitlines()[1]
    for label, task in (("GSM8K", "gsm8k"), ("MATH-500", "math500"), ("HumanEval", "humaneval"), ("MBPP", "mbpp")):
        values = re.search(rf"{label} (\d+\.\d)/(\d+\.\d)/(\d+\.\d)", line).groups()
        spec = reg.get(f"justgrpo-llada-{task}")
        for gen, v in zip((128, 256, 512), values):
            assert _value(spec, "justgrpo-results", gen_length=gen) == float(v)


def test_block_diffusion_recipes_without_scores(reg):
    for bb in ("sdar", "llada2"):
        for alg in ("bgpo", "ebpo", "cj-grpo"):
            specs = reg.select(backbone=bb, algorithm=alg)
            assert specs and all(not s.reported for s in specs)
            for s in (s for s in specs if "paper" in s.scales):  # arith / pyfunc entries are CPU-scale only
                sampler = s.scales["paper"].eval.sampler
                assert sampler.block_length in (4, 32) and sampler.gen_length == 2048


def test_bgpo_llada_sudoku_reports_42_6_with_source(reg, doc):
    spec = reg.get("bgpo-llada-sudoku")
    (r,) = spec.reported
    header, *rows = _table(doc, '"Algorithm Comparison (LLaDA-8B-Instruct)"')
    sudoku = next(row for row in rows if row[0] == "Sudoku")
    assert r.value == float(sudoku[header.index("BGPO")]) == 42.6
    assert r.source.ref == "yjyddq/DARE" and r.source.file == "README.md" and "LLaDA-8B-Instruct" in r.source.table


def test_every_file_is_documented_and_resolves(reg):
    for spec in reg:
        head = reg.files[spec.name].read_text().split("\nname:", 1)[0]
        assert f"dare-bench reproduce {spec.name}" in head and "# Paper:" in head, spec.name
        hashes = {spec.resolve(s).content_hash for s in spec.scales}
        assert len(hashes) == len(spec.scales)
        for scale, prof in spec.scales.items():
            assert prof.train.kind == catalogue.algorithm(spec.algorithm).kind
            if scale in ("tiny", "micro"):
                # the backbone's replica; LLaDA2.0's AR start (ar, wsd) is the same replica at block size 1
                ar_start = spec.algorithm in ("ar", "wsd", "wsd-cap")
                assert prof.model.preset == f"tiny-{spec.backbone}" + ("-ar" if ar_start else "")
                if prof.train.kind in ("rl", "preference"):
                    assert prof.train.lr <= 2e-5  # feasibility: larger lr hurt RL
        micro = spec.scales.get("micro")
        if micro is None:  # a real benchmark's entry: paper only (test_honest_scales.py)
            continue
        assert micro.eval.limit <= 16 and (micro.train.steps or 0) <= 3 and micro.base.start_step <= 50
