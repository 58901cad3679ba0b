"""dLLM-aware evaluation: sandboxed code execution, pinned sampler presets, the evaluator, the OpenCompass plug-in.

Submodules are imported on use (`from dare_bench.evaluators.sandbox import run_code`), so importing this package
never pulls torch or OpenCompass.
"""
