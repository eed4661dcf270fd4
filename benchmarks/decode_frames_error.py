"""GPU probe: the two-level decode's output error over many steps, beside the one-level kernel's.

    python benchmarks/decode_frames_error.py          # JSON rows to stdout and $OUT/decode_err.json

For each case of tests/test_decode_frames.py's float64 comparison that runs long (D128, 80 steps of 16 tokens / 140
of one token over a bf16 cache of 2000 prompt keys, split-K 4, block 128), at ``decode_frame_bound`` 0 (one frame
level) and 1024 (two): the largest relative error over the steps of the kernel's output against the exact step
(float64 keys never rounded) and against the bf16 per-token-rounding reference step, that reference's own error
against the exact step, and the final current-frame keys' errors.  Needs pathtune installed; the test helpers come
from tests/.
"""
from __future__ import annotations

import json
import os
import sys

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
import test_triton_decode as td  # noqa: E402
from pathtune.runtime.reference import path_attention_decode  # noqa: E402


def rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def main() -> None:
    out = []
    for D, H, HQ, TN in ((128, 2, 8, 16), (128, 4, 4, 1)):
        for bound in (0, 1024):
            torch.manual_seed(D + TN)
            B, T0 = 2, 2000
            steps = 80 if TN == 16 else 140
            tri, ref_cache = td.prefilled(B, T0, HQ, H, D, D, True, torch.bfloat16)
            exact = td._EXACT[id(ref_cache)][1]
            cfg = dict(decode_block_n=128, decode_splits=4, decode_num_warps=4, decode_frame_bound=bound)
            m_ref = m_exact = m_refself = 0.0
            for _ in range(steps):
                xs = td.make(B, TN, HQ, H, D, D, True, dtype=torch.bfloat16)
                o = td.path_decode_triton(*xs, tri, config=cfg)
                ref = path_attention_decode(*td.f64(xs), ref_cache)
                ox = path_attention_decode(*td.f64(xs), exact)
                m_ref, m_exact = max(m_ref, rel(o, ref)), max(m_exact, rel(o, ox))
                m_refself = max(m_refself, rel(ref, ox))
            n = tri.length
            row = dict(D=D, H=H, HQ=HQ, TN=TN, frame_bound=bound, steps=steps, max_o_vs_bf16ref=m_ref,
                       max_o_vs_exact=m_exact, max_bf16ref_vs_exact=m_refself,
                       keys_vs_exact=rel(tri.k[:, :n], exact.k[:, :n]),
                       bf16ref_keys_vs_exact=rel(ref_cache.k[:, :n], exact.k[:, :n]))
            print(json.dumps(row), flush=True)
            out.append(row)
    with open(os.path.join(os.environ.get("OUT", "."), "decode_err.json"), "w") as fh:
        json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
