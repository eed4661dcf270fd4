#!/usr/bin/env bash
# Full tune on one H200: D in {64,128} x {fwd, bwd, decode} x 4 length buckets x triton,
# accuracy-gated, within ~10 GPU-minutes. Run in the repo root on the GPU host:
#
#   WHEELS=/path/to/wheels OUT=/path/to/out bash benchmarks/h200_tune.sh
#
#   WHEELS  folder with the optuna / sqlalchemy / alembic wheels (and their deps: colorlog, tqdm, Mako,
#           greenlet, ...), used only when `import optuna` fails here (pip --no-index).
#   OUT     where everything goes (default $OUT of the device run, else /tmp/pathtune-h200-tune):
#             tune.sqlite3                 Optuna studies + perf_db (one worker: SQLite is fine)
#             H200-tune-<UTC time>.json    every measurement (perf_db/RESULTS_FORMAT.md): copy it to
#                                          perf_db/shipped/ (PerfDB.open_default ingests it once)
#             h200_tune_report-<time>.json       per key: default ms vs tuned ms, speedup, best config, SDPA ms
#             env.json, tune.log           `pathtune env --json`, the tune's console output
#   BUDGET  wall-time budget of the tune (default 9m; every key gets an equal share of what is left, and
#           at least one batch of candidates; the batch that runs when the budget ends still finishes
#           compiling, so leave ~2 min of slack under a hard limit)
#   BUCKETS length buckets (default 2048,4096,8192,16384); HEAD_DIMS (64,128); PASSES (decode,fwd,bwd);
#   TOKENS  B*T of each key's timed shape (default 32768; the decode issue's shapes: 8 x 32768 = 262144)
#   COMPILE_WORKERS  child processes compiling a batch at once (default 12: the H200 host has 16 cores)
#   GATE    fox (PaTH-FoX keys, default), path (plain PaTH keys: the dispatcher carries only the schedule
#           knobs of a result across gate settings, so precision moves need their own keys) or both (one run,
#           one compile wave for the seeded configs of both)
#   SEED_CONFIG  JSON knob values every study measures right after its default (--seed-config), e.g.
#           '[{"ut_precision":"tf32"},{"ut_precision":"tf32","bwd_transition_precision":"tf32"}]'
#   SEED_RETIRED, SEED_OTHER_GPUS, SEED_NEIGHBOURS, STARTUP  --seed-retired (3), --seed-other-gpus (2: the
#           current kernels' winners of the same key on other GPUs), --seed-neighbours (12), --startup-trials (8):
#           a short re-tune after a kernel edit measures the default and the retired winners only, e.g.
#           SEED_NEIGHBOURS=0 STARTUP=0 BUDGET=5m,3
#   REFINE  --refine N: after the seeded configs, up to N recombinations of their changes (the fastest one's
#           changes undone one at a time, unions of two winners'), measured like seeds
#   CONFIRM  --confirm N: after each study its N fastest configs re-timed in CONFIRM_ROUNDS (--confirm-rounds, 3)
#           interleaved rounds, each draw recorded (near host-bound keys: one timing moves with host jitter)
#
# Re-running with the same OUT continues the studies (--resume) and never re-measures a config.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT="${OUT:-/tmp/pathtune-h200-tune}"
BUDGET="${BUDGET:-9m}"
mkdir -p "$OUT"

python -c "import pathtune" 2>/dev/null || python -m pip install -q --no-deps -e .
if ! python -c "import optuna, sqlalchemy, alembic" 2>/dev/null; then
    [ -n "${WHEELS:-}" ] || { echo "optuna/sqlalchemy/alembic missing: set WHEELS=<folder of wheels>" >&2; exit 1; }
    python -m pip install -q --no-index --find-links "$WHEELS" optuna sqlalchemy alembic
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
pathtune env --json > "$OUT/env.json"

# no serial smoke run: every candidate compiles in its own child process first (--compile-workers),
# so a config that faults the GPU is recorded as crash there and never reaches the measuring process
STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
case "${GATE:-fox}" in
    fox) GATE_FLAG=--gate ;;
    path) GATE_FLAG=--no-gate ;;
    both) GATE_FLAG=--both-gates ;;
    *) echo "GATE must be fox, path or both, got '$GATE'" >&2; exit 2 ;;
esac
HD="${HEAD_DIMS:-64,128}"
# the GPU's model in the name (H200, H100, ...; perf_db/shipped/README.md): a call for an H200 may land elsewhere
GPU_TAG="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -oE '[A-Z][0-9]{2,4}' | head -1)"
RESULTS="$OUT/${GPU_TAG:-GPU}-tune-d${HD//,/-}-$STAMP.json"
set +e
pathtune tune \
    --head-dim "${HEAD_DIMS:-64,128}" --dtype bfloat16 --pass "${PASSES:-decode,fwd,bwd}" --backend triton \
    --tokens "${TOKENS:-32768}" \
    --compile-workers "${COMPILE_WORKERS:-12}" ${SEED_CONFIG:+--seed-config "$SEED_CONFIG"} \
    ${SEED_RETIRED:+--seed-retired "$SEED_RETIRED"} ${SEED_NEIGHBOURS:+--seed-neighbours "$SEED_NEIGHBOURS"} \
    ${SEED_OTHER_GPUS:+--seed-other-gpus "$SEED_OTHER_GPUS"} \
    ${STARTUP:+--startup-trials "$STARTUP"} ${REFINE:+--refine "$REFINE"} \
    ${CONFIRM:+--confirm "$CONFIRM"} ${CONFIRM_ROUNDS:+--confirm-rounds "$CONFIRM_ROUNDS"} \
    --buckets "${BUCKETS:-2048,4096,8192,16384}" "$GATE_FLAG" \
    --budget "$BUDGET" --storage "sqlite:///$OUT/tune.sqlite3" --resume --seed 0 \
    --results-out "$RESULTS" --report-json "$OUT/h200_tune_report-$STAMP.json" 2>&1 | tee "$OUT/tune.log"
status=${PIPESTATUS[0]}
set -e
# a summary of what is stored (every status), and the default-vs-tuned table again
pathtune query --db "sqlite:///$OUT/tune.sqlite3" --format csv > "$OUT/perf_db_rows.csv" || true
python - "$OUT/h200_tune_report-$STAMP.json" <<'EOF' || true
import json, sys
rows = json.load(open(sys.argv[1]))
print(f"{'key':48s} {'trials':>6s} {'default ms':>11s} {'tuned ms':>9s} {'speedup':>8s} {'tuned/SDPA':>10s} "
      f"{'vs previous':>11s}")
for r in rows:
    f = lambda v: "-" if v is None else f"{v:.4g}"
    vs = r["best_ms"] / r["baseline_ms"] if r["best_ms"] and r["baseline_ms"] else None
    print(f"{r['label']:48s} {r['trials']:6d} {f(r['default_ms']):>11s} {f(r['best_ms']):>9s} "
          f"{f(r['speedup']):>8s} {f(vs):>10s} {f(r.get('vs_previous')):>11s}")
EOF
echo "results file for perf_db/shipped/: $RESULTS (exit status of the tune: $status)"
exit "$status"
