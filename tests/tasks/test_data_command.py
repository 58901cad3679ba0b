"""`dare-bench data get | list | verify` (dare_bench/tasks/data.py, tasks/commands.py), offline: copies from a local
DARE folder checked against the manifest's pins, conversions of raw (Hugging Face layout) rows that must rebuild
DARE's rows exactly, and every bad input refused with one error and nothing written.

The raw fixtures are built from the first rows of DARE's own files (tests/fixtures/data/dare, unchanged copies of
yjyddq/DARE@83ae8a3 data/preprocessed/rl): e.g. for gsm8k the question is DARE's user turn and the HF-style answer is
"<work>\\n#### <gt>"; the converter must give back DARE's row. sudoku / countdown and the code RL sets come from
DARE's files only (no converter), so they are tested as copies.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from dare_bench.errors import DataError
from dare_bench.tasks import data, get_task
from dare_bench.tasks.base import read_rows, sha256_file

from testpaths import DARE_DATA

HUMANEVAL_PREFIX = "Complete the following python code:\n"
MBPP_HEAD = "You are an expert Python programmer, and here is your task: "


@pytest.fixture(autouse=True)
def _no_data_env(monkeypatch):
    monkeypatch.delenv("DARE_BENCH_DATA", raising=False)


def dare_rows(path: str, n: int | None = None) -> list[dict]:
    rows = read_rows(DARE_DATA / path)
    return rows if n is None else rows[:n]


def file_of(path: str) -> data.DataFile:
    files, _ = data.select([path])
    assert len(files) == 1
    return files[0]


def all_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


# ------------------------------------------------------------------------------------------- raw fixtures per task
def raw_gsm8k(row):
    return {"question": row["prompt"][0]["content"],
            "answer": "Some worked steps <<1+1=2>>.\n#### " + row["reward_model"]["ground_truth"]}


def raw_math(row):
    return {"problem": row["prompt"][0]["content"], "answer": row["reward_model"]["ground_truth"],
            "subject": "Algebra", "level": 3}


def raw_humaneval(row):
    content = row["prompt"][0]["content"]
    assert content.startswith(HUMANEVAL_PREFIX)
    return {"task_id": f"HumanEval/{row['extra_info']['index']}", "prompt": content[len(HUMANEVAL_PREFIX):],
            "test": row["reward_model"]["ground_truth"], "entry_point": "f", "canonical_solution": "    pass\n"}


def raw_mbpp(row):
    task = row["prompt"][-2]["content"]
    text = task[len(MBPP_HEAD): task.index(" Your code should pass these tests:")]
    return {"task_id": 11 + row["extra_info"]["index"], "text": text, "code": "pass",
            "test_list": json.loads(row["reward_model"]["ground_truth"]), "test_setup_code": "",
            "challenge_test_list": []}


CONVERSIONS = [
    ("rl/test/gsm8k_1.parquet", raw_gsm8k),
    ("rl/train/gsm8k_1.parquet", raw_gsm8k),
    ("rl/test/math500_1.parquet", raw_math),
    ("rl/train/math_1.parquet", raw_math),
    ("rl/test/humaneval_1.parquet", raw_humaneval),
    ("rl/test/mbpp_1.parquet", raw_mbpp),
]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------- the manifest
def test_manifest_pins_are_those_of_dares_files():
    """sha256, git blob id, row count and rows pin of every DARE file the fixtures hold (the code RL sets: pin by
    git blob only, sha256 / rows unknown, said so in the manifest)."""
    m = data.load_manifest()
    assert m.dare["commit"].startswith("83ae8a3") and m.dare["folder"] == "data/preprocessed/rl"
    checked = 0
    for f in m.files:
        path = DARE_DATA / f.path
        if f.name.endswith("-K8"):
            assert f.sha256 is None and f.rows is None and len(f.git_blob) == 40 and f.tasks == ("humaneval", "mbpp")
            continue
        if not f.from_dare:  # a benchmark DARE evaluates through OpenCompass: only dare-bench's conversion exists
            assert f.origin == "opencompass" and not (f.sha256 or f.git_blob or f.rows_sha256)
            assert f.converter["name"] in data.TABLE_CONVERTERS and f.hf["id"] and f.tasks == (f.name,)
            continue
        assert f.sha256 and f.rows_sha256 and f.git_blob and f.license
        if not path.is_file():
            continue  # countdown-n20000_1.parquet is left out of the fixture copy
        raw = path.read_bytes()
        assert sha256_file(path) == f.sha256 and data.git_blob_id(raw) == f.git_blob
        rows = read_rows(path)
        assert len(rows) == f.rows and data.rows_sha256(rows) == f.rows_sha256
        checked += 1
    assert checked >= 11
    # every task's standard files are in the manifest; the procedural tasks need none
    for name in ("sudoku", "countdown", "gsm8k", "math500", "math", "humaneval", "mbpp", "mmlu", "mmlupro",
                 "hellaswag", "arcc", "gpqa", "aime2024", "aime2025", "olympiadbench"):
        for fname in get_task(name).dare_files.values():
            assert any(f.filename == fname for f in m.files), (name, fname)
    assert set(m.procedural) == {"arith", "pyfunc"}
    assert {f.name for f in data.code_rl_files()} == {"lcbv5-K8", "primeintellect-K8", "taco-K8"}


def test_names_resolve_to_files_and_unknown_names_suggest():
    files, procedural = data.select(["gsm8k", "arith", "countdown-n20000", "rl/test/mbpp_1.parquet"])
    assert [f.path for f in files] == ["rl/test/gsm8k_1.parquet", "rl/train/gsm8k_1.parquet",
                                       "rl/test/mbpp_1.parquet", "rl/train/countdown-n20000_1.parquet"]
    assert procedural == ["arith"]
    assert [f.path for f in data.select(["math500"])[0]] == ["rl/test/math500_1.parquet", "rl/train/math_1.parquet"]
    assert len(data.select(["all"])[0]) == len(data.load_manifest().files)
    with pytest.raises(DataError, match=r"unknown data name 'gsm8kk'; did you mean 'gsm8k'\?"):
        data.select(["gsm8kk"])
    with pytest.raises(DataError, match=r"did you mean 'lcbv5-K8'"):
        data.select(["lcbv5-k8"])


# ------------------------------------------------------------------------------------------- copies from DARE
@pytest.mark.parametrize("layout", ["rl", "checkout"])
def test_copy_from_a_local_dare_folder_is_sha_checked_and_recorded(layout, tmp_path, monkeypatch):
    if layout == "rl":
        src = DARE_DATA  # a folder laid out rl/<split>/
    else:  # a DARE checkout: data/preprocessed/rl/<split>/
        src = tmp_path / "DARE"
        for rel in ("test/gsm8k_1.parquet", "train/gsm8k_1.parquet", "test/sudoku_1.parquet",
                    "train/sudoku-n20000_1.parquet"):
            (src / "data/preprocessed/rl" / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(DARE_DATA / "rl" / rel, src / "data/preprocessed/rl" / rel)
    out = tmp_path / "data"
    report = data.get(["gsm8k", "sudoku", "pyfunc"], from_path=src, out=out)
    assert report["procedural"] == ["pyfunc"]
    assert [e["action"] for e in report["files"]] == ["written"] * 4
    for e in report["files"]:
        f = file_of(e["file"])
        target = out / f.path
        assert sha256_file(target) == f.sha256 and e["checked_by"] == "sha256"
        prov = json.loads((out / (f.path + ".source.json")).read_text())
        assert prov["source"]["kind"] == "dare-local"
        assert prov["source"]["commit"] == data.load_manifest().dare["commit"]
        assert prov["source"]["dare_path"] == f"data/preprocessed/rl/{f.split}/{f.filename}"
        assert prov["sha256"] == f.sha256 and prov["rows"] == f.rows and prov["written_at"]
    assert not [p for p in all_files(out) if p.name.endswith(".tmp")]
    # the loaders read what was written
    monkeypatch.setenv("DARE_BENCH_DATA", str(out))
    ds = get_task("gsm8k").load("test", limit=3)
    assert ds.fingerprint == file_of("rl/test/gsm8k_1.parquet").sha256
    # a second get finds them present; verify agrees
    again = data.get(["gsm8k"], from_path=src, out=out)
    assert [e["action"] for e in again["files"]] == ["present", "present"]
    assert data.verify(out)["status"] == "ok"


def test_download_from_github_is_the_pinned_commit_and_checked(tmp_path, monkeypatch):
    """The default source (network only inside the command): DARE's raw URL at the pinned commit; stubbed here."""
    urls = []

    def fake_download(url, progress, label):
        urls.append(url)
        return (DARE_DATA / "rl/test/humaneval_1.parquet").read_bytes()

    monkeypatch.setattr(data, "_download", fake_download)
    report = data.get(["humaneval"], out=tmp_path)
    assert urls == ["https://raw.githubusercontent.com/yjyddq/DARE/83ae8a305a53a914cce563aedceeac88566891cb/"
                    "data/preprocessed/rl/test/humaneval_1.parquet"]
    assert report["files"][0]["action"] == "written"
    prov = json.loads((tmp_path / "rl/test/humaneval_1.parquet.source.json").read_text())
    assert prov["source"]["kind"] == "dare-github" and prov["source"]["url"] == urls[0]
    # a download that is not DARE's file is refused, nothing written
    monkeypatch.setattr(data, "_download", lambda url, progress, label: b"<html>rate limited</html>")
    with pytest.raises(DataError, match=r"rl/test/mbpp_1.parquet: sha256 mismatch"):
        data.get(["mbpp"], out=tmp_path / "other")
    assert all_files(tmp_path / "other") == []


