// libFuzzer target over the BlockAttentionResiduals forward and grad two-phase APIs: shapes
// (T, N, H, including 0), strides, dtypes, projWeight [H]/[1,H], validBlockNum, normEps, needBackward,
// NULL arguments and buffers sized exactly to their views. Accepted problems are executed.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <vector>

#include "attnops/attnops.h"
#include "fuzz_input.hpp"

namespace {

using attnops::fuzz::Bytes;
using attnops::fuzz::execute;
using attnops::fuzz::FuzzTensor;

const attnopsDataType kTypes[] = {ATTNOPS_FLOAT32, ATTNOPS_FLOAT16, ATTNOPS_BFLOAT16, ATTNOPS_UINT8};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    attnops::fuzz::launchBlockingOnce();
    Bytes in(data, size);
    const attnopsDataType dtype = kTypes[in.small(0, 3)];
    const attnopsDataType other = in.small(0, 7) == 0 ? kTypes[in.small(0, 3)] : dtype;
    const int64_t t = in.small(0, 12), n = in.small(0, 5), h = in.small(0, 40);
    const auto pick = [&](int64_t v) { return in.small(0, 15) == 0 ? v + 1 : v; };  // occasionally wrong
    FuzzTensor pb, br, pw, nw, hidden, inv, probs, gh, gpb, gbr, gpw, gnw;
    pb.make(in, dtype, {t, h});
    br.make(in, other, {pick(t), n, pick(h)});
    pw.make(in, dtype, in.flag() ? std::vector<int64_t>{pick(h)} : std::vector<int64_t>{1, h});
    nw.make(in, dtype, {pick(h)});
    hidden.make(in, dtype, {t, pick(h)});
    const bool needBackward = in.flag();
    if (in.small(0, 7) != 0) inv.make(in, in.small(0, 7) == 0 ? dtype : ATTNOPS_FLOAT32, {t, pick(n + 1)});
    if (in.small(0, 7) != 0) probs.make(in, ATTNOPS_FLOAT32, {t, n + 1});
    const double eps[] = {1e-6, 0.0, -1.0, std::numeric_limits<double>::quiet_NaN(), 1e-50, 0.3};
    const int64_t valid[] = {-1, 0, n, n + 1, std::numeric_limits<int64_t>::min()};
    uint64_t ws = 0;
    attnopsExecutor* exec = nullptr;
    attnopsStatus st = attnopsBlockAttentionResidualsGetWorkspaceSize(
        in.small(0, 15) == 0 ? nullptr : pb.handle, br.handle, pw.handle, nw.handle, valid[in.small(0, 4)],
        eps[in.small(0, 5)], needBackward, hidden.handle, inv.handle, probs.handle, &ws, &exec);
    execute(st, ws, exec, attnopsBlockAttentionResiduals);

    gh.make(in, dtype, {t, pick(h)});
    gpb.make(in, dtype, {t, h});
    gbr.make(in, dtype, {t, n, pick(h)});
    gpw.make(in, dtype, in.flag() ? std::vector<int64_t>{h} : std::vector<int64_t>{1, h});
    gnw.make(in, dtype, {h});
    ws = 0;
    exec = nullptr;
    st = attnopsBlockAttentionResidualsGradGetWorkspaceSize(pb.handle, br.handle, pw.handle, nw.handle, gh.handle,
                                                            inv.handle, probs.handle, valid[in.small(0, 4)],
                                                            gpb.handle, gbr.handle, gpw.handle, gnw.handle, &ws, &exec);
    execute(st, ws, exec, attnopsBlockAttentionResidualsGrad);
    return 0;
}
