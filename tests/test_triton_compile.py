"""Every Triton PaTH kernel compiles for sm_90 (H100/H200) without a GPU and fits its shared memory.

``codegen/triton/compile_check.py`` lowers each launch of ``forward_kernels(params, D, DV)`` (forward
and backward) with ``triton.compile(..., target=GPUTarget("cuda", 90, 32))`` and Triton's bundled
ptxas; no GPU or driver is needed.  That must run WITHOUT ``TRITON_INTERPRET``: with it set before
triton is imported (as in the CPU test run), ``@triton.jit`` yields ``InterpretedFunction`` objects,
which ``triton.compile`` cannot lower (checked below).  So the compilation runs in a child Python
process whose environment lacks ``TRITON_INTERPRET``; one child per head dim, both started at once.

D=64 (spec defaults): compile + shared memory <= 232448 B (the sm_90 per-block opt-in limit) asserted.
D=128 (with ``TritonParams.heuristic(128, 128)``, the parameters ``path_attention_triton`` picks when
no config is given): compile + shared memory <= 232448 B asserted.  A kernel launched twice with
different operand types (the backward's intra walk over the 16-bit recomputed state and over the
forward's float32 state) is checked once per launch, the second as ``name#2``.
D=256 (``TritonParams.heuristic(256, 256)``: the column-blocked transition path, DB = 64 < BD, and
the heuristic's small tiles): compile + shared memory <= 232448 B asserted for every launch
(D=192 pads to the same 256-wide tiles).

Takes ~20 s (D=64) + ~80 s (D=128) + ~100 s (D=256) of CPU on a cold Triton cache: marked ``slow``.
Skipped cleanly when Triton's bundled ptxas is missing.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import triton

PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.exists(PTXAS), reason=f"Triton's bundled ptxas is missing ({PTXAS})"),
]

from pathtune.codegen.triton import TritonParams  # noqa: E402
from pathtune.codegen.triton.compile_check import compile_kernel, forward_kernels  # noqa: E402

SMEM_LIMIT_SM90 = 232448  # bytes: max dynamic shared memory per block on H100/H200 (227 KiB)
HEAD_DIMS = (64, 128, 256)
CHILD_TIMEOUT_S = 900


def _name(fn) -> str:
    return getattr(fn, "fn", fn).__name__


def _numbered(names: list[str]) -> list[str]:
    """Kernel names in launch order, a repeated one as name#2, name#3, ..."""
    seen: dict[str, int] = {}
    out = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n}#{seen[n]}")
    return out


def _launched(D: int) -> list[str]:
    params = TritonParams() if D <= 64 else TritonParams.heuristic(D, D)
    return _numbered([_name(k[0]) for k in forward_kernels(params, D, D)])


# every kernel launched at some head dim, in launch order (some only up to or above a padded head dim)
KERNELS = list(dict.fromkeys(name for D in HEAD_DIMS for name in _launched(D)))

_CHILD = textwrap.dedent("""
    import json, os, sys, time
    assert "TRITON_INTERPRET" not in os.environ
    from triton.runtime.jit import JITFunction
    from pathtune.codegen.triton import TritonParams
    from pathtune.codegen.triton.compile_check import compile_kernel, forward_kernels

    D = int(sys.argv[1])
    params = TritonParams.heuristic(D, D) if D > 64 and hasattr(TritonParams, "heuristic") else TritonParams()
    out = []
    for fn, sig, const, nw, ns in forward_kernels(params, D, D):
        rec = dict(name=fn.fn.__name__, jit=isinstance(fn, JITFunction), num_warps=nw, num_stages=ns)
        t0 = time.time()
        try:
            r = compile_kernel(fn, sig, const, num_warps=nw, num_stages=ns, arch=90, loops=True)
            rec.update(ok=True, shared=r.shared_bytes, regs=r.registers, spills=r.spill_bytes,
                       mma=[[kind, t, n] for (kind, t), n in sorted(r.mma.items())],
                       loops=[lp.instructions for lp in r.loops], serialized=r.wgmma_serialized)
        except Exception as exc:
            rec.update(ok=False, error=f"{type(exc).__name__}: {exc}"[-3000:])
        rec["seconds"] = round(time.time() - t0, 2)
        out.append(rec)
    print("PARAMS " + params.to_json(), flush=True)
    print("RESULT " + json.dumps(out), flush=True)
""")


