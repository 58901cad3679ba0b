"""The eight benchmarks DARE scores through OpenCompass: local samples load in each source's real schema, prompts are
the OpenCompass configs' text, gold completions grade right, and bad input is one DataError.

Samples: tests/fixtures/data/<task>/ (hand-written rows in the public data's schema; AIME: DARE's real parquet).

    OMP_NUM_THREADS=1 python -m pytest tests/tasks/test_eval_tasks.py -q
"""

import json

import pytest
from typer.testing import CliRunner

from dare_bench.errors import DataError
from dare_bench.tasks import data, get_task
from dare_bench.tasks.base import read_rows
from dare_bench.tasks.graders.opencompass_olympiad import latex_parser_available

from testpaths import DARE_DATA, OPENCOMPASS_TASK_PROMPTS, TASK_SAMPLES

EVAL_TASKS = ["mmlu", "mmlupro", "hellaswag", "arcc", "gpqa", "aime2024", "aime2025", "olympiadbench"]
RAW = {"mmlupro": "mmlupro/test.jsonl", "hellaswag": "hellaswag/validation.jsonl", "arcc": "arcc/validation.jsonl",
       "gpqa": "gpqa/gpqa_diamond.jsonl", "olympiadbench": "olympiadbench/test.jsonl"}


@pytest.fixture(autouse=True)
def _no_data(monkeypatch):
    monkeypatch.delenv("DARE_BENCH_DATA", raising=False)


def mmlu_parquet(tmp_path):
    """The sample converted as `dare-bench data get mmlu --hf` converts cais/mmlu, under a DARE-layout root."""
    f = data.select(["mmlu"])[0][0]
    rows = data.convert_rows(f, read_rows(TASK_SAMPLES / "mmlu" / "test.jsonl"), "sample",
                             fewshot_rows=read_rows(TASK_SAMPLES / "mmlu" / "dev.jsonl"))
    path = tmp_path / f.path
    path.parent.mkdir(parents=True)
    path.write_bytes(data.rows_to_parquet(rows))
    return path


def load(name, tmp_path, monkeypatch):
    if name == "olympiadbench" and not latex_parser_available():  # its load insists on the judge's parser
        return get_task(name).rows_to_items(read_rows(TASK_SAMPLES / RAW[name]), "test", RAW[name])
    if name == "mmlu":
        monkeypatch.setenv("DARE_BENCH_DATA", str(mmlu_parquet(tmp_path).parents[2]))
        return get_task(name).load()
    if name.startswith("aime"):
        monkeypatch.setenv("DARE_BENCH_DATA", str(DARE_DATA))
        return get_task(name).load()
    return get_task(name).load(source=TASK_SAMPLES / RAW[name])


def test_registered_and_evaluation_only():
    for name in EVAL_TASKS:
        task = get_task(name)
        assert task.scales == ("paper",) and list(task.dare_files) == ["test"]
        assert task.graders == ["dare", "opencompass"]


@pytest.mark.parametrize("name", EVAL_TASKS)
def test_sample_loads_and_its_gold_grades_right(name, tmp_path, monkeypatch):
    if name == "olympiadbench":
        needs_latex_parser()
    task = get_task(name)
    ds = load(name, tmp_path, monkeypatch)
    assert len(ds) >= 2 and len(ds.fingerprint) == 64
    for item in ds:
        assert item.prompt_messages[-1]["role"] == "user"
        assert task.format_prompt(item, "plain") == item.prompt_messages[-1]["content"]
        assert task.grade(task.format_answer(item), item).correct
        assert not task.grade("I am not sure.", item).correct


def test_mmlu_prompt_is_five_shot_chat(tmp_path, monkeypatch):
    item = load("mmlu", tmp_path, monkeypatch)[0]
    msgs = item.prompt_messages
    assert [m["role"] for m in msgs] == ["user", "assistant"] * 5 + ["user"]
    hint = "There is a single choice question about abstract algebra. Answer the question by replying A, B, C or D."
    assert msgs[0]["content"] == (f"{hint}\nQuestion: Find the order of the element 2 in Z_5 under addition.\n"
                                  "A. 1\nB. 2\nC. 5\nD. 10\nAnswer: ")
    assert msgs[1]["content"] == "C\n"
    assert msgs[-1]["content"] == (f"{hint}\nQ: Find all c in Z_3 such that Z_3[x]/(x^2 + c) is a field.\n"
                                   "A. 0\nB. 1\nC. 2\nD. 3\nA: ")
    assert item.ground_truth == "B" and item.extra["subject"] == "abstract_algebra"


