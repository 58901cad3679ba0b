"""`ast.parse` that is safe where graders run in threads (code tasks grade concurrently: `Task.grade_many`).

CPython 3.11 keeps the AST converter's recursion-depth counter in interpreter-wide state (python/cpython gh-106905,
fixed in 3.12), so two threads parsing at once can raise "SystemError: AST constructor recursion depth mismatch" —
seen in CI scoring a correct HumanEval answer wrong. One lock serialises the parse; walking the tree needs none.
The parse is also quiet: generated code such as `[v*7for v in a]` parses with a SyntaxWarning ("invalid decimal
literal") that Python prints to stderr, one line per rollout in a sweep's worker log.
"""

from __future__ import annotations

import ast
import threading
import warnings

_PARSE_LOCK = threading.Lock()


def parse(source: str, mode: str = "exec") -> ast.AST:
    with _PARSE_LOCK, warnings.catch_warnings():
        # under the lock: the filter change is process-wide, and only the parse should be silenced
        warnings.simplefilter("ignore", SyntaxWarning)
        return ast.parse(source, mode=mode)
