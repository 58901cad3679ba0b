"""`ast.parse` that is safe where graders run in threads (code tasks grade concurrently: `Task.grade_many`).

CPython 3.11 keeps the AST converter's recursion-depth counter in interpreter-wide state (python/cpython gh-106905,
fixed in 3.12), so two threads parsing at once can raise "SystemError: AST constructor recursion depth mismatch" —
seen in CI scoring a correct HumanEval answer wrong. One lock serialises the parse; walking the tree needs none.
"""

from __future__ import annotations

import ast
import threading

_PARSE_LOCK = threading.Lock()


def parse(source: str, mode: str = "exec") -> ast.AST:
    with _PARSE_LOCK:
        return ast.parse(source, mode=mode)
