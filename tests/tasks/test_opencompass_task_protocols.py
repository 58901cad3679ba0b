"""The `protocol` option of the eight OpenCompass-scored benchmarks (mmlu, mmlupro, hellaswag, arcc, gpqa, aime2024,
aime2025, olympiadbench): each OpenCompass dataset config a cell of DARE's table imports.

- every task knows exactly its configs; its default config's name is the task as it was (its items' own chat, the
  shipped verdicts of `opencompass_tasks/verdicts.jsonl` under both graders);
- the other configs (`opencompass_tasks/protocol_verdicts.jsonl`, `protocol_prompts.jsonl`, made by
  `tests/fixtures/graders/make_opencompass_task_verdicts.py` running OpenCompass 0.5.4 on DARE's fork's configs):
  our grader gives every shipped (prediction, verdict), our chat is OpenCompass's rendering turn for turn;
- `extra`: where OpenCompass imports and DARE_OPENCOMPASS names the fork's package dir, both are recomputed live.

    OMP_NUM_THREADS=1 python -m pytest tests/tasks/test_opencompass_task_protocols.py -q
"""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

from dare_bench.errors import ConfigError, DataError, NotBuiltError
from dare_bench.tasks import data, get_task
from dare_bench.tasks.base import Item, read_rows
from dare_bench.tasks.gpqa import simple_evals_options
from dare_bench.tasks.graders.opencompass_olympiad import latex_parser_available

from testpaths import DARE_DATA, FIXTURES, OPENCOMPASS_TASK_PROMPTS, OPENCOMPASS_TASK_VERDICTS, TASK_SAMPLES

CORPUS = FIXTURES / "graders" / "opencompass_tasks"
ROWS = [json.loads(x) for x in (CORPUS / "protocol_verdicts.jsonl").read_text(encoding="utf-8").splitlines()]
PROMPTS = [json.loads(x) for x in (CORPUS / "protocol_prompts.jsonl").read_text(encoding="utf-8").splitlines()]
DEFAULT_ROWS = [json.loads(x) for x in OPENCOMPASS_TASK_VERDICTS.read_text(encoding="utf-8").splitlines()]
DEFAULT_PROMPTS = [json.loads(x) for x in OPENCOMPASS_TASK_PROMPTS.read_text(encoding="utf-8").splitlines()]

#: task -> (its default config, the others): the full OpenCompass config names DARE's table cells import
KNOWN = {
    "mmlu": ("mmlu_gen_a484b3", {"mmlu_gen_4d595a", "mmlu_openai_simple_evals_gen_b618ea"}),
    "mmlupro": ("mmlu_pro_0shot_cot_gen_08c1de", {"mmlu_pro_few_shot_gen_bfaf90"}),
    "hellaswag": ("hellaswag_gen_6faab5", {"hellaswag_10shot_gen_e42710"}),
    "arcc": ("ARC_c_gen_1e0de5", set()),
    "gpqa": ("gpqa_fewshot_gen", {"gpqa_openai_simple_evals_gen_5aeece"}),
    "aime2024": ("aime2024_gen_repeat8_6e39a4", {"aime2024_gen_17d799"}),
    "aime2025": ("aime2025_gen_repeat8_5e9f4f", set()),
    "olympiadbench": ("OlympiadBench_0shot_gen_be8b13", set()),
}
#: the few-shot configs: their shots' sample (MMLU-Pro's validation rows, OpenCompass's hellaswag_train_sampled25.jsonl)
SHOTS = {"mmlu_pro_few_shot_gen_bfaf90": "mmlupro/validation.jsonl",
         "hellaswag_10shot_gen_e42710": "hellaswag/hellaswag_train_sampled25.jsonl"}
RAW = {"mmlupro": "mmlupro/test.jsonl", "hellaswag": "hellaswag/validation.jsonl", "arcc": "arcc/validation.jsonl",
       "gpqa": "gpqa/gpqa_diamond.jsonl", "olympiadbench": "olympiadbench/test.jsonl"}


@pytest.fixture(autouse=True)
def _no_data(monkeypatch):
    monkeypatch.delenv("DARE_BENCH_DATA", raising=False)


