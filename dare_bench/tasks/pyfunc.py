"""pyfunc (dare-bench's own, CPU scale): write a one-line Python function from its docstring (a spec and examples).

A procedural code task for tiny replicas, graded like MBPP: the completion is run with hidden ``assert`` tests
through ``dare_bench.sandbox`` (via the MBPP graders, imported, not copied), so code rewards at tiny scale take the
same sandboxed path as DARE's code RL. No official recipe exists (no ``paper`` scale data; no reproduction YAMLs).

Problems: a function ``f`` (name drawn from f / g / h) of one argument — ``x`` an int, ``a`` a list of ints or ``s``
a string — composed of ``difficulty`` operations (1..3), e.g. ``x*3+1``, ``sum(a[1:])``, ``len(a[::-1]*2)``,
``s.count('a')+2``. The docstring gives two input/output examples with different outputs, then says what the
function does, as a real one does — the operations' words in the order they apply (``Op.words``: "times 3, plus 1",
"after the first, sum", "count of 'a', plus 2"). Hidden tests: four asserts on other inputs. Gold:
``def f(x):return <expr>``.

Splits never share a problem. By default (``unseen_functions=True``) they never share a *function*: a function's
behaviour (its outputs on fixed probe inputs) is hashed into 4 buckets; bucket 0 is ``test``, the rest ``train``,
whatever the seed — so two spellings of one function (``x+2-1``, ``x+1``) land in the same split, and so does one code
text (the argument's name differs by input type). Within a split a function may repeat (with other examples / name):
at difficulty 1 there are 84 non-trivial functions, 21 of them in ``test``. A test function is an unseen combination
of operations and constants that training does show, so the task is compositional translation of the spec into
code (the examples fix the argument's type); from two examples alone (the docstring before the spec was added),
writing an unseen function is program induction, out of a tiny replica's reach (0 of 256 at every SFT step
scanned). ``unseen_functions=False`` splits by *problem* instead — the hash of (behaviour, example and hidden-test
inputs) — so the test asks for known functions on new inputs.

Graders: ``dare`` (DARE's MBPP harness: code extraction, its import preamble, asserts appended, 1 s per assert) and
``strict`` (the named function must be defined; asserts only). Reward = pass/fail as in DARE's code reward: 1.0 iff
every hidden assert passes, else 0.0 (no partial credit; ``score`` = ``reward``). d1 has no code grader.

Tiny format (lengths checked in tests/tasks/test_pyfunc.py), HumanEval's shape: the prompt is the docstring, then
the signature; the answer is the body that follows it::

    task = get_task("pyfunc"); ds = task.generate(4, seed=0)            # difficulty=1 (default), 2 or 3
    task.format_prompt(ds[0])      # "g('cabd')==1; g('cdbcb')==2: count of 'c'\\ndef g(s):"  (<= 105 / 145 / 185 chars)
    task.format_answer(ds[0])      # "return s.count('c')"   (<= 23 / 39 / 55 characters)

(limits at difficulty 1 / 2 / 3; answers are one line, no trailing newline.) A completion that defines no
``name(...)`` is read as the body of the prompt's signature, as HumanEval's harness runs prompt + completion: the
graders run ``def g(s):`` + completion. Why the signature sits in the prompt, and the spec right before it: with
the whole ``def`` as the answer the LLaDA replica plateaued near 7-10 % pass@1, and with the spec first it copied
the constants slowly (calibration scans: _defaults/tasks/pyfunc.yaml). The chat prompt for
real checkpoints asks for the whole function "that satisfies this docstring" and shows the docstring in triple
quotes; a completion that defines the function is graded as it is.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass
from typing import Any, Callable

from dare_bench.errors import ConfigError, DataError
from dare_bench.tasks.base import GraderFn, Item, Task, TaskDataset, sha256_items
from dare_bench.tasks.graders import dare, strict

DIFFICULTIES = (1, 2, 3)
NAMES = ("f", "g", "h")
N_EXAMPLES = 2
N_HIDDEN = 4
TEST_BUCKETS = 4  # 1 of every TEST_BUCKETS behaviours is a test problem
LETTERS = "abcde"

PROMPT = ("Write a Python function {name}({arg}) that satisfies this docstring:\n\"\"\"{doc}\"\"\"\n"
          "Reply with the code only.")


def literal(v: Any) -> str:
    """Compact Python literal (no spaces in lists) — the tiny format's rendering of inputs and outputs."""
    if isinstance(v, list):
        return "[" + ",".join(literal(x) for x in v) + "]"
    return repr(v)


# ---------------------------------------------------------------------------------------------- operations


