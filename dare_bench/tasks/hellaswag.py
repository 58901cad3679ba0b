"""HellaSwag (10042 validation contexts, 4 endings): DARE's generation evaluation.

Follows OpenCompass ``configs/datasets/hellaswag/hellaswag_gen_6faab5.py`` (every DARE example config but SDAR-30B's):
"<ctx>\\nQuestion: Which ending makes the most sense?\\nA. ...\\nD. ...\\nYou may choose from 'A', 'B', 'C', 'D'.\\n
Answer:"; verdict: ``first_option_postprocess`` (ABCD) + AccEvaluator. ``HellaswagDataset_V2`` reads OpenCompass's
hellaswag.jsonl (``query`` = "<activity label>: <context>", ``choices``, ``gold``) and shows the text after the
first ": " of the query. Task option ``protocol``: ``hellaswag_gen_6faab5`` (the above, the only one implemented;
SDAR-30B's ``hellaswag_gen`` -> ``hellaswag_10shot_gen_e42710`` needs the first ten rows of OpenCompass's own
``hellaswag_train_sampled25.jsonl`` as shots, which the task's data does not carry).

Data: ``dare-bench data get hellaswag --hf`` (Rowan/hellaswag validation) -> ``rl/test/hellaswag.parquet``. The
converter rebuilds the query and endings with the lm-evaluation-harness preprocessing that file carries
(activity_label + ": " + ctx_a + " " + ctx_b capitalised; " [title]" -> ". ", other [bracketed] tags dropped, double
spaces collapsed); OpenCompass's own jsonl could not be compared offline. Raw rows of either layout load directly.
"""

from __future__ import annotations

from typing import Sequence

from dare_bench.tasks.choice import ChoiceTask, letter_protocol_grade
from dare_bench.tasks.graders import opencompass_choice as oc
from dare_bench.tasks.protocols import Protocol, own_messages, unavailable

PROTOCOLS = {
    "hellaswag_gen_6faab5": Protocol("hellaswag_gen_6faab5", "hellaswag/hellaswag_gen_6faab5.py", own_messages,
                                     letter_protocol_grade(lambda text: oc.first_option(text, "ABCD"))),
    # SDAR-30B's cell: 10 shots from OpenCompass's own hellaswag_train_sampled25.jsonl, which is not on any index
    "hellaswag_10shot_gen_e42710": unavailable(
        "hellaswag_10shot_gen_e42710", "hellaswag/hellaswag_10shot_gen_e42710.py",
        "its 10 shots come from OpenCompass's own data file hellaswag_train_sampled25.jsonl, which dare-bench does "
        "not ship; the zero-shot hellaswag_gen_6faab5 runs"),
}


class HellaSwagTask(ChoiceTask):
    name = "hellaswag"
    raw_converter = "hellaswag"
    dare_files = {"test": "hellaswag.parquet"}
    hf_hint = "Rowan/hellaswag"

    protocols = PROTOCOLS
    default_protocol = "hellaswag_gen_6faab5"

    def make_prompt(self, ctx: str, endings: Sequence[str]) -> str:
        lines = "".join(f"{letter}. {text}\n" for letter, text in zip("ABCD", endings))
        return (f"{ctx}\nQuestion: Which ending makes the most sense?\n{lines}"
                "You may choose from 'A', 'B', 'C', 'D'.\nAnswer:")
