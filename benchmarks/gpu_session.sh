#!/usr/bin/env bash
# One device call that does several GPU jobs and brings everything back as ONE archive (the device
# tool returns at most 8 files), keeping Triton's compile cache between calls (compiling a fresh
# config of the forward+backward kernels costs ~30-100 s on the GPU host, which ate most of
# session 2's test and bench time).
#
#   bash benchmarks/gpu_session.sh STEP[:SECONDS] ...        (in the repo root on the GPU host)
#
# Steps (each bounded by its SECONDS, default in brackets):
#   tests [240]     pytest -m gpu over the Triton matrix, decode, dispatch and layer tests, 6 workers
#   bench [240]     pathtune bench (fwd, fwd+bwd vs SDPA flash/cuDNN and fla, same run) --record
#   decode [120]    pathtune bench --pass decode --record
#   dsweep [240]    pathtune bench --pass decode --sweep --record (every decode knob config)
#   tune [600]      benchmarks/h200_tune.sh (BUDGET from the step's seconds minus 90 s)
#   flipflop [540]  python -m examples.flipflop --device cuda (budget from the step's seconds)
#   lm [120]        examples/lm_generate.py --device cuda
#   tvm [200]       codegen/tvm/gpu_check.py with the prebuilt bundle (carry build/tvm_gpu_check)
#   probe [60]      benchmarks/memory_probe.py next to the bench's measured peak
#   memcheck [180]  compute-sanitizer memcheck over one small fwd+bwd (catches out-of-bounds accesses)
#
# Carry: .whl (wheels: optuna stack, fla, pydantic...), and .tcache if an earlier call brought one
# back (tar xzf <files_at>/session.tgz tcache.tgz && mkdir -p .tcache && tar xzf tcache.tgz -C .tcache).
# Everything lands in $OUT/session.tgz (logs, JSON, perf_db SQLite with the recorded rows, the tune's
# results file for perf_db/shipped/, flip-flop results) plus $OUT/tcache.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
OUT="${OUT:-/tmp/pathtune-gpu-session}"
S="$OUT/s"
mkdir -p "$S"

if [ -d .whl ] && ! python3 -c "import optuna" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index --target /tmp/pt . >/dev/null 2>&1 \
    && export PYTHONPATH="/tmp/pt${PYTHONPATH:+:$PYTHONPATH}"
# the pathtune console script lands in /tmp/pt/bin; the GPU image has python3 but maybe no `python`
export PATH="/tmp/pt/bin:$PATH"
if ! command -v python >/dev/null; then
    mkdir -p /tmp/pybin && ln -sf "$(command -v python3)" /tmp/pybin/python && export PATH="/tmp/pybin:$PATH"
fi
export PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR="$REPO/.tcache"
export PATHTUNE_DB_URL="sqlite:///$S/perf.sqlite3"
mkdir -p "$TRITON_CACHE_DIR"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$S/gpu.txt" 2>&1
python3 -m pathtune.cli env --json > "$S/env.json" 2>&1

run_step() {  # name seconds command...
    local name="$1" secs="$2"
    shift 2
    local t0=$SECONDS
    echo "== $name (limit ${secs}s)"
    (cd /tmp && timeout "$secs" "$@") > "$S/$name.log" 2>&1
    local rc=$?
    echo "== $name rc=$rc in $((SECONDS - t0))s" | tee -a "$S/steps.txt"
    tail -n 25 "$S/$name.log"
}

for arg in "$@"; do
    step="${arg%%:*}"
    secs="${arg#*:}"
    [ "$secs" = "$arg" ] && secs=""
    case "$step" in
        tests) run_step tests "${secs:-240}" python3 -m pytest -q -m gpu -p no:cacheprovider -n 6 \
                   "$REPO/tests/test_triton_gpu.py" "$REPO/tests/test_triton_decode.py" \
                   "$REPO/tests/test_runtime_dispatch.py" "$REPO/tests/test_layer.py" -rA ;;
        bench) run_step bench "${secs:-240}" python3 -m pathtune.cli bench --record --json "$S/bench.json" ;;
        decode) run_step decode "${secs:-120}" python3 -m pathtune.cli bench --pass decode --record \
                    --json "$S/decode.json" ;;
        dsweep) run_step dsweep "${secs:-240}" python3 -m pathtune.cli bench --pass decode --sweep --record \
                    --json "$S/decode_sweep.json" ;;
        tune) t="${secs:-600}"
              run_step tune "$t" env OUT="$S/tune" BUDGET="$(( (t - 90) / 60 ))m" WHEELS="$REPO/.whl" \
                  bash "$REPO/benchmarks/h200_tune.sh" ;;
        flipflop) t="${secs:-540}"
                  # run from /tmp like every step: the repo goes after the installed pathtune on the path
                  run_step flipflop "$t" env PYTHONPATH="$PYTHONPATH:$REPO" \
                      python3 -m examples.flipflop --device cuda --no-progress \
                      --budget-minutes "$(python3 -c "print(round(($t - 45) / 60, 1))")" \
                      --out "$S/flipflop/results.json" ;;
        lm) run_step lm "${secs:-120}" python3 "$REPO/examples/lm_generate.py" --device cuda ;;
        tvm) run_step tvm "${secs:-200}" python3 "$REPO/codegen/tvm/gpu_check.py" \
                 --budget-min "$(python3 -c "print(round(${secs:-200} / 60 - 0.7, 1))")" ;;
        memcheck) run_step memcheck "${secs:-180}" compute-sanitizer --tool memcheck --print-limit 20 \
                      python3 "$REPO/benchmarks/dev_memcheck.py" 64 1300 512 1 ;;
        probe) run_step probe "${secs:-60}" python3 "$REPO/benchmarks/memory_probe.py" --no-timeline ;;
        *) echo "unknown step '$step' (see the header of $0)" | tee -a "$S/steps.txt" ;;
    esac
done

tar czf "$OUT/session.tgz" -C "$OUT" s
tar czf "$OUT/tcache.tgz" -C "$TRITON_CACHE_DIR" . 2>/dev/null
ls -la "$OUT"
