// The inputLayout strings of the inference family (spec 4): a base layout for query, key and
// value, and the layout of attentionOut, which the output-transposing forms (X_Y) change. Each
// operand becomes a strided (b, n, row, d) view, so kernels never see the layout.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/handles.hpp"
#include "ops/flash_attention_score/layout.hpp"

namespace attnops::fia {

// Operand forms: the fa layouts plus NTD (heads outer, packed rows) and NBSD (attentionOut only).
enum class Form { BSH, BSND, BNSD, TND, NTD, NBSD };

struct LayoutPair {
    const char* name = "BSH";
    Form in = Form::BSH, out = Form::BSH;
};

// The accepted inputLayout strings, in the order messages list them.
inline const std::vector<LayoutPair>& layoutPairs() {
    static const std::vector<LayoutPair> all = {
        {"BSH", Form::BSH, Form::BSH},          {"BSND", Form::BSND, Form::BSND},       {"BNSD", Form::BNSD, Form::BNSD},
        {"TND", Form::TND, Form::TND},          {"NTD", Form::NTD, Form::NTD},          {"BNSD_BSND", Form::BNSD, Form::BSND},
        {"BSH_BNSD", Form::BSH, Form::BNSD},    {"BSND_BNSD", Form::BSND, Form::BNSD},  {"BSH_NBSD", Form::BSH, Form::NBSD},
        {"BSND_NBSD", Form::BSND, Form::NBSD},  {"BNSD_NBSD", Form::BNSD, Form::NBSD},  {"NTD_TND", Form::NTD, Form::TND},
        {"TND_NTD", Form::TND, Form::NTD}};
    return all;
}

// Packed variable-length rows (cumulative lengths, no batch axis).
inline bool isPacked(Form f) { return f == Form::TND || f == Form::NTD; }

inline fa::Axes axesOf(Form f) {
    switch (f) {
        case Form::BSH: return fa::axesOf(fa::Layout::BSH);
        case Form::BSND: return fa::axesOf(fa::Layout::BSND);
        case Form::BNSD: return fa::axesOf(fa::Layout::BNSD);
        case Form::TND: return fa::axesOf(fa::Layout::TND);
        case Form::NTD: return {-1, 0, 1, 2, -1};
        case Form::NBSD: return {1, 0, 2, 3, -1};
    }
    return {};
}

inline int rankOf(Form f) { return f == Form::BSND || f == Form::BNSD || f == Form::NBSD ? 4 : 3; }

// The FlashAttentionScore layout of the same axis order where one exists (Params::layout).
inline fa::Layout baseLayout(Form f) {
    switch (f) {
        case Form::BSH: return fa::Layout::BSH;
        case Form::BSND: return fa::Layout::BSND;
        case Form::BNSD:
        case Form::NBSD: return fa::Layout::BNSD;
        case Form::TND:
        case Form::NTD: return fa::Layout::TND;
    }
    return fa::Layout::BSH;
}

// Strided view with logical axes (b, n, row, d); packed forms have batch stride 0.
template <typename View>
View viewOf(const attnopsTensor& t, Form f, int64_t headDim) {
    return fa::viewOf<View>(t, axesOf(f), headDim);
}

// Shape of an operand of form f (packed forms: s is the row count T).
inline std::vector<int64_t> expectedShape(Form f, int64_t b, int64_t s, int64_t n, int64_t d) {
    switch (f) {
        case Form::BSH: return {b, s, n * d};
        case Form::BSND: return {b, s, n, d};
        case Form::BNSD: return {b, n, s, d};
        case Form::TND: return {s, n, d};
        case Form::NTD: return {n, s, d};
        case Form::NBSD: return {n, b, s, d};
    }
    return {};
}

}  // namespace attnops::fia
