#!/usr/bin/env bash
# One device call that does several GPU jobs and brings everything back as ONE archive (the device
# tool returns at most 8 files), keeping Triton's compile cache between calls (compiling a fresh
# config of the forward+backward kernels costs ~30-100 s on the GPU host, a large part of a short
# call's test and bench time).
#
#   bash benchmarks/gpu_session.sh STEP[:SECONDS] ...        (in the repo root on the GPU host)
#
# Steps (each bounded by its SECONDS, default in brackets):
#   tests [240]     pytest -m gpu over the Triton matrix, decode, dispatch, layer, launch and TVM tests, 6 workers
#                   (4 on a GPU under 120 GiB: six ran an 80 GiB H100 out of memory; TESTS_WORKERS sets it)
#                   (TESTS_K: a pytest -k expression, e.g. "lean"; the TVM ones run the carried build/tvm_bench and
#                   build/tvm_decode_bench, with tvm_ffi importable)
#   fwdtests [180]  pytest -m gpu tests/test_triton_gpu.py: the Triton forward / backward matrix vs the float64 oracle
#                   (FWDTESTS_K: a pytest -k expression, e.g. "D32 or D64-bfloat16-4q4kv-fox", for some cases only)
#   decodetests [120] pytest -m gpu over the decode tests (static cache, graph capture, Triton step, lazy rotation,
#                   two frame levels, repeat launches)
#   decodeprobe [240] benchmarks/decode_probe.py $DECODEPROBE_ARGS: the public decode step vs SDPA, its profile, graph step, generation
#                   (JSON in s/$DECODEPROBE_JSON, default decode_probe.json)
#   tvmtests [120]  pytest -m gpu tests/test_tvm_gpu.py: the TVM forward vs the float64 oracle (carry build/tvm_bench)
#   bench [240]     pathtune bench (fwd, fwd+bwd vs SDPA flash/cuDNN and fla, same run) $BENCH_ARGS --record
#                   (JSON in s/$BENCH_JSON, default bench.json: a second bench step of a lane names its own; it
#                   dispatches from the call's record database, so BENCH_ARGS with --config tuned are refused: the
#                   tuned configs are benchtuned's, whose BENCH_ARGS may add e.g. --memory)
#   decode [120]    pathtune bench --pass decode --record
#   dsweep [240]    pathtune bench --pass decode --sweep --record (every decode knob config, or those of
#                   DSWEEP_KNOBS, --sweep-knobs JSON: the full space takes ~200 s per row; DSWEEP_TOKENS,
#                   --new-tokens: tokens per call, e.g. 4,16, each its own decode key; DSWEEP_ARGS: more
#                   options, e.g. --head-dim 128 --seq-len 32768 --gate on)
#   benchtuned [240] pathtune bench --config tuned (the runtime's dispatch: shipped records / perf_db) $BENCH_ARGS --record
#   tune [600]      benchmarks/h200_tune.sh (BUDGET: the step's seconds minus 150 s of slack)
#   ffcompare [240] flip-flop tokens/s comparison only (--resume on a copy of examples/flipflop/results.json)
#   flipflop [540]  python -m examples.flipflop --device cuda (budget from the step's seconds)
#   lm [120]        examples/lm_generate.py --device cuda
#   tvm [200]       benchmarks/tvm_gpu_check.py with the prebuilt bundle (carry build/tvm_gpu_check)
#   tvmbench [240]  pathtune bench --backends triton,tvm --forward-only --config tuned --record: the TVM forward
#                   (and its ut / transport / scan kernel times) next to Triton, SDPA and fla in one run (carry
#                   build/tvm_bench, built by `pathtune bench-build-tvm --head-dim 64,128 --out build/tvm_bench`;
#                   HEAD_DIMS and BENCH_GATE as benchtuned; JSON in s/bench_tvm.json)
#   tvmdecode [480] the TVM decode layouts vs the Triton decode and SDPA (carry build/tvm_gpu_check_decode,
#                   built by codegen/tvm/build_gpu_check.py; see codegen/tvm/README.md)
#   tvmdecodebench [300] the decode bench with the TVM step next to the Triton step and SDPA flash, recorded
#                   (pathtune bench --pass decode --backends triton,tvm --tvm-modules build/tvm_decode_bench
#                   --baselines sdpa --seq-len 4096,32768 --record), then benchmarks/tvm_decode_auto.py: the plan
#                   backend="auto" takes for D128 at the 32K bucket from those fresh records, and that step timed
#                   through the public API next to backend="triton" and SDPA (~60 s of the limit). Carry .whl and
#                   build/tvm_decode_bench (5.3 MiB; built here by `python -m pathtune.codegen.tvm.build_decode_bench`)
#   utprobe [120]   benchmarks/ut_probe.py $UTPROBE_ARGS: the forward's UT stage, one launch vs three vs the candidates of
#                   benchmarks/variants/, per precision / warps, with errors (UTPROBE_PATHS: --paths)
#   scanprobe [150] benchmarks/scan_probe.py $SCANPROBE_ARGS: scan_intra / scan_inter alone vs candidates (--candidates)
#   fwdprobe [300]  benchmarks/fwd_probe.py $FWDPROBE_ARGS: the forward vs SDPA / fla, per-kernel profile, knob variants
#   kprobe [150]    benchmarks/dev_kernel_probe.py $KPROBE_ARGS: single launches of one fwd+bwd timed next to
#                   variants of their kernels (warps, precision, an older bwd_intra file)
#   precprobe [200] benchmarks/precision_probe.py $PRECPROBE_ARGS: the accuracy gate's errors and fwd+bwd time with the
#                   UT stage at tf32x3, tf32, and tf32 with one group of its products at tf32x3
#   noise [200]     benchmarks/timing_noise.py $NOISE_ARGS: one fwd+bwd of the public call timed in repeated trials of
#                   fresh allocations (the tuner's way), to see whether and where a trial's time moves
#   ncu [150]       Nsight Compute over benchmarks/ncu_step.py $NCUSTEP_ARGS (default --D 128 --T 4096: two fwd+bwd
#                   steps of the public API): the kernels matching regex NCU_KERNELS (default bwd_intra_diag), NCU_COUNT
#                   launches (1) after skipping NCU_SKIP (8: the first step's eight ranges); speed of light, warp
#                   states, occupancy, scheduler and memory sections in the step's log (NCU_EXTRA: more ncu options,
#                   e.g. "--section SourceCounters" for the top stall sites by SASS line)
#   profile [120]   per-kernel device time of one fwd+bwd (heuristic config), D 64/128, T 16K and 4K
#                   (PROFILE_STEPS=profile4k: 4K only, profile2k: 2K only; PROFILE_GATES=both: PaTH next to PaTH-FoX)
#   sweep [240]     benchmarks/dev_gpu_run2.py $SWEEP (default sweep): fwd / fwd+bwd and per-kernel times per knob change
#   probe [60]      benchmarks/memory_probe.py next to the bench's measured peak
#   split [150]     the split flow's GPU half: bash $BUNDLE/run.sh (BUNDLE: a bundle folder from `pathtune tune
#                   build`, carried; default build/split/bundle) -> s/split_results.json for `pathtune tune ingest`
#   ranges [150]    benchmarks/dev_gpu_run2.py ranges: fwd+bwd time and peak per backward range budget
#                   (RANGES_BUDGETS, default 256 / 128 / 512 / unbounded MiB), D 64/128 x T 4K/16K, one process,
#                   at the shipped bwd tune's config (RANGES_CONFIG=heuristic: the untuned one)
#   memcheck [180]  compute-sanitizer memcheck over one small fwd+bwd (catches out-of-bounds accesses)
#
# VAR=value words set VAR for the steps after them; REQUIRE_GPU=H200 runs the steps after it only on a GPU
# whose name holds that text (the others are skipped and say so), REQUIRE_GPU= lifts it.
#
# Two GPUs (the nvidia-h200-x2 kind: same device time, twice the GPUs and cores), one lane per GPU:
#
#   bash benchmarks/gpu_session.sh --lanes "HEAD_DIMS=64 tune:560" "HEAD_DIMS=128 tune:560"
#
# Each quoted lane runs its steps in order on its own GPU (CUDA_VISIBLE_DEVICES = lane index), with the
# VAR=value words set for that lane's later steps only (in a single lane too); lanes run at the same time and share the Triton cache.
# Lane i keeps its files in s/lane<i>/ and continues a tune from .tune_in/lane<i>/tune.sqlite3.
#
# Carry: .whl (wheels: optuna stack, fla, pydantic...), and .tcache_in if an earlier call brought the
# Triton cache back (python benchmarks/ship_call.py <files_at> ...: the union of what the calls brought back, with
# their tune results shipped; both git-excluded),
# and .tune_in/tune.sqlite3 to continue an earlier call's tune (git-excluded too).
# Of the Triton cache, the entries this call opened come back (TCACHE_SCOPE=all: every entry).
# Every step's files (its log, its JSON) are also kept in s/steps/NN-<step>/, so a second step of the same name
# (two kprobe steps, say), which writes the same file names in s/, loses nothing.
# Everything lands in $OUT/session.tgz (logs, JSON, perf_db SQLite with the recorded rows, the tune's
# results file for perf_db/shipped/, flip-flop results) plus $OUT/tcache.txz.aa, .ab, ... (the device
# tool returns files of at most 16 MiB; the staging folder lives outside $OUT so that only these return).
set -uo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
OUT="${OUT:-/tmp/pathtune-gpu-session}"
ROOT_S="/tmp/pathtune-session/s"
S="$ROOT_S"
# a call stopped at its limit (SIGTERM) still brings back what its finished steps wrote
trap 'echo "== stopped: packing what the finished steps wrote"; tar czf "$OUT/session.tgz" -C "$(dirname "$ROOT_S")" s; exit 124' TERM INT
# a machine lent again keeps /tmp: start from an empty staging folder, so the archive holds this call's files only
rm -rf "$ROOT_S"
mkdir -p "$S" "$OUT"

