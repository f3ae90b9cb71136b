// NPY reading and writing: the header is a Python dict literal, parsed here by a small scanner
// that knows strings, True/False and tuples of integers.
#include "npy.hpp"

#include <fmt/format.h>

#include <array>
#include <bit>
#include <cctype>
#include <cstring>
#include <limits>

namespace attnops::cli {

static_assert(std::endian::native == std::endian::little, "the NPY code assumes a little-endian host");

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
constexpr size_t kAlignment = 64;  // total header length is a multiple of this (NumPy >= 1.19)

struct TypeEntry {
    NpyType type;
    const char* descr;
    uint64_t size;
};

constexpr std::array<TypeEntry, 9> kTypes{{
    {NpyType::F32, "<f4", 4},
    {NpyType::F16, "<f2", 2},
    {NpyType::U16, "<u2", 2},
    {NpyType::U8, "|u1", 1},
    {NpyType::Bool, "|b1", 1},
    {NpyType::I64, "<i8", 8},
    {NpyType::I32, "<i4", 4},
    {NpyType::I8, "|i1", 1},
    {NpyType::U64, "<u8", 8},
}};

const TypeEntry& entry(NpyType type) {
    for (const TypeEntry& e : kTypes)
        if (e.type == type) return e;
    throw NpyError("unknown NPY type");
}

// Normalises a descr to the '<'/'|' spelling: '=' is native (little endian here), and one-byte
// types may come without a byte-order character.
NpyType parseDescr(std::string descr, const std::string& where) {
    if (!descr.empty() && descr[0] == '=') descr[0] = '<';
    if (descr == "u1" || descr == "<u1") descr = "|u1";
    if (descr == "b1" || descr == "<b1") descr = "|b1";
    if (descr == "i1" || descr == "<i1") descr = "|i1";
    for (const TypeEntry& e : kTypes)
        if (descr == e.descr) return e.type;
    if (!descr.empty() && descr[0] == '>')
        throw NpyError(fmt::format("{}: big-endian data ('{}') is not supported; save it little-endian", where, descr));
    throw NpyError(
        fmt::format("{}: dtype '{}' is not supported (accepted: <f4 fp32, <f2 fp16, <u2 bf16 bits, |u1, |b1, "
                    "<i8, <i4, |i1, <u8)",
                    where, descr));
}

// Scanner over the header's dict literal.
class DictScanner {
public:
    DictScanner(std::string text, std::string where) : s_(std::move(text)), where_(std::move(where)) {}

    NpyHeader parse() {
        bool haveDescr = false, haveOrder = false, haveShape = false;
        NpyHeader h;
        expect('{');
        while (true) {
            skipSpace();
            if (peek() == '}') break;
            const std::string key = parseString();
            expect(':');
            if (key == "descr") {
                skipSpace();
                if (peek() == '[') fail("structured dtypes are not supported");
                h.type = parseDescr(parseString(), where_);
                haveDescr = true;
            } else if (key == "fortran_order") {
                if (parseBool()) fail("fortran_order True is not supported (write the array in C order)");
                haveOrder = true;
            } else if (key == "shape") {
                h.shape = parseShape();
                haveShape = true;
            } else {
                fail(fmt::format("unexpected header key '{}'", key));
            }
            skipSpace();
            if (peek() == ',') ++pos_;
        }
        if (!haveDescr || !haveOrder || !haveShape) fail("header lacks 'descr', 'fortran_order' or 'shape'");
        return h;
    }

private:
    [[noreturn]] void fail(const std::string& why) const {
        throw NpyError(fmt::format("{}: bad NPY header ({}): {}", where_, why, s_));
    }
    void skipSpace() {
        while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    }
    char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
    void expect(char c) {
        skipSpace();
        if (peek() != c) fail(fmt::format("expected '{}'", c));
        ++pos_;
    }
    std::string parseString() {
        skipSpace();
        const char quote = peek();
        if (quote != '\'' && quote != '"') fail("expected a string");
        const size_t end = s_.find(quote, pos_ + 1);
        if (end == std::string::npos) fail("unterminated string");
        std::string r = s_.substr(pos_ + 1, end - pos_ - 1);
        pos_ = end + 1;
        return r;
    }
    bool parseBool() {
        skipSpace();
        if (s_.compare(pos_, 4, "True") == 0) {
            pos_ += 4;
            return true;
        }
        if (s_.compare(pos_, 5, "False") == 0) {
            pos_ += 5;
            return false;
        }
        fail("expected True or False");
    }
    std::vector<int64_t> parseShape() {
        skipSpace();
        const char open = peek(), close = open == '(' ? ')' : ']';
        if (open != '(' && open != '[') fail("expected a shape tuple");
        ++pos_;
        std::vector<int64_t> shape;
        while (true) {
            skipSpace();
            if (peek() == close) {
                ++pos_;
                return shape;
            }
            if (!std::isdigit(static_cast<unsigned char>(peek()))) fail("expected a non-negative dimension");
            int64_t v = 0;
            while (std::isdigit(static_cast<unsigned char>(peek()))) {
                const int digit = s_[pos_++] - '0';
                if (v > (std::numeric_limits<int64_t>::max() - digit) / 10) fail("dimension too large");
                v = v * 10 + digit;
            }
            shape.push_back(v);
            skipSpace();
            if (peek() == ',') ++pos_;
        }
    }

