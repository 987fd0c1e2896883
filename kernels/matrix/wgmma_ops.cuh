// The wgmma.mma_async instruction, both operands from shared memory, for the
// tile widths the matrix family uses: m64nNk16 with N in {32, 48, 64, 96, 128, 192, 256},
// bf16 or fp16 operands, fp32 accumulators. A thread holds N/2 accumulators
// (the warpgroup's 64 x N tile over 128 threads); for lane l of warp w of the
// warpgroup, d[i] is the element at
//   row 16 w + l / 4 + 8 ((i / 2) % 2),  column 8 (i / 4) + 2 (l % 4) + i % 2,
// that is, N/8 fragments of the m16n8 shape (kernels/matrix/epilogue.cuh).
//
// scale_d = 0 makes the instruction write d = A B instead of d += A B (the
// first k-step of a tile), so the accumulators need no clearing. TRANS_A and
// TRANS_B are the ISA's imm-trans-a / imm-trans-b: 0 for a K-major operand,
// 1 for an MN-major one (allowed for 16-bit types only).
//
// Inline PTX needs its operands spelled out one by one; the lists below are
// the placeholders %0.. and the bindings of d[0].. for 8 to 128 accumulators, eight at a time.
#pragma once
#include "aicg_types.cuh"

#define AICG_WGMMA_PLACES_8 \
    "%0, %1, %2, %3, %4, %5, %6, %7"
#define AICG_WGMMA_PLACES_16 AICG_WGMMA_PLACES_8 ", " \
    "%8, %9, %10, %11, %12, %13, %14, %15"
#define AICG_WGMMA_PLACES_24 AICG_WGMMA_PLACES_16 ", " \
    "%16, %17, %18, %19, %20, %21, %22, %23"
#define AICG_WGMMA_PLACES_32 AICG_WGMMA_PLACES_24 ", " \
    "%24, %25, %26, %27, %28, %29, %30, %31"
#define AICG_WGMMA_PLACES_40 AICG_WGMMA_PLACES_32 ", " \
    "%32, %33, %34, %35, %36, %37, %38, %39"
#define AICG_WGMMA_PLACES_48 AICG_WGMMA_PLACES_40 ", " \
    "%40, %41, %42, %43, %44, %45, %46, %47"
#define AICG_WGMMA_PLACES_56 AICG_WGMMA_PLACES_48 ", " \
    "%48, %49, %50, %51, %52, %53, %54, %55"
#define AICG_WGMMA_PLACES_64 AICG_WGMMA_PLACES_56 ", " \
    "%56, %57, %58, %59, %60, %61, %62, %63"
#define AICG_WGMMA_PLACES_72 AICG_WGMMA_PLACES_64 ", " \
    "%64, %65, %66, %67, %68, %69, %70, %71"
#define AICG_WGMMA_PLACES_80 AICG_WGMMA_PLACES_72 ", " \
    "%72, %73, %74, %75, %76, %77, %78, %79"
#define AICG_WGMMA_PLACES_88 AICG_WGMMA_PLACES_80 ", " \
    "%80, %81, %82, %83, %84, %85, %86, %87"
#define AICG_WGMMA_PLACES_96 AICG_WGMMA_PLACES_88 ", " \
    "%88, %89, %90, %91, %92, %93, %94, %95"
#define AICG_WGMMA_PLACES_104 AICG_WGMMA_PLACES_96 ", " \
    "%96, %97, %98, %99, %100, %101, %102, %103"
#define AICG_WGMMA_PLACES_112 AICG_WGMMA_PLACES_104 ", " \
    "%104, %105, %106, %107, %108, %109, %110, %111"
#define AICG_WGMMA_PLACES_120 AICG_WGMMA_PLACES_112 ", " \
    "%112, %113, %114, %115, %116, %117, %118, %119"
#define AICG_WGMMA_PLACES_128 AICG_WGMMA_PLACES_120 ", " \
    "%120, %121, %122, %123, %124, %125, %126, %127"
#define AICG_WGMMA_OPERANDS_8(d) \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
#define AICG_WGMMA_OPERANDS_16(d) AICG_WGMMA_OPERANDS_8(d), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define AICG_WGMMA_OPERANDS_24(d) AICG_WGMMA_OPERANDS_16(d), \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
#define AICG_WGMMA_OPERANDS_32(d) AICG_WGMMA_OPERANDS_24(d), \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define AICG_WGMMA_OPERANDS_40(d) AICG_WGMMA_OPERANDS_32(d), \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39])
#define AICG_WGMMA_OPERANDS_48(d) AICG_WGMMA_OPERANDS_40(d), \
    "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
