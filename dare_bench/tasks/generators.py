"""Seeded procedural generators for 4x4 Sudoku and Countdown, producing items in DARE's format.

Tiny reproductions need no download: ``get_task("sudoku").generate(n, seed, split)`` (or ``load()`` without data)
builds puzzles here. The output is a pure function of (n, seed, split, settings): ``random.Random(seed)`` drives every
choice, so the same call gives byte-identical items (and fingerprint) on any machine.

Shapes follow DARE's files: Sudoku test puzzles have 8 blanks, the 20k training set 9; every generated puzzle has
exactly one solution. Countdown uses 3 numbers in 1..100 and a target in 1..100 reachable with +, -, *, / using each
number once (exact integer intermediate results, as in the Countdown-Tasks sets d1 and DARE draw from).

Usage::

    from dare_bench.tasks.generators import generate_sudoku, generate_countdown, solve_sudoku, solve_countdown
    puzzles = generate_sudoku(4, seed=0, blanks=8)      # [(puzzle, solution), ...]
    games = generate_countdown(4, seed=0)               # [(numbers, target, expression), ...]
"""

from __future__ import annotations

import itertools
import random
from fractions import Fraction

# ---------------------------------------------------------------------------------------------- sudoku (4x4)

_UNITS: list[tuple[int, ...]] = (
    [tuple(r * 4 + c for c in range(4)) for r in range(4)]
    + [tuple(r * 4 + c for r in range(4)) for c in range(4)]
    + [tuple((br + r) * 4 + bc + c for r in range(2) for c in range(2)) for br in (0, 2) for bc in (0, 2)]
)
_PEERS: list[set[int]] = [set().union(*(set(u) for u in _UNITS if i in u)) - {i} for i in range(16)]


def sudoku_is_solution(grid: str) -> bool:
    """A complete, rule-abiding 4x4 grid of digits 1-4."""
    if len(grid) != 16 or any(ch not in "1234" for ch in grid):
        return False
    return all(sorted(grid[i] for i in unit) == ["1", "2", "3", "4"] for unit in _UNITS)


def count_sudoku_solutions(puzzle: str, cap: int = 2) -> int:
    """Number of completions of ``puzzle`` ('0' = blank), counting at most ``cap``."""
    cells = list(puzzle)
    for i, ch in enumerate(cells):
        if ch != "0" and any(cells[j] == ch for j in _PEERS[i]):
            return 0
    found = 0

    def search() -> None:
        nonlocal found
        if found >= cap:
            return
        try:
            i = cells.index("0")
        except ValueError:
            found += 1
            return
        used = {cells[j] for j in _PEERS[i]}
        for d in "1234":
            if d not in used:
                cells[i] = d
                search()
                cells[i] = "0"
                if found >= cap:
                    return

    search()
    return found


def solve_sudoku(puzzle: str) -> str | None:
    """The unique completion of ``puzzle``, or None when it has none or several."""
    cells = list(puzzle)
    solutions: list[str] = []

    def search() -> None:
        if len(solutions) > 1:
            return
        try:
            i = cells.index("0")
        except ValueError:
            solutions.append("".join(cells))
            return
        used = {cells[j] for j in _PEERS[i]}
        for d in "1234":
            if d not in used:
                cells[i] = d
                search()
                cells[i] = "0"

    if count_sudoku_solutions(puzzle, cap=2) != 1:
        return None
    search()
    return solutions[0]


