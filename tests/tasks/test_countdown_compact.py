"""Countdown's compact format (the tiny replicas' own games): options, splits that never overlap, games that the
strict grader accepts with their gold answers, and the standard format left as it was."""

from __future__ import annotations

import json
import re

import pytest

from dare_bench.errors import ConfigError
from dare_bench.tasks import get_task
from dare_bench.tasks.countdown import game_key, split_of_game

COMPACT = {"max_number": 9, "ops": "+-*"}


def numbers_of(item):
    return json.loads(item.extra["numbers"])


def _keys(ds):
    return {game_key(numbers_of(i), int(i.ground_truth)) for i in ds.items}


def test_compact_splits_never_share_a_game_and_hold_what_the_hash_says():
    task = get_task("countdown").with_options(COMPACT)
    train, test = task.load("train"), task.load("test")
    assert len(test.items) > 200 and len(train.items) > 1500  # the space's size, all of it ("up to" n)
    assert not _keys(train) & _keys(test)
    assert len(_keys(train)) == len(train.items)  # distinct games
    for ds, split in ((train, "train"), (test, "test")):
        for item in ds.items[:200]:
            assert split_of_game(numbers_of(item), int(item.ground_truth)) == split


def test_compact_games_use_their_knobs_and_the_gold_answer_passes_the_strict_grader():
    task = get_task("countdown").with_options({"max_number": 12, "ops": "+-", "numbers": 4})
    ds = task.load("test", limit=64)
    assert len(ds.items) == 64
    for item in ds.items:
        numbers = numbers_of(item)
        assert len(numbers) == 4 and all(1 <= x <= 12 for x in numbers) and int(item.ground_truth) >= 1
        answer = task.format_answer(item, "strict")
        assert not set(answer.removeprefix("<answer>").removesuffix("</answer>")) & set("*/")
        assert task.grade(answer, item, "strict").correct
    # the numbers sit next to the answer, where the target's width cannot move them; the standard games keep
    # DARE's order
    assert task.format_prompt(ds[0]) == f"target {ds[0].ground_truth} numbers {' '.join(map(str, numbers_of(ds[0])))}\n"
    standard = get_task("countdown").generate(1, seed=0)
    assert get_task("countdown").format_prompt(standard[0]).startswith("numbers ")


def test_in_order_games_list_the_numbers_in_the_answers_order_without_parentheses():
    task = get_task("countdown").with_options({**COMPACT, "ops": "+-*/", "in_order": True})
    train, test = task.load("train"), task.load("test")
    ordered = lambda ds: {game_key(numbers_of(i), int(i.ground_truth), True) for i in ds.items}
    assert len(test.items) == 256 and not ordered(train) & ordered(test)
    operators = set()
    for item in test.items:
        numbers = numbers_of(item)
        expr = task.format_answer(item, "strict").removeprefix("<answer>").removesuffix("</answer>")
        assert "(" not in expr and [int(x) for x in re.split(r"[-+*/]", expr)] == numbers
        operators |= set(re.findall(r"[-+*/]", expr))
        assert task.grade(f"<answer>{expr}</answer>", item, "strict").correct  # the usual precedence
    assert operators == set("+-*/")
    assert "in_order" in test.source


def test_compact_generation_is_deterministic_and_seeded():
    task = get_task("countdown").with_options(COMPACT)
    a, b = task.generate(50, seed=0, split="train"), task.generate(50, seed=0, split="train")
    assert a.fingerprint == b.fingerprint
    assert task.generate(50, seed=1, split="train").fingerprint != a.fingerprint
    assert "max_number=9" in a.source and "ops=+-*" in a.source


def test_compact_format_ignores_dares_files(monkeypatch, tmp_path):
    (tmp_path / "rl" / "test").mkdir(parents=True)
    (tmp_path / "rl" / "test" / "countdown_1.parquet").write_bytes(b"not read")
    monkeypatch.setenv("DARE_BENCH_DATA", str(tmp_path))
    standard = get_task("countdown")
    assert standard.dare_path("test") == tmp_path / "rl" / "test" / "countdown_1.parquet"
    compact = standard.with_options(COMPACT)
    assert compact.dare_path("test") is None
    assert compact.load("test").source.startswith("generator:countdown(")


def test_the_standard_games_are_unchanged_by_the_options():
    task = get_task("countdown")
    assert task.with_options({}) is task and task.max_number is None
    ds = task.generate(50, seed=0)
    assert ds.source == "generator:countdown(seed=0,n=50,numbers=3)"
    # the seeded 1..100 generator's games, fingerprinted before the compact format existed
    assert ds.fingerprint == "db7fb94e555a54596bedc4dce08a85354c783ad1861d52a98dab6deef571a7de"


@pytest.mark.parametrize("options, message", [
    ({"max_number": 1}, "max_number must be null or an integer in 2..100"),
    ({"max_number": "9"}, "max_number must be null or an integer"),
    ({"max_number": 9, "numbers": 5}, "numbers must be an integer in 2..4"),
    ({"max_number": 9, "ops": "-/"}, r"including '\+' or '\*'"),
    ({"max_number": 9, "ops": "++"}, "distinct characters"),
    ({"ops": "+-"}, "set max_number too"),
    ({"in_order": True}, "set max_number too"),
    ({"max_number": 9, "in_order": "yes"}, "in_order must be true or false"),
    ({"max_numbers": 9}, "has no option 'max_numbers'"),
])
def test_bad_compact_options_are_one_error(options, message):
    with pytest.raises(ConfigError, match=message):
        get_task("countdown").with_options(options)
