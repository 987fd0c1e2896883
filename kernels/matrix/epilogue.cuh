// The matrix family's epilogue: what happens to an accumulated dot product on
// its way to memory, shared by every realisation (wgmma, mma.sync, decode).
//
//   y[row, col] = round_T( residual[row, col] + act(acc + bias[col]) )
//
// Everything before the one final rounding happens in float, the
// accumulator's precision: the bias and the residual are widened from T, the
// activation is evaluated with the accurate libdevice functions (tanhf,
// erff, expf: a few float ulps each), and only the stored value is rounded.
// GELU comes in both published forms: the tanh approximation (PyTorch's
// approximate="tanh") and the exact erf form (PyTorch's default).
//
// Rows and columns past M and N are never written (ragged edges clip here).
#pragma once
#include "aicg_types.cuh"

namespace aicg {
namespace matrix {

// ACT_GELU_ERF_FITTED is GELU(erf) by a fitted formula on the hardware's 2^x and 1/x approximations
// (fewer than half the instructions of erff's): x Phi(x) with Phi = 1 / (1 + 2^t), t = x q(min(|x|, 6)),
// q the degree-8 polynomial below, fitted to Phi's logit by tests/bench/gelu_fit.py. Its error, with
// ex2.approx within 2 ulp and rcp.approx within 1, stays under a third of the 8 u (|x| + |GELU(x)|)
// that aicg/matrix/reference.py allows an activation's evaluation (tests/test_matrix_activation.py).
enum Activation { ACT_NONE = 0, ACT_GELU_TANH = 1, ACT_GELU_ERF = 2, ACT_SILU = 3, ACT_GELU_ERF_FITTED = 4 };

// q's coefficients are the literals below, highest degree first (tests/bench/gelu_fit.py writes them).
__device__ __forceinline__ float gelu_fitted(float x) {
  const float a = fminf(fabsf(x), 6.0f);   // past |x| = 6, Phi is 1 or 0 to within float's reach either way
  float q = 0x1.2ef270p-17f;
  q = fmaf(q, a, -0x1.c90832p-14f);
  q = fmaf(q, a, 0x1.959482p-12f);
  q = fmaf(q, a, -0x1.0c19aap-13f);
  q = fmaf(q, a, -0x1.70d338p-13f);
  q = fmaf(q, a, 0x1.0ebb4ep-11f);
  q = fmaf(q, a, -0x1.aecaf0p-4f);
  q = fmaf(q, a, 0x1.74d330p-14f);
  q = fmaf(q, a, -0x1.26af02p+1f);
  float e, r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(x * q));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.0f + e));
  return x * r;   // x large and negative: e is inf, r 0, the result a signed zero, as Phi underflows in float64
}

template <int ACT>
__device__ __forceinline__ float activate(float x) {
  if constexpr (ACT == ACT_GELU_TANH) {
    const float sqrt_2_over_pi = 0.7978845608028654f, cubic = 0.044715f;
    return 0.5f * x * (1.0f + tanhf(sqrt_2_over_pi * (x + cubic * x * x * x)));
  } else if constexpr (ACT == ACT_GELU_ERF) {
    return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
  } else if constexpr (ACT == ACT_GELU_ERF_FITTED) {
    return gelu_fitted(x);
  } else if constexpr (ACT == ACT_SILU) {
    return x / (1.0f + expf(-x));   // -x large: expf is inf and the quotient a signed zero, as in float64
  } else {
    return x;
  }
}

// Where the results go and what joins them. `pairs` says whether two
// horizontally adjacent elements may move as one 4-byte access: every row
// start of c and residual, and bias, 4-byte aligned (even leading dimensions,
// aligned pointers). The fragment layouts of all realisations hand each thread
// pairs of adjacent columns starting at an even column, so a pair never
// straddles that alignment.
template <typename T, int ACT, bool BIAS, bool RESIDUAL>
struct Epilogue {
  static constexpr bool HAS_BIAS = BIAS, HAS_RESIDUAL = RESIDUAL;
  T* c;
  long long ldc;
  const T* bias;
  const T* residual;
  long long ldr;
  int m, n;
  bool pairs;

  __device__ __forceinline__ Epilogue(T* c_, int ldc_, const T* bias_, const T* residual_, int ldr_, int m_, int n_)
      : c(c_), ldc(ldc_), bias(bias_), residual(residual_), ldr(ldr_), m(m_), n(n_) {
    unsigned long long addresses = reinterpret_cast<unsigned long long>(c_);
    long long lds = ldc_;
    if constexpr (BIAS) addresses |= reinterpret_cast<unsigned long long>(bias_);
    if constexpr (RESIDUAL) {
      addresses |= reinterpret_cast<unsigned long long>(residual_);
      lds |= ldr_;
    }
    pairs = (addresses & 3) == 0 && (lds & 1) == 0;
  }

