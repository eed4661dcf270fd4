// CPU emulation of the CUDA subset that TVM emits for pathtune's kernels (pathtune.codegen.tvm.cuda_emu).
//
// Purpose: run the *generated* CUDA source of a kernel on a machine without a GPU, to check it numerically.
// One OS thread per CUDA thread, thread blocks one after another. Emulated: threadIdx/blockIdx, dynamic shared
// memory, __syncthreads / __syncwarp (barriers), __shfl_sync / __shfl_xor_sync (per-warp exchange), and
// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 with the PTX register fragment maps.
// half / nv_bfloat16 are 16-bit storage types converted through float with round-to-nearest-even.
// Not a performance tool, and not a model of the memory system: it checks index math, fragment maps, masks and
// barrier placement of kernels whose warp-collective operations are executed by all lanes.
#pragma once
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

typedef unsigned int uint;
typedef unsigned char uchar;
typedef unsigned short ushort;

struct dim3 { int x = 0, y = 0, z = 0; };
static thread_local dim3 threadIdx, blockIdx;
static dim3 blockDim, gridDim;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__
#define __launch_bounds__(...)
#define __align__(n) alignas(n)

// ---------------------------------------------------------------- 16-bit floats
static inline uint32_t emu_f2u(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
static inline float emu_u2f(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

static inline uint16_t emu_float_to_half_bits(float f) {
  uint32_t x = emu_f2u(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mant = x & 0x007fffffu;
  int exp = (int)((x >> 23) & 0xff);
  if (exp == 0xff) return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0u));
  int e = exp - 127 + 15;
  if (e >= 0x1f) return (uint16_t)(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return (uint16_t)sign;
    mant |= 0x00800000u;
    int shift = 14 - e;
    uint32_t hm = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t half_ = 1u << (shift - 1);
    if (rem > half_ || (rem == half_ && (hm & 1u))) hm++;
    return (uint16_t)(sign | hm);
  }
  uint32_t hm = mant >> 13;
  uint32_t rem = mant & 0x1fffu;
  uint32_t out = sign | ((uint32_t)e << 10) | hm;
  if (rem > 0x1000u || (rem == 0x1000u && (hm & 1u))) out++;
  return (uint16_t)out;
}

static inline float emu_half_bits_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  int exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return emu_u2f(sign);
    float v = std::ldexp((float)mant, -24);
    return sign ? -v : v;
  }
  if (exp == 0x1f) return emu_u2f(sign | 0x7f800000u | (mant << 13));
  return emu_u2f(sign | ((uint32_t)(exp - 15 + 127) << 23) | (mant << 13));
}

