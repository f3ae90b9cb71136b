// Whether the tile unit overlaps the forward's softmax: one strip-block's vector steps (a maxima
// pass and an exp pass over 128 keys x 32 rows, P rounded to bf16 pairs and stored, as in
// fa_amx_forward.hpp's fast steps) and the tile work that a software pipeline would hide under
// them (the previous strip's O^T += V^T.P^T and the next strip's S^T = K.Q^T: 128 TDPBF16PS, 128
// tile loads, 16 C loads, 32 C stores, operands in L1), alone, one after the other, and
// interleaved a few tile operations per iteration of the exp pass. Not part of the build (the
// record behind NOTES.md, third AMX session).
//   g++ -O2 -std=c++20 -mamx-tile -mamx-bf16 -mavx512f -mavx512bf16 -mavx512bw tile_overlap_softmax.cpp -o t && ./t
// Intel Xeon with AMX (family 6 model 167 as its KVM guest reported it), 2026-12-07, one thread,
// ns per strip-block:
//   tile work alone 1573; vector steps alone 788; one after the other 2342;
//   interleaved 2, 3, 4, 6, 10 tile operations per iteration: 2449, 2476, 2562, 2751, 2853;
//   the TDPs only (no tile loads or stores): alone 691, interleaved 1390-1507 (by a table of
//   operations), 1216 straight-line (2 TDPs written into each iteration).
// The TMUL and the vector ports hardly overlap here, unlike tmul_overlap.cpp's FMA-only loop:
// a software pipeline of the strip GEMMs under the softmax cannot pay on this machine.
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cstdio>
#include <cstdint>
#include <chrono>
#include <vector>
#include <algorithm>
struct alignas(64) Cfg { uint8_t palette=1, start=0; uint8_t r[14]={}; uint16_t colsb[16]={}; uint8_t rows[16]={}; };
#define DP(c, a, b) __asm__ volatile("tdpbf16ps %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::: "memory")
#define LD(i, p, s) __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #i ::"r"(p), "r"((int64_t)(s)) : "memory")
#define ST(i, p, s) __asm__ volatile("tilestored %%tmm" #i ", (%0,%1,1)" ::"r"(p), "r"((int64_t)(s)) : "memory")
#define ZR(i) __asm__ volatile("tilezero %%tmm" #i ::: "memory")
alignas(64) uint16_t A[128*128];   // K block
alignas(64) uint16_t B[4*2*512];   // Q^T
alignas(64) float C[128*32];       // st (next)
alignas(64) uint16_t VT[128*128];  // V^T
alignas(64) uint16_t PB[4*2*512];  // P^T (prev)
alignas(64) float ACC[128*32];
alignas(64) float ST0[128*32];     // st (current)
alignas(64) uint16_t PB0[4*2*512]; // P^T (current)
constexpr int64_t lda = 128, aS = lda*2, bS = 64, cS = 32*4;
// tile ops: kind 0 zero,1 load,2 store,3 dot ; reg/regs
struct Op { uint8_t kind, r0, r1, r2; int32_t stride; const void* p; };
std::vector<Op> ops;
void gemmOps(const uint16_t* a, int64_t ldaBytes, const uint16_t* b, float* c, bool acc, int mTiles, int kc) {
  for (int mt = 0; mt < mTiles; mt += 2) {
    float* c0 = c + mt*16*32; float* c1 = c0 + 16*32;
    float* cs[4] = {c0, c0+16, c1, c1+16};
    for (int i = 0; i < 4; ++i) ops.push_back(acc ? Op{1,(uint8_t)i,0,0,(int32_t)cS,cs[i]} : Op{0,(uint8_t)i,0,0,0,nullptr});
    for (int k = 0; k < kc; ++k) {
      const uint16_t* at = a + mt*16*(ldaBytes/2) + k*32; const uint16_t* bt = b + k*1024;
      ops.push_back({1,4,0,0,(int32_t)ldaBytes,at}); ops.push_back({1,5,0,0,(int32_t)ldaBytes,at+16*(ldaBytes/2)});
      ops.push_back({1,6,0,0,64,bt}); ops.push_back({1,7,0,0,64,bt+512});
      ops.push_back({3,0,4,6,0,nullptr}); ops.push_back({3,1,4,7,0,nullptr}); ops.push_back({3,2,5,6,0,nullptr}); ops.push_back({3,3,5,7,0,nullptr});
    }
    for (int i = 0; i < 4; ++i) ops.push_back(Op{2,(uint8_t)i,0,0,(int32_t)cS,cs[i]});
  }
}
static inline __attribute__((always_inline)) void exec(const Op& o) {
  switch (o.kind * 8 + o.r0) {
    case 0: ZR(0); break; case 1: ZR(1); break; case 2: ZR(2); break; case 3: ZR(3); break;
    case 8: LD(0,o.p,o.stride); break; case 9: LD(1,o.p,o.stride); break; case 10: LD(2,o.p,o.stride); break; case 11: LD(3,o.p,o.stride); break;
    case 12: LD(4,o.p,o.stride); break; case 13: LD(5,o.p,o.stride); break; case 14: LD(6,o.p,o.stride); break; case 15: LD(7,o.p,o.stride); break;
    case 16: ST(0,o.p,o.stride); break; case 17: ST(1,o.p,o.stride); break; case 18: ST(2,o.p,o.stride); break; case 19: ST(3,o.p,o.stride); break;
    case 24: if (o.r1 == 4) { if (o.r2 == 6) DP(0,4,6); else DP(0,4,7);} else { if (o.r2==6) DP(0,5,6); else DP(0,5,7);} break;
    case 25: DP(1,4,7); break; case 26: DP(2,5,6); break; case 27: DP(3,5,7); break;
  }
}
static inline __attribute__((always_inline)) __m512 expv(__m512 x) {
  const __m512 c = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
  const __mmask16 live = _mm512_cmp_ps_mask(c, _mm512_set1_ps(-87.3f), _CMP_GT_OQ);
  __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(c, _mm512_set1_ps(1.442695f), _mm512_set1_ps(12582912.0f)), _mm512_set1_ps(12582912.0f));
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693359375f), c));
  __m512 p = _mm512_set1_ps(1.0f/5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f/720)); p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f/120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f/24)); p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f/6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f)); p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(live, p, n);
}
// softmax-like vector pass over ST0 [128 keys][32 rows] -> PB0, with tile ops interleaved every `every` pairs
template <int PER>
__attribute__((noinline)) float softmax(int reps, bool tiles) {
  __m512 tot0 = _mm512_setzero_ps(), tot1 = tot0; const __m512 sc = _mm512_set1_ps(0.088f), ms = _mm512_set1_ps(1.0f);
  size_t nops = ops.size();
  for (int r = 0; r < reps; ++r) {
    size_t o = 0;
    // max pass
    __m512 m0 = _mm512_set1_ps(-1e30f), m1 = m0, m2 = m0, m3 = m0;
    for (int j = 0; j < 128; j += 2) {
      m0 = _mm512_max_ps(m0, _mm512_load_ps(ST0 + j*32)); m1 = _mm512_max_ps(m1, _mm512_load_ps(ST0 + j*32 + 16));
      m2 = _mm512_max_ps(m2, _mm512_load_ps(ST0 + j*32 + 32)); m3 = _mm512_max_ps(m3, _mm512_load_ps(ST0 + j*32 + 48));
      if (tiles && PER != 99) for (int q = 0; q < PER/2 && o < nops; ++q) exec(ops[o++]);
    }
    tot0 = _mm512_add_ps(tot0, _mm512_max_ps(m0, m2)); tot1 = _mm512_add_ps(tot1, _mm512_max_ps(m1,m3));
    for (int j = 0; j < 128; j += 2) {
      for (int g = 0; g < 2; ++g) {
        __m512 e0 = expv(_mm512_sub_ps(_mm512_mul_ps(_mm512_load_ps(ST0 + j*32 + g*16), sc), ms));
        __m512 e1 = expv(_mm512_sub_ps(_mm512_mul_ps(_mm512_load_ps(ST0 + (j+1)*32 + g*16), sc), ms));
        if (g) { tot1 = _mm512_add_ps(tot1, e0); tot1 = _mm512_add_ps(tot1, e1);} else { tot0 = _mm512_add_ps(tot0, e0); tot0 = _mm512_add_ps(tot0, e1);}
        __m512i both = (__m512i)_mm512_cvtne2ps_pbh(e1, e0);
        const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
        _mm512_store_si512(PB0 + (j/32)*1024 + ((j%32)/2)*32 + g*512, _mm512_permutexvar_epi16(order, both));
      }
      if (tiles && PER == 99) { DP(0,4,6); DP(1,5,7); }
      else if (tiles) for (int q = 0; q < PER && o < nops; ++q) exec(ops[o++]);
    }
    if (tiles && PER != 99) while (o < nops) exec(ops[o++]);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(tot0, tot1));
}
__attribute__((noinline)) void tilesOnly(int reps) { for (int r = 0; r < reps; ++r) for (auto& o : ops) exec(o); }
int main() {
  syscall(SYS_arch_prctl, 0x1023, 18);
  Cfg cfg; for (int i=0;i<8;++i){cfg.colsb[i]=64;cfg.rows[i]=16;}
  _tile_loadconfig(&cfg);
  for (auto& x : A) x = 0x3f80; for (auto& x : B) x = 0x3f80; for (auto& x : VT) x = 0x3f80; for (auto& x : PB) x = 0x3f80;
  for (int i = 0; i < 128*32; ++i) ST0[i] = (i % 7) * 0.1f;
  gemmOps(A, 256, B, C, false, 8, 4);      // S^T of next strip
  gemmOps(VT, 256, PB, ACC, true, 8, 4);   // O^T of prev strip
  printf("%zu tile ops\n", ops.size());
  auto time = [&](auto f, const char* name) {
    std::vector<double> ts; 
    for (int r = 0; r < 9; ++r) { auto t0 = std::chrono::steady_clock::now(); f(); auto t1 = std::chrono::steady_clock::now(); ts.push_back(std::chrono::duration<double>(t1-t0).count()); }
    std::sort(ts.begin(), ts.end()); printf("%-34s %.0f ns per strip-block\n", name, ts[4]*1e9/20000);
  };
  const int N = 20000;
  std::vector<Op> all = ops;
  auto filt = [&](auto keep) { ops.clear(); for (auto& o : all) if (keep(o)) ops.push_back(o); };
  filt([](const Op& o){ return o.kind == 3; });
  time([&]{ tilesOnly(N); }, "dots only: tiles");
  time([&]{ softmax<2>(N, true); }, "dots only: interleaved 2");
  time([&]{ softmax<1>(N, true); }, "dots only: interleaved 1");
  time([&]{ softmax<99>(N, true); }, "dots only: straight-line 2/iter");
  filt([](const Op& o){ return o.kind == 3 || o.kind == 1 || o.kind == 0; });
  time([&]{ tilesOnly(N); }, "dots+loads: tiles");
  time([&]{ softmax<3>(N, true); }, "dots+loads: interleaved 3");
  filt([](const Op& o){ return o.kind == 3 || o.kind == 2 || o.kind == 0; });
  time([&]{ tilesOnly(N); }, "dots+stores: tiles");
  time([&]{ softmax<2>(N, true); }, "dots+stores: interleaved 2");
  ops = all;
  time([&]{ tilesOnly(N); }, "tiles only");
  time([&]{ softmax<5>(N, false); }, "vector only");
  time([&]{ softmax<1>(N, false); tilesOnly(N); }, "vector then tiles (sequential)");
  time([&]{ softmax<2>(N, true); }, "interleaved 2/iter");
  time([&]{ softmax<3>(N, true); }, "interleaved 3/iter");
  time([&]{ softmax<4>(N, true); }, "interleaved 4/iter");
  time([&]{ softmax<6>(N, true); }, "interleaved 6/iter");
  time([&]{ softmax<10>(N, true); }, "interleaved 10/iter");
  _tile_release();
}
