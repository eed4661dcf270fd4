"""Compile PaTH Triton kernels for a GPU target without a GPU and report their resources.

    python -m pathtune.codegen.triton.compile_check [--arch 90] [--head-dim 64] ...

Triton lowers to PTX on any machine; its bundled ptxas then reports registers, spills and
shared memory for the target.  Used by the CPU tests (every kernel must compile for sm_90 at
the spec's default configuration) and by developers before spending GPU time.  Each line also counts the
kernel's matrix-product instructions in its PTX by kind: ``wgmma`` (sm_90's warpgroup MMA, what a ``tl.dot``
becomes with num_warps a multiple of 4, 64 or more rows per program and 16-bit or tf32 operands) and
``mma.sync`` (the older per-warp MMA, at a fraction of the tensor-core rate), with the operand types, and
the SASS instructions of one iteration of each innermost loop that runs a matrix product (``--ops``: by
opcode), flagging a kernel whose wgmma pipeline ptxas serializes (its warning C7513: a register feeding a
wgmma is written while the pipeline runs, e.g. by a spill reload; ptxas then waits after every wgmma).
Where the loop issues more instructions than the products keep busy (two warps per scheduler, say), each one
costs time: the count is the offline measure of a change to a hot loop.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass, field

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ._ops import next_pow2, padded_dim
from .params import TritonParams

# sm_90 (H100 / H200) per multiprocessor: 64K 32-bit registers, 228 KB of shared memory (1 KB of it reserved
# per block), at most 32 blocks; registers are allocated per warp in units of 256
_SM90_REGS, _SM90_SMEM, _SM90_BLOCK_SMEM_RESERVED, _SM90_BLOCKS = 65536, 233472, 1024, 32


@dataclass
class KernelResources:
    name: str
    shared_bytes: int
    registers: int | None
    spill_bytes: int | None
    num_warps: int | None = None
    # matrix-product instruction sites in the PTX by kind ("wgmma" / "mma.sync") and operand type (``mma_sites``)
    mma: dict = field(default_factory=dict)
    # the innermost SASS loops that run a matrix product (``mma_loops``), in address order
    loops: list = field(default_factory=list)
    # ptxas serialized the kernel's wgmma pipeline (warning C7513)
    wgmma_serialized: bool = False

    def programs_per_sm(self) -> int | None:
        """How many programs (blocks) of this kernel fit one sm_90 multiprocessor at once (registers and shared
        memory; None when ptxas did not report the registers): a latency-bound kernel at 1-2 hides little."""
        if self.registers is None or not self.num_warps:
            return None
        per_warp = -(-self.registers * 32 // 256) * 256
        by_regs = _SM90_REGS // (per_warp * self.num_warps)
        by_smem = _SM90_SMEM // (self.shared_bytes + _SM90_BLOCK_SMEM_RESERVED)
        return min(by_regs, by_smem, _SM90_BLOCKS)

    def mma_summary(self) -> str:
        """``wgmma 48 bf16 / 120 tf32, mma.sync 0``: the product instruction sites by kind and operand type."""
        parts = []
        for kind in ("wgmma", "mma.sync"):
            types = {t: n for (k, t), n in sorted(self.mma.items()) if k == kind}
            parts.append(f"{kind} " + (" / ".join(f"{n} {t}" for t, n in types.items()) if types else "0"))
        return ", ".join(parts)

    def __str__(self):
        per_sm = self.programs_per_sm()
        return (f"{self.name:32s} shared {self.shared_bytes:7d} B  regs {self.registers}  "
                f"spills {self.spill_bytes} B" + ("" if per_sm is None else f"  {per_sm} per SM")
                + (f"  [{self.mma_summary()}]" if self.mma else "")
                + (f"  mma loops {'/'.join(str(lp.instructions) for lp in self.loops)} instr" if self.loops else "")
                + ("  WGMMA SERIALIZED (ptxas C7513)" if self.wgmma_serialized else ""))


@dataclass
class LoopStats:
    """One iteration of a SASS loop: its instruction count and {opcode: count} (predicates and modifiers dropped)."""

    instructions: int
    ops: dict

    def top(self, n: int = 12) -> str:
        return " ".join(f"{op}:{c}" for op, c in sorted(self.ops.items(), key=lambda kv: (-kv[1], kv[0]))[:n])


_SASS_INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+([^;]*);", re.M)
_SASS_BRANCH = re.compile(r"\bBRA\b.*?\b0x([0-9a-f]+)")
_SASS_MMA = re.compile(r"\b(HGMMA|HMMA)\b")


def mma_loops(sass: str) -> list[LoopStats]:
    """The innermost loops of a kernel's SASS (``cuobjdump -sass``) whose body runs a matrix product (HGMMA or
    HMMA): a loop is a backward branch and the instructions from its target to it; innermost: the smallest of
    the spans that intersect (the retry paths of barrier waits, placed after the kernel's end, branch back into
    a loop's body: they cross it without being loops of their own).  In address order."""
    instrs = [(int(a, 16), text.strip()) for a, text in _SASS_INSTR.findall(sass)]
    index = {addr: i for i, (addr, _) in enumerate(instrs)}
    spans = []
    for i, (addr, text) in enumerate(instrs):
        m = _SASS_BRANCH.search(text)
        if m and int(m.group(1), 16) < addr and int(m.group(1), 16) in index:
            j = index[int(m.group(1), 16)]
            if any(_SASS_MMA.search(t) for _, t in instrs[j:i + 1]):
                spans.append((j, i))
    inner: list[tuple[int, int]] = []
    for j, i in sorted(set(spans), key=lambda span: span[1] - span[0]):
        if all(i < b or e < j for b, e in inner):
            inner.append((j, i))
    out = []
    for j, i in sorted(inner):
        ops: Counter = Counter()
        for _, text in instrs[j:i + 1]:
            ops[re.sub(r"^@!?U?P[T\d]+\s+", "", text).split()[0].split(".")[0]] += 1
        out.append(LoopStats(i - j + 1, dict(ops)))
    return out


# a PTX matrix-product instruction: wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 (the last field is
# the B operand's type) or mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
_WGMMA = re.compile(r"\bwgmma\.mma_async\.sync\.aligned\.m\d+n\d+k\d+\.\w+\.(\w+)\.(\w+)")
_MMA_SYNC = re.compile(r"\bmma\.sync\.aligned\.m\d+n\d+k\d+\.row\.col\.\w+\.(\w+)\.(\w+)")


def mma_sites(ptx: str) -> dict:
    """{(kind, operand type): instruction sites} of a kernel's PTX, kind "wgmma" or "mma.sync" (static counts:
    a site in a loop counts once)."""
    counts: Counter = Counter()
    for kind, pattern in (("wgmma", _WGMMA), ("mma.sync", _MMA_SYNC)):
        for a_type, _b_type in pattern.findall(ptx):
            counts[(kind, a_type)] += 1
    return dict(counts)


@dataclass
class _PtxasReport:
    registers: int | None = None
    spill_bytes: int | None = None
    wgmma_serialized: bool = False
    loops: list = field(default_factory=list)


def _nvidia_tool(name: str) -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def _ptxas_report(ptx: str, arch: int, loops: bool = False) -> _PtxasReport:
    """Registers, spills, the C7513 warning and (``loops``) the MMA loops (``cuobjdump -sass``) of ``ptx`` assembled
    by Triton's bundled ptxas for sm_<arch>; empty where a tool is missing or fails."""
    ptxas, cuobjdump = _nvidia_tool("ptxas"), _nvidia_tool("cuobjdump")
    if not os.path.exists(ptxas):
        return _PtxasReport()
    suffix = "a" if arch >= 90 else ""
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        with open(src, "w") as fh:
            fh.write(ptx)
        out = subprocess.run([ptxas, "-v", f"-arch=sm_{arch}{suffix}", src, "-o", cubin],
                             capture_output=True, text=True)
        if out.returncode != 0:  # e.g. a newer Triton's PTX ISA than its bundled ptxas takes standalone
            return _PtxasReport()
        sass = (subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True).stdout
                if loops and os.path.exists(cuobjdump) else "")
    regs = re.search(r"Used (\d+) registers", out.stderr)
    spills = re.findall(r"(\d+) bytes spill stores", out.stderr)
    return _PtxasReport((int(regs.group(1)) if regs else None), (sum(map(int, spills)) if spills else 0),
                        "C7513" in out.stderr, mma_loops(sass))


