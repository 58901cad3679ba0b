"""Gradient snapshots (dare_bench/check/gradients.py): for every trained algorithm of the catalogue (the RL plug-ins,
sft, lora, vrpo) x backbone, the committed snapshot in baselines/gradients.json holds on an unchanged tree (at 1 and
2 threads), and a sign-flipped or rescaled loss (the plug-in's `backward`, or the SFT / VRPO trainers' loss
function, wrapped here, never a production knob) fails it; the projection is deterministic."""

import json

import pytest
import torch
from typer.testing import CliRunner

from dare_bench import catalogue
from dare_bench.check import baseline as bl
from dare_bench.check import gradients as gr
from dare_bench.check import pinned_threads, run_check
from dare_bench.trainers.algorithms import get_algorithm

ENTRIES = gr.entries()
IDS = [gr.key(a, b) for a, b in ENTRIES]
COMMITTED = gr.load(gr.path_in(bl.baselines_directory()))


@pytest.fixture(autouse=True)
def one_thread():
    with pinned_threads(1):
        yield


def _scale_loss(monkeypatch, algorithm: str, factor: float) -> None:
    """The algorithm's loss times `factor`: its gradient and its reported value. sft / lora: the masked-diffusion
    loss `sft.sft_loss` (which `sft_batch_loss` calls; ar / cap / wsd too); vrpo: `preference.vrpo_loss`; RL: the
    plug-in's backward."""
    if algorithm in gr.SUPERVISED:
        from dare_bench.trainers import preference, sft

        module, name = (preference, "vrpo_loss") if algorithm == "vrpo" else (sft, "sft_loss")
        original_loss = getattr(module, name)

        def scaled(*args, **kwargs):
            out = original_loss(*args, **kwargs)
            if isinstance(out, tuple):  # vrpo_loss: (loss, metrics)
                return out[0] * factor, dict(out[1], loss=out[1]["loss"] * factor)
            return out * factor

        monkeypatch.setattr(module, name, scaled)
        return
    cls = get_algorithm(algorithm)
    original = cls.backward

    def backward(self, policy, batch, state, advantages, *, loss_scale, iteration):
        metrics = original(self, policy, batch, state, advantages, loss_scale=loss_scale * factor, iteration=iteration)
        return dict(metrics, loss=float(metrics["loss"]) * factor)

    monkeypatch.setattr(cls, "backward", backward)


def _failed(checks) -> set[str]:
    return {c["name"] for c in checks if c["status"] != "pass"}


def test_every_trained_algorithm_of_the_catalogue_has_a_committed_snapshot():
    """Enumerates the catalogue: an algorithm that trains (kind sft / rl / preference) without a snapshot on every
    attention kind (an RL plug-in: every kind it declares) fails here, so a new one cannot join unseen."""
    assert sorted(COMMITTED["entries"]) == sorted(IDS)
    trained = [spec for spec in catalogue.algorithms().values() if spec.kind != "none"]
    assert {spec.kind for spec in trained} == {"sft", "rl", "preference", "wsd"}
    for spec in trained:
        name = spec.plugin or spec.name  # RL entries are keyed by the plug-in (coupled_grpo), the others by name
        # the others on every attention kind of the diffusion kinds they apply to (ar, cap, wsd: block only)
        kinds = get_algorithm(name).attention_kinds if spec.kind == "rl" else tuple(
            k for k, b in gr.BACKBONES.items() if catalogue.backbone(b).diffusion in spec.diffusion)
        expected = {gr.key(name, gr.BACKBONES[kind]) for kind in kinds}
        assert expected and expected <= set(COMMITTED["entries"]), (spec.name, expected - set(COMMITTED["entries"]))
    assert {a for a, _ in ENTRIES} == {spec.plugin or spec.name for spec in trained}  # and nothing else
    # 15 RL plug-in x backbone + {sft, lora, vrpo} x {llada, sdar} + {ar, cap, wsd, wsd-cap, bdlm} x sdar
    assert len(ENTRIES) == 26
    for snap in COMMITTED["entries"].values():
        assert snap["grad_norm"] > 0 and len(snap["projection"]) == gr.DIMS


def test_lora_snapshot_is_the_adapters_gradient_only():
    """lora's projection covers the adapter parameters alone (far fewer than sft's full model), at the same loss:
    the adapters start with B = 0, so the wrapped model computes the base's loss."""
    full, lora = COMMITTED["entries"]["sft/llada"], COMMITTED["entries"]["lora/llada"]
    assert lora["loss"] == full["loss"] and lora["grad_norm"] != full["grad_norm"]
    from dare_bench.config import LoraSettings
    from dare_bench.trainers.lora import apply_lora

    wrapped = apply_lora(gr.micro_model("llada", gr.POLICY_SEED), LoraSettings(**gr.LORA))
    trainable = [n for n, p in wrapped.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)


