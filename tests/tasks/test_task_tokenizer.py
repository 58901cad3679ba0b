"""Tiny task tokenizers: deterministic, small, round-trip the plain prompts and gold answers, save/load as HF dirs."""

import pytest

from dare_bench.errors import ConfigError
from dare_bench.tasks import get_task
from dare_bench.tasks.tokenizer import SPECIAL_TOKENS, build_task_tokenizer, task_vocab


@pytest.mark.parametrize("name", ["sudoku", "countdown"])
def test_plain_prompts_and_answers_round_trip_without_unk(name):
    task, tok = get_task(name), build_task_tokenizer(name)
    for item in task.generate(10, seed=2):
        text = task.format_prompt(item, "plain") + task.format_answer(item)
        ids = tok(text)["input_ids"]
        assert tok.unk_token_id not in ids
        assert tok.decode(ids) == text
        assert tok.convert_tokens_to_ids("<answer>") in ids and tok.convert_tokens_to_ids("</answer>") in ids


def test_vocab_is_small_deterministic_and_has_the_special_tokens(tmp_path):
    for name in ["sudoku", "countdown", "gsm8k", "math500", "humaneval", "mbpp"]:
        tok = build_task_tokenizer(name)
        assert len(tok) < 512 and tok.get_vocab() == build_task_tokenizer(name).get_vocab()
        assert [tok.pad_token, tok.bos_token, tok.eos_token, tok.mask_token, tok.unk_token] == [
            "[PAD]", "[BOS]", "[EOS]", "[MASK]", "[UNK]"]
        assert [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert len(build_task_tokenizer("sudoku")) < 40
    assert task_vocab("sudoku")[:9] == SPECIAL_TOKENS + ["<answer>", "</answer>", "<reasoning>", "</reasoning>"]
    from transformers import AutoTokenizer

    tok = build_task_tokenizer("countdown")
    tok.save_pretrained(tmp_path / "tok")
    back = AutoTokenizer.from_pretrained(tmp_path / "tok")
    s = "numbers 1 2 3 target 6\n<answer>1+2+3</answer>"
    assert back(s)["input_ids"] == tok(s)["input_ids"] and back.mask_token_id == tok.mask_token_id


def test_text_tasks_cover_ascii_and_unknown_task_is_an_error():
    tok = build_task_tokenizer("gsm8k")
    s = "Q: Janet’s $5, 1,000 apples?\n<reasoning>\nso \\boxed{18}\n</reasoning>\n<answer>\n18\n</answer>\n"
    assert tok.decode(tok(s)["input_ids"]) == s
    with pytest.raises(ConfigError):
        build_task_tokenizer("chess")