def tampered_copy(tmp_path: Path, rel: str) -> Path:
    """A DARE folder whose `rel` has one ground truth changed."""
    src = tmp_path / "tampered"
    (src / rel).parent.mkdir(parents=True)
    df = pd.read_parquet(DARE_DATA / rel)
    rm = dict(df.at[0, "reward_model"])
    rm["ground_truth"] = "999999"
    df.at[0, "reward_model"] = rm
    df.to_parquet(src / rel)
    return src


def test_a_tampered_file_is_one_mismatch_error_and_nothing_is_written(tmp_path):
    src = tampered_copy(tmp_path, "rl/train/gsm8k_1.parquet")
    (src / "rl/test").mkdir()
    shutil.copy(DARE_DATA / "rl/test/gsm8k_1.parquet", src / "rl/test/gsm8k_1.parquet")
    out = tmp_path / "data"
    with pytest.raises(DataError) as exc:
        data.get(["gsm8k"], from_path=src, out=out)
    msg = str(exc.value)
    f = file_of("rl/train/gsm8k_1.parquet")
    assert msg.startswith("rl/train/gsm8k_1.parquet: sha256 mismatch") and f"expected {f.sha256}" in msg
    assert f"got {sha256_file(src / f.path)}" in msg and "nothing written" in msg and "\n" not in msg
    assert all_files(out) == []  # the good test file (checked first) was not written either: all checks come first


