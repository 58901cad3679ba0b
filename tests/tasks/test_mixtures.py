"""`train.data` mixtures (tasks.mixtures): entries resolved to sources with fingerprints, concatenated in order, one
clear DataError per missing source; and verl's over-long prompt filter."""

import shutil

import pytest

from dare_bench.errors import ConfigError, DataError
from dare_bench.tasks import get_task
from dare_bench.tasks.base import sha256_file
from dare_bench.tasks.mixtures import filter_overlong, load_mixture, resolve_entry, resolve_sources

from testpaths import CHECKPOINTS, DARE_DATA

GSM8K_TRAIN = DARE_DATA / "rl" / "train" / "gsm8k_1.parquet"
MATH_TRAIN = DARE_DATA / "rl" / "train" / "math_1.parquet"


@pytest.fixture
def dare_env(monkeypatch):
    monkeypatch.setenv("DARE_BENCH_DATA", str(DARE_DATA))


def test_dare_math_mixture_concatenates_gsm8k_then_math(dare_env):
    """DARE trains its math model on GSM8K + MATH (algorithms.md §6): `data: [gsm8k, math]`, in that order."""
    task = get_task("gsm8k")
    sources = resolve_sources(task, ["gsm8k", "math"])
    assert [s.record() for s in sources] == [
        {"entry": "gsm8k", "source": str(GSM8K_TRAIN.resolve()), "fingerprint": sha256_file(GSM8K_TRAIN)},
        {"entry": "math", "source": str(MATH_TRAIN.resolve()), "fingerprint": sha256_file(MATH_TRAIN)},
    ]
    # MATH rows are read by the task whose split they are (a GSM8K gold must be a number, MATH's need not be)
    assert sources[1].task.name == "math500"
    ds = load_mixture(task, ["gsm8k", "math"])
    assert len(ds) == 7473 + 7474
    assert ds[0].extra["data_source"] != ds[7473].extra["data_source"]
    assert ds[7472].extra["data_source"] == ds[0].extra["data_source"]
    assert load_mixture(task, ["math", "gsm8k"])[0].prompt_messages == ds[7473].prompt_messages
    assert len(load_mixture(task, ["gsm8k", "math"], limit=10)) == 10


def test_a_missing_dare_name_is_one_error_naming_entry_path_and_env(dare_env, tmp_path, monkeypatch):
    task = get_task("countdown")
    with pytest.raises(DataError) as exc:
        resolve_entry(task, "countdown-n20000")
    msg = str(exc.value)
    assert "'countdown-n20000'" in msg and str(DARE_DATA / "rl" / "train" / "countdown-n20000_1.parquet") in msg
    assert "DARE_BENCH_DATA" in msg and "\n" not in msg
    monkeypatch.delenv("DARE_BENCH_DATA")
    with pytest.raises(DataError, match=r"'math'.*\$DARE_BENCH_DATA is unset"):
        resolve_entry(get_task("gsm8k"), "math")
    with pytest.raises(DataError, match=r"'gsm8k'.*no file at \$DARE_BENCH_DATA/rl/train/gsm8k_1.parquet"):
        resolve_entry(get_task("gsm8k"), "gsm8k")  # the task's own split, which has no generator
    with pytest.raises(DataError, match=str(tmp_path / "nope.jsonl")):
        resolve_entry(task, str(tmp_path / "nope.jsonl"))


