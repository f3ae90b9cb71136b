// Uses the installed headers and library: one causal forward through the C++ layer, and one
// library error caught as attnops::Error (this once crashed with the static library, whose
// internal error class had the same name).
#include <attnops/attnops.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

int main() {
    const std::vector<int64_t> shape{1, 2, 8, 4};  // BNSD
    std::vector<float> q(64, 0.25f), k(64, 0.5f), v(64, 1.0f), out(64, -1.0f);
    attnops::Tensor tq(q.data(), ATTNOPS_FLOAT32, shape), tk(k.data(), ATTNOPS_FLOAT32, shape),
        tv(v.data(), ATTNOPS_FLOAT32, shape), to(out.data(), ATTNOPS_FLOAT32, shape);
    attnops::FlashAttentionScoreArgs a;
    a.query = &tq;
    a.key = &tk;
    a.value = &tv;
    a.attentionOut = &to;
    a.headNum = 2;
    a.sparseMode = 2;
    std::vector<uint8_t> causal(2048 * 2048, 0);  // the compressed mask of mode 2 (only its shape is read)
    attnops::Tensor tm(causal.data(), ATTNOPS_UINT8, {2048, 2048});
    a.attenMask = &tm;
    attnops::flashAttentionScore(a);
    for (float x : out)
        if (std::fabs(x - 1.0f) > 1e-6f) return 1;  // every row averages values of 1
    try {
        attnops::flashAttentionScore(attnops::FlashAttentionScoreArgs{});  // no query: an error
        return 2;
    } catch (const attnops::Error& e) {
        if (std::string(e.what()).find("query") == std::string::npos) return 3;
    }
    std::printf("attnops %s: ok\n", attnopsVersion());
    return 0;
}
