"""`dare-bench eval-suite --engine opencompass`: the same released entries through the OpenCompass plug-in give
the same completions and verdicts as the native engine on the same (shrunk) checkpoint, and the runs record the
engine. Without the extra: one line, before anything is shrunk or stored.

Runs with the extra only (its own venv, numpy<2; .ci/run's OpenCompass step):
    /tmp/ocvenv/bin/python -m pytest tests/pipeline/test_eval_suite_opencompass.py -q
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from testpaths import DARE_DATA

HAVE_OC = importlib.util.find_spec("opencompass") is not None
pytestmark = [pytest.mark.extra, pytest.mark.usefixtures("one_thread")]


def _suite(tmp_path, db, *args):
    env = {"DARE_BENCH_DATA": str(DARE_DATA), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "DARE_BENCH_HOME": str(tmp_path / "home")}
    return subprocess.run([sys.executable, "-m", "dare_bench.cli", "eval-suite", "sdar", "--shrunk", "--limit", "2",
                           "--benchmarks", "gsm8k,mbpp", "--db", db, "--json", *args], capture_output=True, text=True,
                          env={**os.environ, **env})


@pytest.mark.skipif(HAVE_OC, reason="checks the message shown when the extra is missing")
def test_without_the_extra_nothing_runs(tmp_path):
    db = tmp_path / "s.db"
    res = _suite(tmp_path, f"sqlite:///{db}", "--engine", "opencompass")
    assert res.returncode == 2 and "opencompass is not installed" in res.stderr
    assert not db.exists() and not (tmp_path / "home" / "shrunk").exists()


@pytest.mark.skipif(not HAVE_OC, reason="opencompass extra not installed (pip install 'dare-bench[opencompass]')")
def test_opencompass_engine_equals_native_on_the_same_checkpoint(tmp_path):
    from dare_bench.store import Store

    db = f"sqlite:///{tmp_path / 's.db'}"
    native = _suite(tmp_path, db)
    assert native.returncode == 0, native.stderr[-2000:]
    oc = _suite(tmp_path, db, "--engine", "opencompass")
    assert oc.returncode == 0, oc.stderr[-2000:]
    rows_n, rows_o = json.loads(native.stdout)["rows"], json.loads(oc.stdout)["rows"]
    assert [r["status"] for r in rows_o] == ["finished", "finished"]  # another config: not a skip of native's
    assert [r["ours"] for r in rows_o] == [r["ours"] for r in rows_n]
    store = Store(db)
    by_run = {}
    for run in store.latest_runs():
        final = next(e for e in run["evaluations"] if e["checkpoint"] == "final")
        samples = [(s["idx"], s["completion"], s["correct"]) for s in store.samples(final["id"])]
        by_run[(run["reproduction"], run["config"]["profile"]["eval"].get("engine", "native"))] = samples
    store.close()
    for name in ("released-sdar-gsm8k", "released-sdar-mbpp"):
        assert by_run[(name, "opencompass")] == by_run[(name, "native")], name