  __device__ __forceinline__ float finish(long long row, int col, float acc, float b) const {
    float v = activate<ACT>(acc + b);
    if constexpr (RESIDUAL) v += to_float(residual[row * ldr + col]);
    return v;
  }

  // Whether rows up to `last_row` and columns below `end_col` lie inside C and move as words.
  __device__ __forceinline__ bool words_inside(int last_row, int end_col) const {
    return pairs && last_row < m && end_col <= n;
  }

  // Two adjacent results, finished and rounded into one word: their bias and residual pairs come as
  // words (read where the epilogue has them).
  __device__ __forceinline__ unsigned pair_word(float v0, float v1, unsigned bias_word, unsigned residual_word) const {
    float b0 = 0.0f, b1 = 0.0f;
    if constexpr (BIAS) {
      b0 = half_of(bias_word, 0, T{});
      b1 = half_of(bias_word, 1, T{});
    }
    float y0 = activate<ACT>(v0 + b0), y1 = activate<ACT>(v1 + b1);
    if constexpr (RESIDUAL) {
      y0 += half_of(residual_word, 0, T{});
      y1 += half_of(residual_word, 1, T{});
    }
    return round_pair(y0, y1, T{});
  }

  // Results for (row, col) and (row, col + 1); col is even.
  __device__ __forceinline__ void store2(int row, int col, float v0, float v1) const {
    if (row >= m || col >= n) return;
    const long long r = row;
    if (pairs && col + 1 < n) {
      const unsigned bias_word = BIAS ? *reinterpret_cast<const unsigned*>(bias + col) : 0u;
      const unsigned residual_word = RESIDUAL ? *reinterpret_cast<const unsigned*>(residual + r * ldr + col) : 0u;
      *reinterpret_cast<unsigned*>(c + r * ldc + col) = pair_word(v0, v1, bias_word, residual_word);
      return;
    }
    float b0 = 0.0f;
    if constexpr (BIAS) b0 = to_float(bias[col]);
    c[r * ldc + col] = from_float<T>(finish(r, col, v0, b0));
    if (col + 1 < n) {
      float b1 = 0.0f;
      if constexpr (BIAS) b1 = to_float(bias[col + 1]);
      c[r * ldc + col + 1] = from_float<T>(finish(r, col + 1, v1, b1));
    }
  }
};

// An accumulator fragment of the m16n8 shape that mma.sync and each warp of a
// wgmma produce: for lane l, v[0], v[1] at (row0 + l/4, col0 + 2(l%4) + {0,1})
// and v[2], v[3] eight rows below.
template <typename E>
__device__ __forceinline__ void store_fragment(const E& ep, int row0, int col0, const float* v) {
  const int lane = threadIdx.x % 32;
  const int row = row0 + lane / 4, col = col0 + 2 * (lane % 4);
  ep.store2(row, col, v[0], v[1]);
  ep.store2(row + 8, col, v[2], v[3]);
}

// G fragments side by side, fragment g at columns col0 + 8 g from v + 4 g: as store_fragment each,
// but where all of them lie inside C and move as words, every residual and bias word they need is
// read before any result is stored. In store2's order a residual load waits for the store before it
// (the compiler cannot tell that c and residual differ); here the loads go out together. In place
// (c == residual) it is the same: a thread reads only the words it writes.
template <int G, typename E>
__device__ __forceinline__ void store_fragments(const E& ep, int row0, int col0, const float* v) {
  const int lane = threadIdx.x % 32;
  const int row = row0 + lane / 4, col = col0 + 2 * (lane % 4);
  if (!ep.words_inside(row + 8, col0 + 8 * G)) {
#pragma unroll
    for (int g = 0; g < G; ++g) store_fragment(ep, row0, col0 + 8 * g, v + 4 * g);
    return;
  }
  const long long r = row;
  unsigned bias_words[G] = {}, residual_words[G][2] = {};
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if constexpr (E::HAS_BIAS) bias_words[g] = *reinterpret_cast<const unsigned*>(ep.bias + col + 8 * g);
    if constexpr (E::HAS_RESIDUAL) {
#pragma unroll
      for (int half = 0; half < 2; ++half)
        residual_words[g][half] = *reinterpret_cast<const unsigned*>(ep.residual + (r + 8 * half) * ep.ldr + col + 8 * g);
    }
  }
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int half = 0; half < 2; ++half)
      *reinterpret_cast<unsigned*>(ep.c + (r + 8 * half) * ep.ldc + col + 8 * g) =
          ep.pair_word(v[4 * g + 2 * half], v[4 * g + 2 * half + 1], bias_words[g], residual_words[g][half]);
  }
}

}  // namespace matrix
}  // namespace aicg
