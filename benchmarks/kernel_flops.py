"""Achieved TFLOP/s of each Triton PaTH kernel in a profile of one fwd+bwd (no GPU needed).

Reads the rows of the ``profile`` step (``benchmarks/dev_gpu_run2.py profile4k``: device ms per kernel
name, summed over its launches) and divides by a count of the kernel's matrix-product work at that
shape, derived from the kernel code: 2*m*n*k per product, for the whole token stream.  The backward's
per-range launches together cover the stream once; a kernel of ``WHOLE_STREAM_LAUNCHES`` covers it at every
launch (the forward's UT stage and transport, which the backward's own prepare_state repeats under
bwd_forward_state recompute), so its count is per launch and ``table`` multiplies it by the launches.  The
backward's per-range UT recompute is one launch a range from padded head dim 64 (``ut_recompute_kernel``), three
below.  Counted: logical FLOPs of the products; tf32x3 products count once (the hardware does three),
elementwise work (exp2, masks) not at all; the super-chunk-local kernels assume full super-chunks and chunks.

    python benchmarks/kernel_flops.py PROFILE.json [--chunk 64 --superchunk 1024 --block-n 64]
    python benchmarks/kernel_flops.py fwd_probe.json --forward     # one forward (benchmarks/fwd_probe.py rows)
"""
from __future__ import annotations

import argparse
import json

# kernels each of whose launches covers the whole token stream: kernel_flops counts one launch
WHOLE_STREAM_LAUNCHES = ("ut_fused_kernel", "superchunk_transport_kernel")


