"""ARC-Challenge: DARE's generation evaluation, on the ARC-Challenge *dev* (validation) split.

Follows OpenCompass ``configs/datasets/ARC_c/ARC_c_gen.py`` -> ``ARC_c_gen_1e0de5.py`` (every DARE example config):
"Question: <stem>\\nA. ...\\nD. ...\\nAnswer:"; verdict: ``first_option_postprocess`` (ABCD) + AccEvaluator. Its dataset
``opencompass/ai2_arc-dev`` is ``ARC-Challenge-Dev.jsonl``: the 299-question validation split, not the 1172-question
test split; ``ARCDataset`` drops the questions without exactly four choices and maps the answer key ("1".."4" or
"A".."D") to its position's letter. Task option ``protocol``: ``ARC_c_gen_1e0de5`` (the only one; every cell).

Data: ``dare-bench data get arcc --hf`` (allenai/ai2_arc ARC-Challenge validation) -> ``rl/test/arcc.parquet``; raw
rows (Hugging Face: question, choices {text, label}, answerKey; or the ARC jsonl: question {stem, choices}) load
directly, and both drop the questions without four choices as ``ARCDataset`` does (``extra_info.source_index`` keeps
the row's place in the file).
"""

from __future__ import annotations

from typing import Sequence

from dare_bench.tasks.choice import ChoiceTask, letter_protocol_grade
from dare_bench.tasks.graders import opencompass_choice as oc
from dare_bench.tasks.protocols import Protocol, own_messages

PROTOCOLS = {
    "ARC_c_gen_1e0de5": Protocol("ARC_c_gen_1e0de5", "ARC_c/ARC_c_gen_1e0de5.py", own_messages,
                                 letter_protocol_grade(lambda text: oc.first_option(text, "ABCD"))),
}


class ARCChallengeTask(ChoiceTask):
    name = "arcc"
    raw_converter = "arcc"
    dare_files = {"test": "arcc.parquet"}
    hf_hint = "allenai/ai2_arc:ARC-Challenge"

    protocols = PROTOCOLS
    default_protocol = "ARC_c_gen_1e0de5"

    def make_prompt(self, question: str, choices: Sequence[str]) -> str:
        lines = "\n".join(f"{letter}. {text}" for letter, text in zip("ABCD", choices))
        return f"Question: {question}\n{lines}\nAnswer:"
