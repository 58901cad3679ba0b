"""One torch-free module per RL plug-in: its `Config` (the knob schema the registry validates with and the plug-in is
built from) and `ALGORITHM = AlgorithmSpec(...)`. The module name is the plug-in's (`coupled_grpo`); the plug-in
itself is `dare_bench/trainers/algorithms/<name>.py`. Discovered by `dare_bench.catalogue.knobs()`."""
