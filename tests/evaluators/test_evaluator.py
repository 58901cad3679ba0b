"""Evaluator: batching, grading, metrics, determinism, sink and predictions scoring (tiny real backbones + fakes)."""

import hashlib
import json
import types

import pytest
import torch

from dare_bench.errors import ConfigError, DataError
from dare_bench.evaluators import evaluator as ev
from dare_bench.evaluators.presets import PRESETS, default_preset, get_preset, sampler_kind


class CharTokenizer:
    """Character-level tokenizer with the special tokens a preset backbone needs."""

    specials = ["<pad>", "<eos>", "<mask>", "<bos>"]
    pad_token_id, eos_token_id, mask_token_id, bos_token_id = 0, 1, 2, 3

    def __init__(self):
        self.chars = [chr(c) for c in range(32, 127)]

    def __len__(self):
        return len(self.specials) + len(self.chars)

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [4 + self.chars.index(c) for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(self.chars[i - 4] for i in ids if i >= 4 or not skip_special_tokens)


class EchoTask:
    """Answer = the item's word; completions are graded by prefix match."""

    name = "echo"
    graders = ["dare", "strict"]

    def __init__(self, n=6):
        self.rows = [types.SimpleNamespace(index=10 + i, ground_truth=w,
                                           prompt_messages=[{"role": "user", "content": w}])
                     for i, w in enumerate(["cat", "dog", "emu", "owl", "yak", "elk", "ant"][:n])]

    def load(self, split="test", source=None, limit=None):
        if source is not None:
            rows = [json.loads(l) for l in open(source)]
            if not all("word" in r for r in rows):
                raise DataError(f"{source}: rows need 'word'")
            items = [types.SimpleNamespace(index=i, ground_truth=r["word"], prompt_messages=[])
                     for i, r in enumerate(rows)]
        else:
            items = list(self.rows)
        items = items[:limit] if limit else items
        fp = hashlib.sha256(json.dumps([i.ground_truth for i in items]).encode()).hexdigest()
        return _DS(items, str(source or "builtin"), fp)

    def format_prompt(self, item, template="plain"):
        assert template == "plain" or hasattr(template, "decode")
        return f"say {item.ground_truth}:" if len(item.ground_truth) == 3 else f"{item.ground_truth}?"

    def grade(self, completion, item, grader="dare"):
        if completion == "CRASH":
            raise RuntimeError("grader exploded")
        ok = completion.strip().startswith(item.ground_truth)
        return types.SimpleNamespace(correct=ok, reward=2.0 if ok else 0.0, extracted=completion.strip()[:3] or None,
                                     details={}, score=float(ok))


class _DS(list):
    def __init__(self, items, source, fingerprint):
        super().__init__(items)
        self.source, self.fingerprint = source, fingerprint


@pytest.fixture(scope="module")
def tok():
    return CharTokenizer()


def _gold_generate(tok, answers_by_prompt):
    """A stand-in sampler that writes the gold word (+ eos) after each prompt, with fake stats."""

    def fake(model, prompt_ids, attention_mask=None, **settings):
        rows = []
        for row in prompt_ids.tolist():
            text = tok.decode([t for t in row if t >= 4])
            word = answers_by_prompt[text]
            rows.append(row + tok(word)["input_ids"] + [tok.eos_token_id])
        width = max(map(len, rows)) + 1
        seq = torch.tensor([r + [tok.mask_token_id] * (width - len(r)) for r in rows])
        stats = types.SimpleNamespace(forwards=4, generated_tokens=5, tokens_per_forward=1.25, wall_seconds=0.01)
        return types.SimpleNamespace(sequences=seq, prompt_length=prompt_ids.shape[1], stats=stats,
                                     settings={"sampler": "fake", **settings})

    return fake


def test_presets_are_pinned_with_sources():
    assert {"tiny", "micro", "d1-llada", "dare-llada-math", "dare-dream-code", "sdar-greedy",
            "llada2-greedy"} <= set(PRESETS)
    for p in PRESETS.values():
        assert p.source and p.settings
    assert get_preset("d1-llada").settings_for("llada") == {
        "gen_length": 256, "steps": 128, "block_length": 32, "temperature": 0.0, "remasking": "low_confidence"}
    assert default_preset("dream", "math500", tiny=False).name == "dare-dream-math"
    assert default_preset("llada", "mbpp", tiny=True).name == "tiny"
    with pytest.raises(ConfigError, match="did you mean"):
        get_preset("d1-lada")
    with pytest.raises(ConfigError, match="no pinned sampler preset"):
        default_preset("llada", "unknown-task", tiny=False)
    with pytest.raises(ConfigError, match="no settings"):
        get_preset("d1-llada").settings_for("block")


@pytest.mark.parametrize("preset_model", ["tiny-llada", "tiny-dream", "tiny-sdar"])
def test_real_tiny_backbone_end_to_end(preset_model, tok):
    task = EchoTask(n=2)
    events = []
    kw = dict(tokenizer=tok, preset="micro", seed=3, progress=False)
    a = ev.evaluate(preset_model, task, sink=lambda e, p: events.append((e, p)), **kw)
    if preset_model == "tiny-llada":  # deterministic under a seed (the RNG-free greedy preset still reseeds)
        b = ev.evaluate(preset_model, task, **kw)
        assert [r["completion"] for r in a.records] == [r["completion"] for r in b.records]
    assert [r["index"] for r in a.records] == [10, 11]
    m = a.metrics
    assert m["n"] == 2 and 0.0 <= m["accuracy"] <= 1.0 and m["forwards"] > 0 and m["tokens_per_forward"] > 0
    assert m["wall_seconds"] >= m["generation_seconds"] > 0
    assert a.preset == "micro" and a.sampler["gen_length"] == 16
    kinds = [e for e, _ in events]
    assert kinds[-1] == "evaluation" and "batch" in kinds
    from dare_bench.store.records import EvaluationRecord  # the payload is what the store takes

    rec = EvaluationRecord(**events[-1][1])
    assert rec.n_items == 2 and rec.samples[0].item_id == "10"


def test_verdicts_metrics_and_malformed_completions(tok):
    task = EchoTask(n=6)
    answers = {task.format_prompt(i): i.ground_truth for i in task.rows}
    answers["say emu:"] = "xyz"  # one wrong
    answers["say owl:"] = "CRASH"  # grader raises: scored wrong, evaluation carries on
    res = ev.evaluate("tiny-llada", task, tokenizer=tok, preset="micro", progress=False, batch_size=4,
                      generate_fn=_gold_generate(tok, answers))
    verdicts = {r["index"]: r["correct"] for r in res.records}
    assert verdicts == {10: True, 11: True, 12: False, 13: False, 14: True, 15: True}
    assert res.metrics["accuracy"] == pytest.approx(4 / 6) and res.metrics["mean_reward"] == pytest.approx(8 / 6)
    assert res.metrics["tokens_per_forward"] == pytest.approx(1.25)
    crashed = [r for r in res.records if r["index"] == 13][0]
    assert "grader exploded" in crashed["details"]["error"]
    out = res.to_json()
    assert set(out) >= {"task", "model", "preset", "metrics", "items"} and out["items"][0]["completion"] == "cat"


def test_block_batches_hold_equal_lengths_only():
    batches = ev._batches([5, 3, 5, 3, 4, 5], 2, equal_length=True)
    assert sorted(i for b in batches for i in b) == list(range(6))
    lengths = [5, 3, 5, 3, 4, 5]
    assert all(len({lengths[i] for i in b}) == 1 and len(b) <= 2 for b in batches)
    mdlm = ev._batches(lengths, 4, equal_length=False)
    assert [len(b) for b in mdlm] == [4, 2]


def test_decode_cuts_at_stop_and_drops_masks(tok):
    ids = (tok("ab")["input_ids"] + [tok.mask_token_id] + tok("c")["input_ids"] + [tok.eos_token_id]
           + tok("zz")["input_ids"])
    assert ev.decode_completion(tok, ids, [tok.eos_token_id], [tok.mask_token_id, tok.pad_token_id]) == "abc"


def test_score_predictions_in_input_order_with_repeats(tmp_path):
    task = EchoTask()
    preds = tmp_path / "p.jsonl"
    lines = [{"index": 11, "completion": "dog!"}, {"index": 10, "completion": "no"}, {"index": 11, "completion": None},
             {"index": 12, "completion": 42}, {"index": 11, "completion": "dog"}]
    preds.write_text("\n".join(json.dumps(l) for l in lines) + "\n")
    res = ev.score_predictions(task, preds)
    assert [(r["index"], r["correct"]) for r in res.items] == [(11, True), (10, False), (11, False), (12, False),
                                                               (11, True)]
    assert res.metrics["accuracy"] == pytest.approx(0.4)
    assert set(res.to_json()) == {"task", "items", "metrics"}
    assert set(res.to_json()["items"][0]) == {"index", "correct", "reward", "extracted"}


def test_score_bad_inputs_are_one_clear_error(tmp_path):
    task = EchoTask()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"index": 99, "completion": "x"}\n')
    with pytest.raises(DataError, match="not in"):
        ev.score_predictions(task, bad)
    bad.write_text('{"index": "ten", "completion": "x"}\n')
    with pytest.raises(DataError, match="must be an integer"):
        ev.score_predictions(task, bad)
    bad.write_text("not json\n")
    with pytest.raises(DataError, match=":1: not a JSON object"):
        ev.score_predictions(task, bad)
    bad.write_text('{"index": 10, "completion": "cat", "task": "echo"}\n{"index": 11, "completion": "x", '
                   '"task": "mmlu"}\n')  # a predictions file of another benchmark
    with pytest.raises(DataError, match="predictions are for task 'mmlu', not 'echo' \\(line 2"):
        ev.score_predictions(task, bad)
    with pytest.raises(DataError, match="cannot read"):
        ev.score_predictions(task, tmp_path / "missing.jsonl")
    data = tmp_path / "data.jsonl"
    data.write_text('{"word": "bee"}\n{"word": "fox"}\n')
    ok = tmp_path / "ok.jsonl"
    ok.write_text('{"index": 1, "completion": "fox"}\n')
    assert ev.score_predictions(task, ok, data=data).items[0]["correct"] is True
    with pytest.raises(ConfigError, match="grader 'nope'"):
        ev.score_predictions(task, ok, grader="nope")


