"""Tiny, deterministic character-level tokenizers for tiny-scale runs, built with the ``tokenizers`` library.

Every character is one token; the XML tags the graders look for (``<answer>``, ``</answer>``, ``<reasoning>``,
``</reasoning>``) are single tokens; ``[PAD] [BOS] [EOS] [MASK] [UNK]`` are ids 0-4. Sudoku and Countdown get only
the characters of their plain prompts and answers (a few dozen tokens, so tiny models stay tiny); the text tasks get
printable ASCII plus newline, tab and the few curly quotes / currency signs of GSM8K (< 128 tokens). The vocabulary is a
constant of the task name: the same ids on
every build and machine.

    from dare_bench.tasks.tokenizer import build_task_tokenizer
    tok = build_task_tokenizer("sudoku")
    ids = tok("sudoku 3102200002100320\n")["input_ids"]
    tok.save_pretrained("out/tok")        # a standard HF tokenizer dir; AutoTokenizer.from_pretrained("out/tok")
"""

from __future__ import annotations

import string

from dare_bench.errors import ConfigError

SPECIAL_TOKENS = ["[PAD]", "[BOS]", "[EOS]", "[MASK]", "[UNK]"]
TAG_TOKENS = ["<answer>", "</answer>", "<reasoning>", "</reasoning>"]

_DIGITS = "0123456789"
_TEXT_CHARS = "".join(ch for ch in string.printable if ch not in "\r\x0b\x0c")  # printable ASCII, \n, \t
# the non-ASCII characters that occur more than once in DARE's GSM8K questions (curly quotes, currencies, dashes)
_TEXT_EXTRA = "’‘“”€£¢–—é"

TASK_CHARS: dict[str, str] = {
    "sudoku": "sudoku \n" + _DIGITS,
    "countdown": "numbers target \n" + _DIGITS + "+-*/()" + "\\boxed{}",  # d1's evaluation wants a \\boxed{}
    "gsm8k": _TEXT_CHARS + _TEXT_EXTRA,
    "math500": _TEXT_CHARS + _TEXT_EXTRA,
    "humaneval": _TEXT_CHARS + _TEXT_EXTRA,
    "mbpp": _TEXT_CHARS + _TEXT_EXTRA,
    "pyfunc": string.ascii_lowercase + _DIGITS + " \n()[]:,;=+-*/%'.",  # docstring examples + one-line def
    "arith": "arith \n" + _DIGITS + "+-*/=#" + "\\boxed{}",  # steps, GSM8K's box and "#### n"
}


def task_vocab(task_name: str) -> list[str]:
    if task_name not in TASK_CHARS:
        raise ConfigError(f"no tiny tokenizer for task {task_name!r}; known: {', '.join(sorted(TASK_CHARS))}")
    chars = sorted(set(TASK_CHARS[task_name]))
    return SPECIAL_TOKENS + TAG_TOKENS + chars


def build_task_tokenizer(task_name: str):
    """A ``PreTrainedTokenizerFast`` with mask/pad/eos/bos/unk set, char-level plus single-token XML tags."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(task_vocab(task_name))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    core.add_tokens([AddedToken(t, special=False, normalized=False, single_word=False) for t in TAG_TOKENS])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="[PAD]", bos_token="[BOS]", eos_token="[EOS]", mask_token="[MASK]", unk_token="[UNK]",
        clean_up_tokenization_spaces=False,
    )
    tok.model_max_length = 4096
    return tok
