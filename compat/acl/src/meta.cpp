// aclnn objects (tensors, integer arrays, tensor lists), error messages and status mapping, and
// the conversion of aclnn views onto attnops tensors.
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "aclnn/opdev/fp16_t.h"
#include "shim.hpp"

namespace attnops::acl {
namespace {

std::mutex registryMutex;
std::unordered_map<const void*, Kind>& registry() {
    static auto* objects = new std::unordered_map<const void*, Kind>();  // outlives static destructors
    return *objects;
}

thread_local std::vector<std::string> pendingErrors;
thread_local std::string returnedErrors;

const char* dataTypeName(aclDataType t) {
    switch (t) {
        case ACL_FLOAT: return "ACL_FLOAT";
        case ACL_FLOAT16: return "ACL_FLOAT16";
        case ACL_INT8: return "ACL_INT8";
        case ACL_INT32: return "ACL_INT32";
        case ACL_UINT8: return "ACL_UINT8";
        case ACL_INT16: return "ACL_INT16";
        case ACL_UINT16: return "ACL_UINT16";
        case ACL_UINT32: return "ACL_UINT32";
        case ACL_INT64: return "ACL_INT64";
        case ACL_UINT64: return "ACL_UINT64";
        case ACL_DOUBLE: return "ACL_DOUBLE";
        case ACL_BOOL: return "ACL_BOOL";
        case ACL_STRING: return "ACL_STRING";
        case ACL_COMPLEX64: return "ACL_COMPLEX64";
        case ACL_COMPLEX128: return "ACL_COMPLEX128";
        case ACL_BF16: return "ACL_BF16";
        case ACL_INT4: return "ACL_INT4";
        case ACL_UINT1: return "ACL_UINT1";
        case ACL_COMPLEX32: return "ACL_COMPLEX32";
        case ACL_DT_UNDEFINED: break;
    }
    return nullptr;
}

bool knownFormat(aclFormat f) {
    switch (f) {
        case ACL_FORMAT_NCHW: case ACL_FORMAT_NHWC: case ACL_FORMAT_ND: case ACL_FORMAT_NC1HWC0:
        case ACL_FORMAT_FRACTAL_Z: case ACL_FORMAT_NC1HWC0_C04: case ACL_FORMAT_HWCN: case ACL_FORMAT_NDHWC:
        case ACL_FORMAT_FRACTAL_NZ: case ACL_FORMAT_NCDHW: case ACL_FORMAT_NDC1HWC0: case ACL_FRACTAL_Z_3D:
        case ACL_FORMAT_NC: case ACL_FORMAT_NCL:
            return true;
        case ACL_FORMAT_UNDEFINED: break;
    }
    return false;
}

// Formats whose storage order is the plain row-major order of the dims (the others are tiled
// device layouts, which have no meaning in host memory).
bool plainFormat(aclFormat f) {
    return f == ACL_FORMAT_ND || f == ACL_FORMAT_NCHW || f == ACL_FORMAT_NHWC || f == ACL_FORMAT_HWCN ||
           f == ACL_FORMAT_NDHWC || f == ACL_FORMAT_NCDHW || f == ACL_FORMAT_NC || f == ACL_FORMAT_NCL;
}

std::string dimsString(const int64_t* dims, uint64_t n) {
    return fmt::format("[{}]", fmt::join(dims, dims + n, ","));
}

// An attnops view of `data`; a rule attnops' tensor description breaks is reported for `name`.
attnops::Tensor describe(const char* name, void* data, aclDataType dtype, const std::vector<int64_t>& dims,
                         const std::vector<int64_t>& strides) {
    try {
        return attnops::Tensor(data, attnopsDataType(int(dtype)), dims, strides);
    } catch (const attnops::Error& e) {
        fail(toAclnnStatus(e.status()), "{}: {}", name, attnopsGetLastErrorMessage());
    }
}

std::vector<int64_t> contiguousStrides(const std::vector<int64_t>& dims) {
    std::vector<int64_t> strides(dims.size(), 1);
    for (size_t i = dims.size(); i-- > 1;) strides[i - 1] = strides[i] * std::max<int64_t>(dims[i], 1);
    return strides;
}

const aclTensor& liveTensor(const aclTensor* t, const char* name) {
    if (!isLive(t, Kind::Tensor))
        fail(ACLNN_ERR_PARAM_INVALID, "{} = {}: not a live aclTensor (destroyed, or not made by aclCreateTensor)", name,
             static_cast<const void*>(t));
    return *t;
}

aclTensor* createTensor(const int64_t* viewDims, uint64_t viewDimsNum, aclDataType dataType, const int64_t* stride,
                        int64_t offset, aclFormat format, const int64_t* storageDims, uint64_t storageDimsNum,
                        void* tensorData) {
    if (viewDimsNum > ATTNOPS_MAX_RANK)
        fail(ACL_ERROR_INVALID_PARAM, "viewDimsNum = {}: must be at most {}", viewDimsNum, ATTNOPS_MAX_RANK);
    if (storageDimsNum > ATTNOPS_MAX_RANK)
        fail(ACL_ERROR_INVALID_PARAM, "storageDimsNum = {}: must be at most {}", storageDimsNum, ATTNOPS_MAX_RANK);
    if (viewDimsNum > 0 && viewDims == nullptr)
        fail(ACL_ERROR_INVALID_PARAM, "viewDims = NULL: required when viewDimsNum = {} > 0", viewDimsNum);
    if (storageDimsNum > 0 && storageDims == nullptr)
        fail(ACL_ERROR_INVALID_PARAM, "storageDims = NULL: required when storageDimsNum = {} > 0", storageDimsNum);
    if (dataTypeName(dataType) == nullptr)
        fail(ACL_ERROR_INVALID_PARAM, "dataType = {}: not an aclDataType value", int(dataType));
    if (!knownFormat(format)) fail(ACL_ERROR_INVALID_PARAM, "format = {}: not an aclFormat value", int(format));
    if (offset < 0) fail(ACL_ERROR_INVALID_PARAM, "offset = {}: must be >= 0", offset);
    auto tensor = std::make_unique<aclTensor>();
    tensor->viewDims.assign(viewDims, viewDims + viewDimsNum);
    tensor->storageDims.assign(storageDims, storageDims + storageDimsNum);
    for (int64_t d : tensor->viewDims)
        if (d < 0) fail(ACL_ERROR_INVALID_PARAM, "viewDims = {}: dims must be >= 0", dimsString(viewDims, viewDimsNum));
    for (int64_t d : tensor->storageDims)
        if (d < 0)
            fail(ACL_ERROR_INVALID_PARAM, "storageDims = {}: dims must be >= 0", dimsString(storageDims, storageDimsNum));
    if (stride) {
        tensor->strides.assign(stride, stride + viewDimsNum);
        for (int64_t s : tensor->strides)
            if (s < 0) fail(ACL_ERROR_INVALID_PARAM, "stride = {}: strides must be >= 0", dimsString(stride, viewDimsNum));
    } else {
        tensor->strides = contiguousStrides(tensor->viewDims);
    }
    // The view must lie inside the storage: its last element at offset + sum((d-1)*s).
    int64_t numel = 1, last = offset, storage = 1;
    bool overflow = false;
    for (size_t i = 0; i < tensor->viewDims.size(); ++i) {
        const int64_t d = tensor->viewDims[i];
        numel *= d;
        if (d > 0) {
            int64_t reach = 0;
            overflow |= __builtin_mul_overflow(d - 1, tensor->strides[i], &reach) ||
                        __builtin_add_overflow(last, reach, &last);
        }
    }
    for (int64_t d : tensor->storageDims) overflow |= __builtin_mul_overflow(storage, d, &storage);
    if (overflow)
        fail(ACL_ERROR_INVALID_PARAM, "viewDims = {}, stride, offset = {}: the extent overflows 64 bits",
             dimsString(viewDims, viewDimsNum), offset);
    if (numel > 0 && last >= storage)
        fail(ACL_ERROR_INVALID_PARAM,
             "viewDims = {}, stride = {}, offset = {}: the view reaches element {} but storageDims = {} holds {}",
             dimsString(viewDims, viewDimsNum), dimsString(tensor->strides.data(), viewDimsNum), offset, last,
             dimsString(storageDims, storageDimsNum), storage);
    tensor->offset = offset;
    tensor->dataType = dataType;
    tensor->format = format;
    tensor->data = tensorData;
    registerObject(tensor.get(), Kind::Tensor);
    return tensor.release();
}

}  // namespace

void registerObject(const void* p, Kind kind) {
    std::lock_guard<std::mutex> lock(registryMutex);
    registry()[p] = kind;
}

bool unregisterObject(const void* p, Kind kind) {
    std::lock_guard<std::mutex> lock(registryMutex);
    auto it = registry().find(p);
    if (it == registry().end() || it->second != kind) return false;
    registry().erase(it);
    return true;
}

bool isLive(const void* p, Kind kind) {
    std::lock_guard<std::mutex> lock(registryMutex);
    auto it = registry().find(p);
    return it != registry().end() && it->second == kind;
}

void recordError(std::string message) { pendingErrors.push_back(std::move(message)); }

aclnnStatus toAclnnStatus(attnopsStatus status) {
    switch (status) {
        case ATTNOPS_SUCCESS: return ACLNN_SUCCESS;
        case ATTNOPS_ERROR_NULL_ARGUMENT: return ACLNN_ERR_PARAM_NULLPTR;
        case ATTNOPS_ERROR_INVALID_ARGUMENT:
        case ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION: return ACLNN_ERR_PARAM_INVALID;
        case ATTNOPS_ERROR_UNSUPPORTED_HARDWARE: return ACLNN_ERR_INNER_FIND_KERNEL_ERROR;
        case ATTNOPS_ERROR_RUNTIME:
        case ATTNOPS_ERROR_OUT_OF_MEMORY: return ACLNN_ERR_RUNTIME_ERROR;
        case ATTNOPS_ERROR_INTERNAL: break;
    }
    return ACLNN_ERR_INNER;
}

aclError toAclError(attnopsStatus status) {
    switch (status) {
        case ATTNOPS_SUCCESS: return ACL_SUCCESS;
        case ATTNOPS_ERROR_NULL_ARGUMENT:
        case ATTNOPS_ERROR_INVALID_ARGUMENT:
        case ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION: return ACL_ERROR_INVALID_PARAM;
        case ATTNOPS_ERROR_UNSUPPORTED_HARDWARE: return ACL_ERROR_API_NOT_SUPPORT;
        case ATTNOPS_ERROR_OUT_OF_MEMORY: return ACL_ERROR_RT_MEMORY_ALLOCATION;
        case ATTNOPS_ERROR_RUNTIME: return ACL_ERROR_RT_FAILURE;
        case ATTNOPS_ERROR_INTERNAL: break;
    }
    return ACL_ERROR_INTERNAL_ERROR;
}

StatsOrder statsOrder(const char* layout, const char* argument) {
    if (layout == nullptr || layout[0] == '\0') return StatsOrder::Declared;
    if (std::strcmp(layout, "same_as_input") == 0) return StatsOrder::HeadMajor;
    fail(ACLNN_ERR_PARAM_INVALID, "{} = \"{}\": must be NULL, \"\" or \"same_as_input\"", argument, layout);
}

attnops::Tensor view(const aclTensor* tensor, const char* name) {
    if (tensor == nullptr) return {};
    const aclTensor& t = liveTensor(tensor, name);
    if (!plainFormat(t.format))
        fail(ACLNN_ERR_PARAM_INVALID, "{}.format = {}: must be ACL_FORMAT_ND (or another plain format)", name,
             int(t.format));
    const uint64_t elementBytes = aclDataTypeSize(t.dataType);
    void* first = t.data == nullptr ? nullptr : static_cast<char*>(t.data) + t.offset * int64_t(elementBytes);
    return describe(name, first, t.dataType, t.viewDims, t.strides);
}

attnops::Tensor statsView(const aclTensor* tensor, const char* name, StatsOrder order) {
    if (tensor == nullptr || order == StatsOrder::Declared) return view(tensor, name);
    const aclTensor& t = liveTensor(tensor, name);
    if (t.viewDims.size() != 3) return view(tensor, name);  // [B,N,S,8]: the order is the declared one
    if (t.strides != contiguousStrides(t.viewDims))
        fail(ACLNN_ERR_PARAM_INVALID,
             "{}: viewDims = {} with stride = {}: \"same_as_input\" needs a contiguous [T,N,8] tensor", name,
             dimsString(t.viewDims.data(), t.viewDims.size()), dimsString(t.strides.data(), t.strides.size()));
    // Declared [T,N,L], stored as [N,T,L].
    const int64_t tokens = t.viewDims[0], lanes = t.viewDims[2];
    const uint64_t elementBytes = aclDataTypeSize(t.dataType);
    void* first = t.data == nullptr ? nullptr : static_cast<char*>(t.data) + t.offset * int64_t(elementBytes);
    return describe(name, first, t.dataType, t.viewDims, {lanes, tokens * lanes, 1});
}

attnops::IntArray view(const aclIntArray* array, const char* name) {
    if (array == nullptr) return {};
    if (!isLive(array, Kind::IntArray))
        fail(ACLNN_ERR_PARAM_INVALID, "{} = {}: not a live aclIntArray (destroyed, or not made by aclCreateIntArray)",
             name, static_cast<const void*>(array));
    return attnops::IntArray(array->values);
}

void requireAbsent(const aclTensor* tensor, const char* name, const char* why) {
    if (tensor != nullptr) fail(ACLNN_ERR_PARAM_INVALID, "{} is given: {} (pass nullptr)", name, why);
}

void requireAbsentOrEmpty(const aclTensor* tensor, const char* name, const char* why) {
    if (tensor == nullptr) return;
    const aclTensor& t = liveTensor(tensor, name);
    for (int64_t d : t.viewDims)
        if (d == 0) return;
    fail(ACLNN_ERR_PARAM_INVALID, "{} = {}: {} (pass nullptr or an empty tensor)", name,
         dimsString(t.viewDims.data(), t.viewDims.size()), why);
}

void requireNoRopeOrQuant(NamedTensors rope, NamedTensors scales, int64_t outDtype) {
    for (auto [tensor, name] : rope) requireAbsent(tensor, name, "rope inputs are not supported by attnops");
    for (auto [tensor, name] : scales)
        requireAbsent(tensor, name, "fp8 dequantisation scales are not supported by attnops");
    if (outDtype != 0 && outDtype != 1)
        fail(ACLNN_ERR_PARAM_INVALID, "outDtype = {}: must be 0 or 1 (the outputs keep the inputs' dtype)", outDtype);
}

void requireLayout(const char* inputLayout, Layouts layouts) {
    if (layouts == Layouts::Any) return;  // attnops checks the value
    if (inputLayout == nullptr) fail(ACLNN_ERR_PARAM_NULLPTR, "inputLayout = NULL: required");
    const bool isTnd = std::strcmp(inputLayout, "TND") == 0, tnd = layouts == Layouts::Tnd;
    if (tnd && !isTnd) fail(ACLNN_ERR_PARAM_INVALID, "inputLayout = \"{}\": this API takes \"TND\" only", inputLayout);
    if (!tnd && isTnd)
        fail(ACLNN_ERR_PARAM_INVALID,
             "inputLayout = \"TND\": this API takes BSH, SBH, BSND or BNSD (TND: the VarLen/Unpadding APIs or V4)");
}

}  // namespace attnops::acl

