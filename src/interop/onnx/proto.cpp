// Reading ONNX's protobuf files: whole files, TensorProtos (inline, typed fields or external
// data) into tensors, and TensorProto .pb files in and out. Every size is checked against the
// bytes actually present before a buffer is allocated.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include <google/protobuf/stubs/logging.h>

#include "core/half.h"
#include "interop/onnx/graph.h"

namespace tessera::onnx::detail {
namespace fs = std::filesystem;

void fail(const std::string& where, const std::string& what) { throw Error("onnx: " + where + ": " + what); }

std::string read_file(const std::string& path, const std::string& what) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) fail(path, "no such " + what + " file");
  uintmax_t size = fs::file_size(path, ec);
  if (ec) fail(path, "cannot read its size: " + ec.message());
  if (size > uintmax_t(std::numeric_limits<int32_t>::max()))
    fail(path, "is " + std::to_string(size) + " bytes, beyond protobuf's 2 GiB limit (store the weights as external data)");
  std::string bytes(size, '\0');
  std::ifstream f(path, std::ios::binary);
  if (!f || !f.read(bytes.data(), std::streamsize(size))) fail(path, "cannot read the file");
  return bytes;
}

bool parse_quietly(google::protobuf::MessageLite& m, const std::string& bytes) {
  auto* previous = google::protobuf::SetLogHandler([](google::protobuf::LogLevel, const char*, int, const std::string&) {});
  bool ok = m.ParseFromString(bytes);
  google::protobuf::SetLogHandler(previous);
  return ok;
}

const char* onnx_type_name(int32_t t) {
  using TP = ::onnx::TensorProto;
  switch (t) {
    case TP::FLOAT: return "float32";
    case TP::UINT8: return "uint8";
    case TP::INT8: return "int8";
    case TP::UINT16: return "uint16";
    case TP::INT16: return "int16";
    case TP::INT32: return "int32";
    case TP::INT64: return "int64";
    case TP::STRING: return "string";
    case TP::BOOL: return "bool";
    case TP::FLOAT16: return "float16";
    case TP::DOUBLE: return "float64";
    case TP::UINT32: return "uint32";
    case TP::UINT64: return "uint64";
    case TP::COMPLEX64: return "complex64";
    case TP::COMPLEX128: return "complex128";
    case TP::BFLOAT16: return "bfloat16";
    default: return "unknown";
  }
}

DType to_dtype(int32_t t, const std::string& where) {
  using TP = ::onnx::TensorProto;
  switch (t) {
    case TP::FLOAT: return DType::Float32;
    case TP::DOUBLE: return DType::Float64;
    case TP::FLOAT16: return DType::Float16;
    case TP::BFLOAT16: return DType::BFloat16;
    case TP::INT32: return DType::Int32;
    case TP::INT64: return DType::Int64;
    case TP::BOOL: return DType::Bool;
    default:
      fail(where, std::string("element type ") + onnx_type_name(t) + " (" + std::to_string(t) +
                      ") has no Tessera dtype (bool, int32, int64, float16, bfloat16, float32, float64)");
  }
}

static int32_t to_onnx_type(DType d) {
  using TP = ::onnx::TensorProto;
  switch (d) {
    case DType::Float32: return TP::FLOAT;
    case DType::Float64: return TP::DOUBLE;
    case DType::Float16: return TP::FLOAT16;
    case DType::BFloat16: return TP::BFLOAT16;
    case DType::Int32: return TP::INT32;
    case DType::Int64: return TP::INT64;
    case DType::Bool: return TP::BOOL;
  }
  return TP::UNDEFINED;
}