def test_verify_finds_a_tampered_file_and_accepts_a_conversion(tmp_path):
    root = tmp_path / "data"
    data.get(["rl/test/humaneval_1.parquet"], from_path=write_jsonl(
        tmp_path / "he.jsonl", [raw_humaneval(r) for r in dare_rows("rl/test/humaneval_1.parquet")]), out=root)
    assert {f["file"]: f["status"] for f in data.verify(root)["files"]}["rl/test/humaneval_1.parquet"] in (
        "ok", "ok-rows")
    src = tampered_copy(tmp_path, "rl/test/sudoku_1.parquet")
    shutil.copy(src / "rl/test/sudoku_1.parquet", root / "rl/test/sudoku_1.parquet")
    report = data.verify(root)
    assert report["status"] == "mismatch" and report["mismatched"] == ["rl/test/sudoku_1.parquet"]
    res = CliRunner().invoke(_app(), ["data", "verify", "--dir", str(root), "--json"])
    assert res.exit_code == 2 and json.loads(res.stdout)["mismatched"] == ["rl/test/sudoku_1.parquet"]


# ------------------------------------------------------------------------------------------- conversions
@pytest.mark.parametrize("path, make_raw", CONVERSIONS, ids=[p for p, _ in CONVERSIONS])
def test_hf_format_rows_convert_to_exactly_dares_rows(path, make_raw, tmp_path):
    expected = dare_rows(path, 12)
    raw = [make_raw(r) for r in expected]
    f = file_of(path)
    converted = data.convert_rows(f, raw, "fixture")
    assert converted == expected  # prompt text, ground truth, extra_info, data_source
    # and through parquet, as the command writes it
    assert data.parquet_rows(data.rows_to_parquet(converted), "x") == expected


