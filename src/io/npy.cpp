// NumPy .npy reading and writing (https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html):
// "\x93NUMPY", a version byte pair, a little-endian header length (2 bytes in 1.0, 4 in 2.0 and
// 3.0), a Python dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } padded
// with spaces to a multiple of 64 bytes, then the raw data.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <vector>

#include "core/half.h"
#include "tessera/error.h"
#include "tessera/io.h"

namespace tessera::io {
namespace {

[[noreturn]] void npy_fail(const std::string& path, const std::string& what) { throw Error("npy: " + path + ": " + what); }

struct Descr {
  const char* code;
  DType dtype;
  size_t size;
};
constexpr Descr kDescrs[] = {{"<f4", DType::Float32, 4}, {"<f8", DType::Float64, 8}, {"<f2", DType::Float16, 2},
                             {"<i4", DType::Int32, 4},   {"<i8", DType::Int64, 8},   {"|b1", DType::Bool, 1}};

// The value of `key` in the header dict, as its literal text ('<f4', False, (2, 3)).
std::string dict_value(const std::string& path, const std::string& h, const std::string& key) {
  size_t k = h.find("'" + key + "'");
  if (k == std::string::npos) npy_fail(path, "header has no '" + key + "'");
  size_t colon = h.find(':', k);
  if (colon == std::string::npos) npy_fail(path, "malformed header");
  size_t b = h.find_first_not_of(' ', colon + 1);
  if (b == std::string::npos) npy_fail(path, "malformed header");
  size_t e;
  if (h[b] == '(') e = h.find(')', b);
  else if (h[b] == '\'') e = h.find('\'', b + 1);
  else e = h.find_first_of(",}", b) - 1;
  if (e == std::string::npos || e < b) npy_fail(path, "malformed header value for '" + key + "'");
  return h.substr(b, e - b + 1);
}

Shape parse_shape(const std::string& path, const std::string& s) {
  Shape shape;
  size_t i = 1;  // after '('
  int64_t total = 1;
  while (i < s.size() - 1) {
    while (i < s.size() && (s[i] == ' ' || s[i] == ',')) ++i;
    if (i >= s.size() - 1) break;
    if (s[i] < '0' || s[i] > '9') npy_fail(path, "shape " + s + " is not a tuple of non-negative integers");
    int64_t v = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
      if (v > (int64_t(1) << 40)) npy_fail(path, "extent in shape " + s + " is too large");
      v = v * 10 + (s[i++] - '0');
    }
    if (v > 0 && total > (int64_t(1) << 40) / v) npy_fail(path, "shape " + s + " has more than 2^40 elements");
    total *= v;
    shape.push_back(v);
  }
  return shape;
}

}  // namespace

