"""The evaluation-reproduction page: DARE's 12 x 6 table from `released` runs, its protocol variants, and the
separation from the algorithm comparison (the same checkpoint under another protocol)."""

import hashlib

import pytest
from streamlit.testing.v1 import AppTest

from dare_bench.leaderboard import data
from dare_bench.registry import load_registry
from dare_bench.store import EvaluationRecord, Store

from lb_helpers import APP, add_run


def _released(store, backbone, task, value, *, sampler, modified=False, seed=0, algorithm="released"):
    name = f"{algorithm}-{backbone}-{task}"
    key = f"{name}/{sorted(sampler.items())}/{modified}/{seed}"
    cfg = {"reproduction": name, "algorithm": algorithm, "backbone": backbone, "task": task, "scale": "paper",
           "content_hash": hashlib.sha256(key.encode()).hexdigest(), "modified": modified,
           "overrides": ["eval.sampler.extra.use_cache=none"] if modified else [], "train": {"kind": "none"}}
    run_id = store.start_run(cfg, seed=seed, code_version="test", packages={}, hardware={})
    ev = EvaluationRecord(task=task, split="test", data_fingerprint="fp", sampler_preset="dare-oc", sampler=sampler,
                          metrics={"accuracy": value, "tokens_per_forward": 2.0}, primary_metric="accuracy",
                          checkpoint="final", step=0)
    store.finish_run(run_id, [ev])
    return run_id


PREFIX = {"gen_length": 256, "block_length": 8, "steps": 256, "use_cache": "prefix", "temperature": 0.0}
NO_CACHE = {**PREFIX, "use_cache": None}


@pytest.fixture(scope="module")
def eval_db(tmp_path_factory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('lb') / 'eval.db'}"
    store = Store(url)
    _released(store, "llada", "gsm8k", 0.80, sampler=PREFIX, seed=0)
    _released(store, "llada", "gsm8k", 0.78, sampler=PREFIX, seed=1)
    _released(store, "llada", "gsm8k", 0.70, sampler=NO_CACHE, modified=True)  # a protocol variant
    _released(store, "sdar", "math500", 0.75, sampler={"gen_length": 4096, "block_length": 4, "threshold": 1.0})
    add_run(store, "baseline", 0.50, task="gsm8k", scale="paper")  # the algorithm comparison's protocol
    add_run(store, "d1", 0.60, task="gsm8k", scale="paper")
    store.sync_reported(load_registry())
    store.close()
    return url


def test_the_table_pairs_released_runs_with_dares_cells(eval_db):
    engine = data.open_reader(eval_db)
    cells = data.eval_reproduction(engine).set_index(["row", "backbone"])
    assert len(cells) == 72
    gsm = cells.loc[("gsm8k", "llada")]
    assert gsm["reported"] == pytest.approx(79.68) and gsm["ours"] == pytest.approx(79.0) and gsm["runs"] == 2
    assert gsm["variants"] == 1 and gsm["tokens_per_forward"] == pytest.approx(2.0)
    assert cells.loc[("math", "sdar")]["ours"] == pytest.approx(75.0)  # SDAR-8B's MATH row is MATH-500
    assert cells.loc[("math", "sdar")]["reported"] == pytest.approx(78.40)
    empty = cells.loc[("gsm8k", "llada2.1")]
    assert empty["runs"] == 0 and pd_isnull(empty["ours"]) and empty["reported"] == pytest.approx(86.13)
    matrix = data.eval_reproduction_matrix(data.eval_reproduction(engine))
    assert matrix.shape == (12, 6) and matrix.loc["GSM8K", "LLaDA-8B"] == "79.00 / 79.68"
    assert matrix.loc["GSM8K", "LLaDA2.1-mini"] == "— / 86.13"


def test_protocol_variants_show_their_spread(eval_db):
    engine = data.open_reader(eval_db)
    gsm = data.eval_reproduction(engine, include_modified=True).set_index(["row", "backbone"]).loc[("gsm8k", "llada")]
    assert gsm["variants"] == 2
    assert gsm["spread_min"] == pytest.approx(70.0) and gsm["spread_max"] == pytest.approx(79.0)
    runs = data.released_runs(engine, include_modified=True)
    variants = set(runs[(runs["backbone"] == "llada") & (runs["task"] == "gsm8k")]["variant"])
    assert len(variants) == 2 and any('"use_cache": "prefix"' in v for v in variants)
    matrix = data.eval_reproduction_matrix(data.eval_reproduction(engine, include_modified=True))
    assert matrix.loc["GSM8K", "LLaDA-8B"] == "76.00 / 79.68 [70.00–79.00, 2 variants]"


def test_the_algorithm_comparison_never_sees_released_runs(eval_db):
    engine = data.open_reader(eval_db)
    cells = data.winners(engine, backbone="llada", scale="paper", include_modified=True)
    assert set(cells["algorithm"]) == {"baseline", "d1"}
    assert data.released_runs(engine)["backbone"].tolist() == ["llada", "llada", "sdar"]


def test_the_page(monkeypatch, eval_db):
    monkeypatch.setenv("DARE_BENCH_DB", eval_db)
    at = AppTest.from_file(str(APP), default_timeout=90).run()
    assert not at.exception, at.exception
    tab = next(t for t in at.tabs if t.label == "Evaluation reproduction")
    matrix = tab.dataframe[0].value
    assert matrix.loc["GSM8K", "LLaDA-8B"] == "79.00 / 79.68" and matrix.loc["MATH", "SDAR-8B-Chat"] == "75.00 / 78.40"
    assert at.selectbox(key="eval_cell").options[0] == "LLaDA-8B · GSM8K"
    assert len(tab.dataframe[1].value) == 2  # the cell's runs (the modified variant hidden by default)
    at.checkbox(key="modified").check().run()
    tab = next(t for t in at.tabs if t.label == "Evaluation reproduction")
    assert "2 variants" in tab.dataframe[0].value.loc["GSM8K", "LLaDA-8B"] and len(tab.dataframe[1].value) == 3


def pd_isnull(v) -> bool:
    import pandas as pd

    return v is None or pd.isna(v)