if [ -d .whl ] && ! python3 -c "import optuna" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
# a fresh copy every call: on a machine lent again, pip --target would keep the previous call's package
# (and its perf_db/shipped files) instead of this tree's
rm -rf /tmp/pt
python3 -m pip install -q --no-deps --no-build-isolation --no-index --target /tmp/pt . >/dev/null 2>&1 \
    && export PYTHONPATH="/tmp/pt${PYTHONPATH:+:$PYTHONPATH}"
# the pathtune console script lands in /tmp/pt/bin; the GPU image has python3 but maybe no `python`
export PATH="/tmp/pt/bin:$PATH"
if ! command -v python >/dev/null; then
    mkdir -p /tmp/pybin && ln -sf "$(command -v python3)" /tmp/pybin/python && export PATH="/tmp/pybin:$PATH"
fi
export PYTHONUNBUFFERED=1
# which tree this is: the commit an extracted copy names in .commit (git archive HEAD | tar x -C .gpuclean
# && git rev-parse --short HEAD > .gpuclean/.commit; checked first: a copy inside a checkout would else
# report the checkout's HEAD), or a git checkout's HEAD
tree="$(cat "$REPO/.commit" 2>/dev/null || git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)"
# (from /tmp, as every step: in the repo root `import pathtune` would find the source tree's top folder first)
hashes="$(cd /tmp && python3 -c 'from pathtune.codegen.triton import source_hash as h
print(" ".join(p + "=" + h(p) for p in ("fwd", "bwd", "decode")))' 2>&1 | tail -1)"
echo "tree: $tree; source hashes: $hashes"
export TRITON_CACHE_DIR="$REPO/.tcache"
mkdir -p "$TRITON_CACHE_DIR"
# which cache entries this call opens (every step, the tuner's compile children too): only those come back
# (TCACHE_SCOPE=all: the whole cache); benchmarks/tcache/pathtune_tcache_log.py
export TRITON_CACHE_USED_LOG="$(dirname "$ROOT_S")/tcache_used.txt"
rm -f "$TRITON_CACHE_USED_LOG"
export TRITON_CACHE_MANAGER=pathtune_tcache_log:LoggingCacheManager
export PYTHONPATH="$REPO/benchmarks/tcache${PYTHONPATH:+:$PYTHONPATH}"
if ls .tcache_in/tcache.txz.* >/dev/null 2>&1; then
    cat .tcache_in/tcache.txz.* | tar xJf - -C "$TRITON_CACHE_DIR" && echo "Triton cache restored: $(du -sh "$TRITON_CACHE_DIR" | cut -f1)"