@pytest.fixture(scope="module")
def compiled():
    """{D: {kernel name: record}}; the children for all head dims run concurrently."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    procs = {D: subprocess.Popen([sys.executable, "-c", _CHILD, str(D)], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
             for D in HEAD_DIMS}
    results = {}
    for D, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            pytest.fail(f"compiling the D={D} kernels took over {CHILD_TIMEOUT_S} s")
        lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        assert proc.returncode == 0 and lines, f"D={D} child failed (rc {proc.returncode}):\n{err[-4000:]}"
        recs = json.loads(lines[-1][len("RESULT "):])
        # a kernel launched twice (other operand types) is keyed name#2 for its second launch, as _launched does
        results[D] = dict(zip(_numbered([r["name"] for r in recs]), recs))
        pline = [ln for ln in out.splitlines() if ln.startswith("PARAMS ")]
        print(f"\nsm_90 resources, D=DV={D}, {pline[-1] if pline else ''}:")
        for r in recs:
            if r["ok"]:
                flag = "" if r["shared"] <= SMEM_LIMIT_SM90 else f"  OVER {SMEM_LIMIT_SM90}"
                print(f"  {r['name']:30s} shared {r['shared']:7d} B  regs {r['regs']}  spills {r['spills']} B  "
                      f"mma {r['mma']}  loops {r['loops']}{'  SERIALIZED' if r['serialized'] else ''} "
                      f"({r['seconds']:.1f} s){flag}")
            else:
                print(f"  {r['name']:30s} FAILED {r['error'][:300]}")
    return results


def test_compile_needs_jit_functions_not_the_interpreter():
    """Under TRITON_INTERPRET=1 the kernels are InterpretedFunction objects and compile_kernel cannot
    lower them -- which is why the compilation below runs in a child without TRITON_INTERPRET."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("only meaningful in the interpreter run (TRITON_INTERPRET=1)")
    from triton.runtime.interpreter import InterpretedFunction

    fn, sig, const, nw, ns = forward_kernels(TritonParams(), 64, 64)[0]
    assert isinstance(fn, InterpretedFunction)
    with pytest.raises(AttributeError):         # an InterpretedFunction has no compiled-kernel attributes
        compile_kernel(fn, sig, const, num_warps=nw, num_stages=ns, arch=90)


def test_every_kernel_was_compiled(compiled):
    for D in HEAD_DIMS:
        assert list(compiled[D]) == _launched(D), f"D={D}: compiled {list(compiled[D])}, expected {_launched(D)}"
        assert all(r["jit"] for r in compiled[D].values()), "the child must see JITFunction kernels"
    assert set(KERNELS) == {name for D in HEAD_DIMS for name in compiled[D]}


@pytest.mark.parametrize("name", KERNELS)
def test_kernel_compiles_and_fits_sm90_d64(compiled, name):
    if name not in compiled[64]:
        pytest.skip(f"{name} is launched for wider head dims only")
    r = compiled[64][name]
    assert r["ok"], f"{name} (D=64) does not compile for sm_90: {r['error']}"
    assert 0 <= r["shared"] <= SMEM_LIMIT_SM90, (
        f"{name} (D=64) needs {r['shared']} B of shared memory > {SMEM_LIMIT_SM90} B (sm_90)")
    assert r["regs"] is not None and r["regs"] <= 255


@pytest.mark.parametrize("name", KERNELS)
def test_kernel_compiles_sm90_d128(compiled, name):
    if name not in compiled[128]:
        pytest.skip(f"compile_check does not list {name} for D=128")
    r = compiled[128][name]
    assert r["ok"], f"{name} (D=128) does not compile for sm_90: {r['error']}"
    assert 0 <= r["shared"] <= SMEM_LIMIT_SM90, (
        f"{name} (D=128) needs {r['shared']} B of shared memory > {SMEM_LIMIT_SM90} B (sm_90)")