Tensor load_npy(const std::string& path, const Device& device) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) npy_fail(path, "no such file");
  uintmax_t size = std::filesystem::file_size(path, ec);
  std::ifstream f(path, std::ios::binary);
  char magic[8];
  if (size < 10 || !f.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0) npy_fail(path, "not a .npy file (bad magic)");
  int major = static_cast<unsigned char>(magic[6]);
  if (major < 1 || major > 3) npy_fail(path, "unsupported .npy version " + std::to_string(major));
  size_t len_bytes = major == 1 ? 2 : 4;
  unsigned char lb[4] = {0, 0, 0, 0};
  if (!f.read(reinterpret_cast<char*>(lb), std::streamsize(len_bytes))) npy_fail(path, "truncated header");
  uintmax_t hlen = uintmax_t(lb[0]) | uintmax_t(lb[1]) << 8 | uintmax_t(lb[2]) << 16 | uintmax_t(lb[3]) << 24;
  uintmax_t data_at = 8 + len_bytes + hlen;
  if (data_at > size) npy_fail(path, "header length " + std::to_string(hlen) + " runs past the file's " + std::to_string(size) + " bytes");
  std::string h(hlen, '\0');
  if (!f.read(h.data(), std::streamsize(hlen))) npy_fail(path, "truncated header");
  std::string descr = dict_value(path, h, "descr"), order = dict_value(path, h, "fortran_order"), shape_s = dict_value(path, h, "shape");
  if (order != "False") npy_fail(path, "Fortran-order arrays are not supported (save with np.ascontiguousarray)");
  if (shape_s.front() != '(') npy_fail(path, "shape " + shape_s + " is not a tuple");
  const Descr* d = nullptr;
  for (const Descr& c : kDescrs)
    if (descr == "'" + std::string(c.code) + "'") d = &c;
  if (!d) npy_fail(path, "dtype " + descr + " is not supported (<f2 <f4 <f8 <i4 <i8 |b1)");
  Shape shape = parse_shape(path, shape_s);
  uintmax_t want = uintmax_t(numel(shape)) * d->size;
  if (size - data_at != want)
    npy_fail(path, "shape " + shape_str(shape) + " of " + descr + " needs " + std::to_string(want) + " data bytes, the file holds " +
                       std::to_string(size - data_at));
  std::vector<char> raw(want);
  if (want && !f.read(raw.data(), std::streamsize(want))) npy_fail(path, "cannot read the data");
  TensorOptions o{d->dtype, device};
  int64_t n = numel(shape);
  auto typed = [&](auto zero) {
    std::vector<decltype(zero)> v(static_cast<size_t>(n));
    if (want) std::memcpy(v.data(), raw.data(), want);
    return from_vector(v, shape, o);
  };
  switch (d->dtype) {
    case DType::Float32: return typed(float());
    case DType::Float64: return typed(double());
    case DType::Int32: return typed(int32_t());
    case DType::Int64: return typed(int64_t());
    case DType::Bool: {
      std::vector<uint8_t> v(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) v[size_t(i)] = raw[size_t(i)] != 0;
      return from_vector(v, shape, o);
    }
    case DType::Float16: {
      std::vector<float> v(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        uint16_t b;
        std::memcpy(&b, raw.data() + 2 * i, 2);
        v[size_t(i)] = half::f16_to_float(b);
      }
      return from_vector(v, shape, o);
    }
    default: break;
  }
  npy_fail(path, "unreachable dtype");
}

void save_npy(const std::string& path, const Tensor& t_in) {
  Tensor t = t_in.to(Device("cpu"));
  if (t.dtype() == DType::BFloat16) t = t.to(DType::Float32);  // NumPy has no bfloat16
  const Descr* d = nullptr;
  for (const Descr& c : kDescrs)
    if (c.dtype == t.dtype()) d = &c;
  std::string shape = "(";
  for (int64_t e : t.shape()) shape += std::to_string(e) + ", ";
  if (t.dim() > 1) shape.resize(shape.size() - 2);
  else if (t.dim() == 1) shape.resize(shape.size() - 1);
  shape += ")";
  std::string h = std::string("{'descr': '") + d->code + "', 'fortran_order': False, 'shape': " + shape + ", }";
  size_t total = 10 + h.size() + 1;
  h.append((64 - total % 64) % 64, ' ');
  h += '\n';
  std::string data;
  auto put = [&](const auto& v) { data.assign(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(v[0])); };
  switch (t.dtype()) {
    case DType::Float32: put(t.to_vector<float>()); break;
    case DType::Float64: put(t.to_vector<double>()); break;
    case DType::Int32: put(t.to_vector<int32_t>()); break;
    case DType::Int64: put(t.to_vector<int64_t>()); break;
    case DType::Bool:
      for (int32_t x : t.to(DType::Int32).to_vector<int32_t>()) data.push_back(char(x != 0));
      break;
    case DType::Float16:
      for (float x : t.to_vector<float>()) {
        uint16_t b = half::float_to_f16(x);
        data.append(reinterpret_cast<const char*>(&b), 2);
      }
      break;
    default: break;
  }
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  uint16_t hl = uint16_t(h.size());
  char lb[2] = {char(hl & 0xff), char(hl >> 8)};
  f.write("\x93NUMPY\x01\x00", 8);
  f.write(lb, 2);
  f << h << data;
  if (!f.flush()) npy_fail(path, "cannot write the file");
}

}  // namespace tessera::io