def test_sampler_kind_follows_traits():
    t = types.SimpleNamespace
    assert sampler_kind(t(attention="block_causal", logit_shift=0)) == "block"
    assert sampler_kind(t(attention="bidirectional", logit_shift=1)) == "dream"
    assert sampler_kind(t(attention="bidirectional", logit_shift=0)) == "llada"


def test_chat_template_path_with_the_real_dream_tokenizer(monkeypatch):
    """Paper-preset wiring minus the 7B forward: real Qwen2 tokenizer + chat template, real GSM8K items."""
    from testpaths import CHECKPOINTS, DARE_DATA

    ckpt = CHECKPOINTS / "Dream-v0-Instruct-7B"
    monkeypatch.setenv("DARE_BENCH_DATA", str(DARE_DATA))
    from dare_bench.models import load_tokenizer
    from dare_bench.models.base import ModelTraits
    from dare_bench.tasks import get_task

    tok = load_tokenizer(ckpt)
    traits = ModelTraits(family="dream", mask_token_id=151666, eos_token_id=151643, pad_token_id=151643,
                         logit_shift=1, attention="bidirectional", stop_token_ids=(151645,))
    model = types.SimpleNamespace(traits=traits, parameters=lambda: iter([torch.zeros(1)]), name_or_path="dream-stub")
    task = get_task("gsm8k")
    items = list(task.load(limit=3))
    gold = {task.format_prompt(it, tok): task.format_answer(it) for it in items}
    wrong_prompt = task.format_prompt(items[1], tok)
    seen = {}

    def fake(model_, prompt_ids, attention_mask=None, **settings):
        seen.update(settings)
        rows = []
        for k, row in enumerate(prompt_ids.tolist()):
            real = row if attention_mask is None else [t for t, m in zip(row, attention_mask[k].tolist()) if m]
            text = tok.decode(real)
            answer = gold[text] if text != wrong_prompt else "I give up"
            rows.append(row + tok(answer, add_special_tokens=False)["input_ids"] + [151645]
                        + tok("#### 0")["input_ids"])
        width = max(map(len, rows))
        seq = torch.tensor([r + [151643] * (width - len(r)) for r in rows])
        st = types.SimpleNamespace(forwards=2, generated_tokens=4, tokens_per_forward=2.0, wall_seconds=0.0)
        return types.SimpleNamespace(sequences=seq, prompt_length=prompt_ids.shape[1], stats=st, settings=settings)

    res = ev.evaluate(model, task, tokenizer=tok, preset="dare-dream-math", limit=3, progress=False,
                      generate_fn=fake)
    assert seen["alg"] == "entropy" and seen["steps"] == 512 and seen["max_new_tokens"] == 512
    assert all(r["prompt"].rstrip().endswith("<|im_start|>assistant") for r in res.records)
    assert [r["correct"] for r in res.records] == [True, False, True]
    assert all("#### 0" not in r["completion"] for r in res.records)  # cut at <|im_end|>