namespace {

// The bytes of an external-data tensor: the file must lie inside the model's folder (after
// resolving links) and hold offset + length bytes.
std::string external_bytes(const ::onnx::TensorProto& t, const std::string& dir, size_t want, const std::string& where) {
  if (dir.empty()) fail(where, "external data is only read for tensors of a model file");
  std::string location;
  int64_t offset = 0, length = -1;
  for (const auto& kv : t.external_data()) {
    try {
      if (kv.key() == "location") location = kv.value();
      else if (kv.key() == "offset") offset = std::stoll(kv.value());
      else if (kv.key() == "length") length = std::stoll(kv.value());
    } catch (const std::exception&) {
      fail(where, "external data " + kv.key() + " '" + kv.value() + "' is not a number");
    }
  }
  if (location.empty()) fail(where, "external data without a location");
  fs::path rel(location);
  if (rel.is_absolute()) fail(where, "external data location '" + location + "' is absolute: refused (it must lie in the model's folder)");
  std::error_code ec;
  fs::path base = fs::weakly_canonical(fs::path(dir), ec);
  fs::path full = fs::weakly_canonical(base / rel, ec);
  if (ec) fail(where, "external data location '" + location + "': " + ec.message());
  auto [b, f] = std::mismatch(base.begin(), base.end(), full.begin(), full.end());
  if (b != base.end() || full == base)
    fail(where, "external data location '" + location + "' leaves the model's folder: refused");
  if (!fs::is_regular_file(full, ec)) fail(where, "external data file '" + location + "' not found");
  uintmax_t size = fs::file_size(full, ec);
  if (offset < 0 || uintmax_t(offset) > size) fail(where, "external data offset " + std::to_string(offset) + " beyond the file's " + std::to_string(size) + " bytes");
  if (length >= 0 && size_t(length) != want)
    fail(where, "external data length " + std::to_string(length) + " does not match the " + std::to_string(want) + " bytes of its shape");
  if (want > size - uintmax_t(offset))
    fail(where, "external data needs " + std::to_string(want) + " bytes at offset " + std::to_string(offset) + " but '" + location +
                    "' holds " + std::to_string(size) + " bytes");
  std::string bytes(want, '\0');
  std::ifstream in(full, std::ios::binary);
  in.seekg(offset);
  if (!in || !in.read(bytes.data(), std::streamsize(want))) fail(where, "cannot read external data file '" + location + "'");
  return bytes;
}

template <class T> T load_le(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

}  // namespace

Tensor to_tensor(const ::onnx::TensorProto& t, const std::string& dir, const Device& device, const std::string& where_in) {
  using TP = ::onnx::TensorProto;
  std::string where = where_in + (t.name().empty() ? "" : " tensor '" + t.name() + "'");
  if (t.has_segment()) fail(where, "segmented tensors are not supported");
  DType dt = to_dtype(t.data_type(), where);
  Shape shape;
  int64_t n = 1;
  for (int64_t d : t.dims()) {
    if (d < 0) fail(where, "negative dimension " + std::to_string(d));
    if (d > 0 && n > (int64_t(1) << 40) / d) fail(where, "more than 2^40 elements");
    n *= d;
    shape.push_back(d);
  }
  // Stored element size: bool is one byte, halves two.
  size_t esize = itemsize(dt);
  size_t want = size_t(n) * esize;
  auto count_check = [&](int64_t have, const char* field) {
    if (have != n)
      fail(where, std::string(field) + " holds " + std::to_string(have) + " values, its shape " + shape_str(shape) + " needs " + std::to_string(n));
  };
  TensorOptions o{dt, device};
  std::string ext;
  const std::string* raw = nullptr;
  if (t.data_location() == TP::EXTERNAL) {
    ext = external_bytes(t, dir, want, where);
    raw = &ext;
  } else if (t.has_raw_data()) {
    if (t.raw_data().size() != want)
      fail(where, "raw_data holds " + std::to_string(t.raw_data().size()) + " bytes, its shape " + shape_str(shape) + " of " +
                      dtype_name(dt) + " needs " + std::to_string(want));
    raw = &t.raw_data();
  }
  // Raw little-endian bytes, or the typed field the format keeps this type in.
  auto typed = [&](auto zero, const auto& field, const char* field_name) {
    std::vector<decltype(zero)> v;
    if (raw) {
      v.resize(static_cast<size_t>(n));
      if (want) std::memcpy(v.data(), raw->data(), want);  // want == 0: v.data() may be null
    } else {
      count_check(field.size(), field_name);
      v.assign(field.begin(), field.end());
    }
    return from_vector(v, shape, o);
  };
  switch (dt) {
    case DType::Float32: return typed(float(), t.float_data(), "float_data");
    case DType::Float64: return typed(double(), t.double_data(), "double_data");
    case DType::Int64: return typed(int64_t(), t.int64_data(), "int64_data");
    case DType::Int32: return typed(int32_t(), t.int32_data(), "int32_data");
    case DType::Bool: {
      if (!raw) count_check(t.int32_data_size(), "int32_data");
      std::vector<uint8_t> v(static_cast<size_t>(n));
      for (int64_t k = 0; k < n; ++k) v[k] = raw ? uint8_t((*raw)[k] != 0) : uint8_t(t.int32_data(int(k)) != 0);
      return from_vector(v, shape, o);
    }
    case DType::Float16:
    case DType::BFloat16: {  // 16-bit patterns: raw little-endian, or one per int32_data entry
      if (!raw) count_check(t.int32_data_size(), "int32_data");
      std::vector<float> v(static_cast<size_t>(n));
      for (int64_t k = 0; k < n; ++k) {
        uint16_t b = raw ? load_le<uint16_t>(raw->data() + 2 * k) : uint16_t(t.int32_data(int(k)));
        v[k] = dt == DType::Float16 ? half::f16_to_float(b) : half::bf16_to_float(b);
      }
      return from_vector(v, shape, o);
    }
  }
  fail(where, "unreachable dtype");
}

}  // namespace tessera::onnx::detail

