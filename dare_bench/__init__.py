"""dare-bench: an evaluation-first reproducibility suite for post-training diffusion language models."""

__version__ = "0.1.0"