#define AICG_WGMMA_OPERANDS_56(d) AICG_WGMMA_OPERANDS_48(d), \
    "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55])
#define AICG_WGMMA_OPERANDS_64(d) AICG_WGMMA_OPERANDS_56(d), \
    "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define AICG_WGMMA_OPERANDS_72(d) AICG_WGMMA_OPERANDS_64(d), \
    "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71])
#define AICG_WGMMA_OPERANDS_80(d) AICG_WGMMA_OPERANDS_72(d), \
    "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79])
#define AICG_WGMMA_OPERANDS_88(d) AICG_WGMMA_OPERANDS_80(d), \
    "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87])
#define AICG_WGMMA_OPERANDS_96(d) AICG_WGMMA_OPERANDS_88(d), \
    "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
#define AICG_WGMMA_OPERANDS_104(d) AICG_WGMMA_OPERANDS_96(d), \
    "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103])
#define AICG_WGMMA_OPERANDS_112(d) AICG_WGMMA_OPERANDS_104(d), \
    "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111])
#define AICG_WGMMA_OPERANDS_120(d) AICG_WGMMA_OPERANDS_112(d), \
    "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119])
#define AICG_WGMMA_OPERANDS_128(d) AICG_WGMMA_OPERANDS_120(d), \
    "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])

namespace aicg {
namespace matrix {

template <int N, typename T, int TRANS_A, int TRANS_B> struct Wgmma;

// ACC: accumulators per thread (N / 2); the descriptors and flags follow them
// as operands ACC .. ACC + 4.
#define AICG_WGMMA_ASM(SHAPE, TYPE, PLACES, A, B, S, TA, TB)                                        \
  "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %" S ", 0;\n"                                \
  "wgmma.mma_async.sync.aligned." SHAPE ".f32." TYPE "." TYPE " {" PLACES "}, %" A ", %" B         \
  ", accumulate, 1, 1, %" TA ", %" TB ";\n}"

#define AICG_WGMMA_DEFINE(N, ACC, A, B, S, TA, TB)                                                   \
  template <int TRANS_A, int TRANS_B>                                                                \
  struct Wgmma<N, bf16, TRANS_A, TRANS_B> {                                                          \
    static __device__ __forceinline__ void mma(float* d, unsigned long long a, unsigned long long b,   \
                                               int scale_d) {                                          \
      asm volatile(AICG_WGMMA_ASM("m64n" #N "k16", "bf16", AICG_WGMMA_PLACES_##ACC, A, B, S, TA, TB)   \
                   : AICG_WGMMA_OPERANDS_##ACC(d)                                                      \
                   : "l"(a), "l"(b), "r"(scale_d), "n"(TRANS_A), "n"(TRANS_B));                        \
    }                                                                                                  \
  };                                                                                                   \
  template <int TRANS_A, int TRANS_B>                                                                \
  struct Wgmma<N, f16, TRANS_A, TRANS_B> {                                                           \
    static __device__ __forceinline__ void mma(float* d, unsigned long long a, unsigned long long b,   \
                                               int scale_d) {                                          \
      asm volatile(AICG_WGMMA_ASM("m64n" #N "k16", "f16", AICG_WGMMA_PLACES_##ACC, A, B, S, TA, TB)    \
                   : AICG_WGMMA_OPERANDS_##ACC(d)                                                      \
                   : "l"(a), "l"(b), "r"(scale_d), "n"(TRANS_A), "n"(TRANS_B));                        \
    }                                                                                                  \
  };

AICG_WGMMA_DEFINE(32, 16, "16", "17", "18", "19", "20")
AICG_WGMMA_DEFINE(48, 24, "24", "25", "26", "27", "28")
AICG_WGMMA_DEFINE(64, 32, "32", "33", "34", "35", "36")
AICG_WGMMA_DEFINE(96, 48, "48", "49", "50", "51", "52")
AICG_WGMMA_DEFINE(128, 64, "64", "65", "66", "67", "68")
AICG_WGMMA_DEFINE(192, 96, "96", "97", "98", "99", "100")
AICG_WGMMA_DEFINE(256, 128, "128", "129", "130", "131", "132")

#undef AICG_WGMMA_DEFINE
#undef AICG_WGMMA_ASM

// Tells the compiler every accumulator may have changed here: placed after a
// wgmma wait, it keeps reads of d from moving above the wait.
template <int ACC>
__device__ __forceinline__ void touch_accumulators(float* d) {
#pragma unroll
  for (int i = 0; i < ACC; ++i) asm volatile("" : "+f"(d[i]) : : "memory");
}

}  // namespace matrix
}  // namespace aicg
