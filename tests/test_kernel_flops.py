"""benchmarks/kernel_flops.py: the matrix-product work per kernel behind BENCHMARKS.md's TFLOP/s columns."""
from repo_scripts import load_script

kf = load_script("benchmarks/kernel_flops.py")


def test_a_superchunk_longer_than_the_sequence_spans_it():
    """At T 2K a super-chunk of 4096 (the tuned D64 forward) does what one of 2048 does: the intra scan covers
    the whole sequence, no inter scan, no transport, no negative counts."""
    long, exact = (kf.kernel_flops(64, 2048, 16, 16, 64, S) for S in (4096, 2048))
    assert long == exact
    assert long["scan_inter_kernel"] == 0 and long["superchunk_transport_kernel"] == 0
    assert all(v >= 0 for v in long.values())
    short = kf.kernel_flops(64, 2048, 16, 16, 64, 1024)
    assert long["scan_intra_kernel"] > 1.9 * short["scan_intra_kernel"] and short["scan_inter_kernel"] > 0


def test_table_reads_each_rows_superchunk():
    """A fwd_probe row's recorded config sets its super-chunk; without one, a call that launched no inter scan
    ran a super-chunk spanning the sequence, else the given default."""
    kernels = [["scan_intra_kernel", 0.9, 1], ["ut_fused_kernel", 0.45, 1]]
    base = dict(D=64, T=2048, B=16, H=16, gate=True)
    rows = [dict(base, profile=dict(kernels=kernels)),
            dict(base, gate=False, config=dict(superchunk_size=1024, chunk_size=64), profile=dict(kernels=kernels)),
            dict(base, T=4096, B=8, profile=dict(kernels=kernels + [["scan_inter_kernel", 0.3, 1]]))]
    got = {(r["T"], r["gate"], r["kernel"]): r["gflop"] for r in kf.table(rows, 64, 1024, 64, forward_only=True)}
    spans = kf.kernel_flops(64, 2048, 16, 16, 64, 2048)["scan_intra_kernel"] / 1e9
    recorded = kf.kernel_flops(64, 2048, 16, 16, 64, 1024)["scan_intra_kernel"] / 1e9
    default = kf.kernel_flops(64, 4096, 8, 16, 64, 1024)["scan_intra_kernel"] / 1e9
    assert got[(2048, True, "scan_intra_kernel")] == spans
    assert got[(2048, False, "scan_intra_kernel")] == recorded < spans
    assert got[(4096, True, "scan_intra_kernel")] == default


def test_whole_stream_kernels_count_per_launch():
    """The forward's UT stage covers the whole stream at every launch (twice under bwd_forward_state recompute):
    the table counts it per launch; the per-range kernels' launches together cover the stream once."""
    base = dict(D=128, T=4096, B=8, H=8, gate=False, kind="profile")
    one = [["ut_fused_kernel", 0.45, 1], ["ut_recompute_kernel", 0.45, 8]]
    two = [["ut_fused_kernel", 0.90, 2], ["ut_recompute_kernel", 0.45, 8]]
    got = [{r["kernel"]: r for r in kf.table([dict(base, kernels=k)], 64, 2048, 128)} for k in (one, two)]
    assert got[1]["ut_fused_kernel"]["gflop"] == 2 * got[0]["ut_fused_kernel"]["gflop"]
    assert got[1]["ut_fused_kernel"]["tflops"] == got[0]["ut_fused_kernel"]["tflops"]
    assert got[0]["ut_recompute_kernel"]["gflop"] == got[0]["ut_fused_kernel"]["gflop"]
