"""pathtune.tuning: ``pathtune tune`` (Optuna) and ``pathtune bench``.

Tuner, one job per module (Optuna, SQLAlchemy and torch load on use, never at import):

* ``space``: the keys (pass x backend x workload, timed at B*T = 32768 tokens), study names, the
  seeded default config, the TPE sampler;
* ``measure``: one candidate: accuracy gate vs the float64 reference, then ``do_bench`` + SDPA baseline
  (torch + triton only: the GPU side of the split flow);
* ``objective``: the Optuna objective: suggest, perf_db lookup, measure, ``PerfDB.record``;
* ``tuner``: the local loop (RDB storage with heartbeats, budget, Ctrl-C, ``--resume``);
  ``progress``: the rich progress display;
* ``bundle`` / ``runner``: split flow (build host proposes + compiles; GPU host measures a bundle;
  ``pathtune tune ingest``).

Benchmarks: ``bench`` / ``decode_bench`` (``pathtune bench``) and ``baselines`` (SDPA, fla); ``inputs``: the
timed shapes and random inputs that the bench and the tuner share. The ``pathtune tune`` and
``pathtune bench`` commands themselves are in ``pathtune/cli/``.
"""
