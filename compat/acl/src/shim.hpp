// Internals of the aclnn compatibility library: the objects behind the aclnn handles, error
// recording, and the conversions onto attnops' public C API (the only attnops code used here).
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "acl/acl.h"
#include "aclnn/aclnn_base.h"
#include "attnops/attnops.hpp"

// A strided view of caller memory, as aclCreateTensor described it.
struct aclTensor {
    std::vector<int64_t> viewDims;
    std::vector<int64_t> strides;  // elements, one per view dim (filled in when NULL was given)
    std::vector<int64_t> storageDims;
    int64_t offset = 0;            // elements from tensorData to the view's first element
    aclDataType dataType = ACL_FLOAT;
    aclFormat format = ACL_FORMAT_ND;
    void* data = nullptr;
};

struct aclIntArray {
    std::vector<int64_t> values;
};

struct aclTensorList {
    std::vector<const aclTensor*> tensors;  // owned
};

namespace attnops::acl {

// The kinds of object the library hands out; a pointer is accepted only as the kind it was
// created as and only while it lives, so stale or foreign pointers are errors, not crashes.
enum class Kind { Tensor, IntArray, TensorList, Context };
void registerObject(const void* p, Kind kind);
bool unregisterObject(const void* p, Kind kind);
bool isLive(const void* p, Kind kind);

// A rule the library itself found broken: the upstream return code and the message.
struct Failure {
    int code;
    std::string message;
};

template <typename... Args>
[[noreturn]] void fail(int code, fmt::format_string<Args...> format, Args&&... args) {
    throw Failure{code, fmt::format(format, std::forward<Args>(args)...)};
}

// Appends a message for aclGetRecentErrMsg (calling thread).
void recordError(std::string message);

aclnnStatus toAclnnStatus(attnopsStatus status);
aclError toAclError(attnopsStatus status);

// Runs `body` for the public function `api`; a Failure or an attnops::Error becomes the
// return code (mapped by `map`) and a message "api: ..." for aclGetRecentErrMsg.
template <typename Body, typename Map>
int guarded(const char* api, Map map, Body&& body) {
    try {
        body();
        return 0;
    } catch (const Failure& f) {
        recordError(fmt::format("{}: {}", api, f.message));
        return f.code;
    } catch (const attnops::Error& e) {
        recordError(fmt::format("{}: {}", api, e.what()));
        return map(e.status());
    } catch (const std::bad_alloc&) {
        recordError(fmt::format("{}: out of memory", api));
        return map(ATTNOPS_ERROR_OUT_OF_MEMORY);
    } catch (const std::exception& e) {
        recordError(fmt::format("{}: internal error: {}", api, e.what()));
        return map(ATTNOPS_ERROR_INTERNAL);
    }
}

template <typename Body>
aclnnStatus guardedOp(const char* api, Body&& body) {
    return guarded(api, toAclnnStatus, std::forward<Body>(body));
}

template <typename Body>
aclError guardedRt(const char* api, Body&& body) {
    return guarded(api, toAclError, std::forward<Body>(body));
}

// How the statistics of a TND problem are stored: in the declared [T,N,8] order, or in N,T
// order ("same_as_input" of softmaxOutLayout / softmaxInLayout).
enum class StatsOrder { Declared, HeadMajor };
StatsOrder statsOrder(const char* layout, const char* argument);

// attnops views of aclnn objects (an empty handle for NULL). `name` is the argument's name in
// the messages.
attnops::Tensor view(const aclTensor* tensor, const char* name);
attnops::Tensor statsView(const aclTensor* tensor, const char* name, StatsOrder order);
attnops::IntArray view(const aclIntArray* array, const char* name);

// Rules of arguments attnops has no counterpart for.
void requireAbsent(const aclTensor* tensor, const char* name, const char* why);
void requireAbsentOrEmpty(const aclTensor* tensor, const char* name, const char* why);

// The inputs of the newest versions attnops has no counterpart for: rope parts and fp8
// dequantisation scales (each must be NULL), and outDtype (0 or 1; outputs keep the inputs' dtype).
using NamedTensors = std::initializer_list<std::pair<const aclTensor*, const char*>>;
void requireNoRopeOrQuant(NamedTensors rope, NamedTensors scales, int64_t outDtype);
// Which inputLayout values a version takes: BSH/SBH/BSND/BNSD (V1-V3), TND (VarLen/Unpadding) or
// any (V4).
enum class Layouts { Fixed, Tnd, Any };
void requireLayout(const char* inputLayout, Layouts layouts);

// The executor and stream handles are attnops' own.
inline attnopsExecutor* toAttnops(aclOpExecutor* executor) { return reinterpret_cast<attnopsExecutor*>(executor); }
inline aclOpExecutor* toAclnn(attnopsExecutor* executor) { return reinterpret_cast<aclOpExecutor*>(executor); }
inline attnopsStream* toAttnops(aclrtStream stream) { return static_cast<attnopsStream*>(stream); }

// Phase 2 of every operator: attnops runs the executor on the stream.
template <attnopsStatus (*Run)(void*, uint64_t, attnopsExecutor*, attnopsStream*)>
aclnnStatus execute(const char* api, void* workspace, uint64_t workspaceSize, aclOpExecutor* executor,
                    aclrtStream stream) {
    return guardedOp(api, [&] { attnops::check(Run(workspace, workspaceSize, toAttnops(executor), toAttnops(stream))); });
}

// Defines the phase-2 entry point `name` on the attnops function `run`.
#define ATTNOPS_ACL_EXECUTE(name, run)                                                                        \
    aclnnStatus name(void* workspace, uint64_t workspaceSize, aclOpExecutor* executor, aclrtStream stream) { \
        return attnops::acl::execute<run>(#name, workspace, workspaceSize, executor, stream);                 \
    }

}  // namespace attnops::acl
