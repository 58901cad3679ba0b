"""MMLU (57 subjects, 14042 test questions, 4 options): DARE's 5-shot generation evaluation.

Follows OpenCompass ``configs/datasets/mmlu/mmlu_gen_a484b3.py`` (what DARE's llada / dream / llada2 example configs
import; yjyddq/DARE @ 83ae8a3 ``opencompass/``): per subject, the first five dev questions as chat turns
("There is a single choice question about <subject>. Answer the question by replying A, B, C or D.\\nQuestion: ...
\\nAnswer: " / "<letter>\\n"), then the test question ("...\\nQ: ...\\nA: "); verdict: ``first_option_postprocess``
(options ABCD) + AccEvaluator (an exact letter). SDAR's configs import ``mmlu_gen_4d595a`` (the same, but
"Question:" / "Answer: " in the last turn) and SDAR-30B ``mmlu_gen``: those prompts are not this task's.
OpenCompass's headline ``mmlu`` is the unweighted mean of the 57 subject accuracies (``mmlu-weighted`` the item
mean); each item carries its ``subject``.

Data: ``dare-bench data get mmlu --hf`` (cais/mmlu ``all``: test + the dev split for the shots; the rows OpenCompass
reads from Hendrycks' CSV files) writes ``$DARE_BENCH_DATA/rl/test/mmlu.parquet``. Raw cais/mmlu rows cannot be
loaded directly: the prompt needs the dev split (convert them with ``tasks.data.convert_table``).
"""

from __future__ import annotations

from typing import Sequence

from dare_bench.tasks.base import GraderFn, Item
from dare_bench.tasks.choice import ChoiceTask, letter_grader
from dare_bench.tasks.graders import opencompass_choice as oc


def _hint(subject: str) -> str:
    return (f"There is a single choice question about {subject.replace('_', ' ')}. Answer the question by replying "
            f"A, B, C or D.")


def _body(question: str, choices: Sequence[str]) -> str:
    return f"{question}\n" + "\n".join(f"{letter}. {text}" for letter, text in zip("ABCD", choices))


class MMLUTask(ChoiceTask):
    name = "mmlu"
    raw_converter = "mmlu"
    dare_files = {"test": "mmlu.parquet"}
    hf_hint = ""  # an hf: source gives one split; the 5-shot prompt needs the dev split too (`data get --hf`)

    def build_graders(self) -> dict[str, GraderFn]:
        grade = letter_grader(lambda text: oc.first_option(text, "ABCD"))
        # DARE scores this benchmark only through OpenCompass: its rule is both `dare` and `opencompass`
        return {"dare": grade, "opencompass": grade}

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
        return f"{item.ground_truth}\n"
