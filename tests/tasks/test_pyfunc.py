"""pyfunc: seeded generator, function-disjoint splits, the docstring's spec, difficulty knob, tiny format,
sandboxed grading."""

import json
import time

import pytest

from dare_bench.errors import ConfigError
from dare_bench.tasks import get_task, list_tasks
from dare_bench.tasks.graders import dare, strict
from dare_bench.tasks.pyfunc import DIFFICULTIES, OPS, compose, generate_pyfunc, spec
from dare_bench.tasks.tokenizer import build_task_tokenizer

TASK = get_task("pyfunc")


def test_registered_and_loads_from_its_generator():
    assert "pyfunc" in list_tasks() and TASK.name == "pyfunc"
    assert TASK.graders == ["dare", "strict"]
    ds = TASK.load(split="test", limit=5)
    assert len(ds) == 5 and ds.source.startswith("generator:pyfunc(seed=0") and "difficulty=1" in ds.source
    loaded = TASK.load(split="train", source="generator:3", limit=4)
    assert loaded.fingerprint == TASK.generate(4, 3, "train").fingerprint
    with pytest.raises(ConfigError, match="grader 'd1' does not exist"):
        TASK.grade("x", ds[0], grader="d1")


def test_generator_is_deterministic_and_seeded():
    a, b = TASK.generate(50, seed=7, split="train"), TASK.generate(50, seed=7, split="train")
    assert a.fingerprint == b.fingerprint and [i.to_json() for i in a] == [i.to_json() for i in b]
    assert TASK.generate(50, seed=8, split="train").fingerprint != a.fingerprint
    assert TASK.generate(50, seed=7, split="train", difficulty=2).fingerprint != a.fingerprint
    item = a[0]
    assert json.loads(item.ground_truth) and all(t.startswith(f"assert {item.extra['name']}(")
                                                 for t in json.loads(item.ground_truth))
    assert item.extra["docstring"] in item.prompt_messages[0]["content"]


@pytest.mark.parametrize("difficulty", DIFFICULTIES)
def test_train_and_test_never_share_a_problem(difficulty):
    train = generate_pyfunc(1500, seed=0, split="train", difficulty=difficulty)
    test = generate_pyfunc(300, seed=1, split="test", difficulty=difficulty)
    assert {p["expr"] for p in train}.isdisjoint({p["expr"] for p in test})
    # not just spellings: behaviour (outputs on the probes) is what is split, so x+2-1 and x+1 go together
    sig = lambda ps: {compose(p["family"], [OPS[i] for i in p["ops"]]).signature() for p in ps}  # noqa: E731
    assert sig(train).isdisjoint(sig(test)) and len(sig(test)) >= 10
    assert {p["family"] for p in test} == {"int", "list", "str"}


def test_shared_functions_split_by_problem_and_never_share_one():
    train = generate_pyfunc(3000, seed=0, split="train", difficulty=1, unseen_functions=False)
    test = generate_pyfunc(300, seed=1, split="test", difficulty=1, unseen_functions=False)
    # no problem (function + hidden-test inputs, whatever the function's name) is in both splits ...
    problem = lambda p: (p["expr"], tuple(t.split("(", 1)[1] for t in p["tests"]))  # noqa: E731
    assert {problem(p) for p in train}.isdisjoint({problem(p) for p in test})
    # ... while the test functions are (mostly) functions the training split has
    assert len({p["expr"] for p in test} & {p["expr"] for p in train}) >= 0.9 * len({p["expr"] for p in test})
    task = TASK.with_options({"unseen_functions": False})
    ds = task.generate(5, seed=0)
    assert "unseen_functions=False" in ds.source and "unseen_functions" not in TASK.generate(5, seed=0).source
    with pytest.raises(ConfigError, match="pyfunc unseen_functions must be true or false"):
        TASK.with_options({"unseen_functions": "no"})


