// Operand layouts of the attention operators (FlashAttentionScore spec 2.3; the inference
// family's BSH/BSND/BNSD/TND are the same): axis positions, strided views over logical
// (batch, head, row, dim) axes, and the shape a layout gives.
#pragma once

#include <cstdint>
#include <vector>

#include "core/handles.hpp"
#include "ops/flash_attention_score/params.hpp"

namespace attnops::fa {

// Layout decoding (spec 2.3). Axis positions of (batch, heads, seq, dim) in the tensor.
struct Axes {
    int b = -1, n = -1, s = -1, d = -1;  // -1: absent (BSH/SBH fold n and d into h, TND has no b)
    int h = -1;
};

inline Axes axesOf(Layout layout) {
    switch (layout) {
        case Layout::BSH: return {0, -1, 1, -1, 2};
        case Layout::SBH: return {1, -1, 0, -1, 2};
        case Layout::BSND: return {0, 2, 1, 3, -1};
        case Layout::BNSD: return {0, 1, 2, 3, -1};
        case Layout::TND: return {-1, 1, 0, 2, -1};
    }
    return {};
}

inline int rankOf(Layout layout) { return layout == Layout::BSND || layout == Layout::BNSD ? 4 : 3; }

// Strided view with logical axes (b, n, s, d) over an operand whose axes sit at `a`, with head
// dim `headDim` (absent axes get stride 0; the inference family's forms use this directly).
template <typename View>
View viewOf(const attnopsTensor& t, const Axes& a, int64_t headDim) {
    View v;
    v.data = t.data;
    v.dtype = t.dtype;
    v.stride[0] = a.b >= 0 ? t.strides[a.b] : 0;
    v.stride[2] = t.strides[a.s];
    if (a.h >= 0) {  // h = n * d: head n starts at column n * d
        v.stride[1] = headDim * t.strides[a.h];
        v.stride[3] = t.strides[a.h];
    } else {
        v.stride[1] = t.strides[a.n];
        v.stride[3] = t.strides[a.d];
    }
    return v;
}

// The same over an operand of `layout`.
template <typename View>
View viewOf(const attnopsTensor& t, Layout layout, int64_t headDim) {
    return viewOf<View>(t, axesOf(layout), headDim);
}

inline std::vector<int64_t> expectedShape(Layout layout, int64_t b, int64_t s, int64_t n, int64_t d) {
    switch (layout) {
        case Layout::BSH: return {b, s, n * d};
        case Layout::SBH: return {s, b, n * d};
        case Layout::BSND: return {b, s, n, d};
        case Layout::BNSD: return {b, n, s, d};
        case Layout::TND: return {s, n, d};
    }
    return {};
}

}  // namespace attnops::fa
