// The per-CPU bf16 path decision (cpu/bf16_path.hpp) with injected CPU features, vendors,
// calibration results and pins, and the process-wide choice on this CPU.
#include "cpu/bf16_path.hpp"

#include <gtest/gtest.h>

#include <string>

#include "attnops/attnops.h"
#include "core/error.hpp"

namespace {

using attnops::cpu::Bf16Calibration;
using attnops::cpu::Bf16Path;
using attnops::cpu::Bf16Pin;
using attnops::cpu::decideBf16Path;
using attnops::cpu::IsaFeatures;

IsaFeatures cpu(const std::string& vendor, bool avx512bf16) {
    IsaFeatures f;
    f.vendor = vendor;
    f.avx2 = f.fma = f.f16c = true;
    f.avx512f = f.avx512bw = f.avx512vl = avx512bf16;
    f.avx512bf16 = avx512bf16;
    return f;
}

// A calibration that records whether it ran.
struct Calibration {
    Bf16Calibration result;
    mutable int runs = 0;
    Bf16Calibration operator()() const {
        ++runs;
        return result;
    }
};

TEST(Bf16Path, WithoutAvx512Bf16WidenIsTheOnlyPathAndNothingIsTimed) {
    for (Bf16Pin pin : {Bf16Pin::Auto, Bf16Pin::Dot, Bf16Pin::Widen})
        for (const char* vendor : {"AuthenticAMD", "GenuineIntel"}) {
            Calibration cal{{900, 500}};
            const auto c = decideBf16Path(cpu(vendor, false), pin, std::cref(cal));
            EXPECT_EQ(c.path, Bf16Path::Widen);
            EXPECT_EQ(cal.runs, 0);
            EXPECT_FALSE(c.calibrated);
            EXPECT_FALSE(c.reason.empty());
        }
}

TEST(Bf16Path, VendorDefaultConfirmedByCalibration) {
    Calibration amd{{951, 526}}, intel{{87, 172}};
    const auto a = decideBf16Path(cpu("AuthenticAMD", true), Bf16Pin::Auto, std::cref(amd));
    EXPECT_EQ(a.path, Bf16Path::Dot);
    EXPECT_TRUE(a.calibrated);
    EXPECT_EQ(amd.runs, 1);
    EXPECT_NE(a.reason.find("confirms"), std::string::npos) << a.reason;
    const auto i = decideBf16Path(cpu("GenuineIntel", true), Bf16Pin::Auto, std::cref(intel));
    EXPECT_EQ(i.path, Bf16Path::Widen);
    EXPECT_NE(i.reason.find("GenuineIntel"), std::string::npos) << i.reason;
}

TEST(Bf16Path, CalibrationOverturnsTheDefaultOnlyBeyondTheSwitchRatio) {
    // A future Intel core with fast vdpbf16ps, an AMD core with slow vdpbf16ps, and noise.
    EXPECT_EQ(decideBf16Path(cpu("GenuineIntel", true), Bf16Pin::Auto, Calibration{{300, 170}}).path, Bf16Path::Dot);
    EXPECT_EQ(decideBf16Path(cpu("AuthenticAMD", true), Bf16Pin::Auto, Calibration{{200, 400}}).path, Bf16Path::Widen);
    EXPECT_EQ(decideBf16Path(cpu("GenuineIntel", true), Bf16Pin::Auto, Calibration{{200, 170}}).path, Bf16Path::Widen);
    EXPECT_EQ(decideBf16Path(cpu("AuthenticAMD", true), Bf16Pin::Auto, Calibration{{200, 250}}).path, Bf16Path::Dot);
    // Unknown vendors start from widen.
    EXPECT_EQ(decideBf16Path(cpu("HygonGenuine", true), Bf16Pin::Auto, Calibration{{200, 170}}).path, Bf16Path::Widen);
    const auto over = decideBf16Path(cpu("AuthenticAMD", true), Bf16Pin::Auto, Calibration{{200, 400}});
    EXPECT_NE(over.reason.find("overturns"), std::string::npos) << over.reason;
}

TEST(Bf16Path, PinsWinWithoutCalibration) {
    Calibration cal{{100, 900}};
    const auto dot = decideBf16Path(cpu("GenuineIntel", true), Bf16Pin::Dot, std::cref(cal));
    EXPECT_EQ(dot.path, Bf16Path::Dot);
    EXPECT_NE(dot.reason.find("ATTNOPS_BF16_PATH=dot"), std::string::npos);
    const auto widen = decideBf16Path(cpu("AuthenticAMD", true), Bf16Pin::Widen, std::cref(cal));
    EXPECT_EQ(widen.path, Bf16Path::Widen);
    EXPECT_EQ(cal.runs, 0);
}

TEST(Bf16Path, PinParsing) {
    EXPECT_EQ(attnops::cpu::parseBf16Pin(""), Bf16Pin::Auto);
    EXPECT_EQ(attnops::cpu::parseBf16Pin("auto"), Bf16Pin::Auto);
    EXPECT_EQ(attnops::cpu::parseBf16Pin("dot"), Bf16Pin::Dot);
    EXPECT_EQ(attnops::cpu::parseBf16Pin("widen"), Bf16Pin::Widen);
    try {
        attnops::cpu::parseBf16Pin("fast");
        FAIL() << "no error";
    } catch (const attnops::StatusError& e) {
        EXPECT_EQ(e.status(), ATTNOPS_ERROR_INVALID_ARGUMENT);
        EXPECT_NE(std::string(e.what()).find("ATTNOPS_BF16_PATH"), std::string::npos) << e.what();
    }
}

TEST(Bf16Path, ThisProcessChoosesOnceAndIsLegal) {
    const auto& first = attnops::cpu::bf16Path();
    EXPECT_EQ(&first, &attnops::cpu::bf16Path());
    EXPECT_FALSE(first.reason.empty());
    if (!attnops::cpu::isa().avx512bf16) {
        EXPECT_EQ(first.path, Bf16Path::Widen);
    }
}

}  // namespace