def test_choice_sources(tmp_path, monkeypatch):
    pro = load("mmlupro", tmp_path, monkeypatch)[0]  # an "N/A" option is dropped with its letter
    assert [x for x, _ in pro.extra["options"]] == list("ABCEFGHIJ")
    assert "Options:\n\nA. encourage safe behaviour\nB. cause unnecessary offence\nC. be truthful\nE. be legal" \
        in pro.prompt_messages[0]["content"]
    swag = load("hellaswag", tmp_path, monkeypatch)
    assert swag[0].prompt_messages[0]["content"] == (
        "A man is sitting on a roof. He\nQuestion: Which ending makes the most sense?\nA. is using wrap to wrap a "
        "pair of skis.\nB. is ripping level tiles off.\nC. is holding a rubik's cube.\nD. starts pulling up roofing "
        "on a roof.\nYou may choose from 'A', 'B', 'C', 'D'.\nAnswer:")
    # lm-evaluation-harness's preprocessing: " [title]" -> ". ", tags dropped after the strip (a leading space stays)
    assert swag[2].prompt_messages[0]["content"].startswith("How to grow tomatoes. Pick a sunny spot.\nQuestion:")
    assert swag[2].extra["options"][0][1] == " Tomatoes need at least six hours of sun."
    arc = load("arcc", tmp_path, monkeypatch)  # the five-choice question is dropped, as ARCDataset does
    assert [it.extra["id"] for it in arc] == ["Mercury_7175875", "NYSEDREGENTS_2015_8_11"]
    assert [it.ground_truth for it in arc] == ["C", "B"] and arc[1].extra["source_index"] == 2
    gpqa = load("gpqa", tmp_path, monkeypatch)
    for item, correct in zip(gpqa, ["photon", "sp3", "nucleus"]):
        assert dict(item.extra["options"])[item.ground_truth] == correct
    assert gpqa[0].prompt_messages[0]["content"].startswith("\nHere are some example questions from experts.")


def test_gpqa_shuffle_is_dares_seeded_sequence():
    import random

    rows = read_rows(TASK_SAMPLES / "gpqa" / "gpqa_diamond.jsonl")
    rng = random.Random(0)  # GPQADataset_: random.seed(0), one shuffle per row in file order
    expected = []
    for r in rows:
        texts = [r["Correct Answer"], r["Incorrect Answer 1"], r["Incorrect Answer 2"], r["Incorrect Answer 3"]]
        rng.shuffle(texts)
        expected.append(texts)
    items = get_task("gpqa").load(source=TASK_SAMPLES / RAW["gpqa"])
    assert [[t for _, t in it.extra["options"]] for it in items] == expected


def test_aime_prompt_adds_opencompass_instruction(monkeypatch):
    monkeypatch.setenv("DARE_BENCH_DATA", str(DARE_DATA))
    a24, a25 = get_task("aime2024").load(), get_task("aime2025").load()
    assert len(a24) == len(a25) == 30
    assert a24[0].prompt_messages[0]["content"].endswith(
        "the $t$ minutes at the coffee shop?\nPlease reason step by step, and put your final answer within \\boxed{}.")
    assert a25[0].prompt_messages[0]["content"] == ("Find the sum of all integer bases $b>9$ for which $17_{b}$ is a "
                                                    "divisor of $97_{b}$.\nRemember to put your final answer within "
                                                    "\\boxed{}.")
    assert not get_task("aime2024").grade("\\boxed{0204}", a24[0]).correct  # MATHEvaluator v2 keeps zeros


def test_olympiadbench_prompt_follows_the_prompter():
    items = get_task("olympiadbench").rows_to_items(read_rows(TASK_SAMPLES / RAW["olympiadbench"]), "test", "sample")
    assert items[0].prompt_messages[0]["content"] == (
        "The following is an open-ended problem from an International Math competition. The answer of The problem "
        "should be a numerical value. Please calculate the answer according to the given requirements and the "
        "information provided. Please use LaTeX format to represent the variables and formulas used in the solution "
        "process and results. Please end your solution with \"So the final answer is \\boxed{answer}.\" and give the "
        "result explicitly.\nCompute $\\frac{1}{2}+\\frac{1}{3}-\\frac{1}{3}$.\n\nPlease reason step by step, and put "
        "your final answer within \\boxed{}.")
    assert "\\boxed{multiple answers connected with commas}" in items[1].prompt_messages[0]["content"]
    assert items[2].prompt_messages[0]["content"].startswith("以下是中国数学竞赛中的解答题，答案类型为数值。")
    assert "(unit).\" and give the result explicitly, note that the unit" in items[3].prompt_messages[0]["content"]
    assert items[4].ground_truth == "$(0,1]$"


# ---------------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("name", EVAL_TASKS)
def test_absent_data_names_the_data_get_command(name, monkeypatch):
    from dare_bench.tasks.graders import opencompass_olympiad

    monkeypatch.setattr(opencompass_olympiad, "latex_parser_available", lambda: True)  # data is checked next
    hf = "" if name.startswith("aime") else " --hf"
    with pytest.raises(DataError, match=rf"^no data for '{name}' \(test\): get it with `dare-bench data get "
                                        rf"{name}{hf}`"):
        get_task(name).load()


