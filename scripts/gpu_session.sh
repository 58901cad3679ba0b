#!/usr/bin/env bash
# One prepared session on a lent CUDA machine (not CI): everything the GPU-only checks need, in one command that
# ends inside ~9 minutes (about 5 on an H200 in session 17). From the repository root, with the device tool: wheels
# for the packages the machine lacks in .whl/ (pydantic, SQLAlchemy, alembic, datasets, the graders' pins), and
# DARE's gsm8k parquet (data/dare/rl/test/gsm8k_1.parquet) copied to .gpu/data/rl/test/, both git-ignored:
#     bash scripts/gpu_session.sh            # writes $OUT/{log.txt,gpu_check.json,bench_*.json}
# 1. scripts/gpu_check.py: ceilings (copy bandwidth, bf16 GEMM peak), flex vs sdpa logits, one FSDP2 step at 8B width
#    vs the memory plan, rollout tokens/s with fractions of the ceilings (#15 item 7, #17).
# 2. the gpu-marked tests: FlexAttention logits + gradients, CUDA mask draws, torch._grouped_mm MoE experts.
# 3. bench moe / flex / packing / rlstep on CUDA (#15 items 1, 3, 4, 5).
set -u
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
start=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - start )) s] $*"; }
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "error: wheel install failed"; exit 1; }
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1 DARE_BENCH_DATA=$PWD/.gpu/data
stamp "machine"; nvidia-smi -L; python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name(0))'

stamp "gpu_check"; timeout 180 python3 scripts/gpu_check.py --out "$OUT/gpu_check.json"
stamp "gpu tests"; timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/models/test_moe.py \
  tests/models/test_flex_block_masks.py tests/diffusion/test_likelihood.py tests/models/test_mdlm_backbones.py
stamp "bench moe"; timeout 45 python3 -m dare_bench.cli bench moe --device cuda --dtype bfloat16 --sections block,train --json > "$OUT/bench_moe.json"
stamp "bench flex"; timeout 90 python3 -m dare_bench.cli bench flex --device cuda --seq-len 4096 --dtype bfloat16 --json > "$OUT/bench_flex.json"
stamp "bench packing"; timeout 40 python3 -m dare_bench.cli bench packing --device cuda --family llada,sdar --d-model 1024 --layers 4 --json > "$OUT/bench_packing.json"
stamp "bench rlstep"; timeout 180 python3 -m dare_bench.cli bench rlstep --device cuda --families llada,sdar --hidden 1024 --layers 4 \
  --gen-length 256 --prompts 2 --group 4 --json > "$OUT/bench_rlstep.json"
stamp "done"