def samples(name: str, monkeypatch, protocol: str | None = None) -> list[Item]:
    """The task's local sample items, converted as `dare-bench data get` converts the public data (with the shots
    of a few-shot `protocol`, as `--hf` / `--from DIR` store them)."""
    task = get_task(name)
    if protocol in SHOTS:
        f = data.select([name])[0][0]
        rows = data.convert_rows(f, read_rows(TASK_SAMPLES / RAW[name]), "sample",
                                 fewshot_rows=read_rows(TASK_SAMPLES / SHOTS[protocol]))
        return list(task.rows_to_items(rows, "test", "sample"))
    if name == "mmlu":
        f = data.select(["mmlu"])[0][0]
        rows = data.convert_rows(f, read_rows(TASK_SAMPLES / "mmlu" / "test.jsonl"), "sample",
                                 fewshot_rows=read_rows(TASK_SAMPLES / "mmlu" / "dev.jsonl"))
        return list(task.rows_to_items(rows, "test", "sample"))
    if name.startswith("aime"):
        monkeypatch.setenv("DARE_BENCH_DATA", str(DARE_DATA))
        return list(task.load())
    return list(task.rows_to_items(read_rows(TASK_SAMPLES / RAW[name]), "test", RAW[name]))


def corpus_item(name: str, gold: str) -> Item:
    letters = getattr(get_task(name), "letters", "")
    extra = {"options": [[x, f"option {x}"] for x in letters]} if letters else {}
    return Item(0, [{"role": "user", "content": "q"}], gold, {"index": 0, **extra})


def needs_latex_parser(name: str) -> None:
    if name == "olympiadbench" and not latex_parser_available():
        pytest.skip("sympy's LaTeX parser is unavailable (needs antlr4-python3-runtime==4.11.0)")


# ---------------------------------------------------------------------------------------------------- the names
def test_every_task_knows_exactly_its_configs():
    for name, (default, others) in KNOWN.items():
        task = get_task(name)
        assert task.default_protocol == default and set(task.protocols) == {default} | others
        assert all(spec.name == key and spec.source.endswith(f"/{key}.py") for key, spec in task.protocols.items())


def test_every_other_config_has_a_corpus_and_prompts():
    others = {(name, p) for name, (_, rest) in KNOWN.items() for p in rest}
    assert {(r["task"], r["protocol"]) for r in ROWS} == others
    assert {(r["task"], r["protocol"]) for r in PROMPTS} == others
    for name, protocol in others:
        verdicts = [r["correct"] for r in ROWS if r["protocol"] == protocol]
        assert len(verdicts) >= 20 and set(verdicts) == {True, False}, protocol


def test_unknown_config_is_one_config_error_listing_the_known():
    # "mmlu_gen" is only an alias file (it imports the simple-evals config): a cell names the config itself
    with pytest.raises(ConfigError, match="mmlu_gen_4d595a, mmlu_gen_a484b3, mmlu_openai_simple_evals_gen_b618ea$"):
        get_task("mmlu").with_options({"protocol": "mmlu_gen"})
    with pytest.raises(ConfigError, match="no OpenCompass protocol 'hellaswag_10shot_gen'"):
        get_task("hellaswag").with_options({"protocol": "hellaswag_10shot_gen"})


def test_no_protocol_is_the_task_as_it_was():
    for name in KNOWN:
        task = get_task(name)
        assert task.protocol is None and task.graders == ["dare", "opencompass"]
        assert task.with_options(None) is task and task.with_options({}) is task
    configured = get_task("gpqa").with_options({"protocol": "gpqa_openai_simple_evals_gen_5aeece"})
    assert configured.graders == ["dare", "opencompass"] and get_task("gpqa").protocol is None


