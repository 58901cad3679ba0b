"""`dare-bench eval-suite`: DARE's evaluation table for one released model through the pipeline, on shrunk
checkpoints over small local samples (the path, not the score): stored runs, ours vs reported, resume, shards,
bad input."""

import importlib.util
import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from dare_bench.cli import app
from dare_bench.errors import ConfigError
from dare_bench.pipeline.suite import parse_shard, shrunk_overrides, suite_entries
from dare_bench.registry import load_registry

from testpaths import DARE_DATA

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def local_data(monkeypatch):
    monkeypatch.setenv("DARE_BENCH_DATA", str(DARE_DATA))


def _suite(*args):
    res = CliRunner().invoke(app, ["eval-suite", *args])
    return res, (json.loads(res.stdout) if "--json" in args and res.stdout.strip() else None)


@pytest.mark.integration
def test_a_shrunk_suite_runs_stores_resumes_and_compares(local_data, tmp_path):
    db = f"sqlite:///{tmp_path / 'suite.db'}"
    args = ["sdar", "--shrunk", "--limit", "1", "--benchmarks", "gsm8k,mbpp", "--db", db, "--json"]
    res, out = _suite(*args)
    assert res.exit_code == 0, res.output
    rows = {r["benchmark"]: r for r in out["rows"]}
    assert list(rows) == ["gsm8k", "mbpp"]  # the table's row order
    for r in rows.values():
        assert r["status"] == "finished" and r["modified"] and r["run_id"] is not None
        assert r["ours"] is not None and r["difference"] == pytest.approx(r["ours"] - r["reported"])
        assert r["tokens_per_forward"] > 0
    assert rows["gsm8k"]["reported"] == pytest.approx(91.36) and rows["mbpp"]["reported"] == pytest.approx(71.60)

    from dare_bench.store import Store

    store = Store(db)
    runs = {r["reproduction"]: r for r in store.latest_runs()}
    store.close()
    assert set(runs) == {"released-sdar-gsm8k", "released-sdar-mbpp"}
    assert all(r["scale"] == "paper" and r["status"] == "finished" for r in runs.values())

    again, out2 = _suite(*args)  # an interrupted or repeated suite resumes: finished benchmarks are skipped
    assert again.exit_code == 0 and {r["status"] for r in out2["rows"]} == {"skipped"}
    assert [r["ours"] for r in out2["rows"]] == [r["ours"] for r in out["rows"]]

    text, _ = _suite("sdar", "--shrunk", "--limit", "1", "--benchmarks", "gsm8k", "--db", db)
    assert text.exit_code == 0 and "gsm8k" in text.stdout and "91.36" in text.stdout and "skipped" in text.stdout


@pytest.mark.integration
def test_shards_split_the_benchmarks(local_data, tmp_path):
    db = f"sqlite:///{tmp_path / 'suite.db'}"
    res, out = _suite("llada", "--shrunk", "--limit", "1", "--benchmarks", "gsm8k,humaneval,mbpp", "--shard", "1/2",
                      "--db", db, "--json")
    assert res.exit_code == 0, res.output
    assert [(r["benchmark"], r["status"]) for r in out["rows"]] == [
        ("gsm8k", "other-shard"), ("humaneval", "finished"), ("mbpp", "other-shard")]


def test_a_failing_benchmark_fails_the_suite_not_the_others(monkeypatch, tmp_path):
    monkeypatch.setenv("DARE_BENCH_DATA", str(tmp_path / "nothing"))  # no local data at all
    res, out = _suite("sdar", "--shrunk", "--limit", "1", "--benchmarks", "gsm8k,mbpp", "--db",
                      f"sqlite:///{tmp_path / 's.db'}", "--json")
    assert res.exit_code == 1
    assert [r["status"] for r in out["rows"]] == ["failed", "failed"]
    assert "dare-bench data get gsm8k" in out["rows"][0]["message"]


