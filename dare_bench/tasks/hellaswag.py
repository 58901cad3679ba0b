"""HellaSwag (10042 validation contexts, 4 endings): DARE's generation evaluation, and SDAR-30B's 10-shot variant.

Follows OpenCompass ``configs/datasets/hellaswag/hellaswag_gen_6faab5.py`` (every DARE example config but SDAR-30B's):
"<ctx>\\nQuestion: Which ending makes the most sense?\\nA. ...\\nD. ...\\nYou may choose from 'A', 'B', 'C', 'D'.\\n
Answer:"; verdict: ``first_option_postprocess`` (ABCD) + AccEvaluator. ``HellaswagDataset_V2`` reads OpenCompass's
hellaswag.jsonl (``query`` = "<activity label>: <context>", ``choices``, ``gold``) and shows the text after the
first ": " of the query.

Task option ``protocol``:
- ``hellaswag_gen_6faab5``: the above (the default).
- ``hellaswag_10shot_gen_e42710`` (SDAR-30B's ``hellaswag_gen``): ``HellaswagDatasetwithICE`` +
  ``FixKRetriever(fix_id_list=range(10))``: the first ten rows of OpenCompass's own
  ``hellaswag_train_sampled25.jsonl`` as alternating turns, user "<ctx>\\nA) ...\\nD) ...\\nWhat is the right
  option?" / assistant "<letter>\\n", the first user turn led by "Continue the following text without adding any
  additional information or formatting:\\n" (a separate HUMAN turn in the config, joined with "\\n" by DARE's model
  wrappers), then the item's own user turn. Verdict: ``first_option_postprocess`` (ABCD) + AccwithDetailsEvaluator
  (an exact letter, as above). That file is in OpenCompass's data bundle only (not on any index): the shots are the
  items' ``extra_info.fewshot`` (its rows: query, choices, gold), which
  ``dare-bench data get hellaswag --from <OpenCompass data/hellaswag folder>`` stores (converting the
  hellaswag.jsonl beside it, the very file that config evaluates). Items without them refuse the protocol with one
  NotBuiltError naming that command and the file.

Data: ``dare-bench data get hellaswag --hf`` (Rowan/hellaswag validation) -> ``rl/test/hellaswag.parquet``, or
``--from DIR`` (OpenCompass's hellaswag.jsonl + hellaswag_train_sampled25.jsonl, shots included). The ``--hf``
converter rebuilds the query and endings with the lm-evaluation-harness preprocessing that OpenCompass's file
carries (activity_label + ": " + ctx_a + " " + ctx_b capitalised; " [title]" -> ". ", other [bracketed] tags
dropped, double spaces collapsed); OpenCompass's own jsonl could not be compared offline. Raw rows of either layout
load directly (without shots).
"""

from __future__ import annotations

from typing import Any, Sequence

from dare_bench.errors import NotBuiltError
from dare_bench.tasks.base import Item
from dare_bench.tasks.choice import ChoiceTask, framed, letter_protocol_grade, options_of
from dare_bench.tasks.graders import opencompass_choice as oc
from dare_bench.tasks.protocols import Protocol, own_messages

TEN_SHOT = "hellaswag_10shot_gen_e42710"
#: OpenCompass's data file of the 10-shot config's shots (its data bundle: data/hellaswag/)
SHOTS_FILE = "hellaswag_train_sampled25.jsonl"
#: FixKRetriever(fix_id_list=list(range(10)))
N_SHOTS = 10
QUESTION = "\nQuestion: Which ending makes the most sense?\n"
CHOOSE = "You may choose from 'A', 'B', 'C', 'D'.\nAnswer:"
INSTRUCTION = "Continue the following text without adding any additional information or formatting:\n"


def _ending_lines(endings: Sequence[str], sep: str) -> str:
    return "".join(f"{letter}{sep}{text}\n" for letter, text in zip("ABCD", endings))


def _ten_shot_question(ctx: str, endings: Sequence[str]) -> str:
    return f"{ctx}\n{_ending_lines(endings, ') ')}What is the right option?"


def ten_shot_messages(task: Any, item: Item) -> list[dict[str, str]]:
    shots = item.extra.get("fewshot")
    if not shots:
        raise NotBuiltError(
            f"OpenCompass protocol {TEN_SHOT} is not available for hellaswag item {item.index}: it has no shots "
            f"(extra_info.fewshot, the first {N_SHOTS} rows of OpenCompass's {SHOTS_FILE}); write the data with "
            f"`dare-bench data get hellaswag --from DIR`, DIR = OpenCompass's data/hellaswag folder holding "
            f"hellaswag.jsonl and {SHOTS_FILE}")
    endings = [text for _, text in options_of(item)]
    ctx = framed(item, item.prompt_messages[-1]["content"], "", QUESTION + _ending_lines(endings, ". ") + CHOOSE)
    turns = []
    for shot in shots:
        shot_ctx = str(shot["query"]).split(": ", 1)[-1]  # HellaswagDatasetwithICE
        turns += [{"role": "user", "content": _ten_shot_question(shot_ctx, shot["choices"])},
                  {"role": "assistant", "content": "ABCD"[int(shot["gold"])] + "\n"}]
    turns.append({"role": "user", "content": _ten_shot_question(ctx, endings)})
    turns[0] = {"role": "user", "content": INSTRUCTION + "\n" + turns[0]["content"]}
    return turns


PROTOCOLS = {
    "hellaswag_gen_6faab5": Protocol("hellaswag_gen_6faab5", "hellaswag/hellaswag_gen_6faab5.py", own_messages,
                                     letter_protocol_grade(lambda text: oc.first_option(text, "ABCD"))),
    TEN_SHOT: Protocol(TEN_SHOT, "hellaswag/hellaswag_10shot_gen_e42710.py", ten_shot_messages,
                       letter_protocol_grade(lambda text: oc.first_option(text, "ABCD"))),
}


class HellaSwagTask(ChoiceTask):
    name = "hellaswag"
    raw_converter = "hellaswag"
    dare_files = {"test": "hellaswag.parquet"}
    hf_hint = "Rowan/hellaswag"

    protocols = PROTOCOLS
    default_protocol = "hellaswag_gen_6faab5"

    def make_prompt(self, ctx: str, endings: Sequence[str]) -> str:
        return f"{ctx}{QUESTION}{_ending_lines(endings, '. ')}{CHOOSE}"
