"""Text and code tasks: DARE files, raw row layouts, hf: sources (stubbed), chat templates of the real checkpoints."""

import json

import pytest

from dare_bench.errors import ConfigError, DataError
from dare_bench.tasks import get_task
from dare_bench.tasks.base import Item
from dare_bench.tasks.tokenizer import build_task_tokenizer

from testpaths import CHECKPOINTS, DARE_DATA


@pytest.fixture
def dare_env(monkeypatch):
    monkeypatch.setenv("DARE_BENCH_DATA", str(DARE_DATA))


@pytest.mark.parametrize("name,n", [("gsm8k", 1319), ("math500", 500), ("humaneval", 164), ("mbpp", 500)])
def test_dare_test_files_load(dare_env, name, n):
    ds = get_task(name).load("test")
    assert len(ds) == n and len(ds.fingerprint) == 64
    it = ds[0]
    assert it.prompt_messages[-1]["role"] in ("user", "assistant") and it.ground_truth
    assert it.extra["task"] == ("code" if name in ("humaneval", "mbpp") else "math")


def test_mbpp_prompts_are_rebuilt_exactly_from_rows(dare_env):
    task = get_task("mbpp")
    for it in task.load("test"):
        text = it.prompt_messages[6]["content"].split("here is your task: ")[1].split(" Your code should pass")[0]
        assert task.make_messages(text, json.loads(it.ground_truth)) == it.prompt_messages


def test_raw_rows_and_gold_answers(tmp_path):
    p = tmp_path / "gsm.jsonl"
    p.write_text(json.dumps({"question": "1+1?", "answer": "1+1=2\n#### 2"}) + "\n")
    item = get_task("gsm8k").load("test", source=p)[0]
    assert item.ground_truth == "2" and item.prompt_messages == [{"role": "user", "content": "1+1?"}]
    gold = get_task("gsm8k").format_answer(item)
    assert all(get_task("gsm8k").grade(gold, item, g).correct for g in ("dare", "d1", "strict"))
    assert get_task("gsm8k").grade(gold, item, "d1").reward == pytest.approx(4.0)

    p = tmp_path / "math.jsonl"
    p.write_text(json.dumps({"problem": "Half?", "solution": "It is $\\boxed{\\frac12}$."}) + "\n")
    item = get_task("math500").load("test", source=p)[0]
    assert item.ground_truth == "\\frac12"
    gold = get_task("math500").format_answer(item)
    assert all(get_task("math500").grade(gold, item, g).correct for g in ("dare", "d1", "strict"))

    p = tmp_path / "he.jsonl"
    p.write_text(json.dumps({"task_id": "HumanEval/0", "prompt": "def add(x, y):\n", "entry_point": "add",
                             "canonical_solution": "    return x + y\n",
                             "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n"}) + "\n")
    item = get_task("humaneval").load("test", source=p)[0]
    assert item.prompt_messages[0]["content"] == "Complete the following python code:\ndef add(x, y):\n"
    assert get_task("humaneval").format_answer(item) == "```python\ndef add(x, y):\n    return x + y\n\n```"


def test_wrongly_shaped_verl_rows_are_data_errors(tmp_path):
    import pandas as pd

    p = tmp_path / "bad.parquet"
    pd.DataFrame({"prompt": ["not a chat"], "reward_model": [{"ground_truth": "1"}]}).to_parquet(p)
    with pytest.raises(DataError, match="row 0"):
        get_task("gsm8k").load("test", source=p)
    pd.DataFrame({"prompt": [[{"role": "user", "content": "q"}]],
                  "reward_model": [{"ground_truth": "abc"}]}).to_parquet(p)
    with pytest.raises(DataError, match="not a number"):
        get_task("gsm8k").load("test", source=p)
    with pytest.raises(DataError, match="no canonical solution"):
        get_task("humaneval").format_answer(Item(0, [], "t", {}))  # DARE's parquet carries no reference code


def test_hf_source_is_pinned_and_fingerprinted(monkeypatch):
    import datasets

    calls = {}

    def fake_load_dataset(path, name=None, split=None, revision=None):
        calls.update(path=path, name=name, split=split, revision=revision)
        return [{"question": "2+2?", "answer": "#### 4"}, {"question": "3+3?", "answer": "#### 6"}]

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    ds = get_task("gsm8k").load("test", source="hf:openai/gsm8k:main@e53f048", limit=1)
    assert calls == {"path": "openai/gsm8k", "name": "main", "split": "test", "revision": "e53f048"}
    assert ds.source == "hf:openai/gsm8k:main@e53f048" and len(ds) == 1 and ds[0].ground_truth == "4"
    again = get_task("gsm8k").load("test", source="hf:openai/gsm8k:main@e53f048")
    assert again.fingerprint == ds.fingerprint and len(again) == 2