def test_eval_cli_without_data_is_one_line(tmp_path):
    from dare_bench.cli import app

    res = CliRunner().invoke(app, ["eval", "--model", "tiny-llada", "--task", "gpqa", "--limit", "1"],
                             env={"DARE_BENCH_HOME": str(tmp_path)})
    assert res.exit_code == 2
    assert res.stderr.strip() == ("error: no data for 'gpqa' (test): get it with `dare-bench data get gpqa --hf` "
                                  "(it writes $DARE_BENCH_DATA/rl/test/gpqa.parquet), or pass source=<file> / "
                                  "'hf:Idavidrein/gpqa:gpqa_diamond@<revision>'")


@pytest.mark.parametrize("name", ["mmlu", "mmlupro", "hellaswag", "arcc", "gpqa"])
def test_choice_item_without_options_is_a_data_error(name, tmp_path):
    row = {"data_source": name, "prompt": [{"role": "user", "content": "Which?"}],
           "reward_model": {"style": "rule", "ground_truth": "A"}, "extra_info": {"index": 0, "options": []}}
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(DataError, match=rf"row 0: {name} item 0 has no options"):
        get_task(name).load(source=path)


@pytest.mark.parametrize("name, row", [
    ("mmlupro", {"question": "q", "options": [], "answer": "A", "category": "math"}),
    ("hellaswag", {"activity_label": "x", "ctx_a": "c", "ctx_b": "", "endings": [], "label": "0"}),
    ("arcc", {"id": "x", "question": "q", "choices": {"text": [], "label": []}, "answerKey": "A"}),
    ("gpqa", {"Question": "q", "Correct Answer": "a"}),
])
def test_raw_row_without_options_is_a_data_error(name, row, tmp_path):
    path = tmp_path / "raw.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(DataError, match="a multiple-choice row with no options"):
        get_task(name).load(source=path)


def test_mmlu_raw_rows_need_the_dev_split():
    with pytest.raises(DataError, match="MMLU's 5-shot prompt needs the dev split's rows"):
        get_task("mmlu").load(source=TASK_SAMPLES / "mmlu" / "test.jsonl")


def test_gold_outside_the_options_is_a_data_error(tmp_path):
    row = {"data_source": "arcc", "prompt": [{"role": "user", "content": "Which?"}],
           "reward_model": {"style": "rule", "ground_truth": "E"},
           "extra_info": {"index": 0, "options": [["A", "x"], ["B", "y"], ["C", "z"], ["D", "w"]]}}
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(DataError, match="gold 'E' is not one of its options ABCD"):
        get_task("arcc").load(source=path)


@pytest.mark.parametrize("name", EVAL_TASKS)
def test_prompts_are_the_ones_opencompass_builds(name, tmp_path, monkeypatch):
    """opencompass_tasks/prompts.jsonl: each sample item's chat as OpenCompass made it (DARE's fork's dataset config,
    its dataset class reading the sample, retriever + prompt templates, the dLLM wrappers' chat conversion; made by
    tests/fixtures/graders/make_opencompass_task_verdicts.py). Ours must be the same text, turn for turn, and gold."""
    shipped = [json.loads(line) for line in OPENCOMPASS_TASK_PROMPTS.read_text(encoding="utf-8").splitlines()]
    want = {r["key"]: (r["messages"], r["gold"]) for r in shipped if r["task"] == name}
    group = {"mmlu": "subject", "mmlupro": "category"}.get(name)
    seen: dict[str, int] = {}
    got = {}
    for item in load(name, tmp_path, monkeypatch):
        if group:
            g = item.extra[group]
            key, seen[g] = f"{g}:{seen.get(g, 0)}", seen.get(g, 0) + 1
        else:
            key = str(len(got))
        got[key] = (item.prompt_messages, item.ground_truth)
    assert want and got == want


def needs_latex_parser():
    """OlympiadBench's judge needs sympy's LaTeX parser: antlr4-python3-runtime 4.11.0 exactly (a dependency)."""
    if not latex_parser_available():
        pytest.skip("sympy's LaTeX parser is unavailable (needs antlr4-python3-runtime==4.11.0)")


def test_olympiadbench_without_the_latex_parser_is_one_config_error(monkeypatch):
    from dare_bench.errors import ConfigError
    from dare_bench.tasks.graders import opencompass_olympiad as olympiad

    message = r"^the olympiadbench grader needs sympy's LaTeX parser.*pip install antlr4-python3-runtime==4.11.0$"
    monkeypatch.setattr(olympiad, "latex_parser_available", lambda: False)
    with pytest.raises(ConfigError, match=message):  # at load, before anything is generated
        get_task("olympiadbench").load(source=TASK_SAMPLES / RAW["olympiadbench"])
    item = get_task("olympiadbench").rows_to_items(read_rows(TASK_SAMPLES / RAW["olympiadbench"]), "test", "s")[0]
    with pytest.raises(ConfigError, match=message):
        get_task("olympiadbench").grade("\\boxed{1}", item)
