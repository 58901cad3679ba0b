"""The `math` task's data (the MATH test set, 5000): `dare-bench data get math --from <OpenCompass's math.json | raw
MATH rows>` / `--hf` (EleutherAI/hendrycks_math's 7 configs, stubbed offline) writes verl rows that load back as the
very items the file gives directly, and a missing file names the command to run.

Sample: tests/fixtures/data/opencompass/math.json (hand-written, OpenCompass's data/math/math.json layout).

    OMP_NUM_THREADS=1 python -m pytest tests/tasks/test_math_data.py -q
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

from dare_bench.errors import DataError
from dare_bench.tasks import data, get_task
from dare_bench.tasks.base import read_rows

from testpaths import FIXTURES

MATH_JSON = FIXTURES / "data" / "opencompass" / "math.json"
PROTOCOLS = ("math_0shot_gen_11c4b5", "math_gen_a58d9d")
SUBJECTS = ["algebra", "counting_and_probability", "geometry", "intermediate_algebra", "number_theory", "prealgebra",
            "precalculus"]


@pytest.fixture(autouse=True)
def _no_data_env(monkeypatch):
    monkeypatch.delenv("DARE_BENCH_DATA", raising=False)


def _math_file() -> data.DataFile:
    files, _ = data.select(["math"])
    assert [f.path for f in files] == ["rl/test/math.parquet"]
    return files[0]


def _pin_rows(monkeypatch, n: int) -> None:
    """The manifest with the MATH file's row count set to the sample's (the real pin is 5000)."""
    real = data.load_manifest()
    small = dataclasses.replace(real, files=tuple(dataclasses.replace(f, rows=n) if f.path == "rl/test/math.parquet"
                                                  else f for f in real.files))
    monkeypatch.setattr(data, "load_manifest", lambda path=None: small)


def _get(args):
    from dare_bench.cli import app

    return CliRunner().invoke(app, ["data", "get", *args, "--json"])


def _item_fields(ds):
    return [(it.index, it.prompt_messages, it.ground_truth, it.extra) for it in ds]


def test_manifest_entry_is_the_full_test_set_from_hendrycks_math():
    f = _math_file()
    assert f.origin == "opencompass" and f.tasks == ("math",) and f.rows == 5000 and f.split == "test"
    assert not (f.sha256 or f.rows_sha256 or f.git_blob)
    assert f.converter == {"name": "opencompass_math", "data_source": "math"}
    assert f.hf["id"] == "EleutherAI/hendrycks_math" and f.hf["configs"] == SUBJECTS and f.hf["split"] == "test"
    assert get_task("math").dare_files == {"test": f.filename}
    # DARE's MATH train file (data name `math` too) stays reachable, and its hint does not name the test set
    assert [g.path for g in data.select(["math_1.parquet"])[0]] == ["rl/train/math_1.parquet"]
    assert data.missing_hint("math") == "; get it with: dare-bench data get math_1.parquet"


def test_missing_data_names_the_data_get_command():
    message = (r"^no data for 'math' \(test\): get it with `dare-bench data get math --hf` \(it writes "
               r"\$DARE_BENCH_DATA/rl/test/math.parquet\), or pass source=<file>$")
    with pytest.raises(DataError, match=message):
        get_task("math").load()
    with pytest.raises(DataError, match=r"not in DARE's repository .*`dare-bench data get math --hf`"):
        data.get(["math"], out="/nonexistent-dare-bench-data")


def test_from_opencompass_json_loads_back_as_the_json_itself(tmp_path, monkeypatch):
    direct = get_task("math").load("test", source=MATH_JSON)
    with pytest.raises(DataError, match=r"math.parquet: 4 rows from the conversion of .*math.json, the benchmark has "
                                        r"5000; nothing written"):  # the real pin
        data.get(["math"], from_path=MATH_JSON, out=tmp_path)
    assert not (tmp_path / "rl").exists()
    _pin_rows(monkeypatch, len(direct))
    res = _get(["math", "--from", str(MATH_JSON), "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    [entry] = json.loads(res.stdout)["files"]
    assert (entry["file"], entry["action"], entry["rows"], entry["checked_by"]) == \
        ("rl/test/math.parquet", "written", 4, "rows")
    prov = json.loads((tmp_path / "rl/test/math.parquet.source.json").read_text())
    assert prov["source"]["kind"] == "local-raw" and prov["source"]["converter"] == "opencompass_math"
    rows = read_rows(tmp_path / "rl/test/math.parquet")
    assert rows[1]["prompt"] == [{"role": "user", "content": "What is $\\sqrt{2}\\cdot\\sqrt{8}+10$?"}]
    assert rows[1]["reward_model"]["ground_truth"] == "14" and rows[1]["extra_info"]["type"] == "Algebra"
    monkeypatch.setenv("DARE_BENCH_DATA", str(tmp_path))
    for protocol in (None, *PROTOCOLS):
        task = get_task("math").with_options({"protocol": protocol} if protocol else None)
        loaded = task.load("test")
        assert loaded.source.endswith("rl/test/math.parquet")
        ref = task.load("test", source=MATH_JSON)
        assert _item_fields(loaded) == _item_fields(ref) == _item_fields(direct)
        assert [task.messages(it) for it in loaded] == [task.messages(it) for it in ref]
    assert [it.ground_truth for it in direct] == ["\\frac{1}{2}", "14", "[2,\\infty)", "120^\\circ"]
    assert direct[0].extra == {"index": 0, "split": "test", "task": "math", "data_source": "math",
                               "level": "Level 1", "type": "Prealgebra",
                               "solution": "Dividing numerator and denominator by 3 gives $\\boxed{\\frac{1}{2}}$."}
    # a second get finds the conversion present
    again = _get(["math", "--from", str(MATH_JSON), "--out", str(tmp_path)])
    assert [e["action"] for e in json.loads(again.stdout)["files"]] == ["present"]


def test_from_raw_math_rows_keeps_a_boxless_solution_as_opencompass_does(tmp_path, monkeypatch):
    records = list(json.loads(MATH_JSON.read_text()).values())
    boxless = {"problem": "Is 7 prime?", "level": "Level 1", "type": "Number Theory",
               "solution": "Yes: its only divisors are 1 and 7."}
    raw = tmp_path / "math_test.jsonl"
    raw.write_text("".join(json.dumps(r) + "\n" for r in [*records, boxless]))
    _pin_rows(monkeypatch, 5)
    out = tmp_path / "data"
    assert _get(["math", "--from", str(raw), "--out", str(out)]).exit_code == 0
    monkeypatch.setenv("DARE_BENCH_DATA", str(out))
    for protocol in PROTOCOLS:
        task = get_task("math").with_options({"protocol": protocol})
        items = task.load("test")
        assert _item_fields(items)[:4] == _item_fields(task.load("test", source=MATH_JSON))
        assert _item_fields(items) == _item_fields(task.load("test", source=raw))
        # MATHDataset's gold for it is None: counted, and no answer is right
        res = task.grade("The answer is \\boxed{Yes}.", items[4], grader="opencompass")
        assert not res.correct and res.details.get("reference") is None
        if protocol == "math_0shot_gen_11c4b5":
            assert task.grade("\\boxed{14}", items[1], grader="opencompass").correct
    with pytest.raises(DataError, match=r"row 0: math raw rows need a solution column"):
        data.convert_rows(_math_file(), [{"problem": "p", "answer": "1"}], "rows")


def test_hf_reads_the_seven_subject_configs_into_one_file(tmp_path, monkeypatch):
    import datasets
    import huggingface_hub

    records = list(json.loads(MATH_JSON.read_text()).values())
    calls = []

    def fake_load(id_, config, split, revision):
        calls.append((id_, config, split, revision))
        return [r for r in records if r["type"].lower() == config]  # the sample's Prealgebra + Algebra rows

    def offline(self, id_, revision):
        raise ConnectionError("offline")

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", offline)
    _pin_rows(monkeypatch, 4)
    res = _get(["math", "--hf", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert calls == [("EleutherAI/hendrycks_math", s, "test", "main") for s in SUBJECTS]
    prov = json.loads((tmp_path / "rl/test/math.parquet.source.json").read_text())
    assert prov["source"]["configs"] == SUBJECTS and prov["rows"] == 4
    monkeypatch.setenv("DARE_BENCH_DATA", str(tmp_path))
    by_subject = [records[i] for i in (1, 2, 0, 3)]  # algebra's rows first, then prealgebra's
    assert [it.prompt_messages[0]["content"] for it in get_task("math").load()] == [r["problem"] for r in by_subject]