@pytest.mark.parametrize("name", KERNELS)
def test_kernel_compiles_and_fits_sm90_d256(compiled, name):
    """Head dim 256 on the heuristic's config: the three kernels with D x D transition products run
    column-blocked (bytes of shared memory unblocked -> blocked, same tiles: scan_inter 327680 -> 131072,
    bwd_inter_dq 606208 -> 147456, bwd_inter_dkv 688128 -> 147456)."""
    if name not in compiled[256]:
        # launched for narrower head dims only (the one-program chain up to 64, the 16-bit pair
        # transitions and the walk of two query chunks per program up to 128)
        assert name in ("bwd_superchunk_chain_kernel", "bwd_pair_transitions_kernel", "bwd_intra_walk_pairs_kernel")
        pytest.skip(f"compile_check does not list {name} for D=256")
    r = compiled[256][name]
    assert r["ok"], f"{name} (D=256) does not compile for sm_90: {r['error']}"
    assert 0 <= r["shared"] <= SMEM_LIMIT_SM90, (
        f"{name} (D=256) needs {r['shared']} B of shared memory > {SMEM_LIMIT_SM90} B (sm_90)")


# Kernels whose every matrix product must lower to sm_90's wgmma at D = 64 and 128 (the tiles of those head
# dims' configs: 64 rows or more per program, 4 or 8 warps, 16-bit or tf32 operands).  Not listed, by design:
# the 16 x 16 diagonal inverses on one warp, the transport backward (32-row tiles of the D x D chain), the D = 128
# chain's row kernel and the gate gradient (no products).
WGMMA_ONLY = ("ut_fused_kernel", "ut_recompute_kernel", "ut_chunk_kernel", "ut_apply_kernel",
              "superchunk_transport_kernel", "scan_intra_kernel", "scan_inter_kernel",
              "bwd_prep_kernel", "bwd_inter_dq_kernel", "bwd_inter_dkv_kernel", "bwd_pair_transitions_kernel",
              "bwd_intra_walk_kernel", "bwd_intra_walk_kernel#2", "bwd_intra_walk_pairs_kernel",
              "bwd_intra_diag_kernel", "ut_bwd_kernel")


@pytest.mark.parametrize("D", (64, 128))
def test_hot_kernels_products_are_wgmma(compiled, D):
    """Every product of the attention-sized kernels is a wgmma instruction in the PTX (none on mma.sync, which
    runs at a fraction of the tensor-core rate): a tile, warp count or operand type that falls off wgmma shows
    up here without a GPU."""
    off = {}
    for name in WGMMA_ONLY:
        r = compiled[D].get(name)
        if r is None or not r["ok"]:
            continue          # a launch not made at this head dim, or a compile failure the tests above report
        kinds = {kind for kind, _t, n in r["mma"] if n}
        if kinds != {"wgmma"}:
            off[name] = r["mma"]
    assert not off, f"D={D}: products off wgmma: {off}"


@pytest.mark.parametrize("D", (64, 128))
def test_hot_kernels_keep_their_wgmma_pipeline(compiled, D):
    """ptxas does not serialize the wgmma pipeline of any kernel at the head dim's untuned config (its warning
    C7513: a register that feeds a wgmma is written while the pipeline runs, e.g. a spill reload; the FoX offsets
    of scan_inter as a TMA block did that at D 128 and took the forward 1.02-1.04x longer on the H100), and the
    forward scans' hot loops are found in their SASS (one loop per scan, the count ``compile_check`` prints)."""
    serialized = [name for name, r in compiled[D].items() if r["ok"] and r["serialized"]]
    assert not serialized, f"D={D}: ptxas serialized the wgmma pipeline of {serialized}"
    for name in ("scan_intra_kernel", "scan_inter_kernel"):
        loops = compiled[D][name]["loops"]
        assert len(loops) == 1 and 100 < loops[0] < 5000, f"D={D} {name}: MMA loops {loops}"


