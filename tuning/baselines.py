"""Baselines measured in the same run as pathtune's kernels: torch SDPA and fla's PaTH kernels.

Each factory returns a zero-argument callable (or None when that baseline is unavailable on
this machine) so that a benchmark can time it with ``triton.testing.do_bench``.
"""
from __future__ import annotations

import contextlib
import os
from typing import Callable, Iterator, Optional

import torch
import torch.nn.functional as F

# Triton's toolchain paths, read at each compile: torch's inductor points TRITON_PTXAS_PATH at the ptxas in
# torch's wheel the first time it compiles in a process (fla's kernels call torch.compile'd helpers), and
# every later Triton compile -- pathtune's kernels included -- then uses that ptxas, which perf_db records
# with each measurement (a soft key: served elsewhere with a warning).
_TRITON_TOOLCHAIN_VARS = ("TRITON_PTXAS_PATH", "TRITON_LIBDEVICE_PATH", "TRITON_CUOBJDUMP_PATH", "TRITON_NVDISASM_PATH")


@contextlib.contextmanager
def keep_triton_toolchain() -> Iterator[None]:
    """Run a baseline without letting it change the process's Triton toolchain (``_TRITON_TOOLCHAIN_VARS``
    restored afterwards), so that pathtune's kernels measured after it compile with the ptxas a process
    that never runs the baseline uses, the one its perf_db records name."""
    saved = {name: os.environ.get(name) for name in _TRITON_TOOLCHAIN_VARS}
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _sdpa_kind(backend: str):
    from torch.nn.attention import SDPBackend

    return {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[backend]


@contextlib.contextmanager
def sdpa_backend(backend: str) -> Iterator[None]:
    """Only SDPA's ``backend`` ('flash', 'cudnn', 'efficient', 'math') enabled inside the block.  Decode
    baselines enter it once around their timing loop: entered in every call, torch's ``sdpa_kernel`` adds
    its host time to each call of a step that runs ~50 us on the GPU, and the baseline looks slower than
    a user's plain SDPA call is."""
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel(_sdpa_kind(backend)):
        yield


def sdpa_decode_callable(q, k, v) -> Optional[Callable[[], object]]:
    """SDPA of the new queries q [B, HQ, TN, D] over cached keys / values k, v [B, H, T, D] (GQA expanded to
    full heads; TN > 1: causal among the new queries, aligned to the last key, ``causal_lower_right``): a plain
    call, timed inside ``sdpa_backend`` (which picks the backend); one trial call here, None when the active
    backend cannot run these inputs."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    mask = None
    if q.shape[2] > 1:
        from torch.nn.attention.bias import causal_lower_right

        mask = causal_lower_right(q.shape[2], k.shape[2])

    def run():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    try:
        run()
        torch.cuda.synchronize()
    except Exception as exc:  # backend unavailable for these shapes / this GPU
        print(f"sdpa decode unavailable: {type(exc).__name__}: {exc}")
        return None
    return run


def sdpa_callable(q, k, v, backend: str, backward: bool = False) -> Optional[Callable[[], object]]:
    """Causal SDPA on [B,T,H,D] inputs with one forced backend ('flash', 'cudnn', 'efficient').

    GQA is expanded to full heads (SDPA's flash path needs equal heads).  Returns None when the
    backend cannot run these inputs here.
    """
    from torch.nn.attention import sdpa_kernel

    group = q.shape[2] // k.shape[2]
    qt = q.transpose(1, 2).detach().requires_grad_(backward)
    kt = k.repeat_interleave(group, dim=2).transpose(1, 2).detach().requires_grad_(backward)
    vt = v.repeat_interleave(group, dim=2).transpose(1, 2).detach().requires_grad_(backward)
    do = torch.randn_like(qt[..., : v.shape[-1]]) if backward else None

    def run():
        with sdpa_kernel(_sdpa_kind(backend)):
            o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
            if backward:
                torch.autograd.grad(o, (qt, kt, vt), do)
        return o

    try:
        run()
        torch.cuda.synchronize()
    except Exception:  # backend not available for this shape/dtype/GPU
        return None
    return run


def fla_path_callable(q, k, v, w, beta, g=None, backward: bool = False) -> Optional[Callable[[], object]]:
    """flash-linear-attention's ``parallel_path_attn`` when importable, else None."""
    try:
        from fla.ops.path_attn import parallel_path_attn
    except Exception:
        return None
    args = [x.detach().requires_grad_(backward) for x in (q, k, v, w, beta)]
    gg = None if g is None else g.detach().requires_grad_(backward)
    do = torch.randn_like(q[..., : v.shape[-1]]) if backward else None

    def run():
        o, _ = parallel_path_attn(*args, g=gg)
        if backward:
            inputs = args + ([gg] if gg is not None else [])
            torch.autograd.grad(o, inputs, do)
        return o

    try:
        run()
        torch.cuda.synchronize()
    except Exception as exc:  # unsupported head dim etc.
        print(f"fla parallel_path_attn unavailable for {tuple(q.shape)}: {type(exc).__name__}: {exc}")
        return None
    return run