def compile_kernel(fn, signature: dict, constexprs: dict, *, num_warps: int, num_stages: int = 2,
                   arch: int = 90, aligned: bool = False, maxnreg: int | None = None,
                   loops: bool = False) -> KernelResources:
    """Compile one @triton.jit kernel for sm_<arch>; raises on compile errors.

    ``aligned``: pointer arguments carry the 16-byte divisibility hint that Triton's launcher adds
    at run time for 16-byte aligned tensors (without it, kernels whose strides are constexpr are
    compiled with scalar instead of vector loads, and report more registers than they use).
    ``maxnreg``: Triton's register cap per thread (the launch option of that name).
    ``loops``: also disassemble the kernel for its MMA loops (``KernelResources.loops``; one more tool run).
    """
    names = fn.arg_names
    sig = {n: signature.get(n, "constexpr") for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if aligned and str(sig[n]).startswith("*")}
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                       options={"num_warps": num_warps, "num_stages": num_stages,
                                **({"maxnreg": maxnreg} if maxnreg else {})})
    r = _ptxas_report(k.asm["ptx"], arch, loops)
    return KernelResources(fn.fn.__name__, k.metadata.shared, r.registers, r.spill_bytes, num_warps,
                           mma_sites(k.asm["ptx"]), r.loops, r.wgmma_serialized)


