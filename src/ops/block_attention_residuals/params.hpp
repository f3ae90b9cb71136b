// BlockAttentionResiduals parameters: the only thing its kernels see. Every tensor is a strided
// view indexed by (token, source, hidden); sources 0..N-1 are blockRes rows, source N the partial
// block (spec section 1.1).
#pragma once

#include <cstdint>

#include "core/dtype.hpp"

namespace attnops::bar {

// Element (t, i, h) at data + t*stride[0] + i*stride[1] + h*stride[2] (elements).
struct View3 {
    const void* data = nullptr;
    DType dtype = DType::F32;
    int64_t stride[3] = {0, 0, 0};
    float load(int64_t t, int64_t i, int64_t h) const {
        return loadAsFloat(data, t * stride[0] + i * stride[1] + h * stride[2], dtype);
    }
};

struct MutView3 {
    void* data = nullptr;
    DType dtype = DType::F32;
    int64_t stride[3] = {0, 0, 0};
    void store(int64_t t, int64_t i, int64_t h, float v) const {
        storeFromFloat(data, t * stride[0] + i * stride[1] + h * stride[2], dtype, v);
    }
    float load(int64_t t, int64_t i, int64_t h) const {
        return loadAsFloat(data, t * stride[0] + i * stride[1] + h * stride[2], dtype);
    }
};

struct Sources {
    int64_t tokens = 0;   // T
    int64_t blocks = 0;   // N (completed blocks); N + 1 sources with the partial block
    int64_t hidden = 0;   // H
    View3 blockRes;       // (t, i < N, h)
    View3 partial;        // (t, -, h)
    View3 projWeight;     // (-, -, h): w
    View3 normWeight;     // (-, -, h): g

    float source(int64_t t, int64_t i, int64_t h) const {
        return i < blocks ? blockRes.load(t, i, h) : partial.load(t, 0, h);
    }
};

struct ForwardParams {
    Sources src;
    float eps = 1e-6f;
    MutView3 hidden;             // (t, -, h), main dtype
    bool saveStats = false;      // needBackward
    MutView3 invNorm, probs;     // fp32 (t, i, -), [T, N+1]
};

struct BackwardParams {
    Sources src;
    View3 gradHidden;            // (t, -, h)
    View3 invNorm, probs;        // fp32 (t, i, -), saved by the forward
    MutView3 gradPartial;        // (t, -, h)
    MutView3 gradBlockRes;       // (t, i < N, h)
    MutView3 gradProjWeight;     // (-, -, h)
    MutView3 gradNormWeight;     // (-, -, h)
};

}  // namespace attnops::bar
