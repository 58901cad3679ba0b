"""`dare-bench reproduce --resume` for SFT and VRPO: an interrupted micro run resumed from its checkpoint ends like
an uninterrupted one (final score, every logged step once in the store)."""

import dataclasses

import pytest


@pytest.fixture
def db(tmp_path):
    return f"sqlite:///{tmp_path / 'runs.db'}"


def _scores(metrics):
    return {k: v for k, v in metrics.items() if "seconds" not in k}  # timings differ between runs


@pytest.mark.parametrize("name,module,fn", [
    ("sft-llada-sudoku", "sft", "train_sft"),
    # slow: the preference pairs come from the base's own rollouts (the same code path as SFT otherwise)
    pytest.param("vrpo-llada-sudoku", "preference", "train_preference", marks=pytest.mark.slow),
])
@pytest.mark.integration
def test_pipeline_resume_ends_like_an_uninterrupted_run(db, monkeypatch, name, module, fn):
    import importlib

    from dare_bench import pipeline
    from dare_bench.store import Store

    mod = importlib.import_module(f"dare_bench.trainers.{module}")
    kw = dict(db=db, progress=False, log=lambda m: None, overrides=["train.checkpoint_every=1"])
    full = pipeline.reproduce(name, "micro", **kw)
    real = getattr(mod, fn)

    def interrupted(model, data, cfg, options):
        real(model, data, cfg, dataclasses.replace(options, stop_after=2))
        raise KeyboardInterrupt("killed after the second checkpoint")

    monkeypatch.setattr(mod, fn, interrupted)
    with pytest.raises(KeyboardInterrupt):
        pipeline.reproduce(name, "micro", force=True, **kw)
    seen = {}

    def recording(*a):
        out = real(*a)
        seen["resumed_from"] = out.resumed_from
        return out

    monkeypatch.setattr(mod, fn, recording)
    resumed = pipeline.reproduce(name, "micro", force=True, resume=True, **kw)
    assert seen["resumed_from"] == 2 and resumed.status == "finished"
    assert _scores(resumed.metrics) == _scores(full.metrics)
    store = Store(db)

    def curve(run_id):
        return [(m["step"], m.get("loss")) for m in store.metrics(run_id)]

    assert curve(resumed.run_id) == curve(full.run_id) and curve(full.run_id)
