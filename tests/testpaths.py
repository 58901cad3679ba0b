"""Paths tests read from: the exactness fixtures and data the repository carries in `tests/fixtures/` (see its
README for where each file came from). Import as `from testpaths import PARITY`: subdirectory conftest.py files
would shadow a `from conftest import ...`."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
PARITY = FIXTURES / "parity"
LOSSES = FIXTURES / "losses"
DARE_DATA = FIXTURES / "data" / "dare"
CHECKPOINTS = FIXTURES / "data" / "checkpoints"
RESEARCH_NOTES = FIXTURES / "docs" / "algorithms.md"
PAPER_TABLES = FIXTURES / "docs" / "paper-tables.md"  # the algorithms' own published tables (reported rows)
OPENCOMPASS_TASK_VERDICTS = FIXTURES / "graders" / "opencompass_tasks" / "verdicts.jsonl"
TASK_SAMPLES = FIXTURES / "data"  # <task>/ small samples in each source's real schema (see its README.md)
OPENCOMPASS_TASK_PROMPTS = FIXTURES / "graders" / "opencompass_tasks" / "prompts.jsonl"