@dataclass(frozen=True)
class Op:
    """One operation: ``template`` over ``{e}`` (the operand expression), which needs precedence >= ``needs``
    (else it is parenthesised); the result has precedence ``prec`` (1: + -, 2: * // %, 3: atom / call / postfix)."""

    template: str
    src: str  # operand type: int | list | str
    dst: str
    needs: int
    prec: int
    fn: Callable[[Any], Any]
    words: str  # the docstring's name for it ("times 3", "count of 'c'")


def _ops() -> list[Op]:
    ops: list[Op] = []
    for k in range(1, 10):
        ops.append(Op(f"{{e}}+{k}", "int", "int", 1, 1, lambda v, k=k: v + k, f"plus {k}"))
        ops.append(Op(f"{{e}}-{k}", "int", "int", 1, 1, lambda v, k=k: v - k, f"minus {k}"))
    for k in range(2, 10):
        ops.append(Op(f"{{e}}*{k}", "int", "int", 2, 2, lambda v, k=k: v * k, f"times {k}"))
        ops.append(Op(f"{{e}}%{k}", "int", "int", 2, 2, lambda v, k=k: v % k, f"mod {k}"))
    for k in range(2, 6):
        ops.append(Op(f"{{e}}//{k}", "int", "int", 2, 2, lambda v, k=k: v // k, f"div {k}"))
    ops += [
        Op("{e}[::-1]", "list", "list", 3, 3, lambda v: v[::-1], "reversed"),
        Op("sorted({e})", "list", "list", 0, 3, sorted, "sorted"),
        Op("{e}[1:]", "list", "list", 3, 3, lambda v: v[1:], "after the first"),
        Op("{e}*2", "list", "list", 2, 2, lambda v: v * 2, "twice"),
        Op("sum({e})", "list", "int", 0, 3, sum, "sum"),
        Op("max({e})", "list", "int", 0, 3, max, "max"),
        Op("min({e})", "list", "int", 0, 3, min, "min"),
        Op("len({e})", "list", "int", 0, 3, len, "length"),
    ]
    for k in range(1, 10):
        ops.append(Op(f"[v+{k} for v in {{e}}]", "list", "list", 0, 3, lambda v, k=k: [a + k for a in v],
                      f"each plus {k}"))
    for k in range(2, 10):
        ops.append(Op(f"[v*{k} for v in {{e}}]", "list", "list", 0, 3, lambda v, k=k: [a * k for a in v],
                      f"each times {k}"))
    ops += [
        Op("{e}[::-1]", "str", "str", 3, 3, lambda v: v[::-1], "reversed"),
        Op("{e}*2", "str", "str", 2, 2, lambda v: v * 2, "twice"),
        Op("{e}[1:]", "str", "str", 3, 3, lambda v: v[1:], "after the first"),
        Op("{e}[:-1]", "str", "str", 3, 3, lambda v: v[:-1], "before the last"),
        Op("{e}[::2]", "str", "str", 3, 3, lambda v: v[::2], "every other"),
        Op("len({e})", "str", "int", 0, 3, len, "length"),
    ]
    for c in LETTERS:
        ops.append(Op(f"{{e}}+'{c}'", "str", "str", 1, 1, lambda v, c=c: v + c, f"append '{c}'"))
        ops.append(Op(f"'{c}'+{{e}}", "str", "str", 2, 1, lambda v, c=c: c + v, f"prepend '{c}'"))
        ops.append(Op(f"{{e}}.count('{c}')", "str", "int", 3, 3, lambda v, c=c: v.count(c), f"count of '{c}'"))
    return ops


OPS = _ops()
FAMILIES = ("int", "list", "str")
#: the argument's name per input type: it keeps one code text from meaning different functions in different families
#: (``x*2`` on ints, ``a*2`` on lists, ``s*2`` on strings), so problems that share a code text share a behaviour
VARS = {"int": "x", "list": "a", "str": "s"}

# fixed probe inputs: a function's outputs on them are its identity for the train / test split
_PROBES: dict[str, list[Any]] = {
    "int": list(range(-6, 21)),
    "list": [[3, 1, 2], [0, 5, 5, 1], [9, 2, 7, 4, 4], [1, 1, 1], [6, 0, 8, 3], [2, 9, 4, 0, 7, 1], [5, 4, 3],
             [0, 0, 7, 2, 2]],
    "str": ["abc", "aab", "edcba", "bbbb", "cadeb", "aeaea", "dcd", "abcdea", "eee", "bad"],
}


def _draw_input(rng: random.Random, family: str) -> Any:
    if family == "int":
        return rng.randint(0, 19)
    if family == "list":
        return [rng.randint(0, 9) for _ in range(rng.randint(3, 5))]
    return "".join(rng.choice(LETTERS) for _ in range(rng.randint(3, 5)))


def _draw_inputs(rng: random.Random, fn: "Function") -> list[Any] | None:
    """Distinct inputs, the first ``N_EXAMPLES`` with distinct outputs (``count('c')`` shown as 0 twice says
    nothing); None when a few draws do not manage it."""
    for _ in range(20):
        inputs: list[Any] = []
        while len(inputs) < N_EXAMPLES + N_HIDDEN:
            x = _draw_input(rng, fn.family)
            if x not in inputs:
                inputs.append(x)
        if len({json.dumps(fn(x)) for x in inputs[:N_EXAMPLES]}) == N_EXAMPLES:
            return inputs
    return None


@dataclass(frozen=True)
class Function:
    family: str
    expr: str
    ops: tuple[Op, ...]

    def __call__(self, x: Any) -> Any:
        for op in self.ops:
            x = op.fn(x)
        return x

    def signature(self) -> str:
        return json.dumps([self.family, [self(p) for p in _PROBES[self.family]]])

    def split(self) -> str:
        h = int(hashlib.sha256(self.signature().encode()).hexdigest()[:12], 16)
        return "test" if h % TEST_BUCKETS == 0 else "train"

    def trivial(self) -> bool:
        """Constant on the probes, or the identity."""
        outs = [self(p) for p in _PROBES[self.family]]
        return len({json.dumps(o) for o in outs}) == 1 or outs == _PROBES[self.family]


def spec(fn: Function) -> str:
    """The docstring's verbal spec: the operations' words in the order they apply ("times 3, plus 1")."""
    return ", ".join(op.words for op in fn.ops)


def compose(family: str, ops: list[Op]) -> Function:
    expr, prec, typ = VARS[family], 3, family
    for op in ops:
        if op.src != typ:
            raise ValueError(f"{op.template} takes {op.src}, got {typ}")
        operand = expr if prec >= op.needs else f"({expr})"
        expr, prec, typ = op.template.replace("{e}", operand), op.prec, op.dst
    return Function(family, expr, tuple(ops))


def random_function(rng: random.Random, difficulty: int) -> Function:
    family = rng.choice(FAMILIES)
    ops, typ = [], family
    for _ in range(difficulty):
        op = rng.choice([o for o in OPS if o.src == typ])
        ops.append(op)
        typ = op.dst
    return compose(family, ops)


def check_difficulty(difficulty: Any) -> int:
    if isinstance(difficulty, bool) or not isinstance(difficulty, int) or difficulty not in DIFFICULTIES:
        raise ConfigError(f"pyfunc difficulty (number of composed operations) must be one of "
                          f"{', '.join(map(str, DIFFICULTIES))}, got {difficulty!r}")
    return difficulty


def check_unseen_functions(unseen_functions: Any) -> bool:
    if not isinstance(unseen_functions, bool):
        raise ConfigError(f"pyfunc unseen_functions must be true or false, got {unseen_functions!r}")
    return unseen_functions


def problem_split(fn: Function, inputs: list[Any]) -> str:
    """The split of one problem when functions may be shared: a pure function of its behaviour and inputs."""
    key = json.dumps([fn.signature(), inputs])
    return "test" if int(hashlib.sha256(key.encode()).hexdigest()[:12], 16) % TEST_BUCKETS == 0 else "train"


def generate_pyfunc(n: int, seed: int = 0, split: str = "test", difficulty: int = 1,
                    unseen_functions: bool = True) -> list[dict[str, Any]]:
    """``n`` problems of ``split``: dicts with name, docstring, tests (assert strings), solution, expr, family,
    difficulty and ops (indices into ``OPS``: ``compose(family, [OPS[i] for i in ops])`` rebuilds the function).
    ``unseen_functions``: the splits share no function (default), else they share no problem (module docstring)."""
    check_difficulty(difficulty)
    check_unseen_functions(unseen_functions)
    if split not in ("train", "test"):
        raise ConfigError(f"unknown split {split!r}; use train or test")
    rng = random.Random(f"pyfunc:{seed}:{split}:{difficulty}")
    out: list[dict[str, Any]] = []
    attempts = 0
    while len(out) < n:
        attempts += 1
        if attempts > 100 * n + 1000:
            raise DataError(f"cannot draw {n} pyfunc {split} problems at difficulty {difficulty}")
        fn = random_function(rng, difficulty)
        if fn.trivial() or (unseen_functions and fn.split() != split):
            continue
        inputs = _draw_inputs(rng, fn)
        if inputs is None or (not unseen_functions and problem_split(fn, inputs) != split):
            continue
        name = rng.choice(NAMES)
        calls = [(f"{name}({literal(x)})", literal(fn(x))) for x in inputs]
        # the examples, then the spec: the spec's constants end up a fixed distance before the body that copies
        # them (the tiny format puts the signature after the docstring), which the replica learns to copy sooner
        doc = "; ".join(f"{c}=={r}" for c, r in calls[:N_EXAMPLES]) + ": " + spec(fn)
        out.append({"name": name, "arg": VARS[fn.family], "docstring": doc,
                    "tests": [f"assert {c}=={r}" for c, r in calls[N_EXAMPLES:]],
                    "solution": f"def {name}({VARS[fn.family]}):return {fn.expr}", "expr": fn.expr, "family": fn.family,
                    "difficulty": difficulty, "ops": [OPS.index(op) for op in fn.ops]})
    return out


# ---------------------------------------------------------------------------------------------- the task


def signature(item: Item) -> str:
    """The function's first line, which the tiny prompt ends with: ``def g(s):``."""
    return f"def {item.extra['name']}({item.extra.get('arg', 'x')}):"


def as_program(text: str, item: Item) -> str:
    """The completion as the graders read it: a completion that defines no ``name(...)`` is the body of the prompt's
    signature (the tiny format; HumanEval's harness likewise runs prompt + completion), one that does stands alone."""
    if re.search(rf"\bdef\s+{re.escape(item.extra['name'])}\s*\(", text):
        return text
    return signature(item) + text


def _grade_dare(text: str, item: Item):
    return dare.grade_code(as_program(text, item), item, "mbpp")


def _grade_strict(text: str, item: Item):
    return strict.grade_mbpp(as_program(text, item), item)


class PyFuncTask(Task):
    name = "pyfunc"
    kind = "code"
    scales = ("tiny", "micro")
    parallel_grading = True
    has_generator = True
    hf_hint = "<none: procedural (dare-bench)>"
    #: default number of composed operations for ``generate`` / ``load``; a reproduction sets it with `task_options`
    difficulty = 1
    unseen_functions = True
    option_defaults = {"difficulty": 1, "unseen_functions": True}

    def check_options(self, options: dict[str, Any]) -> None:
        check_difficulty(options["difficulty"])
        check_unseen_functions(options["unseen_functions"])

    def build_graders(self) -> dict[str, GraderFn]:
        return {"dare": _grade_dare, "strict": _grade_strict}

    def default_generated_size(self, split: str) -> int:
        return 256 if split == "test" else 20000

    def make_item(self, index: int, problem: dict[str, Any], split: str) -> Item:
        name, doc = str(problem["name"]), str(problem["docstring"])
        extra: dict[str, Any] = {"index": index, "split": split, "task": "code", "data_source": "pyfunc",
                                 "name": name, "docstring": doc}
        for key in ("arg", "solution", "expr", "family", "difficulty"):
            if key in problem:
                extra[key] = problem[key]
        messages = [{"role": "user", "content": PROMPT.format(name=name, arg=problem.get("arg", "x"), doc=doc)}]
        return Item(index, messages, json.dumps([str(t) for t in problem["tests"]]), extra)

    def row_to_item(self, row: dict[str, Any], index: int, split: str) -> Item:
        if not {"name", "docstring", "tests"} <= set(row):
            raise DataError(f"pyfunc rows need name, docstring and tests, got {sorted(row)}")
        item = self.make_item(index, row, split)
        self.check_item(item)
        return item

    def check_item(self, item: Item) -> None:
        try:
            tests = json.loads(item.ground_truth)
        except ValueError as e:
            raise DataError(f"pyfunc item {item.index}: ground truth is not a JSON list of asserts") from e
        if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
            raise DataError(f"pyfunc item {item.index}: ground truth is not a non-empty JSON list of asserts")
        if "docstring" not in item.extra:
            raise DataError(f"pyfunc item {item.index}: needs extra_info.docstring")

    def generate(self, n: int, seed: int = 0, split: str = "test", difficulty: int | None = None,
                 unseen_functions: bool | None = None) -> TaskDataset:
        difficulty = check_difficulty(self.difficulty if difficulty is None else difficulty)
        unseen = self.unseen_functions if unseen_functions is None else check_unseen_functions(unseen_functions)
        problems = generate_pyfunc(n, seed=seed, split=split, difficulty=difficulty, unseen_functions=unseen)
        items = [self.make_item(i, p, split) for i, p in enumerate(problems)]
        # named only when not the default, so the default datasets keep their sources
        shared = "" if unseen else ",unseen_functions=False"
        source = f"generator:pyfunc(seed={seed},n={n},difficulty={difficulty}{shared})"
        return TaskDataset(self.name, split, items, source=source, fingerprint=sha256_items(items))

    def plain_prompt(self, item: Item) -> str:
        return f"{item.extra['docstring']}\n{signature(item)}"

    def format_answer(self, item: Item, grader: str | None = None) -> str:
        """The gold body after the prompt's signature (``return s.count('c')``)."""
        solution, head = str(item.extra.get("solution") or ""), signature(item)
        if not solution.startswith(head):
            raise DataError(f"pyfunc item {item.index} has no gold solution that starts with {head!r}")
        return solution[len(head):]
