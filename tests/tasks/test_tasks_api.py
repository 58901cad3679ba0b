"""Task registry, data loading (DARE parquet, d1 CSV/JSONL, generator), fingerprints and error handling."""

import json
import time

import pytest

from dare_bench.errors import ConfigError, DataError
from dare_bench.tasks import get_task, list_tasks
from dare_bench.tasks.base import Item, parse_hf_source
from dare_bench.tasks.generators import count_sudoku_solutions, generate_countdown, generate_sudoku, sudoku_is_solution

from testpaths import DARE_DATA

ALL = ["aime2024", "aime2025", "arcc", "arith", "countdown", "gpqa", "gsm8k", "hellaswag", "humaneval", "math",
       "math500", "mbpp", "mmlu", "mmlupro", "olympiadbench", "pyfunc", "sudoku"]


def need_dare(split="test"):
    assert (DARE_DATA / "rl" / split).is_dir(), f"DARE {split} data missing from {DARE_DATA}"


def test_registry_lists_every_task_and_suggests_on_typos():
    assert list_tasks() == ALL
    with pytest.raises(ConfigError, match="did you mean 'sudoku'"):
        get_task("sudoko")
    with pytest.raises(ConfigError, match="unknown task"):
        get_task("chess")


def test_unknown_grader_and_template_are_config_errors():
    task = get_task("sudoku")
    item = task.generate(1, seed=0)[0]
    with pytest.raises(ConfigError, match="available: d1, dare, strict"):
        task.grade("x", item, grader="nope")
    with pytest.raises(ConfigError):
        task.format_prompt(item, "fancy")


@pytest.mark.parametrize("name,split,n", [("sudoku", "test", 500), ("countdown", "test", 256)])
def test_dare_files_load_and_prompts_are_rebuilt_exactly(monkeypatch, name, split, n):
    need_dare()
    monkeypatch.setenv("DARE_BENCH_DATA", str(DARE_DATA))
    task = get_task(name)
    ds = task.load(split)
    assert len(ds) == n and ds.source.endswith(task.dare_files[split])
    for it in ds:
        if name == "sudoku":
            rebuilt = task.make_item(it.index, it.extra["puzzle"], it.ground_truth, split)
        else:
            rebuilt = task.make_item(it.index, json.loads(it.extra["numbers"]), int(it.ground_truth), split)
        assert rebuilt.prompt_messages == it.prompt_messages  # generator items use DARE's exact prompt text
    assert task.load(split, limit=5).fingerprint == ds.fingerprint  # fingerprint = the file's bytes


def test_quirk_dare_sudoku_test_puzzles_are_not_all_unique(monkeypatch):
    """DARE's (= d1's) 500 test puzzles: 124 have several solutions, yet graders compare with ONE stored grid."""
    need_dare()
    monkeypatch.setenv("DARE_BENCH_DATA", str(DARE_DATA))
    ds = get_task("sudoku").load("test")
    counts = [count_sudoku_solutions(it.extra["puzzle"], cap=10) for it in ds]
    assert sum(c > 1 for c in counts) == 124 and min(counts) == 1
    for it in ds:
        assert sudoku_is_solution(it.ground_truth)
        assert all(p in ("0", s) for p, s in zip(it.extra["puzzle"], it.ground_truth))


def test_generators_are_seeded_and_valid():
    a, b = generate_sudoku(30, seed=7), generate_sudoku(30, seed=7)
    assert a == b and a != generate_sudoku(30, seed=8)
    assert len({p for p, _ in a}) == 30
    for puzzle, solution in a:
        assert puzzle.count("0") == 8 and count_sudoku_solutions(puzzle) == 1 and sudoku_is_solution(solution)
        assert all(p in ("0", s) for p, s in zip(puzzle, solution))
    games = generate_countdown(50, seed=3)
    assert games == generate_countdown(50, seed=3)
    for nums, target, expr in games:
        assert len(nums) == 3 and 1 <= target <= 100 and all(1 <= x <= 100 for x in nums)
        assert eval(expr) == target and sorted(int(t) for t in __import__("re").findall(r"\d+", expr)) == sorted(nums)


def test_generated_datasets_have_stable_fingerprints_and_dare_format():
    task = get_task("sudoku")
    ds = task.generate(10, seed=0, split="train")
    assert ds.fingerprint == task.generate(10, seed=0, split="train").fingerprint
    assert ds.fingerprint != task.generate(10, seed=1, split="train").fingerprint
    assert all(it.extra["puzzle"].count("0") == 9 for it in ds)  # DARE's train set has 9 blanks, test 8
    cd = get_task("countdown").generate(5, seed=0)
    it = cd[0]
    assert it.prompt_messages[0]["role"] == "user" and "Using only the numbers [" in it.prompt_messages[0]["content"]
    assert isinstance(json.loads(it.extra["numbers"]), list) and it.ground_truth.isdigit()


def test_default_source_falls_back_to_generator_without_data(monkeypatch):
    monkeypatch.delenv("DARE_BENCH_DATA", raising=False)
    ds = get_task("countdown").load("test", limit=4)
    assert len(ds) == 4 and ds.source.startswith("generator:")
    with pytest.raises(DataError, match="DARE_BENCH_DATA"):
        get_task("gsm8k").load("test")


