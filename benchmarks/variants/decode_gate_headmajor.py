"""Timing-only proxies of the one-token decode step's gate offsets read from a head-major gate cumsum (built from
codegen/triton/decode.py by text replacement, ``kernel_variants``; same signature and launch arguments).

The cache keeps the gate cumsum as c [B, max_len, HQ] (float32, token-major): the one-row tile loop reads one
4-byte offset per key at a stride of HQ floats, one 32-byte sector per key at HQ >= 8.  A head-major cumsum
([B, HQ, max_len]) would make that read one contiguous vector per tile.

* ``decode_kernel_headmajor``: the tile loop reads its offsets at the head-major addresses of the same buffer
  (c_base + hq * max_len + row: in bounds, the values another layout's, so the outputs are not PaTH-FoX's): the
  access pattern of a head-major cache, for timing only.
* ``decode_kernel_noload``: the tile loop without the offsets' load (offset 0): the bound of what any layout
  of the offsets can save, for timing only.

``python benchmarks/decode_probe.py --skip checks,profiles,hostprofile,generate --tokens 1 --candidate-decode
benchmarks/variants/decode_gate_headmajor.py:decode_kernel_headmajor,benchmarks/variants/decode_gate_headmajor.py:decode_kernel_noload``
"""
from __future__ import annotations

import sys
from pathlib import Path

import pathtune.codegen.triton.decode as decode_mod

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))      # benchmarks/: kernel_variants
from kernel_variants import load_variant, module_source  # noqa: E402

_ROW_LOAD = "            c_v = tl.load(c_base + nr * HQ + h * G, mask=nmask, other=0.0)\n"

decode_kernel_headmajor = load_variant(
    module_source(decode_mod), "decode_kernel", "decode_gate_headmajor",
    [(_ROW_LOAD, "            c_v = tl.load(c_base + (h * G) * max_len + nr, mask=nmask, other=0.0)\n")])

decode_kernel_noload = load_variant(
    module_source(decode_mod), "decode_kernel", "decode_gate_noload",
    [(_ROW_LOAD, "            c_v = tl.zeros([BLOCK_N], tl.float32)\n")])
