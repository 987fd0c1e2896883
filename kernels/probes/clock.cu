// Effective SM clock: each block spins until its SM's cycle counter has
// advanced `cycles`; device events time the launch. The last count is
// written out so the loop stays.
extern "C" __global__ void spin(long long cycles, long long* sink) {
    long long start = clock64(), now = start;
    while (now - start < cycles) now = clock64();
    if (threadIdx.x == 0) sink[blockIdx.x] = now - start;
}
