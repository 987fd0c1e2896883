// Element types and vector packs. Self-contained on purpose: every byte the
// compiler reads is hashed into the compile key, so no system header is used.
#pragma once

namespace aicg {

// bfloat16 and IEEE half as their 16 storage bits; arithmetic always happens in float.
struct bf16 { unsigned short bits; };
struct f16 { unsigned short bits; };

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(bf16 v) { return __uint_as_float(((unsigned)v.bits) << 16); }
__device__ __forceinline__ float to_float(f16 v) {
  float out;
  asm("cvt.f32.f16 %0, %1;" : "=f"(out) : "h"(v.bits));
  return out;
}

// The lower (hi = 0) or upper 16-bit element of a 32-bit word as a float.
__device__ __forceinline__ float half_of(unsigned word, int hi, bf16) {
  return __uint_as_float(hi ? word & 0xffff0000u : word << 16);
}
__device__ __forceinline__ float half_of(unsigned word, int hi, f16) {
  return to_float(f16{(unsigned short)(hi ? word >> 16 : word & 0xffffu)});
}

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ bf16 from_float<bf16>(float v) {
  // Round to nearest even, NaN kept quiet (sm_80+ conversion instruction).
  unsigned short out;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(out) : "f"(v));
  return bf16{out};
}
template <> __device__ __forceinline__ f16 from_float<f16>(float v) {
  unsigned short out;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(out) : "f"(v));
  return f16{out};
}

// V consecutive elements moved as one access of V * sizeof(T) bytes.
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack { T v[V]; };

template <int V, typename T>
__device__ __forceinline__ Pack<T, V> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, V>*>(p);
}

template <int V, typename T>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, V>& pack) {
  *reinterpret_cast<Pack<T, V>*>(p) = pack;
}

template <bool FAST>
__device__ __forceinline__ float exp_(float x) { return FAST ? __expf(x) : expf(x); }

// Two floats rounded to 16-bit types in one instruction, lo in the lower half
// (the lower address). The paired form gives the bits of two single
// conversions: each half is rounded on its own.
__device__ __forceinline__ unsigned round_pair(float lo, float hi, bf16) {
  unsigned out;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(out) : "f"(hi), "f"(lo));
  return out;
}
__device__ __forceinline__ unsigned round_pair(float lo, float hi, f16) {
  unsigned out;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(out) : "f"(hi), "f"(lo));
  return out;
}

// V floats rounded into a pack, two at a time for 16-bit types.
template <typename T, int V>
__device__ __forceinline__ Pack<T, V> pack_floats(const float (&f)[V]) {
  Pack<T, V> p;
  if constexpr (sizeof(T) == 2 && V % 2 == 0) {
    unsigned* pairs = reinterpret_cast<unsigned*>(&p);
#pragma unroll
    for (int k = 0; k < V; k += 2) pairs[k / 2] = round_pair(f[k], f[k + 1], T{});
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) p.v[k] = from_float<T>(f[k]);
  }
  return p;
}

}  // namespace aicg
