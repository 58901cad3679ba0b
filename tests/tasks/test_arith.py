"""The procedural ``arith`` task: seeded generator, disjoint splits, difficulty bounds, GSM8K's graders, tiny format."""

import json

import pytest

from dare_bench.errors import ConfigError
from dare_bench.tasks import get_task
from dare_bench.tasks.arith import apply_op, generate_arith, parse_key, problem_key, split_of
from dare_bench.tasks.tokenizer import build_task_tokenizer

GRADERS = ("dare", "d1", "strict")


@pytest.fixture(scope="module")
def task():
    return get_task("arith")


def test_loads_through_the_registry_with_gsm8ks_graders(task):
    from dare_bench.tasks.graders import d1, dare, strict

    assert task.name == "arith" and task.has_generator and task.graders == ["d1", "dare", "strict"]
    assert task._graders == {"dare": dare.grade_math, "d1": d1.grade_gsm8k, "strict": strict.grade_gsm8k}
    assert task._graders == get_task("gsm8k")._graders
    ds = task.load("test", limit=5)  # no data source: the generator
    assert len(ds) == 5 and ds.source.startswith("generator:arith(seed=0")
    assert task.load("train", source="generator:3", limit=4).fingerprint == task.generate(4, 3, "train").fingerprint


def test_generator_is_deterministic_and_answers_are_the_running_total(task):
    a, b = task.generate(50, seed=7, split="train"), task.generate(50, seed=7, split="train")
    assert a.fingerprint == b.fingerprint and [it.to_json() for it in a] == [it.to_json() for it in b]
    assert task.generate(50, seed=8, split="train").fingerprint != a.fingerprint
    assert task.generate(50, seed=7, split="train", steps=3).fingerprint != a.fingerprint
    for it in a:
        start, ops = parse_key(it.extra["problem"])
        value = start
        for op, n in ops:
            value = apply_op(value, op, n)
            assert 1 <= value <= 999
        assert str(value) == it.ground_truth and len(ops) == 2 == it.extra["steps"]
        assert problem_key(start, ops) == it.extra["problem"]
        assert it.prompt_messages[-1]["content"].endswith("have now?")
    keys = [it.extra["problem"] for it in a]
    assert len(set(keys)) == len(keys)  # no repeats within a split


@pytest.mark.parametrize("steps", [1, 2, 4])
def test_train_and_test_never_share_a_problem(steps):
    n_test = 60 if steps == 1 else 300
    test = _keys(generate_arith(n_test, 0, "test", steps=steps))
    train: set[str] = set()
    for seed in range(3):
        train |= _keys(generate_arith(300, seed, "train", steps=steps))
    assert test and train and not (test & train)
    assert all(split_of(k) == "test" for k in test) and all(split_of(k) == "train" for k in train)


def test_ops_restricts_the_operations_and_keeps_the_splits_apart(task):
    for ops in ("+-", "*", "+/"):
        train = task.generate(200, seed=0, split="train", steps=3, max_operand=9, ops=ops)
        test = task.generate(20, seed=0, split="test", steps=3, max_operand=9, ops=ops)
        for it in [*train, *test]:
            assert {op for op, _ in parse_key(it.extra["problem"])[1]} <= set(ops)
        assert not {it.extra["problem"] for it in train} & {it.extra["problem"] for it in test}
    default = task.generate(3, seed=0)
    assert "ops=" not in default.source  # the default datasets keep their sources
    assert "ops=+-" in task.generate(3, seed=0, ops="+-").source
    configured = task.with_options({"ops": "+-"}).generate(5, seed=0)
    assert configured.fingerprint == task.generate(5, seed=0, ops="+-").fingerprint


def _keys(problems) -> set[str]:
    return {problem_key(start, ops) for start, ops, _, _ in problems}


def test_difficulty_knobs_and_their_bounds(task):
    for steps in (1, 4):
        for max_operand in (4, 99):
            for it in task.generate(2, seed=1, steps=steps, max_operand=max_operand):
                _, ops = parse_key(it.extra["problem"])
                assert len(ops) == steps and all(1 <= n <= max_operand for _, n in ops)
    for kw in ({"steps": 0}, {"steps": 5}, {"steps": 2.0}, {"steps": True}, {"max_operand": 3},
               {"max_operand": 100}, {"max_operand": "20"}):
        with pytest.raises(ConfigError, match="arith: (steps|max_operand) must be an integer in"):
            task.generate(3, seed=0, **kw)
    for ops in ("", "-/", "++", "+x", 1):
        with pytest.raises(ConfigError, match="arith: ops must be distinct characters"):
            task.generate(3, seed=0, ops=ops)
    with pytest.raises(ConfigError, match="unknown split"):
        task.generate(3, split="dev")
    with pytest.raises(ConfigError, match="could not draw 10000 distinct train problems"):
        task.generate(10000, split="train", steps=1, max_operand=9)  # the space is too small: one clear error
    # a test set is "at most n", as an evaluation limit is on a file: the small space gives all it has
    small = task.generate(10000, split="test", steps=1, max_operand=9)
    assert 0 < len(small) < 10000 and len(small) == len(task.generate(20000, split="test", steps=1, max_operand=9))


