#!/usr/bin/env bash
# The GPU work of issue 30 in a few full commands, for a session that is lent a GPU (see the
# developers' guide). Each part fits one device call of at most 10 minutes and writes everything
# under $OUT (the device tool brings $OUT back); commit the result files at once.
#
#   part 1: the CUDA test suite (every CUDA case) and the RoPE kernel's own tests
#   part 2: benchmarks/rope.py (q/k suite, tile sweep, fused baselines)
#   part 3: benchmarks/relative_bias.py in bf16, forward and forward + backward
#   part 4: benchmarks/study_throughput.py (cells per device-minute, 1 to 12 processes)
#
# Before the first call, here (no GPU needed): fetch the fused baselines the device cannot download,
#   echo /.whl/ >> .git/info/exclude; echo /.fa/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl liger-kernel
#   mkdir -p .fa && (cd <mirror of Dao-AILab/flash-attention> && git show HEAD:flash_attn/ops/triton/rotary.py) > .fa/fa_rotary.py
# then, for each part, call the device tool's run with carry [".whl", ".fa"] and the command
#   POSENC_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/gpu_session.sh PART
# (the device's copy of the tree has no .git, so the commit travels in POSENC_COMMIT; commit first,
# so that the results come from a clean commit).
set -uo pipefail
part=${1:?usage: gpu_session.sh 1|2|3|4}
: "${OUT:?OUT must name the folder whose files come back}"
export PYTHONUNBUFFERED=1 POSENC_COMMIT=${POSENC_COMMIT:-unknown}
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD/code
else
  export PYTHONPATH=$PWD/code
fi
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  echo "commit $POSENC_COMMIT, $(nproc) cores"; } > "$OUT/env_part$part.txt" 2>&1
cat "$OUT/env_part$part.txt"
case $part in
  1) # every CUDA case (the parametrised [cuda] ids and the kernel file), 8 processes
     timeout 560 python3 -m pytest -q -p no:cacheprovider -n 8 -k "cuda or kernel" tests \
       --ignore=tests/browser -ra 2>&1 | tee "$OUT/cuda_suite.log" | tail -40 ;;
  2) timeout 560 python3 benchmarks/rope.py --device cuda --tile-sweep --flash-attn-rotary .fa/fa_rotary.py \
       --json "$OUT/rope_cuda.json" > "$OUT/rope_bench.log" 2>&1; echo "rope.py exit $?"
     grep -E "failed|Error" "$OUT/rope_bench.log" | head -20
     grep -E "^\| [0-9]+ \|" "$OUT/rope_bench.log" | grep -E "copy|posenc triton|posenc default|flash|liger|hf compiled" | head -120 ;;
  3) A=(benchmarks/relative_bias.py --device cuda --dtype bfloat16 --batch 1 --heads 32 --head-dim 128
        --method t5 alibi kerple --lengths 8192 32768 16384 2048
        --backends "sdpa, is_causal" "sdpa, causal mask" reference "sdpa + bias" flex "flex, no bias" "flash-attn alibi_slopes"
        --skip-reference-above 2048 --skip-bias-above 8192 --jobs 8 --profile --timeout 150 --time-budget 15)
     timeout -s TERM 230 python3 "${A[@]}" --json "$OUT/relative_bias_cuda_bf16.json" 2>&1 | tee "$OUT/relative_bias_cuda_bf16.log" | tail -30
     timeout -s TERM $((540 - SECONDS)) python3 "${A[@]}" --backward --json "$OUT/relative_bias_cuda_bf16_backward.json" 2>&1 \
       | tee "$OUT/relative_bias_cuda_bf16_backward.log" | tail -30 ;;
  4) timeout 400 python3 benchmarks/study_throughput.py --device cuda --processes 1 4 8 12 --seconds 30 \
       --json "$OUT/study_throughput_cuda.json" 2>&1 | tee "$OUT/study_throughput.log" | tail -20 ;;
  *) echo "unknown part $part"; exit 2 ;;
esac
