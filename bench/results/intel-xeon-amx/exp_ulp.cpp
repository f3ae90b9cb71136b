// The error of the AMX kernels' exp (cpu/amx/lanes.hpp expLanes, fused multiply-adds) and of
// cpu::fastExp against std::exp in double, over about 6e7 arguments in [-87, 88] with normal
// results. g++ -O2 -std=c++20 -ffp-contract=off -Wno-psabi -Isrc bench/results/intel-xeon-amx/exp_ulp.cpp
#pragma GCC diagnostic ignored "-Wpsabi"
#include <cmath>
#include <cstdio>
#include <cstring>
#include "cpu/amx/lanes.hpp"
#include "cpu/generic/fast_exp.hpp"
using namespace attnops::cpu::amx;
static double ulpErr(float got, double want) {
    float w = float(want); int32_t a, b; std::memcpy(&a, &got, 4); std::memcpy(&b, &w, 4);
    double ulp = std::nextafter(w, INFINITY) - w; return std::fabs(got - want) / ulp;
}
int main() {
    double worst = 0, worstFast = 0; float at = 0; long count = 0;
    for (float x = -87.0f; x < 88.0f; x = std::nextafter(x, 100.0f) + (std::fabs(x) > 1e-3f ? std::fabs(x) * 3e-7f : 1e-7f)) {
        F16x v = splat(x); F16x e = expLanes(v);
        const double want = std::exp(double(x));
        if (want < 1.2e-38) continue;  // normal results only
        ++count;
        double u = ulpErr(e[0], want); if (u > worst) { worst = u; at = x; }
        worstFast = std::max(worstFast, ulpErr(attnops::cpu::fastExp(x), want));
    }
    std::printf("expLanes (fma): max %.2f ulp (at x=%g); cpu::fastExp: max %.2f ulp, over %ld arguments in [-87, 88] with normal results\n", worst, at, worstFast, count);
}
