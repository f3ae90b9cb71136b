// The choice of one entry of an operator's implementation list, shared by every operator whose
// entries have a name, available() (this CPU runs it) and accepts(params) (it implements the
// problem): the entry ATTNOPS_FORCE_IMPL names, or else the first legal one not passed over.
#pragma once

#include <fmt/format.h>

#include <string>
#include <vector>

#include "core/error.hpp"

namespace attnops {

// `forced`: the ATTNOPS_FORCE_IMPL value ("" = automatic choice); `passedOver(k)`: whether the
// automatic choice skips a legal entry (an emulator, a path slower on this CPU); `op` names the
// operator in messages.
template <typename Kernel, typename Params, typename PassedOver>
const Kernel& chooseKernel(const std::vector<const Kernel*>& list, const Params& p, const std::string& forced,
                           const char* op, PassedOver&& passedOver) {
    if (!forced.empty()) {
        for (const Kernel* k : list)
            if (forced == k->name) {
                if (!k->available())
                    fail(ATTNOPS_ERROR_UNSUPPORTED_HARDWARE, fmt::format("ATTNOPS_FORCE_IMPL = {}: this CPU cannot run it", forced));
                if (!k->accepts(p)) unsupported("ATTNOPS_FORCE_IMPL = {}: the implementation does not accept this problem", forced);
                return *k;
            }
        std::string names;
        for (const Kernel* k : list) names += std::string(names.empty() ? "" : ", ") + k->name;
        invalidArgument("ATTNOPS_FORCE_IMPL", forced, "is not a {} implementation ({})", op, names);
    }
    for (const Kernel* k : list)
        if (k->available() && k->accepts(p) && !passedOver(*k)) return *k;
    internalError("no {} kernel accepted the problem", op);
}

}  // namespace attnops