using namespace attnops::acl;

extern "C" {

size_t aclDataTypeSize(aclDataType dataType) {
    switch (dataType) {
        case ACL_BOOL: case ACL_INT8: case ACL_UINT8: return 1;
        case ACL_FLOAT16: case ACL_BF16: case ACL_INT16: case ACL_UINT16: return 2;
        case ACL_FLOAT: case ACL_INT32: case ACL_UINT32: case ACL_COMPLEX32: return 4;
        case ACL_INT64: case ACL_UINT64: case ACL_DOUBLE: case ACL_COMPLEX64: return 8;
        case ACL_COMPLEX128: return 16;
        default: return 0;  // ACL_STRING, sub-byte types, unknown values
    }
}

float aclFloat16ToFloat(aclFloat16 value) { return op::fp16_t::toFloat(value); }

aclFloat16 aclFloatToFloat16(float value) { return op::fp16_t::fromFloat(value); }

const char* aclGetRecentErrMsg(void) {
    if (pendingErrors.empty()) return nullptr;
    returnedErrors.clear();
    for (auto it = pendingErrors.rbegin(); it != pendingErrors.rend(); ++it) {
        if (!returnedErrors.empty()) returnedErrors += '\n';
        returnedErrors += *it;
    }
    pendingErrors.clear();
    return returnedErrors.c_str();
}

aclTensor* aclCreateTensor(const int64_t* viewDims, uint64_t viewDimsNum, aclDataType dataType, const int64_t* stride,
                           int64_t offset, aclFormat format, const int64_t* storageDims, uint64_t storageDimsNum,
                           void* tensorData) {
    aclTensor* tensor = nullptr;
    guardedRt("aclCreateTensor", [&] {
        tensor = createTensor(viewDims, viewDimsNum, dataType, stride, offset, format, storageDims, storageDimsNum,
                              tensorData);
    });
    return tensor;
}

aclIntArray* aclCreateIntArray(const int64_t* value, uint64_t size) {
    aclIntArray* array = nullptr;
    guardedRt("aclCreateIntArray", [&] {
        if (size > 0 && value == nullptr) fail(ACL_ERROR_INVALID_PARAM, "value = NULL: required when size = {} > 0", size);
        auto created = std::make_unique<aclIntArray>();
        created->values.assign(value, value + size);
        registerObject(created.get(), Kind::IntArray);
        array = created.release();
    });
    return array;
}

aclTensorList* aclCreateTensorList(const aclTensor* const* value, uint64_t size) {
    aclTensorList* list = nullptr;
    guardedRt("aclCreateTensorList", [&] {
        if (size > 0 && value == nullptr) fail(ACL_ERROR_INVALID_PARAM, "value = NULL: required when size = {} > 0", size);
        auto created = std::make_unique<aclTensorList>();
        for (uint64_t i = 0; i < size; ++i) {
            if (!isLive(value[i], Kind::Tensor))
                fail(ACL_ERROR_INVALID_PARAM, "value[{}] = {}: not a live aclTensor", i, static_cast<const void*>(value[i]));
            created->tensors.push_back(value[i]);
        }
        registerObject(created.get(), Kind::TensorList);
        list = created.release();
    });
    return list;
}

aclnnStatus aclDestroyTensor(const aclTensor* tensor) {
    return guardedOp("aclDestroyTensor", [&] {
        if (tensor == nullptr) return;  // as upstream: destroying NULL is a no-op
        if (!unregisterObject(tensor, Kind::Tensor))
            fail(ACLNN_ERR_PARAM_INVALID, "tensor = {}: not a live aclTensor (destroyed twice?)",
                 static_cast<const void*>(tensor));
        delete tensor;
    });
}

aclnnStatus aclDestroyIntArray(const aclIntArray* array) {
    return guardedOp("aclDestroyIntArray", [&] {
        if (array == nullptr) return;
        if (!unregisterObject(array, Kind::IntArray))
            fail(ACLNN_ERR_PARAM_INVALID, "array = {}: not a live aclIntArray (destroyed twice?)",
                 static_cast<const void*>(array));
        delete array;
    });
}

aclnnStatus aclDestroyTensorList(const aclTensorList* array) {
    return guardedOp("aclDestroyTensorList", [&] {
        if (array == nullptr) return;
        if (!unregisterObject(array, Kind::TensorList))
            fail(ACLNN_ERR_PARAM_INVALID, "array = {}: not a live aclTensorList (destroyed twice?)",
                 static_cast<const void*>(array));
        for (const aclTensor* t : array->tensors)
            if (unregisterObject(t, Kind::Tensor)) delete t;
        delete array;
    });
}

aclnnStatus aclGetViewShape(const aclTensor* tensor, int64_t** viewDims, uint64_t* viewDimsNum) {
    return guardedOp("aclGetViewShape", [&] {
        if (viewDims == nullptr || viewDimsNum == nullptr)
            fail(ACLNN_ERR_PARAM_NULLPTR, "{} = NULL: required", viewDims == nullptr ? "viewDims" : "viewDimsNum");
        if (tensor == nullptr) fail(ACLNN_ERR_PARAM_NULLPTR, "tensor = NULL: required");
        aclTensor& t = const_cast<aclTensor&>(liveTensor(tensor, "tensor"));
        *viewDims = t.viewDims.data();
        *viewDimsNum = t.viewDims.size();
    });
}

aclnnStatus aclGetDataType(const aclTensor* tensor, aclDataType* dataType) {
    return guardedOp("aclGetDataType", [&] {
        if (tensor == nullptr || dataType == nullptr)
            fail(ACLNN_ERR_PARAM_NULLPTR, "{} = NULL: required", tensor == nullptr ? "tensor" : "dataType");
        *dataType = liveTensor(tensor, "tensor").dataType;
    });
}

aclnnStatus aclGetIntArraySize(const aclIntArray* array, uint64_t* size) {
    return guardedOp("aclGetIntArraySize", [&] {
        if (array == nullptr || size == nullptr)
            fail(ACLNN_ERR_PARAM_NULLPTR, "{} = NULL: required", array == nullptr ? "array" : "size");
        if (!isLive(array, Kind::IntArray)) fail(ACLNN_ERR_PARAM_INVALID, "array: not a live aclIntArray");
        *size = array->values.size();
    });
}

aclnnStatus aclGetTensorListSize(const aclTensorList* tensorList, uint64_t* size) {
    return guardedOp("aclGetTensorListSize", [&] {
        if (tensorList == nullptr || size == nullptr)
            fail(ACLNN_ERR_PARAM_NULLPTR, "{} = NULL: required", tensorList == nullptr ? "tensorList" : "size");
        if (!isLive(tensorList, Kind::TensorList)) fail(ACLNN_ERR_PARAM_INVALID, "tensorList: not a live aclTensorList");
        *size = tensorList->tensors.size();
    });
}

aclnnStatus aclnnInit(const char*) { return ACLNN_SUCCESS; }

aclnnStatus aclnnFinalize(void) { return ACLNN_SUCCESS; }

}  // extern "C"