@pytest.mark.parametrize("path, make_raw", [CONVERSIONS[4], CONVERSIONS[5]], ids=["humaneval", "mbpp"])
def test_a_whole_raw_file_converts_to_the_pinned_rows(path, make_raw, tmp_path):
    raw_file = write_jsonl(tmp_path / "raw.jsonl", [make_raw(r) for r in dare_rows(path)])
    out = tmp_path / "data"
    report = data.get([path], from_path=raw_file, out=out)
    assert report["files"][0]["checked_by"] == "rows_sha256"
    f = file_of(path)
    assert read_rows(out / path) == dare_rows(path)
    prov = json.loads((out / (path + ".source.json")).read_text())
    assert prov["source"]["kind"] == "local-raw" and prov["source"]["converter"] == f.converter["name"]
    assert prov["converter_version"] == data.CONVERTER_VERSION and prov["rows_sha256"] == f.rows_sha256


def test_hf_source_converts_and_records_the_revision(tmp_path, monkeypatch):
    """`--hf` through a stubbed `datasets.load_dataset` (no network in tests)."""
    import datasets

    rows = [raw_gsm8k(r) for r in dare_rows("rl/test/gsm8k_1.parquet")]
    calls = []

    def fake_load(id_, config, split, revision):
        calls.append((id_, config, split, revision))
        return rows

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info",
                        lambda self, id_, revision: type("Info", (), {"sha": "c0ffee" * 6 + "beef"})())
    report = data.get(["rl/test/gsm8k_1.parquet"], hf=True, revision="abc123", out=tmp_path)
    assert calls == [("openai/gsm8k", "main", "test", "abc123")]
    assert report["files"][0]["checked_by"] == "rows_sha256"
    prov = json.loads((tmp_path / "rl/test/gsm8k_1.parquet.source.json").read_text())
    assert prov["source"]["kind"] == "hf" and prov["source"]["revision"] == "abc123"
    assert prov["source"]["commit"].startswith("c0ffee")
    # HF rows that are not DARE's (here: a truncated split) fail the rows pin, nothing written
    rows[:] = rows[:5]
    with pytest.raises(DataError, match=r"rows sha256 mismatch .*5 rows, pinned 1319.*nothing written"):
        data.get(["rl/test/gsm8k_1.parquet"], hf=True, out=tmp_path / "other")
    assert all_files(tmp_path / "other") == []
    # a file without a Hugging Face source: said before any work
    with pytest.raises(DataError, match=r"no Hugging Face source for rl/test/sudoku_1.parquet"):
        data.get(["sudoku"], hf=True, out=tmp_path / "other")


# ------------------------------------------------------------------------------------------- bad input
def test_a_local_file_with_the_wrong_columns_is_refused(tmp_path):
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"query": "1+1?", "label": "2"}])
    out = tmp_path / "data"
    with pytest.raises(DataError, match=r"bad.jsonl: row 0: gsm8k raw rows need a question or problem column "
                                        r"\(columns: label, query\)"):
        data.get(["rl/test/gsm8k_1.parquet"], from_path=bad, out=out)
    verl_bad = tmp_path / "verl.parquet"
    pd.DataFrame([{"prompt": [{"role": "user", "content": "x"}], "reward_model": {"ground_truth": "1"}}]).to_parquet(
        verl_bad)
    with pytest.raises(DataError, match=r"sha256 mismatch"):
        data.get(["rl/test/gsm8k_1.parquet"], from_path=verl_bad, out=out)
    with pytest.raises(DataError, match=r"comes from DARE's repository only"):
        data.get(["rl/test/sudoku_1.parquet"], from_path=bad, out=out)
    with pytest.raises(DataError, match=r"a file fills exactly one data file; name one of rl/test/gsm8k_1.parquet, "
                                        r"rl/train/gsm8k_1.parquet"):
        data.get(["gsm8k"], from_path=bad, out=out)
    assert all_files(out) == []


@pytest.mark.parametrize("path, row, message", [
    ("rl/test/humaneval_1.parquet", {"prompt": "def f():\n", "test": "  "}, "a humaneval row with no tests"),
    ("rl/test/humaneval_1.parquet", {"prompt": "def f():\n"}, "humaneval raw rows need a test or tests column"),
    ("rl/test/mbpp_1.parquet", {"text": "Write f.", "test_list": []}, "an mbpp row with no tests"),
    ("rl/test/mbpp_1.parquet", {"text": "Write f.", "test_list": "assert f()"}, "neither a list nor a JSON list"),
])
def test_a_code_row_without_tests_is_refused(path, row, message, tmp_path):
    good = [raw_humaneval(r) if "humaneval" in path else raw_mbpp(r) for r in dare_rows(path, 3)]
    raw = write_jsonl(tmp_path / "raw.jsonl", [*good, row])
    with pytest.raises(DataError, match=rf"raw.jsonl: row 3: .*{message}"):
        data.get([path], from_path=raw, out=tmp_path / "data")
    assert all_files(tmp_path / "data") == []


