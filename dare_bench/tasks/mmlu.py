"""MMLU (57 subjects, 14042 test questions, 4 options): DARE's 5-shot generation evaluation.

Follows OpenCompass ``configs/datasets/mmlu/mmlu_gen_a484b3.py`` (what DARE's llada / dream / llada2 example configs
import; yjyddq/DARE @ 83ae8a3 ``opencompass/``): per subject, the first five dev questions as chat turns
("There is a single choice question about <subject>. Answer the question by replying A, B, C or D.\\nQuestion: ...
\\nAnswer: " / "<letter>\\n"), then the test question ("...\\nQ: ...\\nA: "); verdict: ``first_option_postprocess``
(options ABCD) + AccEvaluator (an exact letter). That is the task without a protocol; the task option
``protocol`` (``tasks/protocols.py``, grader ``opencompass`` = ``dare``) names one of the configs DARE's table used,
each under ``configs/datasets/mmlu/`` of DARE's fork:

- ``mmlu_gen_a484b3``: the above.
- ``mmlu_gen_4d595a`` (SDAR-8B): the same five shots, the test turn "...\nQuestion: ...\nAnswer: " (the shots'
  wording); first_option_postprocess (ABCD) + AccwithDetailsEvaluator (``pred == gold``).
- ``mmlu_openai_simple_evals_gen_b618ea`` (SDAR-30B: ``mmlu_gen`` imports it): zero-shot, one user turn, the
  simple-evals instruction ("... 'ANSWER: $LETTER' ... one of ABCD. Think step by step before answering.\n\n
  <question>\n\nA) ...\nD) ..."); ``match_answer_pattern`` with ``(?i)ANSWER\\s*:\\s*([A-D])`` + AccEvaluator
  ("answer: c" extracts "c", which is wrong).
OpenCompass's headline ``mmlu`` is the unweighted mean of the 57 subject accuracies (``mmlu-weighted`` the item
mean); each item carries its ``subject``.

Data: ``dare-bench data get mmlu --hf`` (cais/mmlu ``all``: test + the dev split for the shots; the rows OpenCompass
reads from Hendrycks' CSV files) writes ``$DARE_BENCH_DATA/rl/test/mmlu.parquet``. Raw cais/mmlu rows cannot be
loaded directly: the prompt needs the dev split (convert them with ``tasks.data.convert_table``).
"""

from __future__ import annotations

from typing import Sequence

from dare_bench.tasks.base import Item
from dare_bench.tasks.choice import (
    SIMPLE_EVALS_ABCD,
    ChoiceTask,
    framed,
    letter_protocol_grade,
    option_lines,
    options_of,
)
from dare_bench.tasks.graders import opencompass_choice as oc
from dare_bench.tasks.protocols import Protocol, own_messages, user_turn


def _hint(subject: str) -> str:
    return (f"There is a single choice question about {subject.replace('_', ' ')}. Answer the question by replying "
            f"A, B, C or D.")


def _body(question: str, choices: Sequence[str]) -> str:
    return f"{question}\n" + "\n".join(f"{letter}. {text}" for letter, text in zip("ABCD", choices))


def question_of(item: Item) -> str:
    """The test question, read back from the item's mmlu_gen_a484b3 turn."""
    prefix = f"{_hint(str(item.extra.get('subject', '')))}\nQ: "
    suffix = f"\n{option_lines(options_of(item))}\nA: "
    return framed(item, item.prompt_messages[-1]["content"], prefix, suffix)


def _messages_4d595a(task, item: Item) -> list[dict[str, str]]:
    hint, body = _hint(str(item.extra.get("subject", ""))), option_lines(options_of(item))
    return [dict(m) for m in item.prompt_messages[:-1]] + user_turn(
        f"{hint}\nQuestion: {question_of(item)}\n{body}\nAnswer: ")


def _messages_simple_evals(task, item: Item) -> list[dict[str, str]]:
    return user_turn(SIMPLE_EVALS_ABCD.format(question=question_of(item),
                                              options=option_lines(options_of(item), ") ")))


_FIRST_OPTION = letter_protocol_grade(lambda text: oc.first_option(text, "ABCD"))
PROTOCOLS = {
    "mmlu_gen_a484b3": Protocol("mmlu_gen_a484b3", "mmlu/mmlu_gen_a484b3.py", own_messages, _FIRST_OPTION),
    "mmlu_gen_4d595a": Protocol("mmlu_gen_4d595a", "mmlu/mmlu_gen_4d595a.py", _messages_4d595a, _FIRST_OPTION),
    "mmlu_openai_simple_evals_gen_b618ea": Protocol(
        "mmlu_openai_simple_evals_gen_b618ea", "mmlu/mmlu_openai_simple_evals_gen_b618ea.py", _messages_simple_evals,
        letter_protocol_grade(lambda text: oc.answer_pattern(text, oc.SIMPLE_EVALS_ABCD_PATTERN))),
}


class MMLUTask(ChoiceTask):
    name = "mmlu"
    raw_converter = "mmlu"
    dare_files = {"test": "mmlu.parquet"}
    hf_hint = ""  # an hf: source gives one split; the 5-shot prompt needs the dev split too (`data get --hf`)

    protocols = PROTOCOLS
    default_protocol = "mmlu_gen_a484b3"

    def make_messages(self, subject: str, question: str, choices: Sequence[str],
                      shots: Sequence[tuple[str, Sequence[str], str]]) -> list[dict[str, str]]:
        """The chat OpenCompass builds: five (user, assistant) shot turns, then the question."""
        hint = _hint(subject)
        messages: list[dict[str, str]] = []
        for shot_question, shot_choices, target in shots:
            messages.append({"role": "user", "content": f"{hint}\nQuestion: {_body(shot_question, shot_choices)}"
                                                        f"\nAnswer: "})
            messages.append({"role": "assistant", "content": f"{target}\n"})
        messages.append({"role": "user", "content": f"{hint}\nQ: {_body(question, choices)}\nA: "})
        return messages

    def plain_prompt(self, item: Item) -> str:
        return item.prompt_messages[-1]["content"]

    def format_answer(self, item: Item, grader: str | None = None) -> str:
        if self.protocol == "mmlu_openai_simple_evals_gen_b618ea":
            return f"ANSWER: {item.ground_truth}"
        return f"{item.ground_truth}\n"
