"""4x4 Sudoku (d1 / DARE): puzzle as a 16-character string, '0' = blank; answer inside ``<answer>`` tags.

Standard data: DARE's ``rl/test/sudoku_1.parquet`` (500 puzzles, 8 blanks) and ``rl/train/sudoku-n20000_1.parquet``
(20 000, 9 blanks); without them, the seeded generator (same prompt text, same blank counts). Also reads d1's CSV
(columns ``Puzzle``, ``Solution``). Graders: ``dare`` (cell-fraction reward = accuracy), ``d1`` (training reward +
``parse_and_get_acc`` cell accuracy), ``strict`` (a full valid grid or nothing).

    task = get_task("sudoku"); ds = task.generate(8, seed=0)
    task.format_prompt(ds[0])            # "sudoku 3102200002100320\n"
    task.format_answer(ds[0])            # "<answer>3142243142131324</answer>"
"""

from __future__ import annotations

from typing import Any

from dare_bench.errors import DataError
from dare_bench.tasks.base import GraderFn, Item, Task, TaskDataset, sha256_items
from dare_bench.tasks.generators import generate_sudoku, solve_sudoku
from dare_bench.tasks.graders import d1, dare, strict

# DARE's prompt text (d1's Sudoku system prompt, sent as the user turn), verified against every row of DARE's files
SUDOKU_PROMPT = (
    "Please solve the following 4x4 Sudoku puzzle. The puzzle is provided as a 16-character string reading "
    "left-to-right, top-to-bottom, where '0' represents empty cells.\n\n"
    "Rules:\n- Fill empty cells with digits 1-4\n- Each row must contain digits 1-4 exactly once\n"
    "- Each column must contain digits 1-4 exactly once\n- Each 2x2 box must contain digits 1-4 exactly once\n\n"
    "Important: Your solution must be a COMPLETE 16-character string with only the digits 1-4, representing your "
    "final solved grid.\n\nRespond in this exact format:\n<reasoning>\nYour step-by-step solving process\n"
    "</reasoning>\n<answer>\n[16-character solution string with no spaces or separators]\n</answer>\n\n\n"
    "Solve the following Sudoku puzzle: {puzzle}\n"
)

BLANKS = {"test": 8, "train": 9}


# d1's eval/sudoku.py instruction (starts and ends with a newline); question "Solve the following Sudoku puzzle: P\n"
D1_EVAL_PROMPT = "\n" + SUDOKU_PROMPT.split("\n\n\nSolve the following")[0] + "\n"

class SudokuTask(Task):
    name = "sudoku"
    d1_eval_prompt = D1_EVAL_PROMPT
    dare_files = {"test": "sudoku_1.parquet", "train": "sudoku-n20000_1.parquet"}
    hf_hint = "<a dataset with Puzzle/Solution columns>"
    has_generator = True

    def build_graders(self) -> dict[str, GraderFn]:
        return {"dare": dare.grade_sudoku, "d1": d1.grade_sudoku, "strict": strict.grade_sudoku}

    def default_generated_size(self, split: str) -> int:
        return 500 if split == "test" else 20000

    def make_item(self, index: int, puzzle: str, solution: str, split: str) -> Item:
        return Item(
            index=index,
            prompt_messages=[{"role": "user", "content": SUDOKU_PROMPT.format(puzzle=puzzle)}],
            ground_truth=solution,
            extra={"index": index, "puzzle": puzzle, "split": split, "task": "math", "data_source": "sudoku"},
        )

    def row_to_item(self, row: dict[str, Any], index: int, split: str) -> Item:
        keys = {k.lower(): k for k in row}
        if "puzzle" not in keys or "solution" not in keys:
            raise DataError(f"sudoku rows need Puzzle and Solution columns, got {sorted(row)}")
        item = self.make_item(index, str(row[keys["puzzle"]]).strip(), str(row[keys["solution"]]).strip(), split)
        self.check_item(item)
        return item

    def check_item(self, item: Item) -> None:
        puzzle = str(item.extra.get("puzzle", ""))
        if len(puzzle) != 16 or not puzzle.isdigit() or len(item.ground_truth) != 16:
            raise DataError(f"sudoku item {item.index}: puzzle and solution must be 16-digit strings")

    def generate(self, n: int, seed: int = 0, split: str = "test") -> TaskDataset:
        pairs = generate_sudoku(n, seed=seed, blanks=BLANKS.get(split, 8))
        items = [self.make_item(i, p, s, split) for i, (p, s) in enumerate(pairs)]
        source = f"generator:sudoku(seed={seed},n={n},blanks={BLANKS.get(split, 8)})"
        return TaskDataset(self.name, split, items, source=source, fingerprint=sha256_items(items))

    def d1_eval_question(self, item: Item) -> str:
        return f"Solve the following Sudoku puzzle: {item.extra['puzzle']}\n"

    def plain_prompt(self, item: Item) -> str:
        return f"sudoku {item.extra['puzzle']}\n"

    def format_answer(self, item: Item, grader: str | None = None) -> str:
        solution = item.ground_truth or solve_sudoku(str(item.extra["puzzle"]))
        return f"<answer>{solution}</answer>"