# ---------------------------------------------------------------------------------------------------- defaults
@pytest.mark.parametrize("name", sorted(KNOWN))
def test_default_config_name_reproduces_the_shipped_verdicts(name):
    needs_latex_parser(name)
    task = get_task(name).with_options({"protocol": KNOWN[name][0]})
    rows = [r for r in DEFAULT_ROWS if r["task"] == name]
    assert rows
    for grader in ("dare", "opencompass"):
        got = [(lambda res: (res.extracted, res.correct))(task.grade(r["completion"], corpus_item(name, r["gold"]),
                                                                    grader)) for r in rows]
        assert got == [(r["pred"], r["correct"]) for r in rows], grader


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_default_config_name_sends_the_items_own_chat(name, monkeypatch):
    needs_latex_parser(name)
    task = get_task(name).with_options({"protocol": KNOWN[name][0]})
    items = samples(name, monkeypatch)
    assert items and [task.messages(it) for it in items] == [it.prompt_messages for it in items]
    shipped = [r["messages"] for r in DEFAULT_PROMPTS if r["task"] == name]
    assert sorted(map(json.dumps, shipped)) == sorted(json.dumps(it.prompt_messages) for it in items)


# ---------------------------------------------------------------------------------------------------- the others
def answer_string(item: Item) -> str:
    """MMLUProDataset's answer_string of an item: what MMLUProBaseEvaluator scores against."""
    return f"{item.ground_truth}. {dict(item.extra['options'])[item.ground_truth]}\n"


def _variant_item(row, monkeypatch) -> Item:
    if row["protocol"] == "mmlu_pro_few_shot_gen_bfaf90":  # the gold is an answer_string "<letter>. <text>\n"
        letter, text = row["gold"][0], row["gold"][3:-1]
        options = [[x, text if x == letter else f"option {x}"] for x in "ABCDEFGHIJ"]
        item = Item(0, [{"role": "user", "content": "q"}], letter, {"index": 0, "options": options})
        assert answer_string(item) == row["gold"]
        return item
    if row["protocol"] != "gpqa_openai_simple_evals_gen_5aeece":
        return corpus_item(row["task"], row["gold"])
    # GPQADataset's gold comes from the row's place in the file: a sample item whose rotated gold is the row's
    return next(it for it in samples("gpqa", monkeypatch) if simple_evals_options(it)[1] == row["gold"])


@pytest.mark.parametrize("row", ROWS, ids=[f"{r['protocol']}-{i}" for i, r in enumerate(ROWS)])
def test_other_config_reproduces_opencompass_verdict(row, monkeypatch):
    task = get_task(row["task"]).with_options({"protocol": row["protocol"]})
    item = _variant_item(row, monkeypatch)
    for grader in ("dare", "opencompass"):
        res = task.grade(row["completion"], item, grader)
        assert (res.extracted, res.correct) == (row["pred"], row["correct"]), (grader, res.details)


@pytest.mark.parametrize("protocol", sorted({r["protocol"] for r in PROMPTS}))
def test_other_config_chat_is_opencompass_rendering(protocol, monkeypatch):
    name = next(r["task"] for r in PROMPTS if r["protocol"] == protocol)
    task = get_task(name).with_options({"protocol": protocol})
    want = {r["key"]: (r["messages"], r["gold"]) for r in PROMPTS if r["protocol"] == protocol}
    got, seen = {}, {}
    for item in samples(name, monkeypatch, protocol):
        if name in ("mmlu", "mmlupro"):  # OpenCompass's one dataset per subject / category
            group = item.extra["subject" if name == "mmlu" else "category"]
            key, seen[group] = f"{group}:{seen.get(group, 0)}", seen.get(group, 0) + 1
        else:
            key = str(len(got))
        gold = simple_evals_options(item)[1] if name == "gpqa" else \
            answer_string(item) if name == "mmlupro" else item.ground_truth
        got[key] = (task.messages(item), gold)
        assert task.grade(task.format_answer(item), item).correct
        assert not task.grade("I am not sure.", item).correct
    assert want and got == want


def test_gpqa_simple_evals_refuses_items_not_in_file_order(monkeypatch):
    task = get_task("gpqa").with_options({"protocol": "gpqa_openai_simple_evals_gen_5aeece"})
    first, second = samples("gpqa", monkeypatch)[:2]
    moved = Item(first.index, first.prompt_messages, first.ground_truth, {**first.extra, "index": 1})
    with pytest.raises(DataError, match="not GPQADataset_'s shuffle of row 1"):
        task.messages(moved)
    assert task.messages(second)  # the same item at its own place is fine