@pytest.mark.parametrize("checkpoint,marker", [
    ("LLaDA-8B-Instruct", "<|start_header_id|>assistant<|end_header_id|>\n\n"),
    ("Dream-v0-Instruct-7B", "<|im_start|>assistant\n"),
    ("SDAR-4B-Chat", "<|im_start|>assistant\n"),
    ("LLaDA2.0-mini", "<role>ASSISTANT</role>"),
])
def test_chat_templates_of_the_real_checkpoints(checkpoint, marker):
    cfg = CHECKPOINTS / checkpoint / "tokenizer_config.json"
    tok = build_task_tokenizer("gsm8k")  # only the template matters for rendering
    tok.chat_template = json.loads(cfg.read_text())["chat_template"]
    task = get_task("sudoku")
    item = task.generate(1, seed=0)[0]
    text = task.format_prompt(item, tok)
    assert text.endswith(marker) and f"Solve the following Sudoku puzzle: {item.extra['puzzle']}" in text
    # MBPP ends with DARE's pre-filled assistant turn: it is continued, not closed
    mbpp = get_task("mbpp")
    m_item = mbpp.row_to_item({"text": "Write f.", "test_list": ["assert f(1) == 1"]}, 0, "test")
    assert mbpp.format_prompt(m_item, tok).rstrip().endswith("[BEGIN]")


def test_d1_evaluation_prompt_style():
    gsm = get_task("gsm8k")
    item = Item(0, [{"role": "user", "content": "What is 9*2?"}], "18", {})
    (msg,) = gsm.messages(item, "d1")
    assert msg["role"] == "user" and msg["content"].startswith("You are a math expert.")
    assert msg["content"].endswith("<answer>\n\\boxed{...}\n</answer>\n\nWhat is 9*2?")
    cd = get_task("countdown")
    c_item = cd.generate(1, seed=0)[0]
    assert cd.messages(c_item, "d1")[0]["content"].endswith("\n\nNumbers: [79, 15, 41]\nTarget: 8")
    su = get_task("sudoku")
    s_item = su.generate(1, seed=0)[0]
    content = su.messages(s_item, "d1")[0]["content"]
    assert content.startswith("\nPlease solve") and content.endswith(
        f"</answer>\n\n\nSolve the following Sudoku puzzle: {s_item.extra['puzzle']}\n")
    tok = build_task_tokenizer("gsm8k")
    tok.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
                         "{% if add_generation_prompt %}<assistant>{% endif %}")
    assert gsm.format_prompt(item, tok, style="d1").endswith("What is 9*2?<assistant><reasoning>")
    assert gsm.format_prompt(item, tok) == "<user>What is 9*2?<assistant>"
    with pytest.raises(ConfigError, match="no evaluation prompt"):
        get_task("humaneval").messages(item, "d1")
    with pytest.raises(ConfigError):
        gsm.format_prompt(item, "plain", style="d1")


def test_real_dare_code_items_grade_through_the_sandbox(dare_env):
    he = get_task("humaneval")
    item = he.load("test", limit=1)[0]  # has_close_elements
    solution = ("```python\nfrom typing import List\n\n\ndef has_close_elements(numbers: List[float], threshold: float)"
                " -> bool:\n    return any(abs(a - b) < threshold for i, a in enumerate(numbers)"
                " for b in numbers[i + 1:])\n```")
    wrong = solution.replace("< threshold", "> threshold")
    res = he.grade_many([solution, wrong, solution], [item] * 3, grader="dare")
    assert [r.correct for r in res] == [True, False, True]
    assert he.grade(solution, item, "strict").correct
    mbpp = get_task("mbpp")
    m_item = mbpp.load("test", limit=1)[0]  # remove_Occ
    # DARE's few-shot answers use "\r\n" inside a quoted [BEGIN] ... [DONE] block; the harness must cope with it
    code = (" 'def remove_Occ(s,ch):\r\n    i = s.find(ch)\r\n    s = s[:i] + s[i+1:]\r\n    j = s.rfind(ch)\r\n"
            "    return s[:j] + s[j+1:]' \n[DONE] \n\n")
    assert mbpp.grade(code, m_item, "dare").correct


def test_a_rewritten_file_is_read_again(tmp_path):
    """Rows are read once per process and file version (planning every entry loads the same files hundreds of
    times): a file rewritten in place, even to the same size, is read again; its fingerprint follows."""
    import os

    p = tmp_path / "gsm.jsonl"
    p.write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n")
    first = get_task("gsm8k").load("test", source=p)
    again = get_task("gsm8k").load("test", source=p)
    assert first[0] == again[0] and first.fingerprint == again.fingerprint
    before = p.stat().st_mtime_ns
    p.write_text(json.dumps({"question": "1+2?", "answer": "#### 3"}) + "\n")  # the same length
    os.utime(p, ns=(before + 10**9, before + 10**9))
    changed = get_task("gsm8k").load("test", source=p)
    assert changed[0].ground_truth == "3" and changed.fingerprint != first.fingerprint
