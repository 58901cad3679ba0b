"""Paths tests read from (the shared fixtures and data beside the repo). Import as `from testpaths import PARITY`:
subdirectory conftest.py files would shadow a `from testpaths import ...`."""

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("DARE_BENCH_SHARED", REPO.parent / "shared"))
PARITY = SHARED / "fixtures" / "parity"
LOSSES = SHARED / "fixtures" / "losses"
DARE_DATA = SHARED / "data" / "dare"
CHECKPOINTS = SHARED / "data" / "checkpoints"