@pytest.mark.parametrize("name,protocol,command", [
    ("mmlupro", "mmlu_pro_few_shot_gen_bfaf90", "`dare-bench data get mmlupro --hf`"),
    ("hellaswag", "hellaswag_10shot_gen_e42710",
     "`dare-bench data get hellaswag --from DIR`.*hellaswag_train_sampled25"),
])
def test_few_shot_config_without_shots_is_one_not_built_error(name, protocol, command, monkeypatch):
    """Items written without the shots (`--hf` for hellaswag, a raw file): the protocol names what writes them."""
    task = get_task(name).with_options({"protocol": protocol})
    item = samples(name, monkeypatch)[0]
    with pytest.raises(NotBuiltError, match=f"{protocol} is not available for {name} item 0: .*{command}"):
        task.messages(item)
    assert task.grade(task.format_answer(item), item).correct  # grading needs no shots


@pytest.mark.parametrize("name,protocol", [("mmlupro", "mmlu_pro_few_shot_gen_bfaf90"),
                                           ("hellaswag", "hellaswag_10shot_gen_e42710")])
def test_few_shot_items_keep_the_default_prompt(name, protocol, monkeypatch):
    """The shots live in extra_info: the default config's chat is byte for byte what it was."""
    with_shots, without = samples(name, monkeypatch, protocol), samples(name, monkeypatch)
    assert [it.prompt_messages for it in with_shots] == [it.prompt_messages for it in without]
    assert all(it.extra["fewshot"] for it in with_shots) and not any("fewshot" in it.extra for it in without)
    shipped = [r["messages"] for r in DEFAULT_PROMPTS if r["task"] == name]
    assert sorted(map(json.dumps, shipped)) == sorted(json.dumps(it.prompt_messages) for it in with_shots)


def test_mmlupro_few_shot_takes_each_categorys_first_five_validation_rows(monkeypatch):
    items = samples("mmlupro", monkeypatch, "mmlu_pro_few_shot_gen_bfaf90")
    math = next(it for it in items if it.extra["category"] == "math")
    assert [s["question"] for s in math.extra["fewshot"]][-1] == "What is the area of a 3 by 5 rectangle?"
    assert len(math.extra["fewshot"]) == 5  # the sixth math row is not a shot
    f = data.select(["mmlupro"])[0][0]
    short = [r for r in read_rows(TASK_SAMPLES / "mmlupro/validation.jsonl") if r["category"] != "chemistry"]
    with pytest.raises(DataError, match="category 'chemistry' has 0 validation questions, the few-shot config needs 5"):
        data.convert_rows(f, read_rows(TASK_SAMPLES / "mmlupro/test.jsonl"), "sample", fewshot_rows=short)


def test_mmlu_other_config_refuses_a_foreign_prompt():
    task = get_task("mmlu").with_options({"protocol": "mmlu_gen_4d595a"})
    item = Item(0, [{"role": "user", "content": "Which?"}], "A",
                {"index": 0, "subject": "anatomy", "options": [["A", "x"], ["B", "y"], ["C", "z"], ["D", "w"]]})
    with pytest.raises(DataError, match="not the task's default config's"):
        task.messages(item)


# ---------------------------------------------------------------------------------------------------- live
def _generator():
    path = FIXTURES / "graders" / "make_opencompass_task_verdicts.py"
    spec = importlib.util.spec_from_file_location("make_opencompass_task_verdicts", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.extra
def test_live_opencompass_gives_the_shipped_protocol_corpus():
    """In OpenCompass's venv with DARE_OPENCOMPASS = DARE's fork's opencompass/opencompass (its configs):
    the configs' own postprocessors + evaluators give the shipped verdicts, their templates the shipped chats."""
    pytest.importorskip("opencompass")
    fork = os.environ.get("DARE_OPENCOMPASS")
    if not fork:
        pytest.skip("set DARE_OPENCOMPASS to DARE's fork (its dataset configs)")
    gen = _generator()
    assert [(r["task"], r["protocol"], r["gold"], r["completion"]) for r in ROWS] == gen.VARIANT_CASES
    live = gen.live_protocol_verdicts(gen.VARIANT_CASES, fork)
    assert live == [{"pred": r["pred"], "correct": r["correct"]} for r in ROWS]
    assert gen.render_protocol_prompts(fork) == PROMPTS
