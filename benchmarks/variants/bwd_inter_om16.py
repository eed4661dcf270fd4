"""Candidate for both backward kernels between super-chunks: super-chunk pair transitions read, not carried.

Shipped (head dims up to 128): ``bwd_inter_dq_kernel`` and ``bwd_inter_dkv_kernel`` carry the running
transition Om_{I,J} = What_{I-1} ... What_{J+1} as a BD x BD float32 register tile across the whole walk,
update it by one D x D x D product per super-chunk (at bwd_transition_precision) and multiply by it
in float32 modes: Om and the loaded What_I hold ~128 of the 255 registers a thread has at D = 128 and
8 warps, the main cause of 1.4-2 KB of spills per thread on sm_90.

Here every pair's Om_{I,J} is formed once per backward, in the scan's 16-bit type (``pair_products``:
a [n_pairs, H, BD, BD] buffer laid out like dOm, half its bytes), and each kernel loads the tile of the
pair it is at from L2 when it needs it: no D x D tile lives across the inner loops, the per-tile
chain products disappear (they were repeated by every key tile and query chunk), and the products
with Om run on 16-bit tensor cores (fp16 keeps tf32's 10-bit mantissa: the precision of the
``tf32`` transitions the heuristic runs at D = 128).  The key-side kernel also works keys-as-rows
(``bwd_inter_rows``).  Text replacements of ``codegen/triton/bwd_inter.py`` (same signatures: the
pair products come in through ``om_ptr``); ``OmLauncher`` supplies them to a captured or swapped launch.
"""
from __future__ import annotations

import functools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernel_variants import load_variant_module, module_source  # noqa: E402

import pathtune.codegen.triton.bwd_inter as bwd_inter  # noqa: E402
from variants import bwd_inter_rows  # noqa: E402

_DQ = (
    ("""            Om = tl.where(d[:, None] == d[None, :], 1.0, 0.0)
            dY = tl.zeros((C, BD), dtype=tl.float32)
            for step in range(0, sc_idx):
                jj = sc_idx - 1 - step
                Zd = tl.dot(Y, Om, input_precision=TP).to(DT)
""", """            pair_base = tl.load(seq_pair_base + sid)
            n_sc_seq = (send - s0 + S - 1) // S
            dpair = d[:, None] * BD + d[None, :]
            Yd = Y.to(DT)
            dY = tl.zeros((C, BD), dtype=tl.float32)
            for step in range(0, sc_idx):
                jj = sc_idx - 1 - step
                om_base = om_ptr + ((pair_base + sc_idx * n_sc_seq + jj) * H + h) * BD * BD
                Zd = mm(Yd, tl.load(om_base + dpair).to(DT), INTERP).to(DT)
"""),
    ("""                dY += tl.dot(dZ, tl.trans(Om), input_precision=TP)
                Wh = tl.load(what_ptr + (((sc_base + jj) * H + h) * BD + d[:, None]) * BD + d[None, :])
                Om = tl.dot(Om, Wh, input_precision=TP)
""", """                dY += mm(dZ.to(DT), tl.trans(tl.load(om_base + dpair).to(DT)), INTERP)
"""),
)
_DKV = (
    ("""                Om = tl.where(d[:, None] == d[None, :], 1.0, 0.0)
                for il in range(jl + 1, n_sc_seq):
                    KZ = tl.dot(KJ.to(tl.float32), tl.trans(Om), input_precision=TP).to(DT)
""", """                KJd = KJ.to(DT)
                for il in range(jl + 1, n_sc_seq):
                    om_base = om_ptr + ((pair_base + il * n_sc_seq + jl) * H + h) * BD * BD
                    KZ = mm(KJd, tl.trans(tl.load(om_base + dpair).to(DT)), INTERP).to(DT)
"""),
    ("""                    tl.store(dkj_ptr + koff, tl.load(dkj_ptr + koff, mask=dmask, other=0.0)
                             + tl.dot(dKZ, Om, input_precision=TP) * scale, mask=dmask)
                    pptr = dom_ptr + ((pair_base + il * n_sc_seq + jl) * H + h) * BD * BD + dpair
                    dom = tl.dot(tl.trans(dKZ), KJ.to(tl.float32), input_precision=TP) * scale
                    tl.atomic_add(pptr, dom, sem="relaxed")
""", """                    dKZd = dKZ.to(DT)
                    tl.store(dkj_ptr + koff, tl.load(dkj_ptr + koff, mask=dmask, other=0.0)
                             + mm(dKZd, tl.load(om_base + dpair).to(DT), INTERP) * scale, mask=dmask)
                    pptr = dom_ptr + ((pair_base + il * n_sc_seq + jl) * H + h) * BD * BD + dpair
                    tl.atomic_add(pptr, mm(tl.trans(dKZd), KJd, INTERP) * scale, sem="relaxed")
"""),
    ("""                    Wh = tl.load(what_ptr + (((sc_base + il) * H + h) * BD + d[:, None]) * BD + d[None, :])
                    Om = tl.dot(Wh, Om, input_precision=TP)
            else:
                krow = (krows * H + h) * D""", """            else:
                krow = (krows * H + h) * D"""),
)


