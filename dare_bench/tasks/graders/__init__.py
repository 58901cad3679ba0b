"""Named graders shared by the task files: ``dare`` (default), ``d1``, ``strict``.

Each module reproduces one official grader rule for rule and documents every quirk it keeps:
``dare.py`` (DARE's ``dllm_rm``), ``d1.py`` (d1's ``reward_func.py`` rewards + ``parse_and_get_acc.py`` verdicts),
``strict.py`` (dare-bench's own, closing exploitable quirks). Helpers: ``hendrycks.py`` (d1's two copies of the
MATH normalisation), ``sympy_grader.py`` (DARE's sympy answer check), ``safe_eval.py`` (Python ``eval`` semantics for
Countdown expressions without the hang on huge powers).
"""