def _random_full_grid(rng: random.Random) -> str:
    # a valid base grid, then validity-preserving symmetries: digit relabel, row/col swaps within bands/stacks,
    # band/stack swaps and transposition together reach every 4x4 Sudoku grid (288 of them)
    base = [[(r * 2 + r // 2 + c) % 4 for c in range(4)] for r in range(4)]
    digits = rng.sample(range(1, 5), 4)
    bands = rng.sample([0, 1], 2)
    rows = [b * 2 + r for b in bands for r in rng.sample([0, 1], 2)]
    stacks = rng.sample([0, 1], 2)
    cols = [s * 2 + c for s in stacks for c in rng.sample([0, 1], 2)]
    grid = [[digits[base[r][c]] for c in cols] for r in rows]
    if rng.random() < 0.5:
        grid = [list(col) for col in zip(*grid)]
    return "".join(str(d) for row in grid for d in row)


def make_sudoku_puzzle(rng: random.Random, blanks: int) -> tuple[str, str]:
    """One (puzzle, solution) pair with exactly ``blanks`` empty cells and a unique solution."""
    if not 0 <= blanks <= 12:
        # no 4x4 puzzle with fewer than 4 givens has a unique solution
        raise ValueError(f"blanks must be in 0..12 for a uniquely solvable 4x4 Sudoku, got {blanks}")
    while True:
        solution = _random_full_grid(rng)
        cells = list(solution)
        removed = 0
        for i in rng.sample(range(16), 16):
            if removed == blanks:
                break
            keep = cells[i]
            cells[i] = "0"
            if count_sudoku_solutions("".join(cells)) == 1:
                removed += 1
            else:
                cells[i] = keep
        if removed == blanks:
            return "".join(cells), solution


def generate_sudoku(n: int, seed: int = 0, blanks: int = 8) -> list[tuple[str, str]]:
    """``n`` distinct (puzzle, solution) pairs."""
    rng = random.Random(f"sudoku:{seed}:{blanks}")
    seen: set[str] = set()
    out: list[tuple[str, str]] = []
    attempts = 0
    while len(out) < n:
        attempts += 1
        if attempts > 50 * n + 1000:
            raise ValueError(f"cannot draw {n} distinct 4x4 puzzles with {blanks} blanks")
        puzzle, solution = make_sudoku_puzzle(rng, blanks)
        if puzzle in seen:
            continue
        seen.add(puzzle)
        out.append((puzzle, solution))
    return out


# ---------------------------------------------------------------------------------------------- countdown

_OPS = ("+", "-", "*", "/")


def _apply(op: str, a: Fraction, b: Fraction) -> Fraction | None:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if b == 0:
        return None
    return a / b


def _expressions(values: list[tuple[Fraction, str]]):
    """Every (value, expression) obtainable by combining all of ``values`` with the four operations."""
    if len(values) == 1:
        yield values[0]
        return
    for i, j in itertools.permutations(range(len(values)), 2):
        rest = [values[k] for k in range(len(values)) if k not in (i, j)]
        (a, ea), (b, eb) = values[i], values[j]
        for op in _OPS:
            v = _apply(op, a, b)
            if v is None:
                continue
            yield from _expressions(rest + [(v, f"({ea}{op}{eb})")])


def _strip_outer(expr: str) -> str:
    if expr.startswith("(") and expr.endswith(")"):
        depth = 0
        for k, ch in enumerate(expr):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0 and k < len(expr) - 1:
                return expr
        return expr[1:-1]
    return expr


def solve_countdown(numbers: list[int], target: int) -> str | None:
    """An expression using each number once that evaluates exactly to ``target`` (None if there is none)."""
    for value, expr in _expressions([(Fraction(x), str(x)) for x in numbers]):
        if value == target:
            return _strip_outer(expr)
    return None


def make_countdown_game(rng: random.Random, n_numbers: int = 3, lo: int = 1, hi: int = 100,
                        target_lo: int = 1, target_hi: int = 100,
                        ops: str = "".join(_OPS)) -> tuple[list[int], int, str]:
    """Numbers, a reachable target and one expression reaching it (integer intermediate results only), combining
    the numbers left to right with operations drawn from ``ops``."""
    while True:
        numbers = [rng.randint(lo, hi) for _ in range(n_numbers)]
        order = rng.sample(numbers, len(numbers))
        value, expr = order[0], str(order[0])
        ok = True
        for x in order[1:]:
            op = rng.choice(ops)
            if op == "/" and (x == 0 or value % x):
                ok = False
                break
            value = {"+": value + x, "-": value - x, "*": value * x, "/": value // x if x else 0}[op]
            expr = f"({expr}){op}{x}" if op in "*/" and any(o in expr for o in "+-") else f"{expr}{op}{x}"
        if ok and target_lo <= value <= target_hi:
            return numbers, value, expr


def generate_countdown(n: int, seed: int = 0, n_numbers: int = 3) -> list[tuple[list[int], int, str]]:
    rng = random.Random(f"countdown:{seed}:{n_numbers}")
    return [make_countdown_game(rng, n_numbers) for _ in range(n)]
