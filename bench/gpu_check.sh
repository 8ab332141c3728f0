#!/usr/bin/env bash
# The GPU check: one command, at most 8 minutes on one H100-class GPU, that writes one markdown table.
#
#   bash bench/gpu_check.sh [--cpu-dry] [--out DIR]
#
# Steps (each logs to DIR/<step>.log; the table is DIR/gpu_check.md, printed at the end):
#   1. pytest -m gpu                       the CUDA tests (tests/gpu): engine, shared-prefix forward, a bf16 step
#   2. train smoke, plain PyTorch bf16     train.py --preset smoke under bf16 autocast
#   3. train smoke, DeepSpeed ZeRO-2       one rank under torchrun, bf16 (configs/ds_zero2.json)
#   4. train smoke, DeepSpeed ZeRO-3       one rank, parameters partitioned (configs/ds_zero3.json)
#   5. rollout, ours vs model.generate     bench/rollout_memagent.py on a random Qwen2 of 0.5B decoder shape, bf16,
#                                          MemAgent's prompt order and section-first
#   6. peak memory vs --dry-run            bench/peak_memory.py: one step of that model, measured vs predicted
# --cpu-dry runs the same steps on the CPU at toy sizes (tiny models, the smoke preset), so the script itself is
# tested end to end where there is no GPU (tests/test_gpu_check.py, in make test's slow group). Exit status: 0 when
# every step passed, else 1; the table says which failed and its log holds why.
set -uo pipefail
cd "$(dirname "$0")/.."

DRY=0
OUT=runs/gpu_check
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu-dry) DRY=1 ;;
    --out) OUT="$2"; shift ;;
    *) echo "usage: bash bench/gpu_check.sh [--cpu-dry] [--out DIR]" >&2; exit 2 ;;
  esac
  shift
done
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
mkdir -p "$OUT"
TABLE="$OUT/gpu_check.md"
FAILED=0
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1

if [ "$DRY" = 1 ]; then
  export CUDA_VISIBLE_DEVICES="" DS_ACCELERATOR=cpu
  DEVICE=cpu
  ROLLOUT=(--models tiny --dtype float32 --device cpu --questions 2 --group 2 --chunks 2 --chunk-tokens 64
           --memory-tokens 8 --answer-tokens 4)
  PEAK=(--preset smoke --run.device cpu --data.num-eval 0 --demo.model-dir "$OUT/smoke-model")
  MACHINE="CPU dry run ($(nproc) cores): toy sizes, figures are not GPU figures"
else
  DEVICE=cuda
  ROLLOUT=(--models qwen2-0.5b --dtype bfloat16 --device cuda --questions 8 --group 4 --chunks 2
           --chunk-tokens 1024 --memory-tokens 128 --answer-tokens 32)
  PEAK=(--preset smollm2 --model.path runs/bench/qwen2-0.5b-shape --rollout.batch-size 4 --optim.mini-batches 1
        --optim.micro-batch-tokens 4096 --rollout.dynamic-sampling false)
  MACHINE="$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1)"
fi
SMOKE=(--preset smoke --run.steps 2 --data.num-eval 0 --run.progress false --demo.model-dir "$OUT/smoke-model"
       --run.device "$DEVICE")

{
  echo "# GPU check: $MACHINE"
  echo
  echo "torch $($PY -c 'import torch; print(torch.__version__)' 2>/dev/null), $(date -u +%Y-%m-%d)"
  echo
  echo "| step | status | seconds | figure |"
  echo "|---|---|---|---|"
} > "$TABLE"

# step NAME FIGURE_COMMAND -- COMMAND...: run COMMAND (log in $OUT/NAME.log), then FIGURE_COMMAND on the log.
step() {
  local name="$1" figure="$2"
  shift 3
  local start status seconds summary
  start=$(date +%s)
  "$@" > "$OUT/$name.log" 2>&1
  status=$?
  seconds=$(( $(date +%s) - start ))
  summary=$(bash -c "$figure" < "$OUT/$name.log" 2>/dev/null | tr '|\n' '/ ' | cut -c1-200)
  if [ "$status" = 0 ]; then
    echo "| $name | ok | $seconds | $summary |" >> "$TABLE"
  else
    echo "| $name | FAILED (exit $status) | $seconds | $(tail -n 1 "$OUT/$name.log" | tr '|' '/' | cut -c1-200) |" >> "$TABLE"
    FAILED=1
  fi
}

# pytest exits 5 when it selects no test: on a CPU the gpu group is all skips, which is still a pass of the script.
step gpu-tests "grep -E '(passed|skipped|failed|error)' | tail -n 1" -- \
  bash -c "$PY -m pytest -m gpu -q -p no:cacheprovider tests/gpu; rc=\$?; [ \$rc = 5 ] && exit 0; exit \$rc"
step train-plain-bf16 "grep -E '^step [0-9]+ [|] reward' | tail -n 1" -- \
  "$PY" train.py "${SMOKE[@]}" --model.autocast bfloat16 --run.output-dir "$OUT/plain"
for stage in 2 3; do
  step "train-zero$stage" "grep -E '^step [0-9]+ [|] reward' | tail -n 1" -- \
    "$PY" -m torch.distributed.run --nproc_per_node 1 --master_port $((29600 + stage)) train.py "${SMOKE[@]}" \
    --deepspeed "configs/ds_zero$stage.json" --run.output-dir "$OUT/zero$stage"
done
step rollout-memagent-order "grep -E '^step: '" -- "$PY" bench/rollout_memagent.py "${ROLLOUT[@]}"
step rollout-section-first "grep -E '^step: '" -- "$PY" bench/rollout_memagent.py "${ROLLOUT[@]}" --section-first
step peak-memory "grep -E '^peak memory'" -- "$PY" bench/peak_memory.py "${PEAK[@]}" --run.output-dir "$OUT/peak"

cat "$TABLE"
exit "$FAILED"