static inline uint16_t emu_float_to_bf16_bits(float f) {
  uint32_t x = emu_f2u(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
  uint32_t lsb = (x >> 16) & 1u;
  x += 0x7fffu + lsb;
  return (uint16_t)(x >> 16);
}
static inline float emu_bf16_bits_to_float(uint16_t b) { return emu_u2f((uint32_t)b << 16); }

struct nv_bfloat16;
struct half {
  uint16_t x;
  half() = default;
  half(float f) : x(emu_float_to_half_bits(f)) {}
  half(double f) : x(emu_float_to_half_bits((float)f)) {}
  half(int f) : x(emu_float_to_half_bits((float)f)) {}
  inline half(const nv_bfloat16& b);
  operator float() const { return emu_half_bits_to_float(x); }
};
struct nv_bfloat16 {
  uint16_t x;
  nv_bfloat16() = default;
  nv_bfloat16(float f) : x(emu_float_to_bf16_bits(f)) {}
  nv_bfloat16(double f) : x(emu_float_to_bf16_bits((float)f)) {}
  nv_bfloat16(int f) : x(emu_float_to_bf16_bits((float)f)) {}
  nv_bfloat16(const half& h) : x(emu_float_to_bf16_bits((float)h)) {}
  operator float() const { return emu_bf16_bits_to_float(x); }
};
inline half::half(const nv_bfloat16& b) : x(emu_float_to_half_bits((float)b)) {}
static_assert(sizeof(half) == 2 && sizeof(nv_bfloat16) == 2, "16-bit storage types");
struct nv_bfloat162 { nv_bfloat16 x, y; };
struct half2 { half x, y; };
struct alignas(8) nv_bfloat164 { nv_bfloat16 x, y, z, w; };
struct alignas(8) half4 { half x, y, z, w; };

// CUDA vector types (TVM's vectorised loads/stores reinterpret memory as these: plain storage here)
struct alignas(4) uint1 { uint x; };
struct alignas(8) uint2 { uint x, y; };
struct alignas(16) uint4 { uint x, y, z, w; };
struct alignas(8) int2 { int x, y; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) double2 { double x, y; };
struct alignas(16) ulonglong2 { unsigned long long x, y; };
struct alignas(16) ulonglong4 { unsigned long long x, y, z, w; };
struct alignas(16) longlong2 { long long x, y; };
struct alignas(16) longlong4 { long long x, y, z, w; };
static_assert(sizeof(uint4) == 16 && sizeof(ulonglong4) == 32 && sizeof(nv_bfloat162) == 4, "vector types");
static inline half __float2half_rn(float f) { return half(f); }
static inline nv_bfloat16 __float2bfloat16_rn(float f) { return nv_bfloat16(f); }

template <class A, class B> static inline auto max(A a, B b) -> decltype(a + b) { return a > b ? a : b; }
template <class A, class B> static inline auto min(A a, B b) -> decltype(a + b) { return a < b ? a : b; }
static inline float max(float a, float b) { return std::fmax(a, b); }
static inline float min(float a, float b) { return std::fmin(a, b); }
static inline double max(double a, double b) { return std::fmax(a, b); }
static inline double min(double a, double b) { return std::fmin(a, b); }
#include <math.h>   // exp2f, log2f, expf, logf, sqrtf in the global namespace, as CUDA has them

// ---------------------------------------------------------------- block / warp collectives
struct EmuWarp {
  std::barrier<> bar{32};
  uint64_t xchg[32][16];
};
struct EmuBlock {
  std::unique_ptr<std::barrier<>> bar;
  std::vector<std::unique_ptr<EmuWarp>> warps;
};
static EmuBlock* emu_block = nullptr;
static unsigned char* emu_dyn_smem = nullptr;

static inline int emu_tid() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
static inline EmuWarp& emu_warp() { return *emu_block->warps[emu_tid() / 32]; }
static inline int emu_lane() { return emu_tid() % 32; }

static inline void __syncthreads() { emu_block->bar->arrive_and_wait(); }
static inline void __syncwarp(uint mask = 0xffffffffu) { (void)mask; emu_warp().bar.arrive_and_wait(); }

template <class T>
static inline T emu_shfl(T v, int src_lane) {
  EmuWarp& w = emu_warp();
  int lane = emu_lane();
  uint64_t bits = 0;
  static_assert(sizeof(T) <= 8, "shuffle of a wide type");
  std::memcpy(&bits, &v, sizeof(T));
  w.xchg[lane][0] = bits;
  w.bar.arrive_and_wait();
  T out;
  std::memcpy(&out, &w.xchg[src_lane & 31][0], sizeof(T));
  w.bar.arrive_and_wait();
  return out;
}
template <class T> static inline T __shfl_sync(uint mask, T v, int src, int width = 32) {
  (void)mask; int lane = emu_lane(); return emu_shfl(v, (lane / width) * width + (src % width));
}
template <class T> static inline T __shfl_xor_sync(uint mask, T v, int lm, int width = 32) {
  (void)mask; int lane = emu_lane(); return emu_shfl(v, (lane / width) * width + ((lane % width) ^ lm));
}

// mma.sync.aligned.m16n8k16.row.col.f32.<ab>.<ab>.f32 (PTX fragment maps; lane = 4 g + t)
//   a0:(g, 2t..2t+1) a1:(g+8, 2t..) a2:(g, 2t+8..) a3:(g+8, 2t+8..)   b0:(k 2t..2t+1, n g) b1:(k 2t+8.., n g)
//   c0,c1:(g, 2t/2t+1) c2,c3:(g+8, 2t/2t+1); low 16 bits of a register = the first (lower-k) element
template <bool BF16>
static inline void emu_mma(float& d0, float& d1, float& d2, float& d3, uint32_t a0, uint32_t a1, uint32_t a2,
                           uint32_t a3, uint32_t b0, uint32_t b1, float c0, float c1, float c2, float c3) {
  EmuWarp& w = emu_warp();
  int lane = emu_lane();
  uint64_t* x = w.xchg[lane];
  x[0] = a0; x[1] = a1; x[2] = a2; x[3] = a3; x[4] = b0; x[5] = b1;
  w.bar.arrive_and_wait();
  auto cvt = [](uint32_t bits) { return BF16 ? emu_bf16_bits_to_float((uint16_t)bits) : emu_half_bits_to_float((uint16_t)bits); };
  float A[16][16], B[16][8];
  for (int l = 0; l < 32; ++l) {
    int g = l / 4, t = l % 4;
    const int rows[4] = {g, g + 8, g, g + 8};
    const int cols[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
    for (int j = 0; j < 4; ++j) {
      uint32_t r = (uint32_t)w.xchg[l][j];
      A[rows[j]][cols[j]] = cvt(r & 0xffffu);
      A[rows[j]][cols[j] + 1] = cvt(r >> 16);
    }
    for (int j = 0; j < 2; ++j) {
      uint32_t r = (uint32_t)w.xchg[l][4 + j];
      int k = 2 * t + 8 * j;
      B[k][g] = cvt(r & 0xffffu);
      B[k + 1][g] = cvt(r >> 16);
    }
  }
  w.bar.arrive_and_wait();
  int g = lane / 4, t = lane % 4;
  float cin[4] = {c0, c1, c2, c3};
  float out[4];
  for (int j = 0; j < 4; ++j) {
    int row = g + (j >= 2 ? 8 : 0), col = 2 * t + (j % 2);
    float acc = cin[j];
    for (int k = 0; k < 16; ++k) acc += A[row][k] * B[k][col];
    out[j] = acc;
  }
  d0 = out[0]; d1 = out[1]; d2 = out[2]; d3 = out[3];
}

static inline void tvm_builtin_ptx_mma_sync_aligned_m16n8k16_row_col_f32_f16_f16_f32(
    float& d0, float& d1, float& d2, float& d3, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
    uint32_t b1, float c0, float c1, float c2, float c3) {
  emu_mma<false>(d0, d1, d2, d3, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3);
}
static inline void tvm_builtin_ptx_mma_sync_aligned_m16n8k16_row_col_f32_bf16_bf16_f32(
    float& d0, float& d1, float& d2, float& d3, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
    uint32_t b1, float c0, float c1, float c2, float c3) {
  emu_mma<true>(d0, d1, d2, d3, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3);
}
static inline void tvm_builtin_cuda_cta_sync() { __syncthreads(); }
static inline void tvm_builtin_cuda_warp_sync() { __syncwarp(); }

// ---------------------------------------------------------------- launching
static void emu_run_grid(int gx, int gy, int gz, int nthreads, size_t smem_bytes, const std::function<void()>& body) {
  blockDim = dim3{nthreads, 1, 1};
  gridDim = dim3{gx, gy, gz};
  std::vector<unsigned char> smem(smem_bytes + 256);
  emu_dyn_smem = smem.data();
  for (int bz = 0; bz < gz; ++bz)
    for (int by = 0; by < gy; ++by)
      for (int bx = 0; bx < gx; ++bx) {
        EmuBlock blk;
        blk.bar = std::make_unique<std::barrier<>>(nthreads);
        for (int w = 0; w < (nthreads + 31) / 32; ++w) blk.warps.push_back(std::make_unique<EmuWarp>());
        emu_block = &blk;
        std::fill(smem.begin(), smem.end(), (unsigned char)0xA5);  // poison: reads before writes show up
        std::vector<std::thread> ts;
        ts.reserve(nthreads);
        for (int t = 0; t < nthreads; ++t)
          ts.emplace_back([&, t, bx, by, bz]() {
            threadIdx = dim3{t, 0, 0};
            blockIdx = dim3{bx, by, bz};
            body();
          });
        for (auto& th : ts) th.join();
      }
}