_GATE_CHILD = textwrap.dedent("""
    import json, sys
    from pathtune.codegen._knobs import resolve
    from pathtune.codegen.triton.compile_check import compile_kernel, forward_kernels

    D = int(sys.argv[1])
    out = {}
    for variant in ("product", "subtract", "ungated"):
        config = {"gate_bias": "subtract" if variant == "ungated" else variant, "num_stages": 2}
        params = resolve("triton", "bwd", config, (D, D))
        fwd = resolve("triton", "fwd", config, (D, D))
        for fn, sig, const, nw, ns in forward_kernels(params, D, D, gate=variant != "ungated", fwd_params=fwd):
            name = fn.fn.__name__
            if name in ("scan_intra_kernel", "scan_inter_kernel", "gate_parts_kernel"):
                r = compile_kernel(fn, sig, const, num_warps=nw, num_stages=ns, arch=90, aligned=True, loops=True)
                out[variant + " " + name] = dict(shared=r.shared_bytes, loops=[lp.instructions for lp in r.loops],
                                                 serialized=r.wgmma_serialized)
    print("RESULT " + json.dumps(out), flush=True)
""")


@pytest.mark.parametrize("D", (64, 128))
def test_gate_offsets_by_product_leave_the_scans_loops_ungated(D):
    """gate_bias product (the FoX gate's key offsets by a K = 16 product of bf16 parts, num_stages 2 at the head
    dim's untuned config): both forward scans compile for sm_90 within its shared memory, keep their wgmma
    pipeline, and their hot loops issue fewer instructions than with the offsets subtracted per logit, within 6 %
    of the ungated loops (offline at D 64 / 128: scan_intra 457 / 610 against 568 / 675 subtracting and 468 / 606
    ungated; scan_inter 479 / 505 against 591 / 640)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _GATE_CHILD, str(D)], env=env, capture_output=True, text=True,
                          timeout=CHILD_TIMEOUT_S)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    r = json.loads(lines[-1][len("RESULT "):])
    print(json.dumps(r, indent=1))
    assert "product gate_parts_kernel" in r and "subtract gate_parts_kernel" not in r
    for name in ("scan_intra_kernel", "scan_inter_kernel"):
        prod, sub, plain = r[f"product {name}"], r[f"subtract {name}"], r[f"ungated {name}"]
        assert prod["shared"] <= SMEM_LIMIT_SM90 and not prod["serialized"], (name, prod)
        assert len(prod["loops"]) == len(sub["loops"]) == len(plain["loops"]) == 1, (name, r)
        assert prod["loops"][0] < sub["loops"][0] and prod["loops"][0] <= 1.06 * plain["loops"][0], (name, r)


_PRECOMPILE_CHILD = textwrap.dedent("""
    import json
    from pathtune.tuning.bundle import precompile_triton
    from pathtune.tuning.measure import MeasureTask

    wl = dict(head_dim=128, head_dim_v=128, heads_q=8, heads_kv=8, dtype="bfloat16", use_gate=True)
    out = {}
    for stages in (3, 2):
        task = MeasureTask(pass_="fwd", backend="triton", workload=wl,
                           config=dict(gate_bias="product", num_stages=stages), batch=8, seq_len=4096)
        out[stages] = precompile_triton(task)
    print("RESULT " + json.dumps(out), flush=True)
""")


def test_split_flow_precompile_sees_the_gate_products_shared_memory():
    """``tuning.bundle.precompile_triton`` builds a fwd candidate's kernels with its forward knobs: gate_bias product
    at D 128 on three pipelining stages needs 245 KB of shared memory in scan_inter (a pre-measured
    ``out_of_resources`` naming that kernel), on two it fits (no verdict, the GPU host measures it)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _PRECOMPILE_CHILD], env=env, capture_output=True, text=True,
                          timeout=CHILD_TIMEOUT_S)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    r = json.loads(lines[-1][len("RESULT "):])
    assert r["3"]["status"] == "out_of_resources" and "scan_inter_kernel" in r["3"]["message"], r
    assert r["2"] is None, r