def test_d1_raw_formats_load(tmp_path):
    csv = tmp_path / "sudoku.csv"
    csv.write_text("Puzzle,Solution\n0321003004002100,4321123434122143\n")
    ds = get_task("sudoku").load("test", source=csv)
    assert ds[0].extra["puzzle"] == "0321003004002100" and ds[0].ground_truth == "4321123434122143"
    jl = tmp_path / "cd.jsonl"
    jl.write_text('{"input": "30,100,93", "output": "23"}\n')
    ds = get_task("countdown").load("test", source=jl)
    assert json.loads(ds[0].extra["numbers"]) == [30, 100, 93] and ds[0].ground_truth == "23"
    assert len(ds.fingerprint) == 64


@pytest.mark.parametrize("content,suffix,match", [
    ("not json at all\n", ".jsonl", "cannot read"),
    ('{"foo": 1}\n', ".jsonl", "wrong shape|need"),
    ("a,b\n1,2\n", ".csv", "Puzzle"),
    ("x", ".txt", "unsupported"),
    (b"PAR1garbage", ".parquet", "cannot read"),
])
def test_bad_files_give_one_data_error(tmp_path, content, suffix, match):
    p = tmp_path / f"bad{suffix}"
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(DataError, match=match):
        get_task("sudoku").load("test", source=p)


def test_missing_file_and_hf_source_syntax(tmp_path):
    with pytest.raises(DataError, match="not found"):
        get_task("gsm8k").load("test", source=tmp_path / "nope.parquet")
    assert parse_hf_source("hf:openai/gsm8k:main@abc123") == ("openai/gsm8k", "main", "abc123")
    assert parse_hf_source("hf:openai/openai_humaneval@v1") == ("openai/openai_humaneval", None, "v1")
    with pytest.raises(ConfigError, match="revision"):
        get_task("gsm8k").load("test", source="hf:openai/gsm8k")


def test_malformed_completions_never_raise():
    task = get_task("countdown")
    item = task.generate(1, seed=0)[0]
    for bad in [None, 123, "", "<answer>", "<answer></answer>", "<answer>((((</answer>", "\x00" * 50]:
        for g in task.graders:
            res = task.grade(bad, item, grader=g)
            assert res.correct is False
    broken = Item(0, [], "23", {"numbers": "not a list"})
    assert task.grade("<answer>1</answer>", broken, "dare").correct is False


def test_plain_prompt_and_gold_answer_round_trip_through_every_grader():
    for name in ("sudoku", "countdown"):
        task = get_task(name)
        for it in task.generate(20, seed=5):
            gold = task.format_answer(it)
            assert task.format_prompt(it, "plain").endswith("\n")
            for g in task.graders:
                assert task.grade(gold, it, g).correct, (name, g, gold)


NASTY = [
    "", " ", "\n" * 50, "<answer>", "</answer><answer>", "<answer>\n</answer>", "\\boxed{", "\\boxed{}", "\\boxed",
    "\\boxed{" * 300 + "1" + "}" * 300, "}" * 100, "\\fbox{1}", "<answer>" * 100 + "1", "\x00\x01\x02",
    "é ü 中文 ١٢٣ ３", "\\boxed{\\frac{1}{0}}", "\\boxed{10**10**10}", "<answer>9**9**9**9</answer>",
    "\\boxed{\\text{ }}", "\\boxed{\\sqrt}", "\\boxed{\\frac}", "\\boxed{a/b/c}", "<answer>()</answer>",
    "<reasoning>" + "x" * 20000,
]


@pytest.mark.parametrize("name", ["sudoku", "countdown", "gsm8k", "math500"])
def test_nasty_completions_are_scored_wrong_without_raising(name):
    task = get_task(name)
    if name in ("sudoku", "countdown"):
        item = task.generate(1, seed=0)[0]
    else:
        item = Item(0, [{"role": "user", "content": "q"}], "18", {})
    t0 = time.time()
    for text in NASTY:
        for grader in task.graders:
            res = task.grade(text, item, grader)
            assert isinstance(res.correct, bool) and isinstance(res.reward, float)
            assert res.correct is False, (grader, text[:40])
    assert time.time() - t0 < 20


def test_generator_source_string():
    ds = get_task("sudoku").load("test", source="generator:3", limit=4)
    assert len(ds) == 4 and ds.fingerprint == get_task("sudoku").generate(4, seed=3).fingerprint
    with pytest.raises(ConfigError, match="generator"):
        get_task("sudoku").load("test", source="generator:abc")
    with pytest.raises(DataError, match="no procedural generator"):
        get_task("gsm8k").load("test", source="generator")
    with pytest.raises(DataError, match="no standard 'train' split"):
        get_task("humaneval").load("train")


def test_grader_sources_for_run_records():
    from dare_bench.tasks import GRADERS, grader_source

    assert all(grader_source(g) for g in GRADERS)
    assert "dllm_rm" in grader_source("dare") and "parse_and_get_acc" in grader_source("d1")
    with pytest.raises(ConfigError):
        grader_source("lenient")