def test_gold_answers_grade_correct_with_every_grader_and_wrong_ones_wrong(task):
    items = list(task.generate(12, seed=3, split="test", steps=2)) + list(task.generate(6, seed=3, steps=4))
    for it in items:
        gold = task.format_answer(it)
        assert gold.endswith(f"\n#### {it.ground_truth}")
        assert f"\\boxed{{{it.ground_truth}}}" in gold and f"<answer>{it.ground_truth}</answer>" in gold
        for g in GRADERS:
            assert task.grade(gold, it, g).correct, (g, gold)
        assert task.grade(gold, it, "d1").details["reward_parts"]["correctness"] == 2.0  # d1's reward reads <answer>
        for g in ("dare", "strict"):
            assert task.grade(task.format_answer(it, grader=g), it, g).correct
        wrong = str(int(it.ground_truth) + 1)
        bad = gold.replace(it.ground_truth + "}", wrong + "}").replace(f">{it.ground_truth}<", f">{wrong}<")
        bad = bad.rsplit("#### ", 1)[0] + f"#### {wrong}"
        for g in GRADERS:
            res = task.grade(bad, it, g)
            assert not res.correct and res.score == 0.0, (g, bad)
        for g in GRADERS:
            assert not task.grade("", it, g).correct


def test_boxed_and_hashes_are_read_exactly_as_on_gsm8k(task):
    it = task.generate(1, seed=5)[0]
    gt = it.ground_truth
    gsm = get_task("gsm8k")
    gsm_item = gsm.row_to_item({"question": "q", "answer": f"steps\n#### {gt}"}, 0, "test")
    assert gsm_item.ground_truth == gt
    completions = {
        f"so \\boxed{{{gt}}}": True,                     # GSM8K's evaluation convention: the box
        f"steps\n\\boxed{{{gt}}}\n#### {gt}": True,      # box + GSM8K's closing line (the gold's shape)
        f"<answer>\n\\boxed{{{gt}}}\n</answer>": True,   # d1's evaluation format
        f"steps\n#### {gt}": None,                       # "####" alone: no grader reads it, on gsm8k either
    }
    for text, expect in completions.items():
        for g in GRADERS:
            mine, theirs = task.grade(text, it, g), gsm.grade(text, gsm_item, g)
            assert (mine.correct, mine.reward, mine.extracted) == (theirs.correct, theirs.reward, theirs.extracted)
            if expect is not None:
                assert mine.correct is expect, (g, text)
    for g in ("dare", "strict"):
        assert not task.grade(f"steps\n#### {gt}", it, g).correct


def test_gsm8k_rows_load_and_keep_their_hash_answer(task, tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"question": "Ana has 3 boxes of 4 apples and gives away 5. How many are left?",
                                "answer": "3*4=12\n12-5=7\n#### 7"}) + "\n")
    ds = task.load("test", source=path)
    it = ds[0]
    assert it.ground_truth == "7" and it.extra["data_source"] == "arith"
    assert task.format_prompt(it).startswith("Question: Ana has 3 boxes")  # no compact form: GSM8K's plain prompt
    assert all(task.grade(task.format_answer(it), it, g).correct for g in GRADERS)


@pytest.mark.parametrize("steps,prompt_max,answer_max", [(1, 13, 36), (2, 17, 47), (3, 21, 58), (4, 25, 69)])
def test_tiny_tokenizer_round_trips_and_lengths_match_the_docs(task, steps, prompt_max, answer_max):
    tok = build_task_tokenizer("arith")
    assert len(tok) < 48
    for it in task.generate(40, seed=2, split="train", steps=steps, max_operand=99):
        prompt, answer = task.format_prompt(it, "plain"), task.format_answer(it)
        ids = tok(prompt + answer)["input_ids"]
        assert tok.unk_token_id not in ids and tok.decode(ids) == prompt + answer
        assert tok.convert_tokens_to_ids("<answer>") in ids
        n_prompt, n_answer = len(tok(prompt)["input_ids"]), len(tok(answer)["input_ids"])
        assert n_prompt <= prompt_max and n_answer <= answer_max  # the documented bounds (9+4s, 25+11s)
        short = len(tok(task.format_answer(it, grader="dare"))["input_ids"])
        assert short == n_answer - 3 - len(it.ground_truth)  # without "<answer>n</answer>\n"
