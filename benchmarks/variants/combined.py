"""The candidates of this folder that change no math, together, as they would land: the heads-fastest program
order (``heads_fastest.py``), the forward transport and the transport backward on 64-row tiles
(``transport_rows64.py``, ``bwd_transport_rows64.py``), and every launch past the JIT's binding on a repeat
(``fast_launch.py``), so that one e2e row of the kernel probe or one candidate of ``fwd_probe`` times the set.

Every kernel the forward and backward launchers call is here: the re-gridded / re-tiled ones wrap their variant
kernel behind ``fast_launch.CompiledLaunch`` (the wrapper first maps the launcher's grid and options, then the
compiled-kernel cache keys on what is launched), the others are ``fast_launch``'s wrappers of the shipped kernels.

    python benchmarks/dev_kernel_probe.py --only e2e --intra-v2 benchmarks/variants/combined.py
    python benchmarks/fwd_probe.py --seq-lens 2048 --no-fla --candidates benchmarks/variants/combined.py

tests/test_triton_backward.py checks a fwd+bwd with it against the shipped one and the float64 oracle.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))      # benchmarks/: kernel_variants, variants
from kernel_variants import RegriddedKernel  # noqa: E402

from variants import bwd_transport_rows64, fast_launch, heads_fastest, transport_rows64  # noqa: E402

CompiledLaunch = fast_launch.CompiledLaunch

# fast_launch's wrappers of the shipped kernels (every name the launchers call), then the candidates over them
globals().update({name: obj for name, obj in vars(fast_launch).items()
                  if name.endswith("_kernel") and isinstance(obj, CompiledLaunch)})
scan_intra_kernel = RegriddedKernel(CompiledLaunch(heads_fastest.scan_intra_kernel.kernel), heads_fastest._flat)
bwd_prep_kernel = RegriddedKernel(CompiledLaunch(heads_fastest.bwd_prep_kernel.kernel), heads_fastest._flat)
bwd_intra_walk_kernel = RegriddedKernel(CompiledLaunch(heads_fastest.bwd_intra_walk_kernel.kernel), heads_fastest._flat)
superchunk_transport_kernel = transport_rows64.Rows64Launch(
    CompiledLaunch(transport_rows64.superchunk_transport_kernel.kernel))
bwd_transport_chain_kernel = transport_rows64.Rows64Launch(
    CompiledLaunch(bwd_transport_rows64.bwd_transport_chain_kernel.kernel), bwd_transport_rows64.CHAIN_OPTIONS,
    row_axis=2, split=True)
bwd_transport_grads_kernel = transport_rows64.Rows64Launch(
    CompiledLaunch(bwd_transport_rows64.bwd_transport_grads_kernel.kernel), bwd_transport_rows64.GRADS_OPTIONS,
    row_axis=None, split=False)