@pytest.mark.parametrize("args, message", [
    (["lada"], "unknown backbone 'lada'"),
    (["llada", "--benchmarks", "gsm8k,sudoku"], "sudoku not in llada's suite"),
    (["llada", "--shard", "2/2"], "need 0 <= K < N"),
    (["llada", "--shard", "half"], "--shard expects K/N"),
    (["llada", "--shrunk", "--checkpoint", "/x"], "--shrunk builds its own checkpoint"),
])
def test_bad_input_is_one_line(args, message, tmp_path):
    res = subprocess.run([sys.executable, "-m", "dare_bench.cli", "eval-suite", *args, "--db",
                          f"sqlite:///{tmp_path / 'never.db'}"], capture_output=True, text=True)
    assert res.returncode == 2 and message in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "never.db").exists()


def test_shrunk_overrides_keep_the_pinned_shape():
    reg = load_registry()
    ov = lambda name: dict(o.split("=", 1) for o in shrunk_overrides(reg.get(name)))  # noqa: E731
    assert ov("released-llada-gsm8k") == {"eval.sampler.gen_length": "16", "eval.sampler.steps": "16",
                                          "eval.sampler.block_length": "8"}  # 256 / 256 steps, block 8
    assert ov("released-sdar-gsm8k") == {"eval.sampler.gen_length": "16"}  # block 4: whole blocks, steps per block
    assert ov("released-llada2-gsm8k") == {"eval.sampler.gen_length": "32"}  # one block of 32
    order = ("mmlu", "mmlupro", "hellaswag", "arcc", "gsm8k", "math500", "gpqa", "aime2024", "aime2025",
             "olympiadbench", "humaneval", "mbpp")  # DARE's table, top to bottom (SDAR-8B's MATH is MATH-500)
    assert [s.task for s in suite_entries("sdar", registry=reg)] == [
        t for t in order if f"released-sdar-{t}" in reg.names()]
    assert parse_shard("0/3") == (0, 3) and parse_shard(None) is None
    with pytest.raises(ConfigError):
        suite_entries("llada", ["nope"], registry=reg)


def test_the_opencompass_engine_is_for_released_checkpoints_only():
    reg = load_registry()
    assert reg.get("released-sdar-gsm8k").resolve("paper", ["eval.engine=opencompass"]).profile.eval.engine == \
        "opencompass"
    assert "engine" not in reg.get("released-sdar-gsm8k").resolve("paper").profile.eval.model_dump()  # old hashes
    with pytest.raises(ConfigError, match="only evaluation-only reproductions"):
        reg.get("d1-llada-gsm8k").resolve("paper", ["eval.engine=opencompass"])
    with pytest.raises(ConfigError, match="only evaluation-only reproductions"):
        reg.get("baseline-llada-sudoku").resolve("tiny", ["eval.engine=opencompass"])


# --------------------------------------------------------------------- every family, every benchmark (slow)

SAMPLES = {"mmlupro": "mmlupro/test.jsonl", "hellaswag": "hellaswag/validation.jsonl",
           "arcc": "arcc/validation.jsonl", "gpqa": "gpqa/gpqa_diamond.jsonl",
           "olympiadbench": "olympiadbench/test.jsonl", "math": "opencompass/math.json"}


SHOTS_10 = "hellaswag_train_sampled25.jsonl"  # OpenCompass's shot file of the 10-shot config (hand-written sample)


def suite_data(root):
    """A DARE-layout data directory holding small local samples of all twelve benchmarks: DARE's own test files
    where DARE has one, else the hand-written samples converted as `dare-bench data get` converts the real data
    (without its row-count pin, which is about the real data)."""
    import shutil

    from dare_bench.tasks import data
    from dare_bench.tasks.base import read_rows

    from testpaths import TASK_SAMPLES

    for name in ("gsm8k_1", "math500_1", "humaneval_1", "mbpp_1", "aime2024", "aime2025"):
        (root / "rl" / "test").mkdir(parents=True, exist_ok=True)
        shutil.copy(DARE_DATA / "rl" / "test" / f"{name}.parquet", root / "rl" / "test" / f"{name}.parquet")
    tables = {"mmlu": (read_rows(TASK_SAMPLES / "mmlu" / "test.jsonl"),
                       dict(fewshot_rows=read_rows(TASK_SAMPLES / "mmlu" / "dev.jsonl"))),
              "mmlupro": (read_rows(TASK_SAMPLES / "mmlupro" / "test.jsonl"),
                          dict(fewshot_rows=read_rows(TASK_SAMPLES / "mmlupro" / "validation.jsonl"))),
              "hellaswag": (read_rows(TASK_SAMPLES / "hellaswag" / "validation.jsonl"),
                            dict(fewshot_rows=read_rows(TASK_SAMPLES / "hellaswag" / SHOTS_10)))}
    for task, rel in SAMPLES.items():
        if task in tables:
            continue
        path = TASK_SAMPLES / rel
        rows = list(json.loads(path.read_text()).values()) if path.suffix == ".json" else read_rows(path)
        tables[task] = (rows, {})
    for task, (rows, kw) in tables.items():
        f = next(x for x in data.select([task])[0] if x.path.startswith("rl/test/"))
        out = root / f.path
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data.rows_to_parquet(data.convert_rows(f, rows, "sample", **kw)))
    return root


