// Whether the AMX tile unit and the AVX-512 FMA ports work at the same time: a loop of one
// TDPBF16PS (16 cycles of the TMUL) and 32 independent zmm FMAs (16 cycles on two ports) per
// iteration, against each alone. Not part of the build (the A/B record of NOTES.md).
//   g++ -O2 -std=c++20 -mamx-tile -mamx-bf16 -mavx512f tmul_overlap.cpp -o tmul_overlap && ./tmul_overlap
// Intel Xeon with AMX (family 6 model 167 as its KVM guest reported it), 2026-12-07:
//   1 dot/iter                               1.103 ms
//   16 fma/iter                              0.479 ms
//   1 dot + 16 fma/iter                      1.055 ms
//   32 fma/iter                              0.977 ms
//   1 dot + 32 fma/iter                      1.071 ms
//   1 load+dot + 32 fma/iter                 1.060 ms
//   2 load+dot + 32 fma/iter                 2.157 ms
// The TDPs and the FMAs overlap fully (operands in L1).
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <chrono>
#include <vector>
#include <algorithm>
struct alignas(64) Cfg { uint8_t palette=1, start=0; uint8_t r[14]={}; uint16_t colsb[16]={}; uint8_t rows[16]={}; };
#define DP(c, a, b) __asm__ volatile("tdpbf16ps %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)
#define LD(i, p, s) __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #i ::"r"(p), "r"((int64_t)(s)) : "memory")
alignas(64) uint16_t buf[64*1024];
template <int DOTS, int FMAS, bool LOADS>
__attribute__((noinline)) float run(int iters) {
  __m512 a0 = _mm512_set1_ps(1.0f), a1 = a0, a2 = a0, a3 = a0, a4=a0, a5=a0, a6=a0, a7=a0;
  const __m512 m = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(0.001f);
  for (int i = 0; i < iters; ++i) {
    if (DOTS >= 1) { if (LOADS) LD(4, buf + (i%8)*512, 64); DP(0,4,6); }
    for (int k = 0; k < FMAS; ++k) { a0 = _mm512_fmadd_ps(a0, m, c); a1 = _mm512_fmadd_ps(a1, m, c); a2 = _mm512_fmadd_ps(a2, m, c); a3 = _mm512_fmadd_ps(a3, m, c); a4 = _mm512_fmadd_ps(a4, m, c); a5 = _mm512_fmadd_ps(a5, m, c); a6 = _mm512_fmadd_ps(a6, m, c); a7 = _mm512_fmadd_ps(a7, m, c);}
    if (DOTS >= 2) { if (LOADS) LD(5, buf + (i%8)*512+4096, 64); DP(1,5,7); }
  }
  __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0,a1),_mm512_add_ps(a2,a3)),_mm512_add_ps(_mm512_add_ps(a4,a5),_mm512_add_ps(a6,a7)));
  return _mm512_reduce_add_ps(s);
}
int main() {
  syscall(SYS_arch_prctl, 0x1023, 18);
  Cfg cfg; for (int i=0;i<8;++i){cfg.colsb[i]=64;cfg.rows[i]=16;}
  _tile_loadconfig(&cfg);
  auto time = [&](auto f, const char* name) {
    std::vector<double> ts; float sink = 0;
    for (int r = 0; r < 7; ++r) { auto t0 = std::chrono::steady_clock::now(); sink += f(); auto t1 = std::chrono::steady_clock::now(); ts.push_back(std::chrono::duration<double>(t1-t0).count()); }
    std::sort(ts.begin(), ts.end()); printf("%-40s %.3f ms (%g)\n", name, ts[3]*1e3, sink);
  };
  const int N = 200000;
  time([&]{ return run<1,0,false>(N); }, "1 dot/iter");
  time([&]{ return run<0,2,false>(N); }, "16 fma/iter");
  time([&]{ return run<1,2,false>(N); }, "1 dot + 16 fma/iter");
  time([&]{ return run<0,4,false>(N); }, "32 fma/iter");
  time([&]{ return run<1,4,false>(N); }, "1 dot + 32 fma/iter");
  time([&]{ return run<1,4,true>(N); }, "1 load+dot + 32 fma/iter");
  time([&]{ return run<2,4,true>(N); }, "2 load+dot + 32 fma/iter");
  _tile_release();
}
