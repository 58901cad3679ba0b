"""The memory plan is true: its prediction for a shrunk real checkpoint's training step is within 25% of the peak
measured on CPU (with and without gradient checkpointing), and its terms scale as the layout says."""

import pytest

from dare_bench.models import from_config
from dare_bench.models.real_configs import real_config
from dare_bench.trainers.memory_plan import estimate_training_memory


@pytest.mark.slow
def test_plan_matches_a_measured_step_on_cpu():
    from dare_bench.bench.memory import compare_plan

    result = compare_plan("LLaDA-8B-Instruct", layers=2, hidden=256, rows=2, seq_len=256, micro_batches=2)
    for p in result["points"]:
        assert 0.75 <= p["ratio"] <= 1.25, p
    by = {p["gradient_checkpointing"]: p for p in result["points"]}
    assert by[True]["terms"]["activations"] < by[False]["terms"]["activations"]


def test_terms_follow_the_layout():
    meta = from_config(real_config("LLaDA-8B-Instruct")[1])
    one = estimate_training_memory(meta, world_size=1, strategy="fsdp2", rows=1, seq_len=1024)
    eight = estimate_training_memory(meta, world_size=8, strategy="fsdp2", rows=1, seq_len=1024)
    rep = estimate_training_memory(meta, world_size=8, strategy="replicated", rows=1, seq_len=1024)
    n = meta.num_parameters()
    assert one["master_weights"] == 4 * n and eight["master_weights"] == 4 * n // 8 == rep["master_weights"] // 8
    assert eight["optimizer"] == 2 * eight["gradients"] == 8 * n // 8
    with_ref = estimate_training_memory(meta, world_size=8, reference=True)
    assert with_ref["reference_model"] == with_ref["master_weights"]
    lora = estimate_training_memory(meta, world_size=8, reference=True, lora_parameters=10**7)
    assert lora["reference_model"] == 0 and lora["optimizer"] == 8 * 10**7 // 8
    ckpt = estimate_training_memory(meta, gradient_checkpointing=True, seq_len=4096)
    full = estimate_training_memory(meta, gradient_checkpointing=False, seq_len=4096)
    assert ckpt["activations"] * 5 < full["activations"] and ckpt["logits"] == full["logits"]
    assert full["logits"] >= 12 * 4096 * 126464  # 3 fp32 [seq, vocab] copies at the loss's peak


def test_paper_plan_reports_the_plan(monkeypatch):
    from dare_bench.pipeline.plan import paper_plan, resolve

    from testpaths import DARE_DATA

    monkeypatch.setenv("DARE_BENCH_DATA", str(DARE_DATA))  # the plan resolves the recipe's training data

    _, cfg = resolve("bgpo-llada-sudoku", "paper")
    mem = paper_plan(cfg, None)["memory_gib"]
    terms = ("master_weights", "compute_weights", "gradients", "optimizer", "reference_model")
    assert mem["assumptions"]["world_size"] == (cfg.profile.train.gpus or 1)
    assert mem["per_rank_total"] >= sum(mem[t] for t in terms) - 0.05
    assert mem["weights_bf16"] > 14
