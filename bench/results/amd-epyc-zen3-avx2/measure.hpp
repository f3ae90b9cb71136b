// Shared by the standalone measurement programs of this folder (each builds alone against the
// library; see its header for the command): the in-process FMA peak loop and the clocks.
#pragma once

#include <immintrin.h>

#include <ctime>

// n iterations of 12 independent chains of AVX2 FMAs (8 lanes each): 192 n FLOP at the FMA
// pipes' rate, the reference the programs' "% of peak" divide by. Returns a value that depends on
// every chain, so that nothing is optimised away.
__attribute__((target("avx2,fma"), noinline)) inline float peak(long n) {
    __m256 a[12];
    for (int i = 0; i < 12; ++i) a[i] = _mm256_set1_ps(float(i));
    const __m256 b = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(1e-3f);
    for (long k = 0; k < n; ++k) {
#pragma GCC unroll 12
        for (int i = 0; i < 12; ++i) a[i] = _mm256_fmadd_ps(a[i], b, c);
        __asm__ volatile("" ::"x"(a[0]), "x"(a[1]), "x"(a[2]), "x"(a[3]), "x"(a[4]), "x"(a[5]), "x"(a[6]), "x"(a[7]),
                         "x"(a[8]), "x"(a[9]), "x"(a[10]), "x"(a[11]));
    }
    float s = 0, t[8];
    for (int i = 0; i < 12; ++i) {
        _mm256_storeu_ps(t, a[i]);
        s += t[0];
    }
    return s;
}

// Process CPU time (every thread) and wall time, in seconds.
inline double cpuNow() {
    timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}
inline double wallNow() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}
