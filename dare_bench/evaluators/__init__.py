"""dLLM-aware evaluation: pinned sampler presets, the evaluator, the OpenCompass plug-in.

Sandboxed code execution is the ground-floor `dare_bench.sandbox` (the task graders use it too). Submodules are
imported on use (`from dare_bench.evaluators.evaluator import evaluate`), so importing this package never pulls
torch or OpenCompass.
"""