def test_a_decode_that_never_finishes_fails_its_items_only(tok):
    """E.g. a block sampler whose model keeps committing the mask token: bounded by a forward budget."""
    from dare_bench.models.base import ModelTraits

    class Stuck(torch.nn.Module):
        traits = ModelTraits(family="stub", mask_token_id=2, eos_token_id=1, pad_token_id=0, logit_shift=0,
                             attention="bidirectional")

        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, ids, attention_mask=None):
            return torch.zeros(ids.shape[0], ids.shape[1], len(tok))

    task = EchoTask(n=3)
    answers = {task.format_prompt(i): i.ground_truth for i in task.rows}
    gold = _gold_generate(tok, answers)

    def sometimes_stuck(model, prompt_ids, attention_mask=None, **settings):
        if prompt_ids.shape[0] == 1:  # 3 items in batches of 2: the single-item batch never finishes
            while True:
                model(prompt_ids)
        return gold(model, prompt_ids, attention_mask, **settings)

    res = ev.evaluate(Stuck(), task, tokenizer=tok, preset="micro", batch_size=2, progress=False,
                      generate_fn=sometimes_stuck)
    budget = ev.forward_budget(get_preset("micro").settings_for("llada"))
    assert budget == 4 * (16 + 8 * 2) + 64
    stuck = [r for r in res.records if "generation_error" in r["details"]]
    assert len(stuck) == 1 and stuck[0]["correct"] is False and str(budget) in stuck[0]["details"]["generation_error"]
    assert sum(r["correct"] for r in res.records) == 2 and res.metrics["generation_errors"] == 1.0