def kernel_flops(D: int, T: int, B: int, H: int, C: int = 64, S: int = 1024, BN: int = 64) -> dict[str, float]:
    """FLOPs per kernel name of one fwd+bwd (DV = D, HQ = H, dense batch of B sequences of T), those of
    ``WHOLE_STREAM_LAUNCHES`` per launch.  A super-chunk longer than the sequence spans the sequence."""
    S = min(S, T)
    N = B * T                       # tokens
    n_chunk = N // C                # UT chunks
    s = S // C                      # chunks per super-chunk
    nsc = T // S                    # super-chunks per sequence
    pairs = B * nsc * (nsc - 1) // 2            # (I, J) super-chunk pairs, J < I, per head
    with_transport = B * (nsc - 1)              # super-chunks with a transition (not the last of a sequence)
    mean_ci = (s - 1) / 2                       # earlier chunks of a query chunk inside its super-chunk
    cc = 2 * C * C * D                          # one C x C x D product
    c3 = 2 * C ** 3
    f = {}
    # UT stage: the one-launch kernel of prepare_state (one launch) and the backward's per-range recompute (one
    # launch a range, the same products; or the three below at padded head dims under 64)
    f["ut_fused_kernel"] = H * n_chunk * (4 * cc + 5 * c3)               # W W^T, W K^T, A W, M^T W; inverse (4), M
    f["ut_recompute_kernel"] = f["ut_fused_kernel"]
    f["ut_diag_inverse_kernel"] = H * n_chunk * (C // 16) * 2 * 16 * 16 * D
    f["ut_chunk_kernel"] = H * n_chunk * (2 * cc + 5 * c3)              # W W^T, W K^T; inverse (4), M
    f["ut_apply_kernel"] = H * n_chunk * 2 * cc                         # U = A W, K~ = K - M^T W
    # forward super-chunk transport (one launch)
    f["superchunk_transport_kernel"] = H * with_transport * s * 3 * 2 * C * D * D
    # forward scan
    f["scan_intra_kernel"] = H * n_chunk * (4 * cc + c3 + mean_ci * 4 * cc)
    f["scan_inter_kernel"] = H * pairs * S * (4 * S * D + 2 * D * D)
    # backward
    f["bwd_prep_kernel"] = H * n_chunk * (2 * cc + mean_ci * 2 * cc)
    f["bwd_inter_dkv_kernel"] = H * pairs * (8 * S * S * D + 3 * 2 * S * D * D + (S // BN) * 2 * D ** 3)
    f["bwd_inter_dq_kernel"] = H * pairs * (6 * S * S * D + s * (4 * C * D * D + 2 * D ** 3))
    f["bwd_transport_chain_kernel"] = H * with_transport * s * 5 * 2 * C * D * D
    f["bwd_transport_grads_kernel"] = H * with_transport * s * 5 * 2 * C * D * D
    f["bwd_transport_kernel"] = f["bwd_transport_chain_kernel"] + f["bwd_transport_grads_kernel"]
    # bwd_intra: the walk (the states pass, ten products per (query chunk, earlier key chunk)) and the
    # diagonal tile's kernel
    f["bwd_intra_walk_kernel"] = H * n_chunk * (2 * cc + max(mean_ci - 1, 0) * 2 * cc + mean_ci * 10 * cc)
    # the walk of two query chunks per program (bwd_walk_chunks 2) runs the same products on 2C-row tiles, plus, per
    # pair, the lower chain's masked half at the upper chain's extra step (ten products) and transition (two)
    f["bwd_intra_walk_pairs_kernel"] = f["bwd_intra_walk_kernel"] + H * (n_chunk / 2) * 12 * cc
    f["bwd_intra_diag_kernel"] = H * n_chunk * (10 * cc + 3 * c3)
    # UT backward (ut_bwd_kernel): W W^T, W K^T, W dK~^T, dU W^T; T^{-1} = I - A strictLower(W W^T), dL, dA, dT
    # (two), A and M read; then five C x C x D products for dW, dK.  Older profiles split it into a chunk kernel
    # (the C x C part) and an apply kernel (dW, dK)
    f["ut_bwd_chunk_kernel"] = H * n_chunk * (4 * cc + 5 * c3)
    f["ut_bwd_apply_kernel"] = H * n_chunk * 5 * cc
    f["ut_bwd_kernel"] = f["ut_bwd_chunk_kernel"] + f["ut_bwd_apply_kernel"]
    return f


def row_superchunk(row: dict, kernels: list, S: int) -> int:
    """The super-chunk size a profiled call ran: its recorded config's, else ``S``, or at least the sequence when
    the call launched no inter scan (a super-chunk as long as the sequence: the intra scan does all the work)."""
    recorded = (row.get("config") or {}).get("superchunk_size")
    if recorded:
        return int(recorded)
    inter = any(name.split("(")[0].strip() == "scan_inter_kernel" for name, *_ in kernels)
    return S if inter else row["T"]


def table(profile_rows: list[dict], C: int, S: int, BN: int, forward_only: bool = False) -> list[dict]:
    """Rows of the profile step (``kind: profile``) or, with ``forward_only``, of fwd_probe.py (a
    ``profile`` dict per shape); a row's recorded config (fwd_probe.py) gives its chunk and super-chunk sizes,
    else ``C`` and ``S`` (``row_superchunk``)."""
    out = []
    for r in profile_rows:
        if forward_only:
            if "profile" not in r:
                continue
            kernels = r["profile"]["kernels"]
        elif r.get("kind") != "profile":
            continue
        else:
            kernels = r["kernels"]
        chunk = int((r.get("config") or {}).get("chunk_size") or C)
        flops = kernel_flops(r["D"], r["T"], r["B"], r["H"], chunk, row_superchunk(r, kernels, S), BN)
        for name, ms, launches in kernels:
            key = name.split("(")[0].strip()
            if key in flops and ms > 0:
                work = flops[key] * (launches if key in WHOLE_STREAM_LAUNCHES else 1)
                out.append(dict(D=r["D"], T=r["T"], gate=r["gate"], kernel=key, launches=launches, ms=ms,
                                gflop=work / 1e9, tflops=work / (ms * 1e-3) / 1e12))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", help="JSON rows of the profile step (run_profile4k.json)")
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--superchunk", type=int, default=1024)
    ap.add_argument("--block-n", type=int, default=64,
                    help="key tile of the profiled config's dk / dv pass (bwd_dkv_block_n, else bwd_block_n)")
    ap.add_argument("--forward", action="store_true", help="rows of benchmarks/fwd_probe.py: one forward")
    a = ap.parse_args(argv)
    with open(a.profile) as fh:
        rows = table(json.load(fh), a.chunk, a.superchunk, a.block_n, a.forward)
    print(f"{'D':>4} {'T':>6} {'gate':>5} {'kernel':32} {'ms':>7} {'GFLOP':>8} {'TFLOP/s':>8}")
    for r in rows:
        print(f"{r['D']:>4} {r['T']:>6} {str(r['gate']):>5} {r['kernel']:32} {r['ms']:7.3f} {r['gflop']:8.1f} "
              f"{r['tflops']:8.1f}")


if __name__ == "__main__":
    main()
