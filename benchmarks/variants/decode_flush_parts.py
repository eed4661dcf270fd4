"""Timing-only proxies of the decode flush step with one of its parts left out (built from codegen/triton/decode.py
by text replacement, ``kernel_variants``; same signature and launch arguments): where a flush step's extra time
goes (0.07-0.10 ms at a 4K cache, 0.4-0.6 ms at 32K, B = 8, on top of a plain step).

A flush step does, besides a plain step's work: every program forms the compact WY factors (``_wy``: NP dependent
back-substitution steps) and rotates its split's frame rows in rounds of ROT_ROWS rows; the owner program also
rotates the pending rows by the factors' trailing parts (``_rotate_pending``: two [PB, BD] x [BD, PB] products).

* ``decode_kernel_flush_no_pending``: the owner skips the pending rows' rotation.
* ``decode_kernel_flush_no_wy``: the factors without the back substitution (T = diag(beta)).
* ``decode_kernel_flush_no_rounds``: the factors formed, the frame rows' rounds skipped.

Their outputs and keys are not PaTH's (timing only); ``flush_net_ms`` minus each ``candidate*_flush_net_ms`` is that
part's share:

``python benchmarks/decode_probe.py --skip checks,profiles,hostprofile,generate --tokens 1,16 --candidate-decode
benchmarks/variants/decode_flush_parts.py:decode_kernel_flush_no_pending,benchmarks/variants/decode_flush_parts.py:decode_kernel_flush_no_wy,benchmarks/variants/decode_flush_parts.py:decode_kernel_flush_no_rounds``
"""
from __future__ import annotations

import sys
from pathlib import Path

import pathtune.codegen.triton.decode as decode_mod

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))      # benchmarks/: kernel_variants
from kernel_variants import load_variant, module_source  # noqa: E402

PENDING = "            Kp = _rotate_pending(Kp, Wm, M, PB, cdt == tl.bfloat16, F32)\n"
SUBSTITUTION = """    for i2 in range(0, NP):
        i = NP - 1 - i2
"""
ROUNDS = "        for r0 in range(row_lo, row_hi, ROT_ROWS):\n"

_SRC = module_source(decode_mod)
decode_kernel_flush_no_pending = load_variant(_SRC, "decode_kernel", "decode_flush_no_pending", [(PENDING, "")])
decode_kernel_flush_no_wy = load_variant(
    _SRC, "decode_kernel", "decode_flush_no_wy",
    [(SUBSTITUTION, "    T = tl.where(s[:, None] == s[None, :], bw[None, :], 0.0)\n    for i2 in range(0, 0):\n"
                    "        i = NP - 1 - i2\n")])
decode_kernel_flush_no_rounds = load_variant(
    _SRC, "decode_kernel", "decode_flush_no_rounds",
    [(ROUNDS, "        for r0 in range(row_lo, tl.minimum(row_hi, row_lo), ROT_ROWS):\n")])
