"""Host side of the Triton forward: layout, grids and launches of the three forward stages."""
from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from typing import Optional

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources
from triton.tools.tensor_descriptor import TensorDescriptor

from .._knobs import resolve_json, spec_default
from ._layout import SequenceTables, build_tables, gate_cumsum
from ._ops import interpreting, padded_dim
from .gate_bias import gate_parts_kernel
from .launch import compiled
from .params import TritonParams
from .scan_fwd import scan_inter_kernel, scan_intra_kernel
from .transport import superchunk_transport_kernel
from .ut import ut_apply_kernel, ut_chunk_kernel, ut_diag_inverse_kernel, ut_fused_kernel

_LOG2E = 1.4426950408889634
UT_COLUMN_BLOCK = 64   # D columns per UT program (ut_chunk accumulates over them, ut_apply splits over them)
# 4 warps: on the H200 (benchmarks/dev_kernel_probe.py, one launch over 32K tokens) ut_chunk took
# 1.12 -> 0.59 ms (D=64) and 0.69 -> 0.37 ms (D=128) from 8 warps to 4, ut_apply 0.50 -> 0.30 ms at both
UT_NUM_WARPS = 4
# Column block of the dense BD x BD super-chunk transition products (the forward's X What_J, the
# backward's Om_{I,J} products).  Up to BD = 128 a kernel holds a whole BD x BD float32 tile
# (DB == BD, one product).  Above, such a tile alone (256 KB at BD = 256) exceeds the 227 KB of
# shared memory of an sm_90 block, so the products run "full K, column-blocked output":
# out[:, cb] = A @ B[:, cb] with BD x DB blocks of B read from global memory (DB < BD).
TRANSITION_COLUMN_BLOCK = 64
TRANSITION_BLOCKED_ABOVE = 128   # padded head dims above this take the column-blocked path


def transition_column_block(BD: int) -> int:
    """DB, the constexpr column block of the transition products for padded head dim BD:
    BD itself (one unblocked product) up to ``TRANSITION_BLOCKED_ABOVE``, else
    ``TRANSITION_COLUMN_BLOCK``."""
    return BD if BD <= TRANSITION_BLOCKED_ABOVE else min(BD, TRANSITION_COLUMN_BLOCK)


@dataclass
class ForwardState:
    """Per-call tensors the backward pass reuses (all O(T) in size); the backward releases each
    (sets the field to None) once it is dead."""

    tables: SequenceTables
    u: torch.Tensor        # [N, H, D] float32 (a forward's compact state: the scan's 16-bit type)
    kt: torch.Tensor       # [N, H, D] as u, keys adjusted to their chunk end
    m: torch.Tensor        # [N, H, C] float32
    kj: torch.Tensor       # [N, H, D] scan dtype, keys transported to their super-chunk end
    what: torch.Tensor     # [n_sc, H, BD, BD] float32, super-chunk transitions
    gc: torch.Tensor | None  # [HQ, N] float32 gate cumsum, head-major (a head's tokens contiguous)
    wd: torch.Tensor | None = None  # [N, H, D] w in the scan's 16-bit type (compact state only)
    y: torch.Tensor | None = None   # [N, HQ, D] scan dtype, queries at their super-chunk start (kept state only)
    pending: tuple | None = field(default=None, repr=False)  # (main, side) streams while the transport runs

    def join(self) -> None:
        """Make the current stream wait for a transport queued on the side stream (no-op otherwise)."""
        if self.pending is not None:
            main, side = self.pending
            main.wait_stream(side)
            self.pending = None


# bwd_forward_state keep / keep_inter: the state tensors the forward hands to autograd for the backward, in
# this order; an absent one (keep_inter: u, kt, m, wd; gc without a gate, wd when the scan is float32, y when
# no sequence is longer than one super-chunk) is an empty placeholder.
KEPT_STATE_FIELDS = ("u", "kt", "m", "kj", "what", "gc", "wd", "y")
# the fields keep_inter keeps: what the backward's inter-super-chunk stages read
KEPT_INTER_FIELDS = ("kj", "what", "gc", "y")
KEEP_MODES = ("keep_inter", "keep")


