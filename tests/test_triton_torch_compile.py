"""torch.compile(fullgraph=True) traces through the Triton custom ops; compiled == eager, grads too."""
import pytest
import torch

from pathtune.codegen.triton import path_attention_triton

CFG = dict(chunk_size=16, superchunk_size=32, block_n=16, bwd_block_n=16, scan_precision="tf32")


def _inputs(seed):
    gen = torch.Generator().manual_seed(seed)
    B, T, HQ, H, D = 1, 40, 2, 1, 16
    q = torch.randn(B, T, HQ, D, generator=gen)
    k = torch.randn(B, T, H, D, generator=gen)
    v = torch.randn(B, T, H, D, generator=gen)
    w = torch.nn.functional.normalize(torch.randn(B, T, H, D, generator=gen), dim=-1)
    beta = torch.rand(B, T, H, generator=gen) * 0.5 + 1.5
    g = torch.log(torch.rand(B, T, HQ, generator=gen) * 0.1 + 0.9)
    return [x.requires_grad_() for x in (q, k, v, w, beta, g)]


def _loss(q, k, v, w, beta, g, state="recompute"):
    o, lse = path_attention_triton(q, k, v, w, beta, g, config={**CFG, "bwd_forward_state": state})
    return (o * o).sum() + lse.sum()


@pytest.mark.parametrize("state", ["recompute", "keep_inter", "keep"])
def test_fullgraph_compile_matches_eager(state):
    """Also with bwd_forward_state keep_inter / keep: the forward op's kept state (fake shapes from sizes)
    reaches the backward op through autograd under the compiled graph."""
    xs = _inputs(1)
    eager = _loss(*xs, state)
    g_eager = torch.autograd.grad(eager, xs)
    compiled_fn = torch.compile(lambda *a: _loss(*a, state), fullgraph=True, backend="aot_eager")
    comp = compiled_fn(*xs)
    g_comp = torch.autograd.grad(comp, xs)
    torch.testing.assert_close(comp, eager)
    for a, b in zip(g_comp, g_eager):
        torch.testing.assert_close(a, b)


def test_fake_tensor_shapes():
    import json

    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(2, 64, 4, 32)
        k = torch.empty(2, 64, 2, 32)
        v = torch.empty(2, 64, 2, 16)
        w = torch.empty(2, 64, 2, 32)
        beta = torch.empty(2, 64, 2)
        small = json.dumps(CFG)
        o, lse, kept = torch.ops.pathtune.path_attn_fwd(q, k, v, w, beta, None, None, 0.2, small, "inside_scale")
        assert o.shape == (2, 64, 4, 16) and lse.shape == (2, 64, 4) and lse.dtype == torch.float32
        # bwd_forward_state keep_inter (the default): transported keys, transitions (2 x 2 super-chunks) and the
        # queries at their super-chunk start; no compact state, no gate cumsum without a gate
        assert len(kept) == 8
        sizes = {name: tuple(t.shape) for name, t in zip(("u", "kt", "m", "kj", "what", "gc", "wd", "y"), kept)}
        assert sizes == dict(u=(0,), kt=(0,), m=(0,), kj=(128, 2, 32), what=(4, 2, 32, 32), gc=(0,), wd=(0,),
                             y=(128, 4, 32))
        o, lse, kept = torch.ops.pathtune.path_attn_fwd(q, k, v, w, beta, None, None, 0.2,
                                                        '{"bwd_forward_state": "recompute"}', "inside_scale")
        assert len(kept) == 8 and all(t.numel() == 0 for t in kept)     # bwd_forward_state recompute


@pytest.mark.parametrize("state,scan,varlen", [("recompute", "tf32", False), ("keep", "tf32", False),
                                               ("keep", "fp16", False), ("keep", "tf32", True),
                                               ("keep_inter", "fp16", False), ("keep_inter", "tf32", True)])
def test_opcheck_fake_matches_real_on_permuted_inputs(state, scan, varlen):
    """torch.library.opcheck: the fake implementations agree with the real ops in shape, dtype and
    strides, also for permuted (non-contiguous) inputs as a model's projections produce them.
    (The backward's fake once copied a permuted q's strides; inductor then asserted on the H200.)
    With bwd_forward_state keep / keep_inter the forward also returns its state: 16-bit (fp16 scan) or
    float32, and for packed varlen input a transitions tensor sized from the sequence count alone."""
    import json

    from pathtune.codegen.triton import TritonParams

    xs = [x.detach() for x in _inputs(3)]
    q = xs[0].transpose(1, 2).contiguous().transpose(1, 2)      # [B, T, HQ, D] with permuted strides
    assert not q.is_contiguous()
    k, v, w, beta, g = xs[1:]
    cu = torch.tensor([0, 7, 40], dtype=torch.int64) if varlen else None
    pj = TritonParams.from_config({**CFG, "scan_precision": scan, "bwd_forward_state": state}).to_json()
    args = (q, k, v, w, beta, g, cu, 0.25, pj, "inside_scale")
    torch.library.opcheck(torch.ops.pathtune.path_attn_fwd.default, args,
                          test_utils=("test_schema", "test_faketensor"))
    o, lse, kept = torch.ops.pathtune.path_attn_fwd(*args)
    do = torch.randn_like(o).transpose(1, 2).contiguous().transpose(1, 2)
    assert all(t.numel() == 0 for t in kept) == (state == "recompute")
    bwd_args = (do, None, q, k, v, w, beta, g, o, lse, cu, kept, 0.25, pj, "inside_scale")
    torch.library.opcheck(torch.ops.pathtune.path_attn_bwd.default, bwd_args,
                          test_utils=("test_schema", "test_faketensor"))
    assert json.loads(pj)["chunk_size"] == 16