def test_files_hf_and_generators_resolve_without_reading_rows(tmp_path, monkeypatch):
    monkeypatch.delenv("DARE_BENCH_DATA", raising=False)
    task = get_task("gsm8k")
    copy = tmp_path / "mine.parquet"
    shutil.copy(GSM8K_TRAIN, copy)
    src = resolve_entry(task, str(copy))
    assert (src.kind, src.fingerprint) == ("file", sha256_file(GSM8K_TRAIN))
    assert len(load_mixture(task, [str(copy)])) == 7473
    hf = resolve_entry(task, "hf:openai/gsm8k:main@e53f048")
    assert hf.kind == "hf" and hf.fingerprint != resolve_entry(task, "hf:openai/gsm8k:main@0000000").fingerprint
    with pytest.raises(ConfigError, match="pinned revision"):
        resolve_entry(task, "hf:openai/gsm8k")
    sudoku = get_task("sudoku")
    own = resolve_entry(sudoku, "sudoku", limit=12)  # no DARE file: the seeded generator
    assert own.kind == "generator" and own.source == "generator:sudoku(seed=0,n=12,split=train)"
    assert resolve_entry(sudoku, "generator:3", limit=12).fingerprint != own.fingerprint
    ds = load_mixture(sudoku, ["sudoku", "generator:3"], limit=20)
    assert len(ds) == 20
    assert [it.extra["puzzle"] for it in ds.items[:12]] == [
        it.extra["puzzle"] for it in sudoku.generate(12, seed=0, split="train").items]
    with pytest.raises(DataError, match="no procedural generator"):
        resolve_entry(task, "generator")


def test_filter_overlong_drops_what_verl_drops():
    """verl's filter_overlong_prompts keeps a row iff len(apply_chat_template(prompt, add_generation_prompt=True))
    <= max_prompt_length; the filter renders the prompt as the run does and counts the same tokens."""
    from dare_bench.models import load_tokenizer

    tok = load_tokenizer(CHECKPOINTS / "Dream-v0-Instruct-7B")
    task = get_task("gsm8k")
    items = list(task.load("train", source=GSM8K_TRAIN, limit=40))
    encoded = [tok.apply_chat_template(it.prompt_messages, add_generation_prompt=True, tokenize=True) for it in items]
    verl_len = [len(e["input_ids"] if hasattr(e, "keys") else e) for e in encoded]
    cut = sorted(verl_len)[len(verl_len) // 2]
    kept, dropped = filter_overlong(task, items, tok, tok, cut)
    assert [it.index for it in kept] == [it.index for it, n in zip(items, verl_len) if n <= cut]
    assert dropped == sum(n > cut for n in verl_len) > 0
    assert filter_overlong(task, items, tok, tok, None) == (items, 0)


def test_filter_overlong_on_the_plain_tiny_prompt():
    from dare_bench.tasks.tokenizer import build_task_tokenizer

    task = get_task("sudoku")
    tok = build_task_tokenizer("sudoku")
    items = task.generate(5, seed=0, split="train").items
    n = len(tok(task.format_prompt(items[0], "plain"), add_special_tokens=False)["input_ids"])
    assert filter_overlong(task, items, tok, "plain", n) == (list(items), 0)
    assert filter_overlong(task, items, tok, "plain", n - 1) == ([], 5)


def test_check_rows_parses_a_file_once_per_content_and_rereads_a_changed_one(tmp_path, monkeypatch):
    """Plan-time row checks remember a file content (sha256) that parsed cleanly; new content is parsed again and
    its error still raised."""
    import pandas as pd

    from dare_bench.tasks import mixtures
    from dare_bench.tasks.mixtures import check_rows

    monkeypatch.setattr(mixtures, "_ROWS_READ_CLEANLY", {})
    task = get_task("gsm8k")
    path = tmp_path / "mine.parquet"
    pd.read_parquet(GSM8K_TRAIN).head(5).to_parquet(path)
    loads = []
    original = type(task).load
    monkeypatch.setattr(type(task), "load", lambda self, *a, **k: loads.append(1) or original(self, *a, **k))
    check_rows(task, [resolve_entry(task, str(path))])
    check_rows(task, [resolve_entry(task, str(path))])
    assert len(loads) == 1
    pd.DataFrame({"wrong": ["columns"]}).to_parquet(path)
    with pytest.raises(DataError):
        check_rows(task, [resolve_entry(task, str(path))])
    with pytest.raises(DataError):  # a failure is never remembered
        check_rows(task, [resolve_entry(task, str(path))])
    assert len(loads) == 3
