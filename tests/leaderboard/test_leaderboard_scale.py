"""The leaderboard's queries on 10,000 runs and 1,000,000 step-metric rows: aggregated and limited in SQL.

Timings are printed (`pytest -s` shows them), never asserted: the shared CI cores make wall-clock thresholds
flaky. What is asserted is what keeps the app responsive: every query returns a bounded number of rows.
"""

import json
import sqlite3
import time

import pytest
from streamlit.testing.v1 import AppTest

from dare_bench.leaderboard import data as L
from dare_bench.store import Store

from lb_helpers import APP

N_RUNS = 10_000
STEPS = 100  # x N_RUNS = 1,000,000 metric rows
ALGORITHMS = ["baseline", "sft", "d1", "bgpo", "spg", "vrpo", "mdpo", "espo", "cj-grpo", "coupled-grpo"]
BACKBONES = ["llada", "dream", "sdar", "llada2"]
TASKS = ["sudoku", "countdown", "gsm8k", "math500", "humaneval", "mbpp"]
SCALES = ["tiny", "micro"]


@pytest.fixture(scope="module")
def big_db(tmp_path_factory):
    path = tmp_path_factory.mktemp("big") / "big.db"
    url = f"sqlite:///{path}"
    Store(url).close()  # the store's own schema, at HEAD
    t0 = time.perf_counter()
    conn = sqlite3.connect(path)
    now = "2026-11-30 00:00:00.000000"
    runs = []
    for i in range(N_RUNS):
        a, b = ALGORITHMS[i % 10], BACKBONES[(i // 10) % 4]
        t, s = TASKS[(i // 40) % 6], SCALES[(i // 240) % 2]
        cfg = json.dumps({"reproduction": f"{a}-{b}-{t}", "algorithm": a, "backbone": b, "task": t, "scale": s})
        runs.append((i + 1, f"uid{i}", f"{a}-{b}-{t}", a, b, t, s, cfg, f"{i:064d}", 0, "[]", i // 480, "v", "{}",
                     "{}", "finished", now, now, 1.0, "local"))
    conn.executemany(
        "INSERT INTO runs (id, uid, reproduction, algorithm, backbone, task, scale, config_json, config_hash, "
        "modified, overrides_json, seed, code_version, packages_json, hardware_json, status, started_at, "
        "finished_at, duration_s, origin) VALUES (" + ",".join("?" * 20) + ")", runs)
    # The winner of every (backbone, task, scale) is coupled-grpo (index 9): score grows with the algorithm index.
    for checkpoint, offset in (("base", 0.0), ("final", 1.0)):
        conn.execute(f"""
            INSERT INTO evaluations (run_id, task, split, data_fingerprint, sampler_preset, sampler_json, metrics_json,
                                     primary_metric, primary_value, n_items, checkpoint, step, created_at, uid)
            SELECT id, task, 'test', 'fp', 'preset', '{{}}', '{{}}', 'accuracy',
                   0.05 * ((id - 1) % 10) * {offset} + 0.001 * (seed % 5), 100, '{checkpoint}', 0, '{now}',
                   '{checkpoint}' || id FROM runs""")
    conn.execute(f"""
        WITH RECURSIVE steps(step) AS (SELECT 1 UNION ALL SELECT step + 1 FROM steps WHERE step < {STEPS})
        INSERT INTO step_metrics (run_id, step, reward_mean, reward_std, loss, kl, entropy, tokens_per_forward,
                                  peak_memory_mb, stage_seconds_json, extra_json, logged_at)
        SELECT r.id, s.step, s.step * 0.01, 0.1, 1.0 / s.step, 0.001 * s.step, 2.0, 1.5, 100.0,
               '{{"rollout": 1.5, "update": 0.5}}', '{{}}', '{now}'
        FROM runs r CROSS JOIN steps s""")
    conn.commit()
    counts = [conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in ("runs", "step_metrics")]
    conn.close()
    print(f"\n[scale] built {counts[0]} runs / {counts[1]} metric rows in {time.perf_counter() - t0:.1f} s")
    assert counts == [N_RUNS, N_RUNS * STEPS]
    return url


def _timed(label, fn, *args, **kwargs):
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    n = len(out[0]) if isinstance(out, tuple) else len(out)
    print(f"[scale] {label}: {time.perf_counter() - t0:.3f} s, {n} rows")
    return out


def test_queries_stay_aggregated_on_10k_runs_and_1m_metric_rows(big_db):
    engine = L.open_reader(big_db)
    ov = _timed("overview", L.overview, engine)
    assert ov["runs"] == N_RUNS and len(ov["backbones"]) == 4
    sel = dict(backbone="llada", scale="micro")
    cells = _timed("winners", L.winners, engine, **sel)
    assert len(cells) == len(ALGORITHMS) * len(TASKS)  # one row per cell, whatever the number of runs
    assert L.task_winners(cells) == {t: ["coupled-grpo"] for t in TASKS}
    expected = sum(BACKBONES[(i // 10) % 4] == "llada" and SCALES[(i // 240) % 2] == "micro" for i in range(N_RUNS))
    assert cells["n"].sum() == expected  # every micro llada run, each counted once
    _timed("reported vs reproduced", L.reported_vs_reproduced, cells, L.reported_scores(engine, "llada")[0], None)
    one = dict(sel, task="sudoku")
    curves = _timed("curves (mean per algorithm)", L.curves, engine, **one)
    assert len(curves) == (len(ALGORITHMS)) * STEPS  # STEPS < MAX_CURVE_POINTS: every step, averaged over runs
    small = _timed("curves (downsampled to 20 points)", L.curves, engine, **one, max_points=20)
    assert len(small) <= len(ALGORITHMS) * 20
    stages = _timed("stage times", L.stage_times, engine, **one)
    assert len(stages) == len(ALGORITHMS) * 2
    runs = _timed("runs page", L.runs_page, engine, **one, limit=50)
    assert len(runs) <= 50
    run_id = int(runs["run_id"].iloc[0])
    _timed("run detail", lambda: [L.run_detail(engine, run_id)])
    _timed("run curve", L.run_curve, engine, run_id)


def test_app_renders_on_the_big_database(monkeypatch, big_db):
    monkeypatch.setenv("DARE_BENCH_DB", big_db)
    t0 = time.perf_counter()
    at = AppTest.from_file(str(APP), default_timeout=120).run()
    print(f"[scale] first full page render (AppTest): {time.perf_counter() - t0:.1f} s")
    assert not at.exception, at.exception
    winners = next(t for t in at.tabs if t.label == "Winners")
    assert "coupled-grpo" in winners.markdown[0].value
    overview = next(t for t in at.tabs if t.label == "Overview").dataframe[0].value
    assert len(overview) and set(overview["winner"]) <= set(winners.dataframe[0].value.index)