elif ls .tcache_in/tcache.tgz.* >/dev/null 2>&1; then
    cat .tcache_in/tcache.tgz.* | tar xzf - -C "$TRITON_CACHE_DIR" && echo "Triton cache restored: $(du -sh "$TRITON_CACHE_DIR" | cut -f1)"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$S/gpu.txt" 2>&1
# from /tmp, like every step: in the checkout's root, `python -m` would import its pathtune/ folder
(cd /tmp && python3 -m pathtune.cli env --json) > "$S/env.json" 2>&1

ensure_tvm_ffi() {  # the TVM runtime's Python side, from .whl when the image lacks it (no compiler needed)
    if ! python3 -c "import tvm_ffi" 2>/dev/null && ls "$REPO"/.whl/apache_tvm_ffi-*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-tvm \
            "$REPO"/.whl/apache_tvm_ffi-*.whl && export PYTHONPATH="/tmp/site-tvm${PYTHONPATH:+:$PYTHONPATH}"
    fi
}

STEP_NO=0
run_step() {  # name seconds command...
    local name="$1" secs="$2"
    shift 2
    local t0=$SECONDS
    echo "== $name (limit ${secs}s)"
    local before
    before="$(_step_files)"
    # SIGINT at the limit (then SIGKILL 45 s later): a tune stops like after Ctrl-C (the running trial
    # finishes and is recorded, the report is written), pytest prints its summary
    (cd /tmp && timeout --signal=INT --kill-after=45 "$secs" "$@") > "$S/$name.log" 2>&1
    local rc=$?
    echo "== $name rc=$rc in $((SECONDS - t0))s" | tee -a "$S/steps.txt"
    tail -n 25 "$S/$name.log"
    # the files this step wrote or rewrote in $S (its log, its JSON) also in s/steps/NN-name/: a later step of
    # the same name writes the same names at the top (databases excepted: they only grow)
    STEP_NO=$((STEP_NO + 1))
    local keep
    keep="$S/steps/$(printf %02d "$STEP_NO")-$name"
    mkdir -p "$keep"
    comm -13 <(echo "$before") <(_step_files) | cut -d' ' -f1 | grep -v -e '^steps\.txt$' -e '\.sqlite3' \
        | while read -r f; do cp -p "$S/$f" "$keep/"; done
}
_step_files() {  # "name mtime size" of every file at the top of $S, sorted
    (cd "$S" && find . -maxdepth 1 -type f -printf '%f %T@ %s\n' | sort)
}

