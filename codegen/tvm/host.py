"""Host side of the TVM backend: layouts, tables, allocations and launches (torch only, no TVM import).

The same code drives modules built for the GPU (loaded with only the TVM runtime, runtime.py) and
modules built for the CPU (llvm, the numerics tests): ``kernels`` maps a kernel name ("ut",
"transport", "scan", "decode", "decode_merge") to a callable taking the tensors in the order the
prim_func declares them. Layout and tables are the Triton backend's (codegen/triton/_layout.py):
token-major [N_tok, heads, dim] tensors and chunk / super-chunk tables.
"""
from __future__ import annotations

from typing import Callable, Mapping, Optional, Tuple

import torch

from .params import KernelDims, TVMParams

__all__ = ["forward", "decode_step", "decode_bytes_moved", "torch_dtype", "check_forward_inputs"]

_LOG2E = 1.4426950408889634
_TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}


def torch_dtype(name: str) -> torch.dtype:
    return _TORCH[name]


def _layout():
    """codegen/triton/_layout.py (the shared chunk tables), without requiring the triton package to import."""
    global _LAYOUT
    if _LAYOUT is None:
        try:
            from ..triton import _layout as lay
        except ImportError:  # triton missing: load the torch-only module file directly
            import importlib.util
            from pathlib import Path

            path = Path(__file__).resolve().parent.parent / "triton" / "_layout.py"
            spec = importlib.util.spec_from_file_location("pathtune_tvm_shared_layout", path)
            lay = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(lay)
        _LAYOUT = lay
    return _LAYOUT


_LAYOUT = None
_TABLES: dict = {}


def build_tables(B, T, cu_seqlens, C, S, device):
    """Chunk tables; dense batches are cached per (B, T, C, S, device) (no host work on repeated calls)."""
    if cu_seqlens is not None:
        return _layout().build_tables(B, T, cu_seqlens, C, S, device)
    key = (B, T, C, S, str(device))
    tab = _TABLES.get(key)
    if tab is None:
        if len(_TABLES) > 64:
            _TABLES.clear()
        tab = _TABLES[key] = _layout().build_tables(B, T, None, C, S, device)
    return tab


def gate_cumsum(g, cu_seqlens):
    return _layout().gate_cumsum(g, cu_seqlens)


def _tokens(x: torch.Tensor, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """[B, T, ...] -> contiguous [B*T, ...] (cast to dtype when given)."""
    x = x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])
    if dtype is not None and x.dtype != dtype:
        x = x.to(dtype)
    return x.contiguous()


def check_forward_inputs(q, k, v, w, beta, g, dims: KernelDims) -> None:
    """The compiled module fixes heads, head dims, dtype and gating: say clearly what does not match."""
    B, T, HQ, D = q.shape
    want = dict(H=dims.H, HQ=dims.HQ, D=dims.D, DV=dims.DV, dtype=dims.dtype, gated=dims.gated)
    got = dict(H=k.shape[2], HQ=HQ, D=D, DV=v.shape[-1], dtype=str(q.dtype).replace("torch.", ""), gated=g is not None)
    if want != got:
        raise ValueError(f"inputs do not match the compiled TVM module: module {want}, inputs {got}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError("q, k and v must have the same dtype")


def forward(kernels: Mapping[str, Callable], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: torch.Tensor,
            beta: torch.Tensor, g: Optional[torch.Tensor], *, scale: float, cu_seqlens: Optional[torch.Tensor],
            params: TVMParams, dims: KernelDims, gate_placement: str = "inside_scale",
            fdt: torch.dtype = torch.float32) -> Tuple[torch.Tensor, torch.Tensor]:
    """PaTH(-FoX) forward through the three kernels ut -> transport -> scan.

    q [B,T,HQ,D], k/w [B,T,H,D], v [B,T,H,DV], beta [B,T,H], g [B,T,HQ] or None.
    Returns o [B,T,HQ,DV] (q's dtype) and lse [B,T,HQ] (fdt, natural log).
    """
    check_forward_inputs(q, k, v, w, beta, g, dims)
    B, T, HQ, D = q.shape
    H, DV = v.shape[2], v.shape[3]
    C, S = params.chunk_size, params.superchunk_size
    dev = q.device
    if B * T == 0:
        return (torch.empty(B, T, HQ, DV, device=dev, dtype=q.dtype), torch.empty(B, T, HQ, device=dev, dtype=fdt))
    sdt = torch_dtype(params.scan_dtype()) if fdt == torch.float32 else fdt
    tables = build_tables(B, T, cu_seqlens, C, S, dev)
    qt, kt_in, vt = _tokens(q), _tokens(k), _tokens(v)
    wt, bt = _tokens(w, fdt), _tokens(beta, fdt)
    N = qt.shape[0]

    u = torch.empty(N, H, D, device=dev, dtype=fdt)
    ktil = torch.empty(N, H, D, device=dev, dtype=fdt)
    m = torch.empty(N, H, C, device=dev, dtype=fdt)
    kernels["ut"](wt, bt, kt_in, u, ktil, m, tables.chunk_tok0, tables.chunk_seq, tables.seq_end, params.beta_max)

    kj = torch.empty(N, H, D, device=dev, dtype=sdt)
    what = torch.empty(max(tables.n_sc, 1), H, D, D, device=dev, dtype=fdt)
    if tables.max_seq_len > S:
        kernels["transport"](ktil, wt, u, kj, what, tables.sc_tok0, tables.sc_seq, tables.seq_end)

    o = torch.empty(N, HQ, DV, device=dev, dtype=q.dtype)
    lse = torch.empty(N, HQ, device=dev, dtype=fdt)
    gate_scale = (scale if gate_placement == "inside_scale" else 1.0) * _LOG2E
    args = [qt, kt_in, vt, wt, u, m, ktil, kj, what]
    if g is not None:
        gc = gate_cumsum(g, cu_seqlens) if fdt == torch.float32 else _gate_cumsum64(g, cu_seqlens)
        args.append(_tokens(gc, fdt))
    args += [o, lse, tables.chunk_tok0, tables.chunk_seq, tables.seq_start, tables.seq_end, tables.seq_sc_base,
             scale * _LOG2E, gate_scale]
    kernels["scan"](*args)
    return o.view(B, T, HQ, DV), lse.view(B, T, HQ)


def _gate_cumsum64(g: torch.Tensor, cu_seqlens: Optional[torch.Tensor]) -> torch.Tensor:
    """gate_cumsum in float64 (the CPU float64 numerics check)."""
    c = torch.cumsum(g.to(torch.float64), dim=1)
    if cu_seqlens is not None:
        starts = cu_seqlens[:-1].to(torch.int64)
        lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).to(torch.int64)
        offs = torch.cat([torch.zeros_like(c[:, :1]), c], dim=1)[:, starts]
        c = c - torch.repeat_interleave(offs, lengths, dim=1)
    return c