def test_the_docstring_states_the_operations_in_the_order_they_apply():
    by = {(op.src, op.template): op for op in OPS}
    fn = compose("int", [by["int", "{e}*3"], by["int", "{e}+1"]])
    assert (fn.expr, spec(fn)) == ("x*3+1", "times 3, plus 1")
    fn = compose("list", [by["list", "{e}[1:]"], by["list", "sum({e})"]])
    assert (fn.expr, spec(fn)) == ("sum(a[1:])", "after the first, sum")
    fn = compose("str", [by["str", "{e}.count('c')"], by["int", "{e}+2"]])
    assert (fn.expr, spec(fn)) == ("s.count('c')+2", "count of 'c', plus 2")
    # the words name one operation per input type, so the spec and the argument's type fix the function
    assert len({(op.src, op.words) for op in OPS}) == len(OPS)
    for p in generate_pyfunc(200, seed=3, split="train", difficulty=2):
        fn = compose(p["family"], [OPS[i] for i in p["ops"]])
        # the examples first, then the words: "g(3)==10; g(7)==22: times 3, plus 1"
        assert p["docstring"].startswith(p["name"] + "(") and p["docstring"].endswith(": " + spec(fn))


def test_test_functions_are_unseen_combinations_of_operations_training_shows():
    """At difficulty 2 every operation of a test function is in the training split, in other combinations."""
    train = generate_pyfunc(4000, seed=0, split="train", difficulty=2)
    test = generate_pyfunc(256, seed=0, split="test", difficulty=2)
    assert {i for p in test for i in p["ops"]} <= {i for p in train for i in p["ops"]}
    assert {p["expr"] for p in test}.isdisjoint({p["expr"] for p in train})


def test_equivalent_spellings_land_in_the_same_split():
    plus = {op.template: op for op in OPS if op.src == "int"}
    f1 = compose("int", [plus["{e}+2"], plus["{e}-1"]])
    f2 = compose("int", [plus["{e}+1"]])
    assert (f1.expr, f2.expr) == ("x+2-1", "x+1") and f1.signature() == f2.signature() and f1.split() == f2.split()


def test_difficulty_is_the_number_of_composed_operations_and_out_of_range_is_refused():
    for d in DIFFICULTIES:
        ps = generate_pyfunc(40, seed=0, split="train", difficulty=d)
        assert {p["difficulty"] for p in ps} == {d}
    for bad in (0, 4, -1, "1", 1.0, True, None):
        with pytest.raises(ConfigError, match="pyfunc difficulty"):
            TASK.generate(3, seed=0, difficulty=bad) if bad is not None else generate_pyfunc(3, difficulty=bad)


def test_tiny_format_lengths_and_the_tokenizer_round_trips():
    tok = build_task_tokenizer("pyfunc")
    assert len(tok) < 80
    limits = {1: (105, 23), 2: (145, 39), 3: (185, 55)}  # (prompt, answer) characters, documented in pyfunc.py
    for d, (max_prompt, max_answer) in limits.items():
        for split in ("train", "test"):
            for item in TASK.generate(300, seed=2, split=split, difficulty=d):
                prompt, answer = TASK.format_prompt(item, "plain"), TASK.format_answer(item)
                assert len(prompt) <= max_prompt and len(answer) <= max_answer
                # HumanEval's shape: the prompt ends with the signature, the answer is the body
                assert prompt.endswith(f"\ndef {item.extra['name']}({item.extra['arg']}):")
                assert answer.startswith("return ")
                assert prompt[prompt.index("\n") + 1:] + answer == item.extra["solution"]
                ids = tok(prompt + answer)["input_ids"]
                assert tok.unk_token_id not in ids and tok.decode(ids) == prompt + answer


def _spy(monkeypatch):
    calls = []
    for mod in (dare, strict):
        real = mod.run_code

        def spy(program, *a, _real=real, **k):
            calls.append(program)
            return _real(program, *a, **k)

        monkeypatch.setattr(mod, "run_code", spy)
    return calls


