"""MMLU-Pro (12032 test questions, up to 10 options A-J): DARE's 0-shot chain-of-thought generation evaluation, and
SDAR-30B's 5-shot variant.

Follows OpenCompass ``configs/datasets/mmlu_pro/mmlu_pro_gen.py`` -> ``mmlu_pro_0shot_cot_gen_08c1de.py`` (DARE's
llada / dream / llada2 / SDAR-8B configs): the simple-evals instruction ("... 'ANSWER: $LETTER' ..."),
"Question:\\n\\n<question>\\n\\nOptions:\\n\\n<options>", where the options are ``MMLUProDataset``'s ``options_str``
("A. ..." lines, an "N/A" option skipped, its letter kept); verdict: ``match_answer_pattern`` with
``(?i)ANSWER\\s*:\\s*([A-P])`` + AccEvaluator (an exact letter: the case-insensitive pattern captures a lowercase
"d", which is then wrong). OpenCompass reports per category (``extra_info.category``) and averages the 14 categories.

Task option ``protocol``:
- ``mmlu_pro_0shot_cot_gen_08c1de``: the above (the default).
- ``mmlu_pro_few_shot_gen_bfaf90`` (SDAR-30B's cell): one user turn, "Answer the following multiple choice question
  about <category>, and give your answer option directly.\\n", then the category's first five validation questions
  (``FixKRetriever(fix_id_list=[0..4])``), each "Question:\\n<q>\\nOptions:\\n<options_str>\\nAnswer: <letter>\\n",
  then "Question:\\n<q>\\nOptions:\\n<options_str>\\nAnswer: " (the trailing space kept). The shots are the item's
  ``extra_info.fewshot`` ({question, options, answer} as MMLU-Pro's validation rows have them), which
  ``dare-bench data get mmlupro --hf`` stores (it reads the validation split too); items without them refuse this
  protocol with one NotBuiltError naming that command. Verdict: ``MMLUProBaseEvaluator`` (no postprocessor): the
  completion's first line, stripped, is right when it is the gold letter (A-P, exact case) or the gold option's
  text, compared with ``answer_string`` "<letter>. <text>\\n" split at ". ", which must give two parts (an option
  text containing ". " is never right: OpenCompass's own quirk, kept).

Data: ``dare-bench data get mmlupro --hf`` (TIGER-Lab/MMLU-Pro test + validation) ->
``$DARE_BENCH_DATA/rl/test/mmlupro.parquet``; raw rows (question, options, answer, category, ...) load directly
(without shots).
"""

from __future__ import annotations

from typing import Any, Sequence

from dare_bench.errors import NotBuiltError
from dare_bench.tasks.base import GradeResult, Item
from dare_bench.tasks.choice import ChoiceTask, framed, letter_protocol_grade, option_lines, options_of
from dare_bench.tasks.graders import opencompass_choice as oc
from dare_bench.tasks.protocols import Protocol, own_messages, user_turn

LETTERS = "ABCDEFGHIJKLMNOP"
FEW_SHOT = "mmlu_pro_few_shot_gen_bfaf90"
#: the default config's prompt around the question (the options follow it)
ZERO_SHOT_HEAD = ("Answer the following multiple choice question. The last line of your response should be of the "
                  "following format: 'ANSWER: $LETTER' (without quotes) where LETTER is one of Options(e.g. one of "
                  "ABCDEFGHIJKLMNOP). Think step by step before answering.\n\nQuestion:\n\n")
#: FixKRetriever(fix_id_list=[0, 1, 2, 3, 4]) over the category's validation rows
N_SHOTS = 5


def options_str(options: Sequence[str]) -> tuple[str, list[tuple[str, str]]]:
    """``MMLUProDataset._parse``: "X. text" lines by position, "N/A" options left out (their letters too)."""
    shown = [(LETTERS[i], str(text)) for i, text in enumerate(options) if text != "N/A"]
    return "".join(f"{letter}. {text}\n" for letter, text in shown).strip(), shown


def fewshot_entry(row: dict[str, Any]) -> dict[str, Any]:
    """What the few-shot template reads of one validation row (stored in each test row's extra_info.fewshot)."""
    return {"question": str(row["question"]), "options": [str(o) for o in row["options"]],
            "answer": str(row["answer"])}


def _question_block(question: str, options_text: str) -> str:
    return f"Question:\n{question}\nOptions:\n{options_text}\nAnswer: "


def few_shot_messages(task: Any, item: Item) -> list[dict[str, str]]:
    shots = item.extra.get("fewshot")
    if not shots:
        raise NotBuiltError(f"OpenCompass protocol {FEW_SHOT} is not available for mmlupro item {item.index}: it has "
                            "no validation-split shots (extra_info.fewshot); write the data with "
                            "`dare-bench data get mmlupro --hf`, which reads TIGER-Lab/MMLU-Pro's validation split")
    options_text = option_lines(options_of(item))
    question = framed(item, item.prompt_messages[-1]["content"], ZERO_SHOT_HEAD, f"\n\nOptions:\n\n{options_text}")
    # ice_template + ice_eos_token "\n" per shot, then the prompt template's own question
    examples = "".join(_question_block(s["question"], options_str(s["options"])[0]) + f"{s['answer']}\n"
                       for s in shots)
    return user_turn(f"Answer the following multiple choice question about {item.extra.get('category', '')}, and "
                     f"give your answer option directly.\n{examples}{_question_block(question, options_text)}")


def base_evaluator_grade(task: Any, completion: str, item: Item) -> GradeResult:
    """``MMLUProBaseEvaluator.score`` on one completion: prediction = its first line, stripped."""
    pred = completion.split("\n")[0].strip()
    text = dict(options_of(item)).get(item.ground_truth, "")
    parts = f"{item.ground_truth}. {text}\n".split(". ")  # answer_string; is_equal unpacks exactly two parts
    ok = len(parts) == 2 and ((pred in LETTERS and parts[0] == pred) or parts[1].strip() == pred)
    return GradeResult(ok, float(ok), pred, {"pred": pred})


PROTOCOLS = {
    "mmlu_pro_0shot_cot_gen_08c1de": Protocol(
        "mmlu_pro_0shot_cot_gen_08c1de", "mmlu_pro/mmlu_pro_0shot_cot_gen_08c1de.py", own_messages,
        letter_protocol_grade(lambda text: oc.answer_pattern(text, oc.MMLU_PRO_PATTERN))),
    FEW_SHOT: Protocol(FEW_SHOT, "mmlu_pro/mmlu_pro_few_shot_gen_bfaf90.py", few_shot_messages, base_evaluator_grade),
}


class MMLUProTask(ChoiceTask):
    name = "mmlupro"
    raw_converter = "mmlupro"
    letters = LETTERS
    dare_files = {"test": "mmlupro.parquet"}
    hf_hint = "TIGER-Lab/MMLU-Pro"

    protocols = PROTOCOLS
    default_protocol = "mmlu_pro_0shot_cot_gen_08c1de"

    def make_prompt(self, question: str, options_text: str) -> str:
        return f"{ZERO_SHOT_HEAD}{question}\n\nOptions:\n\n{options_text}"

    def format_answer(self, item: Item, grader: str | None = None) -> str:
        if self.protocol == FEW_SHOT:
            return item.ground_truth
        return f"ANSWER: {item.ground_truth}"
