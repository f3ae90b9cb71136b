// A small reader and writer of NumPy .npy files (format versions 1.0-3.0, C order only), enough
// for the tensors attnops takes and returns: <f4, <f2, <u2 (bf16 bits), |u1, |b1, <i8, <i4, |i1, <u8 (uint64
// deq scales of full quantisation).
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace attnops::cli {

struct NpyError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// The element types the reader accepts, by their NumPy descr.
enum class NpyType { F32, F16, U16, U8, Bool, I64, I32, I8, U64 };

const char* npyDescr(NpyType type);
uint64_t npyItemSize(NpyType type);

struct NpyHeader {
    NpyType type = NpyType::F32;
    std::vector<int64_t> shape;

    int64_t numel() const;
    uint64_t bytes() const { return uint64_t(numel()) * npyItemSize(type); }
};

// Opens a file and parses its header; readData then reads the elements (header().bytes() of them).
class NpyReader {
public:
    explicit NpyReader(const std::filesystem::path& path);
    const NpyHeader& header() const { return header_; }
    void readData(void* dst);

private:
    std::filesystem::path path_;
    std::ifstream in_;
    NpyHeader header_;
};

// Reads an integer array (<i8 or <i4, any shape) as int64 values in C order.
std::vector<int64_t> readNpyInts(const std::filesystem::path& path);

// Writes a version 1.0 file (version 2.0 if the header needs more than 64 KiB).
void writeNpy(const std::filesystem::path& path, NpyType type, const std::vector<int64_t>& shape, const void* data);

}  // namespace attnops::cli
