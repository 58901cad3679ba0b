"""Named graders shared by the task files: ``dare`` (default), ``d1``, ``strict``, and ``opencompass`` (only on a
task with an OpenCompass ``protocol`` option set: ``opencompass_protocols.py``, see ``tasks/protocols.py``).

Each module reproduces one official grader rule for rule and documents every quirk it keeps:
``dare.py`` (DARE's ``dllm_rm``), ``d1.py`` (d1's ``reward_func.py`` rewards + ``parse_and_get_acc.py`` verdicts),
``strict.py`` (dare-bench's own, closing exploitable quirks). Helpers: ``hendrycks.py`` (d1's two copies of the
MATH normalisation), ``sympy_grader.py`` (DARE's sympy answer check), ``safe_eval.py`` (Python ``eval`` semantics for
Countdown expressions without the hang on huge powers).
"""

from dare_bench.errors import ConfigError

#: what each grader reproduces, for run records (bump the strict version whenever its rules change)
GRADER_SOURCES: dict[str, str] = {
    "dare": "DARE verl/utils/reward_score dllm_rm (math_reward.py, code_reward.py; read at hxhcreate/DARE@f4999da, "
            "a fork of yjyddq/DARE)",
    "d1": "dllm-reasoning/d1 diffu-grpo/reward_func.py@4bab4b9 + math500_utils.py; eval/parse_and_get_acc.py + "
          "parser_helper.py (read through forks SimonCao1207/d1, xiaohangt/wd1)",
    "strict": "dare-bench strict v1",
    "opencompass": "OpenCompass's pred_postprocessor + evaluator of the task's protocol (dataset config) in DARE's "
                   "fork yjyddq/DARE@83ae8a3 opencompass/ (= OpenCompass 0.5.4 except MBPPEvaluator): "
                   "graders/opencompass_protocols.py",
}


def grader_source(name: str) -> str:
    if name not in GRADER_SOURCES:
        raise ConfigError(f"unknown grader {name!r}; known: {', '.join(sorted(GRADER_SOURCES))}")
    return GRADER_SOURCES[name]