_tuned_without_records() {  # BENCH_ARGS RECORD_DB: the args ask for --config tuned while the steps dispatch from
    # the call's own record database (empty until a step records): every key would run its heuristic config
    [[ " $1 " =~ [[:space:]]--config(=|[[:space:]]+)tuned[[:space:]] ]] && [ "${PATHTUNE_DB_URL:-}" = "$2" ]
}

run_steps() {  # the steps of one lane, in order, with S set
    # this call's database (it comes back): the steps record there; a PATHTUNE_DB_URL= word changes only what
    # the steps after it dispatch from
    local record_db="sqlite:///$S/perf.sqlite3"
    export PATHTUNE_DB_URL="$record_db"
    local arg step secs t dispatch_db pack_args pack_db
    for arg in "$@"; do
        # VAR=value: set for the steps after it (e.g. PASSES=bwd tune:300 PASSES=decode tune:90)
        if [[ "$arg" =~ ^[A-Z_][A-Z0-9_]*= ]]; then export "$arg"; continue; fi
        step="${arg%%:*}"
        secs="${arg#*:}"
        [ "$secs" = "$arg" ] && secs=""
        # REQUIRE_GPU=H200: the steps after it run only on a GPU whose name holds that text (a call for an H200
        # may land on an H100, whose tune would make H100 records); REQUIRE_GPU= lifts it
        if [ -n "${REQUIRE_GPU:-}" ] && ! grep -qi -- "$REQUIRE_GPU" "$ROOT_S/gpu.txt" 2>/dev/null; then
            echo "== $step skipped: the GPU ($(head -1 "$ROOT_S/gpu.txt" 2>/dev/null)) is not REQUIRE_GPU=$REQUIRE_GPU" \
                | tee -a "$S/steps.txt"
            continue
        fi
        case "$step" in
            tests) # the TVM decode test runs when build/tvm_decode_bench is carried and skips (saying why) otherwise
                   decode_store=""; [ -d "$REPO/build/tvm_decode_bench" ] && decode_store="$REPO/build/tvm_decode_bench"
                   # workers share one GPU and the largest cases hold 9-18 GiB each: six overfill an 80 GiB H100
                   gpu_mib=$(awk -F', ' 'NR == 1 { print $3 + 0 }' "$ROOT_S/gpu.txt" 2>/dev/null)   # "81559 MiB"
                   workers="${TESTS_WORKERS:-$([ "${gpu_mib:-0}" -ge 120000 ] 2>/dev/null && echo 6 || echo 4)}"
                   run_step tests "${secs:-240}" env ${decode_store:+PATHTUNE_TVM_MODULES="$decode_store"} \
                       PATHTUNE_TVM_BENCH_MODULES="$REPO/build/tvm_bench" \
                       python3 -m pytest -q -m gpu -p no:cacheprovider -n "$workers" \
                       "$REPO/tests/test_triton_gpu.py" "$REPO/tests/test_triton_decode.py" \
                       "$REPO/tests/test_runtime_dispatch.py" "$REPO/tests/test_layer.py" \
                       "$REPO/tests/test_decode_dispatch.py" "$REPO/tests/test_tvm_gpu.py" \
                       "$REPO/tests/test_triton_launch.py" ${TESTS_K:+-k "$TESTS_K"} -rA ;;
            # 8 workers: the matrix is bound by cold compiles (ptxas on the host's 16 cores), not by the GPU
            fwdtests) run_step fwdtests "${secs:-180}" python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 \
                          "$REPO/tests/test_triton_gpu.py" ${FWDTESTS_K:+-k "$FWDTESTS_K"} -rA ;;
            decodetests) run_step decodetests "${secs:-120}" python3 -m pytest -q -m gpu -p no:cacheprovider \
                             "$REPO/tests/test_decode_static.py" "$REPO/tests/test_triton_decode.py" \
                             "$REPO/tests/test_decode_lazy.py" "$REPO/tests/test_decode_frames.py" \
                             "$REPO/tests/test_triton_launch.py" -rA ;;
            decodeprobe) run_step decodeprobe "${secs:-240}" python3 "$REPO/benchmarks/decode_probe.py" \
                             --budget-s "$(( ${secs:-240} - 15 ))" ${DECODEPROBE_ARGS:-} --out "$S/${DECODEPROBE_JSON:-decode_probe.json}" ;;
            tvmtests) run_step tvmtests "${secs:-120}" env PATHTUNE_TVM_BENCH_MODULES="$REPO/build/tvm_bench" \
                          python3 -m pytest -q -m gpu -p no:cacheprovider "$REPO/tests/test_tvm_gpu.py" -rA ;;
            bench) if _tuned_without_records "${BENCH_ARGS:-}" "$record_db"; then
                       echo "== bench skipped: BENCH_ARGS ask for --config tuned, but this step dispatches from the call's" \
                            "empty record database: use the benchtuned step (or a PATHTUNE_DB_URL= word before bench)" \
                           | tee -a "$S/steps.txt"
                       continue
                   fi
                   run_step bench "${secs:-240}" python3 -m pathtune.cli bench --head-dim "${HEAD_DIMS:-64,128}" ${BENCH_ARGS:-} \
                       --record --json "$S/${BENCH_JSON:-bench.json}" ;;
            decode) run_step decode "${secs:-120}" python3 -m pathtune.cli bench --pass decode --record \
                        --json "$S/decode.json" ;;
            dsweep) run_step dsweep "${secs:-240}" python3 -m pathtune.cli bench --pass decode --sweep --record \
                        ${DSWEEP_KNOBS:+--sweep-knobs "$DSWEEP_KNOBS"} ${DSWEEP_TOKENS:+--new-tokens "$DSWEEP_TOKENS"} ${DSWEEP_ARGS:-} \
                        --json "$S/${DSWEEP_JSON:-decode_sweep.json}" ;;
            benchtuned)  # dispatch from this call's tune database if a tune step ran, else the shipped records
                         if [ -f "$S/tune/tune.sqlite3" ]; then dispatch_db="sqlite:///$S/tune/tune.sqlite3"; else dispatch_db=""; fi
                         run_step benchtuned "${secs:-240}" env PATHTUNE_DB_URL="$dispatch_db" python3 -m pathtune.cli bench \
                             --head-dim "${HEAD_DIMS:-64,128}" --config tuned --gate "${BENCH_GATE:-both}" ${BENCH_ARGS:-} --record --db "$record_db" \
                             --json "$S/bench_tuned.json" ;;
            tune) t="${secs:-600}"
                  # a tune spread over several calls: carry the last call's database in (.tune_in/tune.sqlite3,
                  # from session.tgz s/tune/), h200_tune.sh resumes its studies and looks up what it measured
                  if [ -f ".tune_in/${LANE:+$LANE/}tune.sqlite3" ] && [ ! -f "$S/tune/tune.sqlite3" ]; then
                      mkdir -p "$S/tune" && cp ".tune_in/${LANE:+$LANE/}tune.sqlite3" "$S/tune/tune.sqlite3"
                  fi
                  run_step tune "$t" env OUT="$S/tune" BUDGET="${TUNE_BUDGET:-$(( (t - 150) / 60 ))m}" WHEELS="$REPO/.whl" \
                      bash "$REPO/benchmarks/h200_tune.sh" ;;
            ffcompare) mkdir -p "$S/flipflop" && cp "$REPO/examples/flipflop/results.json" "$S/flipflop/results.json"
                       run_step ffcompare "${secs:-240}" env PYTHONPATH="$PYTHONPATH:$REPO" \
                           python3 -m examples.flipflop --device cuda --no-progress --resume \
                           --budget-minutes "$(python3 -c "print(round((${secs:-240} - 20) / 60, 1))")" \
                           --out "$S/flipflop/results.json" ;;
            flipflop) t="${secs:-540}"
                      # run from /tmp like every step: the repo goes after the installed pathtune on the path
                      run_step flipflop "$t" env PYTHONPATH="$PYTHONPATH:$REPO" \
                          python3 -m examples.flipflop --device cuda --no-progress \
                          --budget-minutes "$(python3 -c "print(round(($t - 45) / 60, 1))")" \
                          --out "$S/flipflop/results.json" ;;
            lm) pack_args=()   # PACK=<file in the checkout> (carried), else a pack exported here from this
                # call's tune, or from the shipped records (a fresh database ingests them; the lane's
                # PATHTUNE_DB_URL file may not exist, and the runtime would then use its heuristics)
                if [ -f "$S/tune/tune.sqlite3" ]; then pack_db="sqlite:///$S/tune/tune.sqlite3"; else pack_db="sqlite:///$S/shipped.sqlite3"; fi
                if [ -n "${PACK:-}" ]; then
                    pack_args=(--pack "$REPO/$PACK")
                elif (cd /tmp && python3 -m pathtune.cli export --gpu H200 -o "$S/h200_pack.json" --db "$pack_db") \
                       > "$S/export.log" 2>&1; then
                    pack_args=(--pack "$S/h200_pack.json")
                fi
                run_step lm "${secs:-120}" python3 "$REPO/examples/lm_generate.py" --device cuda "${pack_args[@]}" ;;
            tvm) run_step tvm "${secs:-200}" python3 "$REPO/benchmarks/tvm_gpu_check.py" \
                     --budget-min "$(python3 -c "print(round(${secs:-200} / 60 - 0.7, 1))")" ;;
            tvmbench)  ensure_tvm_ffi   # the runtime libraries come from the module folder
                       if [ -f "$S/tune/tune.sqlite3" ]; then dispatch_db="sqlite:///$S/tune/tune.sqlite3"; else dispatch_db=""; fi
                       run_step tvmbench "${secs:-240}" env PATHTUNE_DB_URL="$dispatch_db" python3 -m pathtune.cli bench \
                           --head-dim "${HEAD_DIMS:-64,128}" --gate "${BENCH_GATE:-both}" --config tuned \
                           --backends triton,tvm --tvm-modules "$REPO/build/tvm_bench" --forward-only \
                           --record --db "$record_db" --json "$S/bench_tvm.json" ;;
            tvmdecode) run_step tvmdecode "${secs:-480}" python3 "$REPO/benchmarks/tvm_gpu_check.py" \
                           --bundle "$REPO/build/tvm_gpu_check_decode" ${TVM_ONLY:+--only "$TVM_ONLY"} \
                           --budget-min "$(python3 -c "print(round(${secs:-480} / 60 - 0.7, 1))")" ;;
            tvmdecodebench) t="${secs:-300}"
                            ensure_tvm_ffi
                            run_step tvmdecodebench "$((t - 60))" python3 -m pathtune.cli bench --pass decode \
                                --backends triton,tvm --tvm-modules "$REPO/build/tvm_decode_bench" --baselines sdpa \
                                --seq-len 4096,32768 --record --json "$S/decode_tvm.json"
                            run_step tvmdecodeauto 60 env PATHTUNE_TVM_MODULES="$REPO/build/tvm_decode_bench" \
                                PATHTUNE_PRINT_DISPATCH=1 python3 "$REPO/benchmarks/tvm_decode_auto.py" \
                                --json "$S/decode_auto.json" ;;
            memcheck) run_step memcheck "${secs:-180}" compute-sanitizer --tool memcheck --print-limit 20 \
                          python3 "$REPO/benchmarks/dev_memcheck.py" 64 1300 512 1 ;;
            probe) run_step probe "${secs:-60}" python3 "$REPO/benchmarks/memory_probe.py" --no-timeline ;;
            profile) run_step profile "${secs:-120}" env OUT="$S" python3 "$REPO/benchmarks/dev_gpu_run2.py" ${PROFILE_STEPS:-profile profile4k} ;;
            utprobe) run_step utprobe "${secs:-120}" python3 "$REPO/benchmarks/ut_probe.py" ${UTPROBE_PATHS:+--paths "$UTPROBE_PATHS"} ${UTPROBE_ARGS:-} \
                         --out "$S/ut_probe.json" ;;
            scanprobe) run_step scanprobe "${secs:-150}" python3 "$REPO/benchmarks/scan_probe.py" ${SCANPROBE_ARGS:-} \
                           --out "$S/scan_probe.json" ;;
            fwdprobe) run_step fwdprobe "${secs:-300}" env OUT="$S" python3 "$REPO/benchmarks/fwd_probe.py" ${FWDPROBE_ARGS:-} ;;
            kprobe) run_step kprobe "${secs:-150}" env OUT="$S" python3 "$REPO/benchmarks/dev_kernel_probe.py" ${KPROBE_ARGS:-} ;;
            precprobe) run_step precprobe "${secs:-200}" env OUT="$S" python3 "$REPO/benchmarks/precision_probe.py" \
                       ${PRECPROBE_ARGS:-} ;;
            noise) run_step noise "${secs:-200}" env OUT="$S" python3 "$REPO/benchmarks/timing_noise.py" ${NOISE_ARGS:-} ;;
            ncu) run_step ncu "${secs:-150}" ncu --kernel-name "regex:${NCU_KERNELS:-bwd_intra_diag}" \
                     --launch-skip "${NCU_SKIP:-8}" --launch-count "${NCU_COUNT:-1}" \
                     --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats \
                     --section SchedulerStats --section MemoryWorkloadAnalysis ${NCU_EXTRA:-} \
                     python3 "$REPO/benchmarks/ncu_step.py" ${NCUSTEP_ARGS:---D 128 --T 4096} ;;
            sweep) run_step sweep "${secs:-240}" env OUT="$S" python3 "$REPO/benchmarks/dev_gpu_run2.py" ${SWEEP:-sweep} ;;
            split) run_step split "${secs:-150}" bash "$REPO/${BUNDLE:-build/split/bundle}/run.sh" "$S/split_results.json" ;;
            ranges) run_step ranges "${secs:-150}" env OUT="$S" python3 "$REPO/benchmarks/dev_gpu_run2.py" ranges ;;
            *) echo "unknown step '$step' (see the header of $0)" | tee -a "$S/steps.txt" ;;
        esac
    done
}

