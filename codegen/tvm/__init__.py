"""pathtune.codegen.tvm: the TVM (TensorIR / TIRx) backend of PaTH(-FoX) attention.

Importing this package is light (no TVM import). Pieces:

* stir_ut, stir_transport, stir_scan, stir_decode: the stages as S-TIR macros and prim_funcs
  (UT inverse, boundary adjustment, super-chunk transport, right-to-left scan with low-rank query
  updates and online softmax, FoX bias, fused decode step); built unscheduled for the CPU they are the
  numerics check against runtime.reference;
* schedule: the parameterised CUDA-core schedule of those stages; tc_scan: the tensor-core
  (mma.sync, TIRx) forward scan;
* build: lowering + nvcc build of exported, cached modules (no GPU needed; toolchain: libcuda stub);
* runtime: loading prebuilt modules with only the TVM runtime, ``path_attention_tvm`` and
  ``path_attention_decode_step_tvm``; host: the torch-side layout and launches.
"""

__all__ = ["path_attention_tvm", "path_attention_decode_step_tvm"]


def __getattr__(name):
    if name in __all__:
        from . import runtime

        return getattr(runtime, name)
    raise AttributeError(name)