def superchunk_rows(batch: int, seq_len: int, n_seqs: int | None, S: int) -> int:
    """Rows of the super-chunk transitions ``what`` from sizes alone (what a fake implementation knows):
    a dense batch's super-chunk count, or for a packed stream of ``n_seqs`` sequences in ``seq_len``
    tokens the most it can have (each sequence adds at most one partial super-chunk)."""
    if n_seqs is None:
        return max(batch * -(-seq_len // S), 1)
    return max(seq_len // S + n_seqs, 1)


def _absent(like: torch.Tensor) -> torch.Tensor:
    """The placeholder of a state tensor that is not there (custom ops return tensors, not None)."""
    return like.new_empty(0, dtype=torch.float32)


def absent_state(like: torch.Tensor) -> list[torch.Tensor]:
    """What the forward op returns for the kept state under bwd_forward_state recompute: placeholders."""
    return [_absent(like) for _ in KEPT_STATE_FIELDS]


def kept_fields(mode: str) -> tuple[str, ...]:
    """The ``KEPT_STATE_FIELDS`` a forward at bwd_forward_state ``mode`` keeps for its backward."""
    return KEPT_STATE_FIELDS if mode == "keep" else KEPT_INTER_FIELDS if mode == "keep_inter" else ()


def keeps_queries(seq_len: int, S: int) -> bool:
    """Whether a forward of ``seq_len`` tokens per batch row (a packed stream's total: the most any of its
    sequences can have) has queries carried to a super-chunk start to keep: from sizes alone, as a fake
    implementation knows them."""
    return seq_len > S


def kept_state_like(q: torch.Tensor, k: torch.Tensor, g: torch.Tensor | None, n_seqs: int | None,
                    params: TritonParams) -> list[torch.Tensor]:
    """Uninitialised tensors of the kept state's shapes and dtypes (``KEPT_STATE_FIELDS``, placeholders for
    the fields ``params.bwd_forward_state`` does not keep) for a forward of these inputs: the custom op's fake
    implementation."""
    B, T, HQ, D = q.shape
    H, N, BD, C = k.shape[2], B * T, padded_dim(D), params.chunk_size
    store, f32 = params.scan_torch_dtype, torch.float32
    shapes = dict(u=(N, H, D, store), kt=(N, H, D, store), m=(N, H, C, f32), kj=(N, H, D, store),
                  what=(superchunk_rows(B, T, n_seqs, params.superchunk_size), H, BD, BD, f32),
                  gc=(HQ, N, f32) if g is not None else None, wd=(N, H, D, store) if store != f32 else None,
                  y=(N, HQ, D, store) if keeps_queries(T, params.superchunk_size) else None)
    keep = kept_fields(params.bwd_forward_state)
    return [q.new_empty(*shapes[name][:-1], dtype=shapes[name][-1]) if name in keep and shapes[name] is not None
            else _absent(q) for name in KEPT_STATE_FIELDS]


def kept_state_tensors(state: "ForwardState", mode: str) -> list[torch.Tensor]:
    """The forward's state as the list ``KEPT_STATE_FIELDS`` names, the fields bwd_forward_state ``mode`` keeps
    (placeholders for the others and for absent ones)."""
    keep = kept_fields(mode)
    return [getattr(state, name) if name in keep and getattr(state, name) is not None else _absent(state.kj)
            for name in KEPT_STATE_FIELDS]


def state_from_kept(tensors: list[torch.Tensor], tables: SequenceTables) -> "ForwardState":
    """``kept_state_tensors``' list back as a ForwardState over ``tables`` (placeholders as None)."""
    values = {name: (t if t.numel() else None) for name, t in zip(KEPT_STATE_FIELDS, tensors)}
    return ForwardState(tables=tables, **values)


def has_kept_state(kept: list[torch.Tensor]) -> bool:
    """Whether the forward op's kept list holds a state (bwd_forward_state keep / keep_inter: the transported
    keys are there whatever the length), not only placeholders."""
    return bool(kept) and kept[KEPT_STATE_FIELDS.index("kj")].numel() > 0


@dataclasses.dataclass(frozen=True)
class TritonFwdParams(TritonParams):
    """``TritonParams`` plus the knobs only the forward reads (declared here, so that they key the fwd pass's
    source hash alone); ``resolve("triton", "fwd", ...)`` builds it (``codegen/_knobs.py``)."""

    gate_bias: str = spec_default("gate_bias")


def gate_by_product(params: TritonParams, gated: bool) -> bool:
    """Whether the forward's scans add the gate's key offsets by a K = 16 product of their bf16 parts (knob
    ``gate_bias`` product; params without the fwd knobs take its spec default): only with a gate."""
    return gated and getattr(params, "gate_bias", TritonFwdParams.gate_bias) == "product"


GATE_PARTS_BLOCK = 1024     # gate cumsum entries per program of gate_parts_kernel


def gate_parts(gc: torch.Tensor, ratio: float) -> torch.Tensor:
    """The keys' logit offsets x = gc * ratio (ratio = -gate_scale / qk_scale) as ``gate_bias.bias_parts``: [HQ, N,
    16] bfloat16 from the head-major gate cumsum gc [HQ, N], one launch of ``gate_parts_kernel``."""
    gp = torch.empty(*gc.shape, 16, device=gc.device, dtype=torch.bfloat16)
    n = gc.numel()
    compiled(gate_parts_kernel)[(triton.cdiv(n, GATE_PARTS_BLOCK),)](gc, gp, n, ratio, BLOCK=GATE_PARTS_BLOCK,
                                                                     num_warps=4)
    return gp


def gate_parts_operand(gp: torch.Tensor, rows: int, tma: bool):
    """The gate parts [HQ, N, 16] as a scan reads them: a tensor descriptor over their [HQ * N, 16] view with [rows,
    16] blocks when the scan's key tiles come by TMA, else the tensor."""
    if tma:
        return TensorDescriptor.from_tensor(gp.view(-1, 16), [rows, 16])
    return gp


def query_block(params: TritonParams) -> int:
    """Query rows per program of the inter-super-chunk scan: block_m, or the whole super-chunk when that is
    shorter (a schedule choice; small tiles in tests and probes)."""
    return min(params.block_m, params.superchunk_size)


def state_tables(batch: int, seq_len: int, cu_seqlens: torch.Tensor | None, params: TritonParams,
                 device: torch.device) -> SequenceTables:
    """The chunk / super-chunk / query-block tables of a forward (and of the backward's state) at ``params``."""
    return build_tables(batch, seq_len, cu_seqlens, params.chunk_size, params.superchunk_size, device,
                        block_m=query_block(params))


def _tokens(x: torch.Tensor) -> torch.Tensor:
    """[B, T, ...] -> contiguous [B*T, ...] (a view when already contiguous)."""
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:]).contiguous()


def ut_inverse_scratch(wt, bt, tables: SequenceTables, H: int, D: int, C: int, params: TritonParams):
    """Scratch tiles [n_chunks, H, C, C] holding the diagonal 16 x 16 blocks of each chunk's T^{-1}."""
    scratch = torch.empty(tables.n_chunks * H * C * C, device=wt.device, dtype=torch.float32)
    compiled(ut_diag_inverse_kernel)[(tables.n_chunks * (C // 16), H)](
        wt, bt, scratch, tables.chunk_tok0, tables.chunk_seq, tables.seq_end,
        H=H, D=D, BD=padded_dim(D), DB=min(padded_dim(D), UT_COLUMN_BLOCK), C=C, BETA_MAX=params.beta_max,
        UP=params.ut_precision, num_warps=1, num_stages=1,
    )
    return scratch


def ut_chunk_state(kt_in, wt, bt, tables: SequenceTables, H: int, D: int, C: int, params: TritonParams):
    """The C x C half of stage ut_inverse over the chunks of ``tables``: A = T^{-1} diag(beta) and
    M = A strictLower(W K^T) ([N, H, C] float32 rows each, ``ut_chunk_kernel``)."""
    N = kt_in.shape[0]
    a = torch.empty(N, H, C, device=kt_in.device, dtype=torch.float32)
    m = torch.empty(N, H, C, device=kt_in.device, dtype=torch.float32)
    scratch = ut_inverse_scratch(wt, bt, tables, H, D, C, params)
    BD = padded_dim(D)
    compiled(ut_chunk_kernel)[(tables.n_chunks, H)](
        wt, bt, kt_in, a, m, scratch,
        tables.chunk_tok0, tables.chunk_seq, tables.seq_end,
        H=H, D=D, BD=BD, DB=min(BD, UT_COLUMN_BLOCK), C=C, BETA_MAX=params.beta_max, UP=params.ut_precision,
        num_warps=UT_NUM_WARPS, num_stages=1,
    )
    return a, m


def ut_forward(kt_in, wt, bt, tables: SequenceTables, H: int, D: int, C: int, params: TritonParams,
               out_dtype: torch.dtype = torch.float32, write_w: bool = False, keep_a: bool = False):
    """Stage ut_inverse over the chunks of ``tables`` in three launches: u, K~ ([N, H, D], ``out_dtype``),
    m ([N, H, C], float32), with ``keep_a`` A ([N, H, C] float32, which the backward's
    ``ut_bwd_kernel`` reads; else None) and, with ``write_w``, w in ``out_dtype`` (else None).

    The token-major inputs may be a token range of a longer stream (``tables`` rebased to it).
    """
    N = kt_in.shape[0]
    u = torch.empty(N, H, D, device=kt_in.device, dtype=out_dtype)
    ktil = torch.empty(N, H, D, device=kt_in.device, dtype=out_dtype)
    wd = torch.empty(N, H, D, device=kt_in.device, dtype=out_dtype) if write_w else None
    a, m = ut_chunk_state(kt_in, wt, bt, tables, H, D, C, params)
    BD = padded_dim(D)
    DB = min(BD, UT_COLUMN_BLOCK)
    compiled(ut_apply_kernel)[(tables.n_chunks, H, BD // DB)](
        wt, kt_in, a, m, u, ktil, wd if write_w else u,
        tables.chunk_tok0, tables.chunk_seq, tables.seq_end,
        H=H, D=D, DB=DB, C=C, UP=params.ut_precision, WRITE_W=write_w,
        num_warps=UT_NUM_WARPS, num_stages=1,
    )
    return u, ktil, m, (a if keep_a else None), wd


def ut_apply_mode(params: TritonParams, out_dtype: torch.dtype) -> str:
    """How ut_fused_kernel multiplies its float32 A / M^T into the w tile.  A 16-bit state (the
    forward's compact one) takes w in that type, and at ut_precision fp16x3 or tf32x3 the product is
    "split": A as hi + lo in that type, two 16-bit tensor-core passes (22 bits of A in fp16, 16 in
    bf16; w is exact in that type, so fp16x3's third pass would multiply by zero), an error under the
    16-bit store's rounding.  A float32 state (the backward's) keeps the float32 product at ut_precision."""
    if _is_16bit(out_dtype) and params.ut_precision in ("fp16x3", "tf32x3"):
        return "split"
    return params.ut_precision


def _is_16bit(dtype: torch.dtype) -> bool:
    return dtype in (torch.float16, torch.bfloat16)


_TL_TYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}
_TRANSITION_16BIT = {"fp16": torch.float16, "bf16": torch.bfloat16}


def ut_operand_type(out_dtype: torch.dtype):
    """The type the one-launch UT stage (``ut._ut_stage``'s OPDT) takes w and k in for a state of ``out_dtype``:
    that type when it is 16-bit (a compact state), else tl.float32 (w and k as loaded)."""
    return _TL_TYPES[out_dtype] if _is_16bit(out_dtype) else tl.float32


def ut_state_m_dtype(params: TritonParams, D: int, out_dtype: torch.dtype) -> torch.dtype:
    """The element type of M in ``ut_fused``'s state of ``out_dtype``.  The forward's only reader of M is
    scan_intra's diagonal tile, whose product ``tdot(QW, M, transition_precision)`` rounds M to fp16 / bf16 at a
    16-bit transition_precision: then M is stored in that type (half its bytes written and read, the same o and
    lse bit for bit), where the state is 16-bit (a compact forward's), not kept for the backward (under
    bwd_forward_state keep its UT gradient kernels read M as float32) and U's rows can hold the inverse's float32
    scratch (``ut_fused_kernel``: ut_diag_block words, rows 4-byte aligned).  Else float32."""
    m16 = _TRANSITION_16BIT.get(params.transition_precision)
    row_bytes = D * out_dtype.itemsize
    if (m16 is None or not _is_16bit(out_dtype) or params.bwd_forward_state == "keep" or row_bytes % 4
            or row_bytes < 4 * params.ut_diag_block):
        return torch.float32
    return m16


def ut_scratch_stride(m_dtype: torch.dtype, C: int, D: int, out_dtype: torch.dtype) -> int:
    """Float32 words per (token, head) row of ``ut_fused_kernel``'s inverse scratch (its RS): M's own rows (C) for a
    float32 M, else U's rows of D ``out_dtype`` entries seen as float32 words."""
    return C if m_dtype == torch.float32 else D * out_dtype.itemsize // 4


# Padded head dims below this take the three-launch UT stage (ut_forward): on the H200 the fused
# kernel's forward at D = 32 returned NaN (GPU only; the interpreter agrees with float64), not yet
# root-caused.  At D = 32 the UT stage is a small part of the forward.
UT_FUSED_MIN_BD = 64


def ut_fused(kt_in, wt, bt, tables: SequenceTables, H: int, D: int, C: int, params: TritonParams,
             out_dtype: torch.dtype = torch.float32, write_w: bool = False, apply_mode: str | None = None,
             num_warps: int = UT_NUM_WARPS):
    """Stage ut_inverse in one launch (``ut_fused_kernel``): u, K~ ([N, H, D], ``out_dtype``), m
    ([N, H, C], ``ut_state_m_dtype``: float32, or the scan's 16-bit transition type) and, with ``write_w``, w in
    ``out_dtype`` (else None).  A 16-bit ``out_dtype`` rounds w and k to it first (``ut_operand_type``), as the
    scan does.  The same outputs as ``ut_forward`` (up to M's type) without its scratch tiles."""
    N = kt_in.shape[0]
    dev = kt_in.device
    u = torch.empty(N, H, D, device=dev, dtype=out_dtype)
    ktil = torch.empty(N, H, D, device=dev, dtype=out_dtype)
    wd = torch.empty(N, H, D, device=dev, dtype=out_dtype) if write_w else None
    m = torch.empty(N, H, C, device=dev, dtype=ut_state_m_dtype(params, D, out_dtype))
    # the diagonal inverse's float32 scratch: M's rows, or U's (seen as float32 words) where M is 16-bit
    scratch = m if m.dtype == torch.float32 else u.view(torch.float32)
    BD = padded_dim(D)
    compiled(ut_fused_kernel)[(tables.n_chunks, H)](
        wt, bt, kt_in, u, ktil, wd if write_w else u, m, scratch,
        tables.chunk_tok0, tables.chunk_seq, tables.seq_end,
        H=H, D=D, BD=BD, DB=min(BD, UT_COLUMN_BLOCK), C=C, BETA_MAX=params.beta_max, UP=params.ut_precision,
        AP=apply_mode or ut_apply_mode(params, out_dtype), OPDT=ut_operand_type(out_dtype),
        RS=ut_scratch_stride(m.dtype, C, D, out_dtype),
        WRITE_W=write_w, INTERP=interpreting(), SB=params.ut_diag_block,
        num_warps=num_warps, num_stages=1,
    )
    return u, ktil, m, wd


_SIDE_STREAMS: dict = {}


def _side_stream(device: torch.device):
    """One extra CUDA stream per device (None off the GPU / in the interpreter), on which the
    transport runs beside the intra-super-chunk scan: both only read the UT stage's outputs, and
    the transport's few long serial programs fill the multiprocessors the scan leaves idle."""
    if device.type != "cuda" or interpreting():
        return None
    key = device.index if device.index is not None else torch.cuda.current_device()
    if key not in _SIDE_STREAMS:
        _SIDE_STREAMS[key] = torch.cuda.Stream(device=device)
    return _SIDE_STREAMS[key]


def transport_rows(BD: int) -> int:
    """Rows of the running D x D suffix product per transport program (its grid's third axis): 64 up to
    BD 128, so that both products of a step are wgmma tiles (3-4 programs per SM at 4 warps, no spills); 32
    above, where a 64-row block of a 256-wide product no longer fits the registers."""
    return min(BD, 64) if BD <= 128 else 32


def _tma_ready(t: torch.Tensor) -> bool:
    """Whether a [N, H, D] tensor can back a TMA descriptor of its [N, H * D] view: contiguous, its base and
    row stride 16-byte aligned (a contiguous view at an odd offset of a larger buffer is not)."""
    return t.is_contiguous() and t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0


def inter_tma_shapes(D: int, DV: int, BD: int, BDV: int) -> bool:
    """Whether scan_inter_kernel's key and value tiles can be TMA blocks: each head dim its own padded
    power of two (a block is one head's slice of a row) and at most ``TRANSITION_BLOCKED_ABOVE``."""
    return D == BD and DV == BDV and BD <= TRANSITION_BLOCKED_ABOVE


def _row_blocks(tensors: tuple[torch.Tensor, ...], rows: int, shapes_fit: bool) -> tuple:
    """(*operands, TMA): tensor descriptors over each [N, H, X] tensor's [N, H * X] view with [rows, X]
    blocks (one head's slice of ``rows`` tokens) where ``shapes_fit`` and every tensor is aligned
    (``_tma_ready``), else the tensors themselves."""
    if shapes_fit and all(_tma_ready(t) for t in tensors):
        return (*(TensorDescriptor.from_tensor(t.view(t.shape[0], -1), [rows, t.shape[-1]]) for t in tensors), True)
    return (*tensors, False)


def inter_operands(kj: torch.Tensor, vt: torch.Tensor, block_n: int, D: int, DV: int, BD: int, BDV: int):
    """(kj, v, TMA) as ``scan_inter_kernel`` takes them: tensor descriptors with [block_n, D] /
    [block_n, DV] blocks (TMA loads) where ``inter_tma_shapes`` holds and both tensors are aligned, else
    the tensors themselves (block-pointer loads)."""
    return _row_blocks((kj, vt), block_n, inter_tma_shapes(D, DV, BD, BDV))


def intra_walk_tma_shapes(D: int, DV: int, BD: int, BDV: int) -> bool:
    """Whether the walk of scan_intra_kernel can read its tiles as TMA blocks: each head dim its own
    padded power of two (a block is one head's slice of C rows, no column mask)."""
    return D == BD and DV == BDV


def intra_walk_operands(ktil: torch.Tensor, w: torch.Tensor, u: torch.Tensor, vt: torch.Tensor, C: int,
                        D: int, DV: int, BD: int, BDV: int):
    """(K~, W, U, V, TMA) as ``scan_intra_kernel``'s walk takes them: tensor descriptors with [C, D] /
    [C, DV] blocks where ``intra_walk_tma_shapes`` holds and every tensor is aligned, else the tensors."""
    return _row_blocks((ktil, w, u, vt), C, intra_walk_tma_shapes(D, DV, BD, BDV))


def prepare_state(
    q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, beta: torch.Tensor, g: torch.Tensor | None,
    *, cu_seqlens: torch.Tensor | None, params: TritonParams, compact: bool = False,
    side_stream: bool = False, what_rows: int | None = None,
) -> ForwardState:
    """Stages ut_inverse and super-chunk transport (O(T) work and memory).

    compact: U, K~ and a copy of w in the scan's 16-bit type (when scan_precision is 16-bit), the
    operands the forward scan and the transport read; else float32, what the backward's per-chunk
    kernels read (``backward.backward_state`` picks).  side_stream: the transport is queued on a
    second stream (``_side_stream``); the caller joins it before reading kj / what
    (``ForwardState.join``).  what_rows: rows of ``what`` when at least the super-chunk count (a
    kept state's size from sizes alone, ``superchunk_rows``); default the count.

    With bwd_forward_state recompute (the default) the backward recomputes this instead of keeping
    it alive between forward and backward, so only o and lse are saved for autograd; with keep the
    forward hands it to autograd (``kept_state_tensors``).
    """
    B, T, HQ, D = q.shape
    H = k.shape[2]
    C, S = params.chunk_size, params.superchunk_size
    BD = padded_dim(D)
    dev = q.device
    dt = params.scan_dtype
    store_dtype = params.scan_torch_dtype

    tables = state_tables(B, T, cu_seqlens, params, dev)
    kt_in, wt, bt = _tokens(k), _tokens(w), _tokens(beta)
    N = kt_in.shape[0]

    compact = compact and store_dtype != torch.float32
    out_dtype = store_dtype if compact else torch.float32
    if BD >= UT_FUSED_MIN_BD:
        u, ktil, m, wd = ut_fused(kt_in, wt, bt, tables, H, D, C, params, out_dtype=out_dtype, write_w=compact)
    else:
        u, ktil, m, _, wd = ut_forward(kt_in, wt, bt, tables, H, D, C, params, out_dtype=out_dtype, write_w=compact)

    kj = torch.empty(N, H, D, device=dev, dtype=store_dtype)
    # zeros: the last super-chunk of each sequence has no transition (nothing after it reads one)
    what = torch.zeros(max(tables.n_sc, 1, what_rows or 0), H, BD, BD, device=dev, dtype=torch.float32)
    if tables.max_seq_len > S:
        rows = transport_rows(BD)
        side = _side_stream(dev) if side_stream else None
        main = torch.cuda.current_stream(dev) if side is not None else None
        if side is not None:
            side.wait_stream(main)
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            compiled(superchunk_transport_kernel)[(tables.n_sc, H, BD // rows)](
                ktil, wd if wd is not None else wt, u, kj, what,
                tables.sc_tok0, tables.sc_seq, tables.seq_end,
                H=H, D=D, BD=BD, C=C, S=S, ROWS=rows, DT=dt, TP=params.transition_precision,
                INTERP=interpreting(), num_warps=4, num_stages=1,
            )
        pending = (main, side) if side is not None else None
    else:
        pending = None
    gc = None if g is None else gate_cumsum(g, cu_seqlens, head_major=True)
    return ForwardState(tables=tables, u=u, kt=ktil, m=m, kj=kj, what=what, gc=gc, wd=wd, pending=pending)


def path_attention_fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: torch.Tensor, beta: torch.Tensor,
    g: torch.Tensor | None, *, scale: float, cu_seqlens: torch.Tensor | None,
    params: TritonParams, gate_placement: str = "inside_scale", state: ForwardState | None = None,
) -> tuple[torch.Tensor, torch.Tensor, ForwardState]:
    """PaTH(-FoX) forward.  q [B,T,HQ,D], k/w [B,T,H,D], v [B,T,H,DV], beta [B,T,H], g [B,T,HQ].

    Returns o [B,T,HQ,DV] (q's dtype), lse [B,T,HQ] float32 (natural log) and the state (with
    bwd_forward_state keep, ``what`` has ``superchunk_rows`` rows: its size follows from the sizes).
    """
    B, T, HQ, D = q.shape
    H, DV = v.shape[2], v.shape[3]
    C, S = params.chunk_size, params.superchunk_size
    BD, BDV = padded_dim(D), padded_dim(DV)
    dev = q.device
    dt = params.scan_dtype
    n_seqs = None if cu_seqlens is None else cu_seqlens.numel() - 1
    kept = params.bwd_forward_state in KEEP_MODES
    if state is None:
        rows = superchunk_rows(B, T, n_seqs, S) if kept else None
        state = prepare_state(q, k, w, beta, g, cu_seqlens=cu_seqlens, params=params, compact=True,
                              side_stream=True, what_rows=rows)
    tables, u, ktil, m, kj, what, gc = state.tables, state.u, state.kt, state.m, state.kj, state.what, state.gc
    qt, kt_in, vt = _tokens(q), _tokens(k), _tokens(v)
    wt = state.wd if state.wd is not None else _tokens(w)
    N = qt.shape[0]
    o = torch.empty(N, HQ, DV, device=dev, dtype=q.dtype)
    lse = torch.empty(N, HQ, device=dev, dtype=torch.float32)
    gate_scale = (scale if gate_placement == "inside_scale" else 1.0) * _LOG2E
    interp = interpreting()
    # Earlier super-chunks exist: the intra kernel leaves a float32 partial output and the queries
    # carried to the start of their super-chunk for the inter kernel, which writes o.
    inter = tables.max_seq_len > S
    o_part = torch.empty(N, HQ, DV, device=dev, dtype=torch.float32) if inter else o
    x = torch.empty(N, HQ, D, device=dev, dtype=torch.float32) if inter else lse
    # the same queries in the scan's type for the backward, when it keeps them (from the sizes, as the fake
    # implementation knows them: a packed stream may have none longer than one super-chunk, then y is unwritten)
    write_y = kept and inter
    if kept and keeps_queries(T, S):
        state.y = torch.empty(N, HQ, D, device=dev, dtype=kj.dtype)
    gc_arg = gc if gc is not None else lse
    # gate_bias product: the keys' offsets as bf16 parts, added by a product in both scans (else both scans take
    # lse for the parts' unused pointer)
    parts = gate_by_product(params, g is not None)
    gp = gate_parts(gc, -gate_scale / (scale * _LOG2E)) if parts else None
    *walk, walk_tma = intra_walk_operands(ktil, wt, u, vt, C, D, DV, BD, BDV)
    gp_walk = gate_parts_operand(gp, C, walk_tma) if parts else lse
    # one program per (chunk, query head) on a flat grid, query heads fastest (_ops.chunk_and_head)
    compiled(scan_intra_kernel)[(tables.n_chunks * HQ,)](
        qt, kt_in, vt, wt, u, m, gc_arg,
        o_part, lse, x, state.y if write_y else lse, *walk, gp_walk,
        tables.chunk_tok0, tables.chunk_seq, tables.seq_start, tables.seq_end,
        scale * _LOG2E, gate_scale, N,
        HQ=HQ, H=H, D=D, DV=DV, BD=BD, BDV=BDV, C=C, S=S,
        DT=dt, TP=params.transition_precision, USE_GATE=g is not None, WRITE_X=inter, INTERP=interp,
        TMA=walk_tma, WALK_STAGES=params.intra_num_stages, WRITE_Y=write_y, GATE_MMA=parts,
        # the kernel-wide pipeliner stays off: it doubles the shared memory of the diagonal tile's operands
        num_warps=params.num_warps, num_stages=1,
    )
    state.join()
    if inter:
        kj_arg, v_arg, tma = inter_operands(kj, vt, params.block_n, D, DV, BD, BDV)
        gp_arg = gate_parts_operand(gp, params.block_n, tma) if parts else lse
        compiled(scan_inter_kernel)[(tables.n_blocks, HQ)](
            x, kj_arg, v_arg, what, gc_arg, gp_arg, o_part,
            o, lse,
            tables.blk_tok0, tables.blk_seq, tables.seq_start, tables.seq_end, tables.seq_sc_base,
            tables.n_blocks, scale * _LOG2E, gate_scale, N,
            HQ=HQ, H=H, D=D, DV=DV, BD=BD, BDV=BDV, BLOCK_M=query_block(params), S=S, BLOCK_N=params.block_n,
            DB=transition_column_block(BD), DT=dt, TP=params.transition_precision, USE_GATE=g is not None,
            INTERP=interp, TMA=tma, GATE_MMA=parts,
            num_warps=params.inter_num_warps, num_stages=params.num_stages,
        )
    return o.view(B, T, HQ, DV), lse.view(B, T, HQ), state


class KernelConfigError(RuntimeError):
    """A Triton config that does not compile or does not fit this GPU (shared memory, registers)."""


def config_error(exc: Exception, q: torch.Tensor, v: torch.Tensor, config_json: str, what: str) -> KernelConfigError:
    """The error a user sees when the kernels at ``config_json`` do not fit: what to change, and how to check."""
    D, DV = q.shape[-1], v.shape[-1]
    wide = (" (above head dim 128, TritonParams.heuristic(D, DV)'s tiles are the ones checked to fit an "
            "sm_90 GPU: chunk_size 32, block_m and bwd_block_m 64, block_n and bwd_block_n 32, one stage)"
            if max(D, DV) > 128 else "")
    return KernelConfigError(
        f"the Triton PaTH {what} kernels with config {config_json} do not fit this GPU for head dims "
        f"D={D}, DV={DV} ({type(exc).__name__}: {exc}). Pass a smaller config (chunk_size, num_stages, "
        f"block_m, block_n, bwd_block_m, bwd_block_n){wide}, tune one for this GPU, or use "
        f"backend='reference'. `python -m pathtune.codegen.triton.compile_check --head-dim {D} --pass fwd "
        f"--config JSON` reports a config's shared memory per kernel without a GPU.")


def forward_params(config_json: str, q: torch.Tensor, v: torch.Tensor) -> TritonFwdParams:
    """The custom op's config (a complete spec Config as JSON) -> kernel params: the one representation
    change (``_knobs.resolve_json``, cached per config text and head dims)."""
    return resolve_json("triton", "fwd", config_json, int(q.shape[-1]), int(v.shape[-1]))


def forward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: torch.Tensor, beta: torch.Tensor,
               g: Optional[torch.Tensor], cu_seqlens: Optional[torch.Tensor], scale: float, config_json: str,
               gate_placement: str) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """The custom op ``pathtune::path_attn_fwd`` (autograd.py registers it): the forward at the config
    ``config_json``; (o, lse, the kept state under bwd_forward_state keep, else placeholders)."""
    params = forward_params(config_json, q, v)
    try:
        o, lse, state = path_attention_fwd(q, k, v, w, beta, g, scale=scale, cu_seqlens=cu_seqlens, params=params,
                                           gate_placement=gate_placement)
    except OutOfResources as exc:
        raise config_error(exc, q, v, config_json, "forward") from exc
    mode = params.bwd_forward_state
    return o, lse, (kept_state_tensors(state, mode) if mode in KEEP_MODES else absent_state(q))


def forward_op_like(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: torch.Tensor, beta: torch.Tensor,
                    g: Optional[torch.Tensor], cu_seqlens: Optional[torch.Tensor], scale: float, config_json: str,
                    gate_placement: str):
    """``forward_op``'s results as uninitialised tensors from the sizes alone (its fake implementation)."""
    B, T, HQ, _ = q.shape
    params = forward_params(config_json, q, v)
    n_seqs = None if cu_seqlens is None else cu_seqlens.shape[0] - 1
    kept = kept_state_like(q, k, g, n_seqs, params) if params.bwd_forward_state in KEEP_MODES else absent_state(q)
    return q.new_empty(B, T, HQ, v.shape[-1]), q.new_empty(B, T, HQ, dtype=torch.float32), kept