if [ "${1:-}" = "--lanes" ]; then
    shift
    lane_index=0
    # the compile children of a lane's tune share the host's cores with the other lanes
    export COMPILE_WORKERS="${COMPILE_WORKERS:-$(( $(nproc) / $# - 2 ))}"
    for lane_spec in "$@"; do
        (
            read -r -a words <<< "$lane_spec"
            export CUDA_VISIBLE_DEVICES="$lane_index" LANE="lane$lane_index"
            S="$ROOT_S/$LANE"
            mkdir -p "$S"
            echo "== $LANE on GPU $lane_index: $lane_spec" | tee -a "$S/steps.txt"
            run_steps "${words[@]}" > "$S/lane.log" 2>&1
        ) &
        lane_index=$((lane_index + 1))
    done
    wait
    for lane_dir in "$ROOT_S"/lane*; do echo "#### $(basename "$lane_dir")"; cat "$lane_dir/steps.txt"; done
else
    run_steps "$@"
fi

tar czf "$OUT/session.tgz" -C "$(dirname "$S")" s
# TCACHE_OUT=0: leave the Triton cache behind; TCACHE_SCOPE=all: every entry, not only those this call opened
# Only what a cache hit reads comes back (the cubin, its metadata JSON, the group files, the launcher .so):
# Triton loads a cached kernel from those and skips the IR files it lists but cannot find; xz keeps the
# parts few (~10 MiB for both head dims' fwd + bwd kernels and fla's)
if [ "${TCACHE_OUT:-1}" = 1 ]; then
    entries="$(dirname "$ROOT_S")/tcache_entries.txt"
    if [ "${TCACHE_SCOPE:-used}" = used ] && [ -s "$TRITON_CACHE_USED_LOG" ]; then
        sort -u "$TRITON_CACHE_USED_LOG" | while read -r e; do [ -d "$TRITON_CACHE_DIR/$e" ] && echo "./$e"; done > "$entries"
        echo "Triton cache: the $(grep -c . "$entries") of $(ls "$TRITON_CACHE_DIR" | wc -l) entries this call opened come back"
    else
        echo . > "$entries"
        echo "Triton cache: all $(ls "$TRITON_CACHE_DIR" | wc -l) entries come back"
    fi
    tar cf - -C "$TRITON_CACHE_DIR" --exclude='*.ttir' --exclude='*.ttgir' --exclude='*.llir' --exclude='*.ptx' \
        --exclude='*.source' -T "$entries" 2>/dev/null | xz -T0 -6 | split -b 15m - "$OUT/tcache.txz."
fi
ls -la "$OUT"
