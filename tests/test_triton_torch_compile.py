"""torch.compile(fullgraph=True) traces through the Triton custom ops; compiled == eager, grads too."""
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


def _loss(q, k, v, w, beta, g):
    o, lse = path_attention_triton(q, k, v, w, beta, g, config=CFG)
    return (o * o).sum() + lse.sum()


def test_fullgraph_compile_matches_eager():
    xs = _inputs(1)
    eager = _loss(*xs)
    g_eager = torch.autograd.grad(eager, xs)
    compiled_fn = torch.compile(_loss, fullgraph=True, backend="aot_eager")
    comp = compiled_fn(*xs)
    g_comp = torch.autograd.grad(comp, xs)
    torch.testing.assert_close(comp, eager)
    for a, b in zip(g_comp, g_eager):
        torch.testing.assert_close(a, b)


def test_fake_tensor_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(2, 64, 4, 32)
        k = torch.empty(2, 64, 2, 32)
        v = torch.empty(2, 64, 2, 16)
        w = torch.empty(2, 64, 2, 32)
        beta = torch.empty(2, 64, 2)
        o, lse = torch.ops.pathtune.path_attn_fwd(q, k, v, w, beta, None, None, 0.2, "{}", "inside_scale")
        assert o.shape == (2, 64, 4, 16) and lse.shape == (2, 64, 4) and lse.dtype == torch.float32


def test_opcheck_fake_matches_real_on_permuted_inputs():
    """torch.library.opcheck: the fake implementations agree with the real ops in shape, dtype and
    strides, also for permuted (non-contiguous) inputs as a model's projections produce them.
    (The backward's fake once copied a permuted q's strides; inductor then asserted on the H200.)"""
    import json

    from pathtune.codegen.triton import TritonParams

    xs = [x.detach() for x in _inputs(3)]
    q = xs[0].transpose(1, 2).contiguous().transpose(1, 2)      # [B, T, HQ, D] with permuted strides
    assert not q.is_contiguous()
    k, v, w, beta, g = xs[1:]
    pj = TritonParams.from_config(CFG).to_json()
    args = (q, k, v, w, beta, g, None, 0.25, pj, "inside_scale")
    torch.library.opcheck(torch.ops.pathtune.path_attn_fwd.default, args,
                          test_utils=("test_schema", "test_faketensor"))
    o, lse = torch.ops.pathtune.path_attn_fwd(*args)
    do = torch.randn_like(o).transpose(1, 2).contiguous().transpose(1, 2)
    bwd_args = (do, None, q, k, v, w, beta, g, o, lse, None, 0.25, pj, "inside_scale")
    torch.library.opcheck(torch.ops.pathtune.path_attn_bwd.default, bwd_args,
                          test_utils=("test_schema", "test_faketensor"))
    assert json.loads(pj)["chunk_size"] == 16