_PTR_F32 = "*fp32"
SMEM_LIMIT_SM90 = 232448  # bytes of dynamic shared memory a block may opt in to on H100/H200 (227 KiB)


def forward_kernels(params: TritonParams, D: int, DV: int, *, dtype: str = "bf16", gate: bool = True,
                    heads: int = 16, group: int = 1, fwd_params: TritonParams | None = None):
    """(fn, signature, constexprs, num_warps, num_stages) of every forward and backward launch; ``fwd_params``
    (default ``params``): the params of the forward's own knobs (``TritonFwdParams``: gate_bias)."""
    from .backward import (
        CHAIN_KERNEL_MAX_BD,
        GATE_GRAD_SPAN,
        TritonBwdParams,
        chain_blocks,
        dkv_launch,
        dkv_query_step,
        float_transition_mode,
        gate_sums_by_mma,
        inter_gate_by_product,
        intra_walk_launch,
        transport_backward_rows,
        transport_launch,
        walk_gate_sums_by_product,
    )
    from .bwd_chain import (
        bwd_chain_dwhat_kernel,
        bwd_chain_rows_kernel,
        bwd_superchunk_chain_kernel,
        bwd_superchunk_pairs_kernel,
        bwd_transport_chain_kernel,
        bwd_transport_grads_kernel,
        gate_grad_kernel,
    )
    from .bwd_inter import bwd_inter_dkv_kernel, bwd_inter_dq_kernel, bwd_pair_transitions_kernel
    from .bwd_intra import bwd_intra_diag_kernel
    from .bwd_prep import bwd_prep_kernel
    from .forward import (
        GATE_PARTS_BLOCK,
        UT_COLUMN_BLOCK,
        UT_NUM_WARPS,
        gate_by_product,
        inter_tma_shapes,
        intra_walk_tma_shapes,
        query_block,
        transition_column_block,
        transport_rows,
        ut_apply_mode,
        ut_operand_type,
        ut_scratch_stride,
        ut_state_m_dtype,
    )
    from .gate_bias import gate_parts_kernel
    from .scan_fwd import scan_inter_kernel, scan_intra_kernel
    from .transport import superchunk_transport_kernel
    from .ut import ut_apply_kernel, ut_chunk_kernel, ut_diag_inverse_kernel, ut_fused_kernel, ut_recompute_kernel
    from .ut_bwd import UT_BWD_WARPS, ut_bwd_kernel

    io = f"*{dtype}"
    sig_of = {tl.float16: "*fp16", tl.bfloat16: "*bf16", tl.float32: "*fp32"}
    scan = sig_of[params.scan_dtype]
    H, HQ = heads, heads * group
    C, S = params.chunk_size, params.superchunk_size
    BD, BDV = padded_dim(D), padded_dim(DV)
    i64 = "*i64"
    common = dict(HQ=HQ, H=H, D=D, DV=DV, BD=BD, BDV=BDV, C=C, S=S, DT=params.scan_dtype)
    tp = params.transition_precision
    sig = {}
    for name in ("q_ptr", "k_ptr", "v_ptr", "o_ptr", "do_ptr", "dq_ptr"):
        sig[name] = io
    for name in ("w_ptr", "u_ptr", "m_ptr", "kt_ptr", "what_ptr", "gc_ptr", "lse_ptr", "beta_ptr", "y_ptr",
                 "delta_ptr", "dy_ptr", "dc_ptr", "dkj_ptr", "dv_ptr", "dom_ptr", "dwhat_ptr", "dkt_ptr",
                 "dw_ptr", "du_ptr", "dm_ptr", "dk_ptr", "scratch_ptr", "dw_acc_ptr", "dk_acc_ptr",
                 "dbeta_ptr", "a_ptr", "om_ptr", "cc_ptr", "dlse_ptr"):
        sig[name] = _PTR_F32
    sig["kj_ptr"] = sig["z_ptr"] = sig["kz_ptr"] = sig["xs_ptr"] = scan   # xs: bwd_intra's chain-state slots
    for name in ("x_ptr", "o_part_ptr"):
        sig[name] = _PTR_F32
    for name in ("chunk_tok0", "chunk_seq", "seq_start", "seq_end", "seq_sc_base", "sc_tok0", "sc_seq",
                 "seq_pair_base", "blk_tok0", "blk_seq"):
        sig[name] = i64
    for name in ("qk_scale", "gate_scale", "scale", "gate_nat"):
        sig[name] = "fp32"
    sig["n_chunks"] = "i32"
    sig["n_blocks"] = "i32"
    sig["gc_hs"] = sig["dc_hs"] = "i32"     # head stride of the head-major gate cumsum and its gradient
    ut_sig = dict(sig, k_ptr=io, dk_ptr=io)
    # a forward's compact state: U, K~ and w's copy in the scan's type (forward.prepare_state)
    fwd_sig = dict(sig, u_ptr=scan, kt_ptr=scan, w_ptr=scan)
    range_sig = fwd_sig     # the backward's per-range recompute: the same three in the scan's type
    flags = dict(USE_GATE=gate, INTERP=False, TP=tp)
    btp_transport = params.bwd_transition_precision
    btp = float_transition_mode(btp_transport)
    bflags = dict(flags, TP=btp)
    rows, bwd_rows = transport_rows(BD), transport_backward_rows(BD)
    DB = transition_column_block(BD)   # < BD: the column-blocked transition path of wide head dims
    inter_sig = dict(sig, om_ptr=scan) if DB == BD else sig   # the pairs' Om: scan type, or float32 blocks
    # scan_inter reads the transported keys and the values as TMA blocks where forward.inter_operands does
    tma = inter_tma_shapes(D, DV, BD, BDV)
    inter_fwd_sig = dict(sig, o_ptr=io)
    # scan_intra's walk reads K~, W, U and V as TMA blocks where forward.intra_walk_operands does
    # M: float32, or the forward's 16-bit transition type (forward.ut_state_m_dtype), which scan_intra reads
    m_dtype = ut_state_m_dtype(fwd_params or params, D, params.scan_torch_dtype)
    m_scan = sig_of[ut_operand_type(m_dtype)]
    intra_fwd_sig = dict(fwd_sig, kt_walk=scan, w_walk=scan, u_walk=scan, v_walk=io, y_ptr=scan, m_ptr=m_scan)
    intra_tma = intra_walk_tma_shapes(D, DV, BD, BDV)
    if intra_tma:
        intra_fwd_sig.update({n: f"tensordesc<{scan[1:]}[{C}, {D}]>" for n in ("kt_walk", "w_walk", "u_walk")},
                             v_walk=f"tensordesc<{dtype}[{C}, {DV}]>")
    # gate_bias product: both scans read the gate's bf16 parts (by TMA where their key tiles come by TMA)
    parts = gate_by_product(fwd_params or params, gate)
    bwd_parts = inter_gate_by_product(params, gate)     # bwd_gate_bias product: dq reads the parts, dk / dv builds them
    intra_fwd_sig["gp_walk"] = inter_fwd_sig["gp_ptr"] = "*bf16"
    if parts and intra_tma:
        intra_fwd_sig["gp_walk"] = f"tensordesc<bf16[{C}, 16]>"
    if parts and tma:
        inter_fwd_sig.update(gp_ptr=f"tensordesc<bf16[{params.block_n}, 16]>")
    if tma:
        inter_fwd_sig.update(kj_ptr=f"tensordesc<{scan[1:]}[{params.block_n}, {D}]>",
                             v_ptr=f"tensordesc<{dtype}[{params.block_n}, {DV}]>")
    chain_rows, chain_cb, chain_dcb, chain_warps = chain_blocks(BD)
    transport_chain_warps, transport_chain_stages, transport_grads_warps = transport_launch(BD)
    dkv_block_n, dkv_warps = dkv_launch(params)
    gate_bh = min(next_pow2(HQ), 16)     # as backward._gate_grad launches it
    # bwd_intra's kernels run at least 64 wide (backward.path_attention_bwd: head dims under 64 on masked tiles)
    intra = dict(common, BD=max(BD, 64), BDV=max(BDV, 64), **bflags)
    scan_bytes = params.scan_dtype.primitive_bitwidth // 8
    walk, walk_warps, walk_stages = intra_walk_launch(params, BD, scan_bytes)
    walk_flags = dict(intra, GATE_SUM_MMA=walk_gate_sums_by_product(params, gate))   # bwd_gate_sums
    walk32, walk32_warps, walk32_stages = intra_walk_launch(params, BD, 4)
    pairs, pairs_warps, pairs_stages = intra_walk_launch(TritonBwdParams(bwd_walk_chunks=2), BD, scan_bytes)
    return [
        # the forward's UT stage: one launch, and the backward's per-range recompute of it (plus A); the three
        # launches below run both at padded head dims under 64
        (ut_fused_kernel, dict(sig, k_ptr=io, u_ptr=scan, kt_ptr=scan, wd_ptr=scan, m_ptr=m_scan),
         dict(H=H, D=D, BD=BD, DB=min(BD, UT_COLUMN_BLOCK), C=C, BETA_MAX=params.beta_max, UP=params.ut_precision,
              AP=ut_apply_mode(params, params.scan_torch_dtype), OPDT=ut_operand_type(params.scan_torch_dtype),
              RS=ut_scratch_stride(m_dtype, C, D, params.scan_torch_dtype),
              WRITE_W=True, INTERP=False, SB=params.ut_diag_block),
         UT_NUM_WARPS, 1),
        (ut_recompute_kernel, dict(sig, k_ptr=io, u_ptr=scan, kt_ptr=scan, wd_ptr=scan),
         dict(H=H, D=D, BD=BD, DB=min(BD, UT_COLUMN_BLOCK), C=C, BETA_MAX=params.beta_max, UP=params.ut_precision,
              AP=ut_apply_mode(params, params.scan_torch_dtype), OPDT=params.scan_dtype, WRITE_UK=True,
              WRITE_W=params.scan_dtype != tl.float32, INTERP=False, SB=params.ut_diag_block),
         UT_NUM_WARPS, 1),
        (ut_diag_inverse_kernel, sig, dict(H=H, D=D, BD=BD, DB=min(BD, UT_COLUMN_BLOCK), C=C,
                                           BETA_MAX=params.beta_max, UP=params.ut_precision), 1, 1),
        (ut_chunk_kernel, ut_sig, dict(H=H, D=D, BD=BD, DB=min(BD, UT_COLUMN_BLOCK), C=C, BETA_MAX=params.beta_max,
                                       UP=params.ut_precision), UT_NUM_WARPS, 1),
        (ut_apply_kernel, dict(ut_sig, u_ptr=scan, kt_ptr=scan, wd_ptr=scan),
         dict(H=H, D=D, DB=min(BD, UT_COLUMN_BLOCK), C=C, UP=params.ut_precision, WRITE_W=True), UT_NUM_WARPS, 1),
        (superchunk_transport_kernel, fwd_sig, dict(H=H, D=D, BD=BD, C=C, S=S, ROWS=rows, DT=params.scan_dtype,
                                                    TP=tp, INTERP=False), 4, 1),
        # gate_bias product: the gate's bf16 parts, once per forward
        *([(gate_parts_kernel, dict(gc_ptr=_PTR_F32, gp_ptr="*bf16", n="i32", scale="fp32"),
            dict(BLOCK=GATE_PARTS_BLOCK), 4, 1)] if parts else []),
        (scan_intra_kernel, intra_fwd_sig,
         dict(common, WRITE_X=True, TMA=intra_tma, WALK_STAGES=params.intra_num_stages,
              WRITE_Y=params.bwd_forward_state != "recompute", GATE_MMA=parts, **flags), params.num_warps, 1),
        (scan_inter_kernel, inter_fwd_sig, dict({k: v for k, v in common.items() if k != 'C'}, TMA=tma,
                                                BLOCK_M=query_block(params), BLOCK_N=params.block_n, DB=DB,
                                                GATE_MMA=parts, **flags),
         params.inter_num_warps, params.num_stages),
        # with its query chain (the backward's own Y: bwd_forward_state recompute)
        (bwd_prep_kernel, sig, dict(common, INTERP=False, HAS_DLSE=True, CHAIN=True),
         params.bwd_num_warps, 1),
        (bwd_inter_dq_kernel, dict(inter_sig, gp_ptr="*bf16"), dict(common, BLOCK_N=params.bwd_block_n, DB=DB,
                                                                  GATE_MMA=bwd_parts, **bflags),
         params.bwd_inter_num_warps, params.bwd_num_stages),
        (bwd_inter_dkv_kernel, inter_sig, dict(common, BLOCK_N=dkv_block_n, BLOCK_M=dkv_query_step(params),
                                               DB=DB, GATE_SUM_MMA=gate_sums_by_mma(BD), GATE_MMA=bwd_parts,
                                               **bflags),
         dkv_warps, params.bwd_num_stages),
        # every pair's transition in the scan type, read by the two kernels above (padded head dims <= 128)
        *([(bwd_pair_transitions_kernel, inter_sig, dict(H=H, BD=BD, S=S, ROWS=min(BD, 64), TP=btp),
            4 if BD <= 64 else 8, 1)] if DB == BD else []),
        # the super-chunk chain: one kernel per sequence up to padded head dim 64, row / column-block kernels
        # above (backward.superchunk_chain), and the float32 pair products of the column-blocked path
        *([(bwd_superchunk_chain_kernel, sig, dict(H=H, BD=BD, S=S, TP=btp), 4, 1)] if BD <= CHAIN_KERNEL_MAX_BD
          else [(bwd_chain_rows_kernel, sig, dict(H=H, BD=BD, S=S, ROWS=chain_rows, CB=chain_cb, TP=btp),
                 chain_warps, 1),
                (bwd_chain_dwhat_kernel, sig, dict(H=H, BD=BD, S=S, CB=chain_dcb, HAS_OM=DB < BD, TP=btp),
                 chain_warps, 1)]),
        *([(bwd_superchunk_pairs_kernel, sig, dict(H=H, BD=BD, S=S, ROWS=chain_rows, CB=chain_cb, TP=btp),
            chain_warps, 1)] if DB < BD else []),
        (gate_grad_kernel, dict(dc_ptr=_PTR_F32, dg_ptr=_PTR_F32, seq_start=i64, seq_end=i64, dc_hs="i32"),
         dict(HQ=HQ, BH=gate_bh, BT=min(max(16, 1024 // gate_bh), GATE_GRAD_SPAN), SPAN=GATE_GRAD_SPAN), 4, 1),
        # the per-range stages read the range's recomputed u, K~ (and bwd_intra w's copy) in the scan's type
        (bwd_transport_chain_kernel, dict(range_sig, w_ptr=_PTR_F32, suf_ptr=_PTR_F32, gs_ptr=_PTR_F32),
         dict(H=H, D=D, BD=BD, C=C, S=S, ROWS=bwd_rows, TP=btp_transport), transport_chain_warps,
         transport_chain_stages),
        (bwd_transport_grads_kernel, dict(range_sig, w_ptr=_PTR_F32, suf_ptr=_PTR_F32, gs_ptr=_PTR_F32),
         dict(H=H, D=D, BD=BD, C=C, S=S, ROWS=bwd_rows, TP=btp_transport), transport_grads_warps, 1),
        (walk, range_sig, walk_flags, walk_warps, walk_stages),
        # a single range with the forward's float32 state (backward.path_attention_bwd: no recompute)
        (walk32, dict(range_sig, u_ptr=_PTR_F32, kt_ptr=_PTR_F32, w_ptr=_PTR_F32), walk_flags, walk32_warps,
         walk32_stages),
        # the walk of two query chunks per program (bwd_walk_chunks 2) where the config runs one and it can run
        *([(pairs, range_sig, walk_flags, pairs_warps, pairs_stages)] if pairs not in (walk, walk32) else []),
        (bwd_intra_diag_kernel, range_sig, intra, params.bwd_num_warps, 1),
        (ut_bwd_kernel, ut_sig, dict(H=H, D=D, BD=BD, DB=min(BD, UT_COLUMN_BLOCK), C=C, BETA_MAX=params.beta_max,
                                     UP=params.ut_precision, GP=params.ut_grad_precision), UT_BWD_WARPS, 1),
    ]


def decode_kernels(params: TritonParams, D: int, DV: int, *, dtype: str = "bf16", gate: bool = True,
                   heads: int = 8, group: int = 1, tokens: int = 1):
    """(fn, signature, constexprs, num_warps, num_stages) of the decode step's two launches
    (``decode.py``, which owns their arguments) for ``tokens`` new tokens and ``group`` query heads per kv head."""
    from .decode import decode_compile_specs

    return decode_compile_specs(params, D, DV, dtype=dtype, gate=gate, heads=heads, group=group, tokens=tokens)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--only", default=None, help="substring of kernel names to compile")
    ap.add_argument("--config", default=None,
                    help="knob overrides of the head dim's untuned config, as JSON (spec spelling)")
    ap.add_argument("--pass", dest="pass_", choices=("all", "fwd", "decode"), default="all",
                    help="forward+backward kernels, decode kernels, or all")
    ap.add_argument("--no-gate", action="store_true", help="the PaTH kernels (default: PaTH-FoX, the gated ones)")
    ap.add_argument("--ops", action="store_true",
                    help="also print each MMA loop's SASS instructions per iteration by opcode")
    args = ap.parse_args(argv)
    gate = not args.no_gate
    import json

    from .._knobs import resolve

    # the config a call of this head dim runs without a record: the spec's per-head-dim defaults (the bwd pass's
    # params: every knob the forward reads, and the backward's own)
    config = json.loads(args.config) if args.config else None
    params = resolve("triton", "bwd", config, (args.head_dim, args.head_dim))
    fwd_params = resolve("triton", "fwd", config, (args.head_dim, args.head_dim))
    launches = []
    if args.pass_ in ("all", "fwd"):
        launches += forward_kernels(params, args.head_dim, args.head_dim, gate=gate, fwd_params=fwd_params)
    if args.pass_ in ("all", "decode"):
        # one token, MHA (row-reduction path) and 4- and 16-token GQA steps (tensor-core path); every
        # flush rotates the keys in a second pass in compact WY form
        launches += decode_kernels(params, args.head_dim, args.head_dim, gate=gate)
        for tokens in (4, 16):
            launches += decode_kernels(params, args.head_dim, args.head_dim, gate=gate, group=4, tokens=tokens)[:1]
    for fn, sig, const, nw, ns in launches:
        if args.only and args.only not in fn.fn.__name__:
            continue
        try:
            res = compile_kernel(fn, sig, const, num_warps=nw, num_stages=ns, arch=args.arch,
                                 aligned=True, loops=True)
            if fn.fn.__name__ == "decode_kernel":
                res.name = f"decode_kernel[TN={const['TN']},G={const['G']}]"
            over = args.arch >= 90 and res.shared_bytes > SMEM_LIMIT_SM90
            print(f"{res}{f'  OVER the sm_90 limit of {SMEM_LIMIT_SM90} B: the launch fails' if over else ''}",
                  flush=True)
            if args.ops:
                for loop in res.loops:
                    print(f"    loop of {loop.instructions} instructions: {loop.top()}", flush=True)
        except Exception as exc:  # report and continue: a failing config is a status
            print(f"{fn.fn.__name__:32s} FAILED: {type(exc).__name__}: {str(exc)[:400]}", flush=True)


if __name__ == "__main__":
    main()