@functools.lru_cache(maxsize=None)
def kernels() -> dict:
    """{shipped kernel name: variant} for bwd_inter_dq_kernel and bwd_inter_dkv_kernel, built once."""
    mod = load_variant_module(module_source(bwd_inter), "bwd_inter_om16", _DQ + _DKV + bwd_inter_rows._REPLACEMENTS)
    return {name: getattr(mod, name) for name in ("bwd_inter_dq_kernel", "bwd_inter_dkv_kernel")}


def pair_products(what: torch.Tensor, seq_start, seq_end, seq_sc_base, seq_pair_base, S: int,
                  dtype: torch.dtype) -> torch.Tensor:
    """Om_{I,J} = What_{I-1} ... What_{J+1} (identity for J = I-1) of every super-chunk pair of every
    sequence, laid out like dOm ([n_pairs, H, BD, BD], pair index pair_base + I * n_sc + J), in float32
    products rounded once to ``dtype``.  Host loops: probe and test use only."""
    _, H, BD, _ = what.shape
    starts, ends = seq_start.tolist(), seq_end.tolist()
    sc_base, pair_base = seq_sc_base.tolist(), seq_pair_base.tolist()
    n_sc = [-(-(e - s) // S) for s, e in zip(starts, ends)]
    n_pairs = max(pb + n * n for pb, n in zip(pair_base, n_sc))
    om = torch.zeros(n_pairs, H, BD, BD, device=what.device, dtype=torch.float32)
    eye = torch.eye(BD, device=what.device).expand(H, BD, BD)
    for sb, pb, n in zip(sc_base, pair_base, n_sc):
        for i in range(1, n):
            cur = eye
            for j in range(i - 1, -1, -1):        # Om_{i,j} = Om_{i,j+1} What_{j+1}
                if j < i - 1:
                    cur = cur @ what[sb + j + 1]
                om[pb + i * n + j] = cur
    return om.to(dtype)


class OmLauncher:
    """Launches ``kernel`` (a variant from ``kernels()``) with the pair products in place of the
    ``om_ptr`` argument of a shipped launch; stands in for the shipped kernel in a launcher module."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.launched = 0

    def __getitem__(self, grid):
        def launch(*args, **kw):
            names = self.kernel.arg_names
            a = dict(zip(names, args))
            om = pair_products(a["what_ptr"], a["seq_start"], a["seq_end"], a["seq_sc_base"], a["seq_pair_base"],
                               kw["S"], a["kj_ptr"].dtype)
            args = list(args)
            args[names.index("om_ptr")] = om
            self.launched += 1
            return self.kernel[grid](*args, **kw)
        return launch