def test_mma_loops_finds_the_innermost_product_loops():
    """compile_check.mma_loops: a loop is a backward branch and its body; only loops running a product count, the
    innermost of nested ones, and a retry path that branches back into a loop's body from past the kernel's end
    (a barrier wait's) is not a loop of its own; instructions are counted by opcode without predicates."""
    from pathtune.codegen.triton.compile_check import mma_loops

    def sass(lines):
        return "\n".join(f"        /*{16 * i:04x}*/                   {text} ;" for i, text in enumerate(lines))

    body = ["FFMA R1, R2, R3, R4", "@P0 FADD R5, R5, R6", "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24",
            "MUFU.EX2 R7, R7"]
    code = (["MOV R0, RZ"]                                   # 0
            + body                                            # 1-4: inner loop body
            + ["@P1 BRA 0x10"]                               # 5: back to 1 (inner loop)
            + ["IADD3 R9, R9, 1", "@P2 BRA 0x10"]            # 6-7: outer loop back to 1 (contains the inner)
            + ["FADD R8, R8, R8", "@P3 BRA 0x80"]            # 8-9: a loop without products (back to 8)
            + ["EXIT", "SYNCS.PHASECHK P4, [UR5]", "@!P4 BRA 0x30"])   # 10-12: a retry path into the inner body
    loops = mma_loops(sass(code))
    assert [lp.instructions for lp in loops] == [5]
    assert loops[0].ops == {"FFMA": 1, "FADD": 1, "HGMMA": 1, "MUFU": 1, "BRA": 1}
    assert mma_loops(sass(body + ["EXIT"])) == []


def test_mma_sites_count_ptx_products_by_kind():
    """compile_check.mma_sites counts wgmma and mma.sync instruction sites by operand type; the fences and
    commits of wgmma are not products."""
    from pathtune.codegen.triton.compile_check import KernelResources, mma_sites

    ptx = "\n".join([
        "wgmma.fence.sync.aligned;",
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%f1}, %rd1, %rd2, p, 1, 1, 0, 1;",
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%f1}, {%r1}, %rd2, p, 1, 1, 1;",
        "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 {%f1}, %rd1, %rd2, p, 1, 1;",
        "wgmma.commit_group.sync.aligned;",
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%f1}, {%r1}, {%r2}, {%f2};",
    ])
    sites = mma_sites(ptx)
    assert sites == {("wgmma", "bf16"): 2, ("wgmma", "tf32"): 1, ("mma.sync", "tf32"): 1}
    assert KernelResources("k", 0, 32, 0, 4, sites).mma_summary() == "wgmma 2 bf16 / 1 tf32, mma.sync 1 tf32"
    assert mma_sites("ld.global.b32 %r1, [%rd1];") == {}


def test_decode_kernels_compile_sm90_multi_token():
    """``compile_check --pass decode`` compiles the decode step's launches at D = 64 and 128: the one-token
    MHA kernel and 4- and 16-token GQA kernels (every flush rotates the keys in a second
    pass, compact WY form); each compiles for sm_90 and fits its shared memory."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    procs = {D: subprocess.Popen([sys.executable, "-m", "pathtune.codegen.triton.compile_check", "--pass", "decode",
                                  "--head-dim", str(D)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
             for D in (64, 128)}
    for D, proc in procs.items():
        out, err = proc.communicate(timeout=CHILD_TIMEOUT_S)
        assert proc.returncode == 0, err[-3000:]
        print(f"\nD={D}:\n{out}")
        lines = {ln.split()[0]: ln for ln in out.splitlines() if ln.strip()}
        for name in ("decode_kernel[TN=1,G=1]", "decode_kernel[TN=4,G=4]", "decode_kernel[TN=16,G=4]"):
            assert name in lines, f"D={D}: {name} missing from\n{out}"
            assert "FAILED" not in lines[name] and "OVER" not in lines[name], lines[name]
            shared = int(lines[name].split("shared")[1].split()[0])
            assert 0 <= shared <= SMEM_LIMIT_SM90, lines[name]


def test_programs_per_sm_from_registers_and_shared_memory():
    """KernelResources.programs_per_sm: the lesser of the register file (per-warp allocation in units of 256) and
    shared memory (1 KB reserved per block) of an sm_90 multiprocessor; unknown registers give None."""
    from pathtune.codegen.triton.compile_check import KernelResources

    assert KernelResources("k", 32768, 255, 0, 4).programs_per_sm() == 2          # 8192 registers a warp
    assert KernelResources("k", 32768, 168, 0, 4).programs_per_sm() == 3          # 5376 a warp
    assert KernelResources("k", 163840, 128, 0, 4).programs_per_sm() == 1         # shared memory bounds it
    assert KernelResources("k", 0, 32, 0, 1).programs_per_sm() == 32              # the block limit
    assert KernelResources("k", 1024, None, None, 4).programs_per_sm() is None
    assert "2 per SM" in str(KernelResources("ut", 32768, 255, 0, 4))