def test_the_preset_follows_what_the_checkpoint_is_not_its_size(tmp_path):
    """A shrunk real checkpoint (80M parameters, real tokenizer + chat template) gets the paper preset; a tiny
    replica with a task tokenizer gets `tiny`."""
    from dare_bench.evaluators.evaluator import load_model, resolve_preset
    from dare_bench.models.shrink import shrink_checkpoint
    from dare_bench.tasks import get_task

    from testpaths import CHECKPOINTS

    task = get_task("gsm8k")
    shrink_checkpoint(CHECKPOINTS / "Dream-v0-Instruct-7B", tmp_path / "dream")
    real = load_model(str(tmp_path / "dream"), task)
    assert real.model.num_parameters() < 100_000_000 and not real.tiny
    assert resolve_preset(None, "dream", "gsm8k", real.tiny).name != "tiny"
    replica = load_model("tiny-dream", task)
    assert replica.tiny and resolve_preset(None, "dream", "gsm8k", replica.tiny).name == "tiny"


def test_repeats_average_k_fresh_samples_per_item(tok):
    """OpenCompass' repeatN datasets (DARE's AIME avg@8): every item decoded k times from one seeded stream, one
    record per sample with its `repeat`, and the metric is the mean over all k x n samples (not pass@k)."""
    task = EchoTask(n=3)
    draws = []

    def coin(model, prompt_ids, attention_mask=None, **settings):
        # right or wrong by a draw from the global RNG, which the evaluator reseeds per batch
        rows = []
        for row in prompt_ids.tolist():
            text = tok.decode([t for t in row if t >= 4])
            right = bool(torch.rand(()) < 0.5)
            draws.append(right)
            rows.append(row + tok(text[4:7] if right else "zzz")["input_ids"] + [tok.eos_token_id])
        seq = torch.tensor(rows)
        stats = types.SimpleNamespace(forwards=2, generated_tokens=4, tokens_per_forward=2.0, wall_seconds=0.01)
        return types.SimpleNamespace(sequences=seq, prompt_length=prompt_ids.shape[1], stats=stats,
                                     settings={"sampler": "fake", **settings})

    kw = dict(tokenizer=tok, preset="micro", progress=False, batch_size=1, generate_fn=coin, seed=5)
    res = ev.evaluate("tiny-llada", task, repeats=8, **kw)
    assert len(res.records) == 24 and [r["repeat"] for r in res.records] == [r for r in range(8) for _ in range(3)]
    assert [r["index"] for r in res.records] == [10, 11, 12] * 8
    verdicts = [r["correct"] for r in res.records]
    assert verdicts == draws and 0 < sum(verdicts) < 24  # fresh draws, not one sample copied 8 times
    assert res.metrics["accuracy"] == pytest.approx(sum(verdicts) / 24) and res.metrics["n"] == 24
    again = ev.evaluate("tiny-llada", task, repeats=8, **kw)
    assert [r["completion"] for r in again.records] == [r["completion"] for r in res.records]  # seeded
    one = ev.evaluate("tiny-llada", task, **kw)
    assert "repeat" not in one.records[0] and len(one.records) == 3
    with pytest.raises(ConfigError, match="repeats must be a positive integer"):
        ev.evaluate("tiny-llada", task, repeats=0, **kw)