_VEC_ALIGN = 32


def _vec_aligned(x: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    return x if x.data_ptr() % _VEC_ALIGN == 0 else x.clone()


def decode_step(kernels: Mapping[str, Callable], q_t: torch.Tensor, k_t: torch.Tensor, v_t: torch.Tensor,
                w_t: torch.Tensor, beta_t: torch.Tensor, g_t: Optional[torch.Tensor], cache, *, scale: float,
                params: TVMParams, dims: KernelDims, gate_placement: str = "inside_scale",
                fdt: torch.dtype = torch.float32) -> Tuple[torch.Tensor, torch.Tensor]:
    """One fused decoding step on a ``runtime.reference.PaTHKVCache`` (mutated in place).

    q_t [B,HQ,D], k_t/w_t [B,H,D], v_t [B,H,DV], beta_t [B,H], g_t [B,HQ] or None. The cache must hold
    keys/values in k's dtype (the module's dtype) and, when gated, the gate cumsum in fdt.
    Returns (o_t [B,HQ,DV] in q's dtype, lse [B,HQ] in fdt).
    """
    if (g_t is None) != (cache.c is None) or (g_t is not None) != dims.gated:
        raise ValueError("g_t must be given iff the cache is gated and the module was compiled with the gate")
    B, HQ, D = q_t.shape
    if (HQ, D, k_t.shape[1], v_t.shape[-1]) != (dims.HQ, dims.D, dims.H, dims.DV):
        raise ValueError(f"token shapes do not match the compiled decode module {dims}")
    cdt = torch_dtype(dims.dtype)
    if cache.k.dtype != cdt or cache.v.dtype != cdt:
        raise ValueError(f"the TVM decode module keeps the cache in {dims.dtype}; got {cache.k.dtype}/{cache.v.dtype}")
    L = cache.length
    cache.reserve(1)
    NSPLIT = params.decode_splits
    dev = q_t.device
    o_part = torch.empty(B, HQ, NSPLIT, dims.DV, device=dev, dtype=fdt)
    ml_part = torch.empty(B, HQ, NSPLIT, 2, device=dev, dtype=fdt)
    gate_scale = (scale if gate_placement == "inside_scale" else 1.0) * _LOG2E
    # the decode kernel reads/writes rows with vector accesses of up to 32 bytes: every tensor must be contiguous
    # and start on a 32-byte boundary (fresh torch allocations do; views with an offset are copied)
    args = [_vec_aligned(x) for x in (q_t, k_t, v_t, w_t.to(fdt), beta_t.to(fdt))]
    if g_t is not None:
        args.append(_vec_aligned(g_t.to(fdt)))
    caches = [("cache.k", cache.k), ("cache.v", cache.v)]
    if g_t is not None:
        if cache.c.dtype != fdt:
            raise ValueError(f"the gate cumsum of the cache must be {fdt}")
        caches.append(("cache.c", cache.c))
    for name, x in caches:                            # updated in place: cannot be copied
        if not x.is_contiguous() or x.data_ptr() % _VEC_ALIGN:
            raise ValueError(f"{name} must be contiguous and {_VEC_ALIGN}-byte aligned for the TVM decode kernel "
                             "(rebuild the cache with PaTHKVCache.empty or .contiguous() its tensors)")
        args.append(x)
    args += [o_part, ml_part, int(L), scale * _LOG2E, gate_scale, params.beta_max]
    kernels["decode"](*args)
    o = torch.empty(B, HQ, dims.DV, device=dev, dtype=q_t.dtype)
    lse = torch.empty(B, HQ, device=dev, dtype=fdt)
    kernels["decode_merge"](o_part, ml_part, o, lse)
    cache.length = L + 1
    return o, lse


def decode_bytes_moved(B: int, L: int, H: int, HQ: int, D: int, DV: int, esize: int, gated: bool,
                       splits: int = 1) -> dict:
    """DRAM bytes of one decode step over a cache of L keys (what a GB/s figure divides).

    kv: read K, write the updated K, read V (the floor: B*L*H*(2D+DV)*esize); gate: the FoX gate cumsums
    (fp32, B*L*HQ*4); partials: the split partials written by ``decode`` and read by ``decode_merge``."""
    kv = B * L * H * (2 * D + DV) * esize
    gate = B * L * HQ * 4 if gated else 0
    part = 2 * B * HQ * splits * (DV + 2) * 4
    return dict(kv=kv, gate=gate, partials=part, total=kv + gate + part)


def default_scale(D: int, scale: Optional[float]) -> float:
    return float(D) ** -0.5 if scale is None else float(scale)