def test_code_rl_sets_are_pinned_by_git_blob_and_their_missing_file_error_says_what_to_get(tmp_path, monkeypatch):
    from dare_bench.tasks.mixtures import resolve_entry

    fake = tmp_path / "dare" / "rl" / "train"
    fake.mkdir(parents=True)
    shutil.copy(DARE_DATA / "rl/train/gsm8k_1.parquet", fake / "taco-K8_1.parquet")
    with pytest.raises(DataError, match=r"taco-K8_1.parquet: git blob id mismatch .*expected "
                                        r"829eea0e46e9c3609a66cd3639655b760a6d9fae"):
        data.get(["taco-K8"], from_path=tmp_path / "dare", out=tmp_path / "data")
    assert all_files(tmp_path / "data") == []
    monkeypatch.setenv("DARE_BENCH_DATA", str(tmp_path / "data"))
    with pytest.raises(DataError) as exc:
        resolve_entry(get_task("mbpp"), "lcbv5-K8")
    msg = str(exc.value)
    assert msg.startswith("train.data entry 'lcbv5-K8': no file at") and "\n" not in msg
    for name in ("lcbv5-K8", "primeintellect-K8", "taco-K8"):
        assert f"rl/train/{name}_1.parquet" in msg
    assert "preprocess_sampled.py" in msg and "yjyddq/DARE@83ae8a3" in msg
    assert msg.endswith("dare-bench data get lcbv5-K8 primeintellect-K8 taco-K8")


def test_dry_run_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "_download", lambda *a: pytest.fail("a dry run downloads nothing"))
    out = tmp_path / "data"
    report = data.get(["all", "arith"], out=out, dry_run=True)
    assert report["dry_run"] and report["procedural"] == ["arith"]
    assert {e["action"] for e in report["files"]} == {"would write", "skipped"}
    assert [e["file"] for e in report["files"] if e["action"] == "skipped"] == [
        f.path for f in data.load_manifest().files if not f.from_dare]
    assert any("raw.githubusercontent.com/yjyddq/DARE/83ae8a3" in e["source"] for e in report["files"])
    assert not out.exists()
    res = CliRunner().invoke(_app(), ["data", "get", "gsm8k", "--from", str(DARE_DATA), "--out", str(out),
                                      "--dry-run", "--json"])
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    assert payload["status"] == "ok" and [e["action"] for e in payload["files"]] == ["would write"] * 2
    assert not out.exists()


# ------------------------------------------------------------------------------------------- the CLI
def _app():
    from dare_bench.cli import app

    return app


@pytest.mark.parametrize("args", [["data", "--help"], ["data", "list", "--help"], ["data", "get", "--help"],
                                  ["data", "verify", "--help"]])
def test_every_data_command_has_help(args):
    res = CliRunner().invoke(_app(), args)
    assert res.exit_code == 0 and "Usage" in res.output