    std::string s_, where_;
    size_t pos_ = 0;
};

}  // namespace

const char* npyDescr(NpyType type) { return entry(type).descr; }
uint64_t npyItemSize(NpyType type) { return entry(type).size; }

int64_t NpyHeader::numel() const {
    int64_t n = 1;
    for (int64_t d : shape) {
        if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) throw NpyError("NPY shape overflows 64 bits");
        n *= d;
    }
    return n;
}

NpyReader::NpyReader(const std::filesystem::path& path) : path_(path), in_(path, std::ios::binary) {
    const std::string where = path.string();
    if (!in_) throw NpyError(fmt::format("{}: cannot open", where));
    std::array<char, kMagicLen + 2> lead{};
    if (!in_.read(lead.data(), lead.size()) || std::memcmp(lead.data(), kMagic, kMagicLen) != 0)
        throw NpyError(fmt::format("{}: not an NPY file (no \\x93NUMPY magic)", where));
    const int major = static_cast<unsigned char>(lead[kMagicLen]);
    uint64_t headerLen = 0;
    if (major == 1) {
        unsigned char len[2];
        if (!in_.read(reinterpret_cast<char*>(len), 2)) throw NpyError(fmt::format("{}: truncated header", where));
        headerLen = len[0] | (uint64_t(len[1]) << 8);
    } else if (major == 2 || major == 3) {
        unsigned char len[4];
        if (!in_.read(reinterpret_cast<char*>(len), 4)) throw NpyError(fmt::format("{}: truncated header", where));
        headerLen = len[0] | (uint64_t(len[1]) << 8) | (uint64_t(len[2]) << 16) | (uint64_t(len[3]) << 24);
    } else {
        throw NpyError(fmt::format("{}: NPY format version {} is not supported", where, major));
    }
    std::string text(headerLen, '\0');
    if (!in_.read(text.data(), std::streamsize(headerLen))) throw NpyError(fmt::format("{}: truncated header", where));
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\0')) text.pop_back();
    header_ = DictScanner(text, where).parse();
    header_.bytes();  // rejects shapes whose size overflows
}

void NpyReader::readData(void* dst) {
    const uint64_t want = header_.bytes();
    const std::streamoff start = in_.tellg();
    in_.seekg(0, std::ios::end);
    const std::streamoff available = in_.tellg() - start;
    in_.seekg(start);
    if (uint64_t(available) < want)
        throw NpyError(fmt::format("{}: truncated: the header promises {} bytes of data, the file holds {}",
                                   path_.string(), want, available));
    if (want > 0 && !in_.read(static_cast<char*>(dst), std::streamsize(want)))
        throw NpyError(fmt::format("{}: read error", path_.string()));
}

std::vector<int64_t> readNpyInts(const std::filesystem::path& path) {
    NpyReader r(path);
    const NpyHeader& h = r.header();
    if (h.type == NpyType::I64) {
        std::vector<int64_t> v(size_t(h.numel()));
        r.readData(v.data());
        return v;
    }
    if (h.type == NpyType::I32) {
        std::vector<int32_t> v32(size_t(h.numel()));
        r.readData(v32.data());
        return {v32.begin(), v32.end()};
    }
    throw NpyError(fmt::format("{}: expected an integer array (<i8 or <i4), got {}", path.string(), npyDescr(h.type)));
}

void writeNpy(const std::filesystem::path& path, NpyType type, const std::vector<int64_t>& shape, const void* data) {
    std::string dims;
    for (int64_t d : shape) dims += fmt::format("{}, ", d);
    if (shape.size() > 1)
        dims.resize(dims.size() - 2);  // (3,) for rank 1, (2, 3) otherwise
    else if (shape.size() == 1)
        dims.pop_back();
    std::string dict = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}", npyDescr(type), dims);
    // Magic, version, header length (2 bytes in version 1.0, 4 in 2.0), then the padded dict.
    auto paddedTotal = [&](size_t prefix) {
        return (prefix + dict.size() + 1 + kAlignment - 1) / kAlignment * kAlignment;
    };
    size_t prefix = kMagicLen + 2 + 2;
    int major = 1;
    if (paddedTotal(prefix) - prefix > 65535) {
        major = 2;
        prefix = kMagicLen + 2 + 4;
    }
    const size_t total = paddedTotal(prefix);
    dict.append(total - prefix - dict.size() - 1, ' ');
    dict.push_back('\n');

    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out) throw NpyError(fmt::format("{}: cannot create", path.string()));
    out.write(kMagic, kMagicLen);
    out.put(char(major));
    out.put(0);
    const uint64_t len = dict.size();
    for (size_t i = 0; i < (major == 1 ? 2u : 4u); ++i) out.put(char((len >> (8 * i)) & 0xff));
    out.write(dict.data(), std::streamsize(dict.size()));
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    out.write(static_cast<const char*>(data), std::streamsize(uint64_t(n) * npyItemSize(type)));
    if (!out.flush()) throw NpyError(fmt::format("{}: write error", path.string()));
}

}  // namespace attnops::cli
