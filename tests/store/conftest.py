import pytest

from dare_bench.config import ReproductionSpec


def _profile(preset: bool) -> dict:
    model = {"preset": "tiny-llada"} if preset else {"checkpoint": "GSAI-ML/LLaDA-8B-Instruct", "revision": "unpinned"}
    prof = {
        "model": model,
        "train": {
            "kind": "rl", "lr": 2e-5, "steps": 3, "batch_prompts": 2, "group_size": 2,
            "rollout": {"gen_length": 16, "steps": 16, "block_length": 16, "temperature": 0.9},
            "algorithm": {"p_mask_prompt": 0.15},
        },
        "eval": {"limit": 8, "sampler": {"name": "tiny-sudoku", "gen_length": 16, "steps": 16}},
    }
    if preset:
        prof["base"] = {"lr": 1e-3, "batch_size": 8, "start_step": 20}
    return prof


@pytest.fixture
def spec() -> ReproductionSpec:
    return ReproductionSpec.model_validate({
        "name": "d1-llada-sudoku", "algorithm": "d1", "backbone": "llada", "task": "sudoku",
        "paper_ref": "test", "scales": {"paper": _profile(False), "tiny": _profile(True), "micro": _profile(True)},
    })


@pytest.fixture
def db_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'results.db'}"
