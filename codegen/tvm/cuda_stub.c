/* A stand-in libcuda.so.1 for BUILD hosts without a GPU driver (pathtune.codegen.tvm.toolchain).
 *
 * TVM's CUDA runtime library (libtvm_runtime_cuda.so) links against libcuda.so.1. Without it the
 * library does not load, and tvm.compile silently emits a source-only CUDA module (no nvcc run).
 * These nine entry points are the driver symbols libtvm_runtime_cuda.so imports; each one fails with
 * CUDA_ERROR_NO_DEVICE (100). Nothing built with this stub ever runs a kernel on the build host;
 * on a GPU host the real driver is used and this file plays no part.
 *
 * Build: gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o libcuda.so.1 cuda_stub.c
 */
typedef int CUresult;
#define PATHTUNE_CUDA_STUB(name) CUresult name(void) { return 100; }

PATHTUNE_CUDA_STUB(cuDeviceGetName)
PATHTUNE_CUDA_STUB(cuFuncSetAttribute)
PATHTUNE_CUDA_STUB(cuGetErrorName)
PATHTUNE_CUDA_STUB(cuGetErrorString)
PATHTUNE_CUDA_STUB(cuLaunchKernelEx)
PATHTUNE_CUDA_STUB(cuModuleGetFunction)
PATHTUNE_CUDA_STUB(cuModuleLoadData)
PATHTUNE_CUDA_STUB(cuModuleUnload)
PATHTUNE_CUDA_STUB(cuTensorMapEncodeTiled)