namespace tessera::onnx {

Tensor load_tensor(const std::string& path, std::string* name, const Device& device) {
  std::string bytes = detail::read_file(path, "TensorProto");
  ::onnx::TensorProto t;
  if (!detail::parse_quietly(t, bytes)) detail::fail(path, "not a serialized ONNX TensorProto (malformed or truncated)");
  if (name) *name = t.name();
  return detail::to_tensor(t, "", device, path);
}

void save_tensor(const std::string& path, const Tensor& t_in, const std::string& name) {
  ::onnx::TensorProto t;
  t.set_name(name);
  t.set_data_type(detail::to_onnx_type(t_in.dtype()));
  for (int64_t d : t_in.shape()) t.add_dims(d);
  Tensor h = t_in.to(Device("cpu"));
  std::string raw;
  auto put = [&](const auto& v, size_t esize) { raw.assign(reinterpret_cast<const char*>(v.data()), v.size() * esize); };
  switch (h.dtype()) {
    case DType::Float32: put(h.to_vector<float>(), 4); break;
    case DType::Float64: put(h.to_vector<double>(), 8); break;
    case DType::Int32: put(h.to_vector<int32_t>(), 4); break;
    case DType::Int64: put(h.to_vector<int64_t>(), 8); break;
    case DType::Bool:
      for (int32_t x : h.to(DType::Int32).to_vector<int32_t>()) raw.push_back(char(x != 0));
      break;
    case DType::Float16:
    case DType::BFloat16:
      for (float f : h.to_vector<float>()) {
        uint16_t b = h.dtype() == DType::Float16 ? half::float_to_f16(f) : half::float_to_bf16(f);
        raw.append(reinterpret_cast<const char*>(&b), 2);
      }
      break;
  }
  t.set_raw_data(raw);
  std::ofstream f(path, std::ios::binary);
  if (!f || !t.SerializeToOstream(&f)) detail::fail(path, "cannot write the TensorProto");
}

}  // namespace tessera::onnx
