"""Register fragments of the mma.sync m16n8k16 tensor-core path (TIRx ``Tx.warp.gemm``).

A warp multiplies an A fragment [16*Mt, 16*Kt] by a B fragment [16*Kt, 8*Nt] into a D fragment
[16*Mt, 8*Nt] (f16/bf16 operands, f32 accumulation). Each fragment is a "local" buffer with a
TileLayout that says which lane holds which element in which register slot. We fix the slot order
ourselves (below) so that kernels can address slots with plain integer formulas:

    lane = 4*g + t      (g = lane // 4 in [0, 8), t = lane % 4)
    A: slot = ((mt*Kt + kt)*2 + kHi)*4 + rM*2 + kp   ->  row = 16mt + 8rM + g,  col = 16kt + 8kHi + 2t + kp
    B: slot = ((nt*Kt + kt)*2 + kHi)*2 + kp          ->  row = 16kt + 8kHi + 2t + kp,  col = 8nt + g
    D: slot = ((mt*Nt + nt)*2 + rM)*2 + rN           ->  row = 16mt + 8rM + g,  col = 8nt + 2t + rN

These are the PTX m16n8k16 register maps (ISA "Matrix Fragments for mma.m16n8k16"), and with them
a D fragment [R, N] and an A fragment [R, N] hold the same element in the same slot (N % 16 == 0):
an accumulator (P = softmax tile, the moving query X, XW) becomes the next product's A operand by a
per-slot cast, without shuffles. tests/test_tvm_build.py checks every formula against
``TileLayout.apply`` and the slot order TVM's mma lowering emits.
"""
from __future__ import annotations

__all__ = ["lay_A", "lay_B", "lay_D", "a_coord", "b_coord", "d_coord", "a_slots", "b_slots", "d_slots"]


def lay_A(Mt: int, Kt: int):
    from tvm.tirx.layout import S, TileLayout, laneid

    return TileLayout(S[(Mt, 2, 8, Kt, 2, 4, 2):(8 * Kt, 2, 4 @ laneid, 8, 4, 1 @ laneid, 1)])


def lay_B(Kt: int, Nt: int):
    from tvm.tirx.layout import S, TileLayout, laneid

    return TileLayout(S[(Kt, 2, 4, 2, Nt, 8):(4, 2, 1 @ laneid, 1, 4 * Kt, 4 @ laneid)])


def lay_D(Mt: int, Nt: int):
    from tvm.tirx.layout import S, TileLayout, laneid

    return TileLayout(S[(Mt, 2, 8, Nt, 4, 2):(4 * Nt, 2, 4 @ laneid, 4, 1 @ laneid, 1)])


def a_slots(Mt: int, Kt: int) -> int:
    return 8 * Mt * Kt


def b_slots(Kt: int, Nt: int) -> int:
    return 4 * Kt * Nt


def d_slots(Mt: int, Nt: int) -> int:
    return 4 * Mt * Nt


def a_coord(s, lane, Mt: int, Kt: int):
    """(row, col) of slot s of an A fragment [16Mt, 16Kt] held by ``lane`` (ints or PrimExprs)."""
    mt, kt, kHi, rM, kp = s // (8 * Kt), (s // 8) % Kt, (s // 4) % 2, (s // 2) % 2, s % 2
    return mt * 16 + rM * 8 + lane // 4, kt * 16 + kHi * 8 + (lane % 4) * 2 + kp


def b_coord(s, lane, Kt: int, Nt: int):
    """(row, col) = (k, n) of slot s of a B fragment [16Kt, 8Nt] held by ``lane``."""
    nt, kt, kHi, kp = s // (4 * Kt), (s // 4) % Kt, (s // 2) % 2, s % 2
    return kt * 16 + kHi * 8 + (lane % 4) * 2 + kp, nt * 8 + lane // 4


def d_coord(s, lane, Mt: int, Nt: int):
    """(row, col) of slot s of a D (accumulator) fragment [16Mt, 8Nt] held by ``lane``."""
    mt, nt, rM, rN = s // (4 * Nt), (s // 4) % Nt, (s // 2) % 2, s % 2
    return mt * 16 + rM * 8 + lane // 4, nt * 8 + (lane % 4) * 2 + rN