@pytest.mark.parametrize("algorithm,backbone", ENTRIES, ids=IDS)
def test_snapshot(algorithm, backbone, monkeypatch):
    recorded = COMMITTED["entries"][gr.key(algorithm, backbone)]
    # (1) an unchanged tree passes, at the recorded thread count and at 2 threads
    current = gr.snapshot(algorithm, backbone)
    assert current["batch_fingerprint"] == recorded["batch_fingerprint"]
    assert _failed(gr.compare(recorded, current)) == set()
    with pinned_threads(2):
        assert _failed(gr.compare(recorded, gr.snapshot(algorithm, backbone))) == set()
    # (4) deterministic: the same numbers again
    again = gr.snapshot(algorithm, backbone)
    assert again["projection"] == current["projection"] and again["grad_norm"] == current["grad_norm"]
    # (2) a sign-flipped loss turns the gradient around; (3) a rescaled one changes its norm
    for factor, must_fail in ((-1.0, "gradient/cosine"), (2.0, "gradient/norm"), (0.5, "gradient/norm")):
        with monkeypatch.context() as m:
            _scale_loss(m, algorithm, factor)
            broken = gr.snapshot(algorithm, backbone)
        assert must_fail in _failed(gr.compare(recorded, broken)), (factor, broken["grad_norm"])


def test_projection_is_chunked_and_matches_the_dense_matrix(monkeypatch):
    params = [torch.nn.Parameter(torch.zeros(5, 7)), torch.nn.Parameter(torch.zeros(3)),
              torch.nn.Parameter(torch.zeros(2))]
    gen = torch.Generator().manual_seed(0)
    for p in params[:2]:
        p.grad = torch.randn(p.shape, generator=gen)
    monkeypatch.setattr(gr, "CHUNK", 4)  # several blocks per parameter
    first = gr.project(params, dims=8, seed=11)
    assert first == gr.project(params, dims=8, seed=11)
    # the same numbers as the dense matrix drawn block by block, a None grad counted as zeros
    gen = torch.Generator().manual_seed(11)
    blocks, flat = [], []
    for p in params:
        g = torch.zeros(p.numel(), dtype=torch.float64) if p.grad is None else p.grad.reshape(-1).double()
        for s in range(0, p.numel(), 4):
            blocks.append(torch.randn(8, min(4, p.numel() - s), generator=gen, dtype=torch.float64))
            flat.append(g[s:s + 4])
    dense = torch.cat(blocks, dim=1) @ torch.cat(flat) / 8 ** 0.5
    assert torch.allclose(torch.tensor(first, dtype=torch.float64), dense, rtol=1e-12, atol=1e-12)


def test_check_reports_a_broken_snapshot_and_a_missing_one(tmp_path):
    doc = json.loads(json.dumps(COMMITTED))
    snap = doc["entries"]["d1/llada"]
    snap["projection"] = [-x for x in snap["projection"]]
    doc["entries"] = {"d1/llada": snap}
    gr.write(gr.path_in(tmp_path), doc)
    report = run_check([], baselines=str(tmp_path), db=f"sqlite:///{tmp_path / 'runs.db'}", log=lambda m: None)
    by_name = {e["name"]: e for e in report["gradients"]}
    assert report["reproductions"] == [] and report["exit_code"] == 1
    assert by_name["gradients:d1/llada"]["status"] == "fail"
    assert _failed(by_name["gradients:d1/llada"]["checks"]) == {"gradient/cosine"}
    assert by_name["gradients:wd1/llada"]["status"] == "error"
    assert "--record-gradients" in by_name["gradients:wd1/llada"]["message"]


def test_cli_record_gradients_then_check_and_options(tmp_path):
    from dare_bench.cli import app

    runner = CliRunner()
    out = runner.invoke(app, ["check", "--record-gradients", "--baselines", str(tmp_path)])
    assert out.exit_code == 0, out.output
    assert sorted(gr.load(gr.path_in(tmp_path))["entries"]) == sorted(IDS)
    # a gradients-only baseline directory: the snapshots just recorded pass
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    out = runner.invoke(app, ["check", "--baselines", str(tmp_path), "--db", db, "--json"])
    assert out.exit_code == 0, out.output
    report = json.loads(out.stdout)
    assert {e["status"] for e in report["gradients"]} == {"pass"} and len(report["gradients"]) == len(IDS)
    # --no-gradients: nothing compared, and a directory without reproduction baselines is then bad input
    out = runner.invoke(app, ["check", "--baselines", str(tmp_path), "--db", db, "--no-gradients"])
    assert out.exit_code == 2 and len(out.output.strip().splitlines()) == 1
    out = runner.invoke(app, ["check", "--record-gradients", "d1-llada-sudoku", "--baselines", str(tmp_path)])
    assert out.exit_code == 2 and "takes no names" in out.output and len(out.output.strip().splitlines()) == 1


def test_the_supervised_snapshots_pin_the_loss_the_trainers_step_with(monkeypatch):
    """`train_sft` and `train_preference` compute each step's loss through `sft_batch_loss` /
    `preference_batch_loss`, the functions the sft / lora / vrpo snapshots call: a loss re-inlined in a trainer would
    leave the snapshots pinning code that no longer trains."""
    from dare_bench.trainers import preference, sft

    calls = []
    for module, name in ((sft, "sft_batch_loss"), (preference, "preference_batch_loss")):
        original = getattr(module, name)

        def counted(*args, _original=original, _name=name, **kwargs):
            calls.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    examples, pairs = gr._pinned_examples()
    sft.train_sft(gr.micro_model("llada", 0), examples, sft.SFTConfig(steps=1, batch_size=4))
    preference.train_preference(gr.micro_model("llada", 0), pairs,
                                preference.PreferenceConfig(steps=1, batch_pairs=2, mc_samples=1))
    assert calls == ["sft_batch_loss", "preference_batch_loss"]
