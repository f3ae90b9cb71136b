// The process-wide bf16 path: the decision rule and its one-time evaluation.
#include "cpu/bf16_path.hpp"

#include <fmt/format.h>

#include "core/error.hpp"
#include "runtime/platform.hpp"

namespace attnops::cpu {

const char* bf16PathName(Bf16Path path) { return path == Bf16Path::Dot ? "dot" : "widen"; }

Bf16Pin parseBf16Pin(const std::string& value) {
    if (value.empty() || value == "auto") return Bf16Pin::Auto;
    if (value == "dot") return Bf16Pin::Dot;
    if (value == "widen") return Bf16Pin::Widen;
    invalidArgument("ATTNOPS_BF16_PATH", value, "is not one of auto, dot, widen");
}

Bf16Choice decideBf16Path(const IsaFeatures& f, Bf16Pin pin, const std::function<Bf16Calibration()>& calibrate) {
    Bf16Choice c;
    const bool dotLegal = f.avx512f && f.avx512bw && f.avx512vl && f.avx512bf16;
    if (pin == Bf16Pin::Widen) {
        c.reason = "pinned by ATTNOPS_BF16_PATH=widen";
        return c;
    }
    if (!dotLegal) {
        c.reason = pin == Bf16Pin::Dot
                       ? "ATTNOPS_BF16_PATH=dot, but this CPU has no AVX512_BF16: widen is the only legal path"
                       : "this CPU has no AVX512_BF16: widen is the only legal path";
        return c;
    }
    if (pin == Bf16Pin::Dot) {
        c.path = Bf16Path::Dot;
        c.reason = "pinned by ATTNOPS_BF16_PATH=dot";
        return c;
    }
    const Bf16Path vendorDefault = f.vendor == "AuthenticAMD" ? Bf16Path::Dot : Bf16Path::Widen;
    c.calibration = calibrate();
    c.calibrated = true;
    const double dot = c.calibration.dotGflops, widen = c.calibration.widenGflops;
    c.path = vendorDefault;
    if (vendorDefault == Bf16Path::Dot && widen >= kBf16SwitchRatio * dot) c.path = Bf16Path::Widen;
    if (vendorDefault == Bf16Path::Widen && dot >= kBf16SwitchRatio * widen) c.path = Bf16Path::Dot;
    c.reason = fmt::format("vendor default for {} is {}; calibration dot {:.1f} vs widen {:.1f} GFLOP/s {}",
                           f.vendor.empty() ? "an unknown vendor" : f.vendor, bf16PathName(vendorDefault), dot, widen,
                           c.path == vendorDefault ? "confirms it" : "overturns it");
    return c;
}

const Bf16Choice& bf16Path() {
    static const Bf16Choice choice =
        decideBf16Path(isa(), parseBf16Pin(envString("ATTNOPS_BF16_PATH")), calibrateBf16Avx512);
    return choice;
}

}  // namespace attnops::cpu