def test_gold_passes_its_hidden_tests_through_the_sandbox(monkeypatch):
    calls = _spy(monkeypatch)
    items = TASK.generate(4, seed=5, split="test", difficulty=1).items + TASK.generate(2, 5, "test", 3).items
    gold = [TASK.format_answer(it) for it in items]
    for grader in ("dare", "strict"):
        res = TASK.grade_many(gold, items, grader=grader)
        assert all(r.correct and r.reward == 1.0 and r.score == 1.0 for r in res), [r.details for r in res]
    assert len(calls) == 2 * len(items)  # every verdict came from a sandboxed run
    assert all(json.loads(it.ground_truth)[-1] in prog for it, prog in zip(items + items, calls))


def test_a_body_is_graded_after_the_prompts_signature_and_a_whole_function_as_it_is(monkeypatch):
    calls = _spy(monkeypatch)
    item = TASK.generate(1, seed=0, split="test")[0]
    body, whole = TASK.format_answer(item), item.extra["solution"]
    for grader in ("dare", "strict"):
        res = TASK.grade_many([body, whole, "return None"], [item] * 3, grader=grader)
        assert [r.correct for r in res] == [True, True, False], [r.details for r in res]
    # the body ran as `def name(arg):` + body, the same program text as the whole function
    assert sum(whole in prog for prog in calls) == 2 * 2 and len(calls) == 2 * 3


def test_wrong_solutions_fail():
    item = TASK.generate(1, seed=0, split="test")[0]
    name = item.extra["name"]
    wrong = [f"def {name}(x):return 0", f"def other(x):return {item.extra['expr']}", "no code here",
             f"def {name}(x):return x"]
    for grader in ("dare", "strict"):
        res = TASK.grade_many(wrong, [item] * len(wrong), grader=grader)
        assert [r.reward for r in res] == [0.0] * len(wrong) and not any(r.correct for r in res)


def test_hostile_completions_are_contained_and_score_zero(tmp_path):
    item = TASK.generate(1, seed=0, split="test")[0]
    name, target = item.extra["name"], tmp_path / "pwned"
    hostile = [
        f"import os; os.system('touch {target}')",
        f"def {name}(x):\n    import os\n    return os.system('touch {target}')",
        f"def {name}(x):\n    while True:\n        pass",
    ]
    t0 = time.monotonic()
    for grader in ("dare", "strict"):
        res = TASK.grade_many(hostile, [item] * len(hostile), grader=grader)
        assert [r.reward for r in res] == [0.0, 0.0, 0.0], [r.details for r in res]
        assert res[2].details["status"] == "timeout"
    # dare: 1 s per hidden assert + the sandbox's startup grace; strict: max(3, asserts) s
    assert time.monotonic() - t0 < 2 * (dare.STARTUP_GRACE_S + 10) + 20
    assert not target.exists()


def test_grade_many_grades_a_repeated_program_once_per_item(monkeypatch):
    """An RL group repeats completions: each distinct (program, item) reaches the sandbox once, and every
    position still gets its own verdict, in input order."""
    from dare_bench.tasks import get_task

    task = get_task("pyfunc")
    items = task.generate(2, seed=0, split="test").items
    gold = [task.format_answer(it) for it in items]
    calls = []
    real = type(task).grade

    def counting(self, completion, item, grader="dare"):
        calls.append((completion, item.index))
        return real(self, completion, item, grader)

    monkeypatch.setattr(type(task), "grade", counting)
    completions = [gold[0], "def f(x):return 0", gold[0], gold[1], gold[1], gold[0]]
    which = [items[0], items[0], items[0], items[1], items[1], items[1]]
    results = task.grade_many(completions, which, "dare")
    assert [r.correct for r in results] == [True, False, True, True, True, False]
    assert sorted(calls) == sorted({(c, it.index) for c, it in zip(completions, which)})
    assert len(calls) == 4
