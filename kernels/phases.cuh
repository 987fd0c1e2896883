// Where a row's time goes (tests/bench/phases.py): a kernel compiled with AICG_PHASES defined has
// block 0's first and last threads read clock64() at the kernel's start and at each mark below:
// a row set up (its loads issued, for a held row), each sweep, each reduction, the write. Without
// the definition a mark is nothing, so every other build compiles to the code it always did.
#pragma once

#ifdef AICG_PHASES
// [thread: 0 first, 1 last][mark]: the clock, and what the mark ends (aicg::Phase)
__device__ long long aicg_phase_clocks[2][AICG_PHASES];
__device__ int aicg_phase_kinds[2][AICG_PHASES];
#endif

namespace aicg {

enum Phase { PHASE_START = 0, PHASE_SET_UP = 1, PHASE_SWEEP = 2, PHASE_REDUCTION = 3, PHASE_WRITE = 4 };

__device__ __forceinline__ void phase_mark(Phase kind) {
#ifdef AICG_PHASES
  const int who = threadIdx.x == 0 ? 0 : threadIdx.x == blockDim.x - 1 ? 1 : -1;
  if (blockIdx.x != 0 || who < 0) return;
  __shared__ int marks[2];
  const long long now = clock64();
  if (kind == PHASE_START) marks[who] = 0;
  const int k = marks[who]++;
  if (k < AICG_PHASES) aicg_phase_clocks[who][k] = now, aicg_phase_kinds[who][k] = kind;
#endif
}

}  // namespace aicg