def test_a_cell_whose_shots_are_missing_is_refused_before_any_write(tmp_path, monkeypatch):
    """SDAR-30B's few-shot MMLU-Pro / 10-shot HellaSwag cells need shots in the data (`dare-bench data get
    mmlupro --hf`, `hellaswag --from <OpenCompass data>`); data written without them is refused at the plan."""
    from dare_bench.tasks import data
    from dare_bench.tasks.base import read_rows

    from testpaths import TASK_SAMPLES

    root = tmp_path / "data"
    for task, rel in (("mmlupro", "mmlupro/test.jsonl"), ("hellaswag", "hellaswag/validation.jsonl")):
        f = data.select([task])[0][0]
        (root / f.path).parent.mkdir(parents=True, exist_ok=True)
        (root / f.path).write_bytes(data.rows_to_parquet(data.convert_rows(f, read_rows(TASK_SAMPLES / rel), "s")))
    monkeypatch.setenv("DARE_BENCH_DATA", str(root))
    db = tmp_path / "never.db"
    for name, command in (("released-sdar30b-mmlupro", "dare-bench data get mmlupro --hf"),
                          ("released-sdar30b-hellaswag", "dare-bench data get hellaswag --from")):
        res = subprocess.run([sys.executable, "-m", "dare_bench.cli", "reproduce", name, "--scale", "paper",
                              "--dry-run", "--db", f"sqlite:///{db}"], capture_output=True, text=True)
        assert res.returncode == 2 and "is not available" in res.stderr and command in res.stderr, res.stderr
    assert not db.exists()


@pytest.mark.slow
@pytest.mark.timeout(3600)  # LLaDA2.1's editing decode recomputes the whole prefix: ~15-25 min on a shared CPU
@pytest.mark.parametrize("backbone", ["llada", "dream", "sdar", "sdar30b", "llada2", "llada2.1"])
def test_every_benchmark_of_every_family_on_a_shrunk_checkpoint(backbone, tmp_path, monkeypatch):
    """`eval-suite --shrunk` over small local samples of all twelve benchmarks fills the model's column of the
    leaderboard's evaluation-reproduction page."""
    from dare_bench.leaderboard import data as lb

    monkeypatch.setenv("DARE_BENCH_DATA", str(suite_data(tmp_path / "data")))
    db = f"sqlite:///{tmp_path / 'suite.db'}"
    res, out = _suite(backbone, "--shrunk", "--limit", "1", "--db", db, "--json")
    assert res.exit_code == 0, res.output
    rows = out["rows"]
    assert len(rows) == 12 and all(r["status"] == "finished" for r in rows), [r for r in rows if r["message"]]
    cells = lb.eval_reproduction(lb.open_reader(db), include_modified=True)
    mine = cells[cells["backbone"] == backbone]
    assert len(mine) == 12 and (mine["runs"] == 1).all() and mine["reported"].notna().all()


@pytest.mark.extra
@pytest.mark.skipif(importlib.util.find_spec("opencompass") is not None,
                    reason="checks the message shown when the extra is missing")
def test_a_dry_run_through_opencompass_without_the_extra_fails_like_the_run(tmp_path):
    res = subprocess.run([sys.executable, "-m", "dare_bench.cli", "reproduce", "released-sdar-gsm8k", "--scale",
                          "paper", "--dry-run", "eval.engine=opencompass"], capture_output=True, text=True,
                         env={**__import__("os").environ, "DARE_BENCH_DATA": str(DARE_DATA)})
    assert res.returncode == 2 and "opencompass is not installed" in res.stderr