def test_list_json_and_get_json(tmp_path):
    runner = CliRunner()
    res = runner.invoke(_app(), ["data", "list", "--json"])
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    assert payload["root"] is None and payload["procedural"] == ["arith", "pyfunc"]
    by_file = {f["file"]: f for f in payload["files"]}
    assert by_file["rl/test/gsm8k_1.parquet"]["sources"][0] == "dare"
    assert by_file["rl/test/gsm8k_1.parquet"]["hf"]["id"] == "openai/gsm8k"
    assert by_file["rl/train/taco-K8_1.parquet"]["sha256"] is None
    res = runner.invoke(_app(), ["data", "get", "rl/test/sudoku_1.parquet", "--from", str(DARE_DATA), "--out",
                                 str(tmp_path), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["files"][0]["action"] == "written"
    res = runner.invoke(_app(), ["data", "list", "--dir", str(tmp_path), "--json"])
    statuses = {f["file"]: f["status"] for f in json.loads(res.stdout)["files"]}
    assert statuses["rl/test/sudoku_1.parquet"] == "ok" and statuses["rl/test/gsm8k_1.parquet"] == "missing"
    res = runner.invoke(_app(), ["data", "verify", "--dir", str(tmp_path), "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["status"] == "ok"


def test_cli_errors_are_one_line_and_exit_2(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DARE_BENCH_DATA": str(tmp_path / "data")}
    res = subprocess.run([sys.executable, "-m", "dare_bench.cli", "data", "get", "sudokku", "--json"],
                         capture_output=True, text=True, env=env)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    payload = json.loads(res.stdout.strip().splitlines()[-1])
    assert payload["error_type"] == "DataError" and "did you mean 'sudoku'" in payload["error"]
    assert not (tmp_path / "data").exists()


# ------------------------------------------------------------------------------------------- OpenCompass benchmarks
def test_opencompass_benchmarks_convert_from_the_hub_rows(tmp_path, monkeypatch):
    """`data get mmlu olympiadbench gpqa --hf` through a stubbed `datasets.load_dataset`: MMLU's dev split goes to
    the converter, OlympiadBench's configs land in one file, a count pin refuses a short split, gated ids say so."""
    import datasets

    from testpaths import TASK_SAMPLES

    samples = {("cais/mmlu", "all", "test"): "mmlu/test.jsonl", ("cais/mmlu", "all", "dev"): "mmlu/dev.jsonl",
               ("Hothan/OlympiadBench", "OE_TO_maths_en_COMP", "train"): "olympiadbench/test.jsonl"}
    calls = []

    def fake_load(id_, config, split, revision):
        calls.append((id_, config, split))
        if id_ == "Idavidrein/gpqa":
            raise ConnectionError("401 Client Error: this dataset is gated")
        return read_rows(TASK_SAMPLES / samples[(id_, config, split)]) if (id_, config, split) in samples else []

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    import huggingface_hub

    def offline(self, id_, revision):
        raise ConnectionError("offline")  # the provenance record's Hub commit is optional

    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", offline)
    with pytest.raises(DataError, match=r"rl/test/mmlu.parquet: 3 rows from .*the benchmark has 14042; nothing"):
        data.get(["mmlu"], hf=True, out=tmp_path)
    assert calls == [("cais/mmlu", "all", "test"), ("cais/mmlu", "all", "dev")]
    mmlu = data.select(["mmlu"])[0][0]
    real = data.load_manifest()  # the sample's 3 questions stand for the pinned 14042
    small = dataclasses.replace(real, files=tuple(dataclasses.replace(f, rows=3) if f == mmlu else f
                                                  for f in real.files))
    monkeypatch.setattr(data, "load_manifest", lambda path=None: small)
    mmlu = dataclasses.replace(mmlu, rows=3)
    report = data.get(["mmlu", "olympiadbench"], hf=True, out=tmp_path)
    assert [(e["file"], e["rows"], e["checked_by"]) for e in report["files"]] == [
        ("rl/test/mmlu.parquet", 3, "rows"), ("rl/test/olympiadbench.parquet", 5, "unchecked")]
    prov = json.loads((tmp_path / "rl/test/olympiadbench.parquet.source.json").read_text())
    assert prov["source"]["configs"][0] == "OE_TO_maths_en_COMP" and len(prov["rows_sha256"]) == 64
    items = get_task("olympiadbench").rows_to_items(read_rows(tmp_path / "rl/test/olympiadbench.parquet"), "test",
                                                    "the written file")  # (its load also needs the judge's parser)
    assert items[0].extra["category"] == "OE_TO_maths_en_COMP" and items[0].ground_truth == "$\\frac{1}{2}$"
    monkeypatch.setenv("DARE_BENCH_DATA", str(tmp_path))
    assert len(get_task("mmlu").load()) == 3
    assert data.present_status(mmlu, tmp_path)["status"] == "ok-rows"
    with pytest.raises(DataError, match=r"Idavidrein/gpqa is gated: accept its terms at https://huggingface.co/"):
        data.get(["gpqa"], hf=True, out=tmp_path)
    # without --hf: these have no DARE file
    with pytest.raises(DataError, match=r"not in DARE's repository .*`dare-bench data get mmlu --hf`"):
        data.get(["mmlu"], out=tmp_path / "other")


def test_mmlupro_hub_conversion_stores_the_validation_shots(tmp_path, monkeypatch):
    """`data get mmlupro --hf` reads the validation split too: each row carries its category's five shots, the
    default prompt is untouched (what the raw rows give)."""
    import datasets

    from testpaths import TASK_SAMPLES

    calls = []

    def fake_load(id_, config, split, revision):
        calls.append(split)
        return read_rows(TASK_SAMPLES / "mmlupro" / f"{split}.jsonl")

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    mmlupro = data.select(["mmlupro"])[0][0]
    real = data.load_manifest()
    small = dataclasses.replace(real, files=tuple(dataclasses.replace(f, rows=3) if f == mmlupro else f
                                                  for f in real.files))
    monkeypatch.setattr(data, "load_manifest", lambda path=None: small)
    data.get(["mmlupro"], hf=True, out=tmp_path)
    assert calls == ["test", "validation"]
    written = get_task("mmlupro").rows_to_items(read_rows(tmp_path / "rl/test/mmlupro.parquet"), "test", "file")
    raw = get_task("mmlupro").rows_to_items(read_rows(TASK_SAMPLES / "mmlupro/test.jsonl"), "test", "raw")
    assert [it.prompt_messages for it in written] == [it.prompt_messages for it in raw]
    assert [len(it.extra["fewshot"]) for it in written] == [5, 5, 5]
    assert written[1].extra["fewshot"][0] == {"question": "What is 12 + 30?", "answer": "C",
                                              "options": [str(n) for n in range(40, 50)]}


def test_hellaswag_from_opencompass_folder_stores_the_ten_shots(tmp_path, monkeypatch):
    """`data get hellaswag --from DIR`, DIR holding OpenCompass's hellaswag.jsonl and hellaswag_train_sampled25.jsonl
    (or DIR/hellaswag/ holding them): the first ten shot rows in every row's extra_info, provenance names both."""
    from testpaths import TASK_SAMPLES

    folder = tmp_path / "oc" / "hellaswag"
    folder.mkdir(parents=True)
    rows = read_rows(TASK_SAMPLES / "hellaswag/validation.jsonl")
    (folder / "hellaswag.jsonl").write_text("".join(json.dumps(
        {"query": r["activity_label"] + ": " + r["ctx"], "choices": r["endings"], "gold": int(r["label"])}) + "\n"
        for r in rows), encoding="utf-8")
    shutil.copy(TASK_SAMPLES / "hellaswag/hellaswag_train_sampled25.jsonl", folder)
    hellaswag = data.select(["hellaswag"])[0][0]
    real = data.load_manifest()
    small = dataclasses.replace(real, files=tuple(dataclasses.replace(f, rows=len(rows)) if f == hellaswag else f
                                                  for f in real.files))
    monkeypatch.setattr(data, "load_manifest", lambda path=None: small)
    report = data.get(["hellaswag"], from_path=tmp_path / "oc", out=tmp_path / "out", dry_run=True)
    assert "hellaswag_train_sampled25.jsonl (OpenCompass's files" in report["files"][0]["source"]
    data.get(["hellaswag"], from_path=tmp_path / "oc", out=tmp_path / "out")
    items = get_task("hellaswag").rows_to_items(read_rows(tmp_path / "out/rl/test/hellaswag.parquet"), "test", "f")
    assert len(items) == len(rows) and all(len(it.extra["fewshot"]) == 10 for it in items)
    assert items[0].extra["fewshot"][9]["query"].startswith("Family Life: How to plan a picnic.")
    prov = json.loads((tmp_path / "out/rl/test/hellaswag.parquet.source.json").read_text())
    assert prov["source"]["kind"] == "opencompass-local" and len(prov["source"]["fewshot_sha256"]) == 64
    ten = get_task("hellaswag").with_options({"protocol": "hellaswag_10shot_gen_e42710"})
    assert len(ten.messages(items[0])) == 21
    (folder / "hellaswag_train_sampled25.jsonl").write_text("", encoding="utf-8")
    with pytest.raises(DataError, match="the 10-shot config needs 10 shot rows, got 0"):
        data.get(["hellaswag"], from_path=tmp_path / "oc", out=tmp_path / "again")
    (folder / "hellaswag_train_sampled25.jsonl").unlink()  # a folder without the shots is a DARE folder, as before
    with pytest.raises(DataError, match="not found in"):
        data.get(["hellaswag"], from_path=tmp_path / "oc", out=tmp_path / "again")
    assert not (tmp_path / "again").exists() or not any((tmp_path / "again").rglob("*.parquet"))
