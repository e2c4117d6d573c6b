// The StableHLO text writer (writer.h).
#include "backends/stablehlo/writer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "core/fail.h"
#include "core/half.h"

namespace tessera::stablehlo {

std::string V::type() const { return tensor_type(shape, elem); }

std::string elem_of(DType t) {
  switch (t) {
    case DType::Bool: return "i1";
    case DType::Int32: return "i32";
    case DType::Int64: return "i64";
    case DType::Float16: return "f16";
    case DType::BFloat16: return "bf16";
    case DType::Float32: return "f32";
    case DType::Float64: return "f64";
  }
  fail("stablehlo", "unknown dtype");
}

std::string tensor_type(const Shape& s, const std::string& elem) {
  std::string t = "tensor<";
  for (int64_t d : s) t += std::to_string(d) + "x";
  return t + elem + ">";
}

static std::string join(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(v[i]);
  }
  return s;
}
std::string i64_array(const std::vector<int64_t>& v) { return v.empty() ? "array<i64>" : "array<i64: " + join(v) + ">"; }
std::string int_list(const std::vector<int64_t>& v) {
  std::string s = "[";
  s += join(v);
  s += "]";
  return s;
}
std::vector<int64_t> iota_vec(int64_t n, int64_t from) {
  std::vector<int64_t> v;
  for (int64_t i = from; i < n; ++i) v.push_back(i);
  return v;
}

static int64_t to_int64(double x) {  // as the reference converts (truncation, saturation, NaN -> 0)
  if (std::isnan(x)) return 0;
  double t = std::trunc(x);
  if (t >= 9223372036854775808.0) return std::numeric_limits<int64_t>::max();
  if (t < -9223372036854775808.0) return std::numeric_limits<int64_t>::min();
  return int64_t(t);
}

static std::string hex(uint64_t bits, int digits) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%0*llX", digits, static_cast<unsigned long long>(bits));
  return buf;
}

std::string literal(double v, const std::string& elem) {
  if (elem == "i1") return v != 0 ? "true" : "false";
  if (elem == "i64") return std::to_string(to_int64(v));
  if (elem == "i32") return std::to_string(int32_t(uint32_t(to_int64(v))));
  if (elem == "ui32") return std::to_string(uint32_t(to_int64(v)));
  if (elem == "ui64") return std::to_string(uint64_t(to_int64(v)));
  if (elem == "f64") {
    uint64_t b;
    std::memcpy(&b, &v, 8);
    return hex(b, 16);
  }
  if (elem == "f32") return hex(half::bits(float(v)), 8);
  if (elem == "f16") return hex(half::float_to_f16(float(v)), 4);
  if (elem == "bf16") return hex(half::float_to_bf16(float(v)), 4);
  fail("stablehlo", "no literal of element type " + elem);
}

std::string quote(const std::string& s) {
  std::string q = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') q += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    q += c;
  }
  return q + "\"";
}

V Writer::op(const std::string& name, const std::vector<V>& args, const Shape& shape, const std::string& elem,
             const std::string& attrs, const std::string& region) {
  V r{fresh(), shape, elem};
  std::string s = r.id + " = \"" + name + "\"(";
  std::string types;
  for (size_t i = 0; i < args.size(); ++i) {
    if (i) s += ", ", types += ", ";
    s += args[i].id;
    types += args[i].type();
  }
  s += ")";
  if (!region.empty()) s += " (" + region + ")";
  if (!attrs.empty()) s += " {" + attrs + "}";
  s += " : (" + types + ") -> " + r.type() + loc;
  line(s);
  return r;
}

std::string Writer::fresh() {
  std::string s = "%";
  s += std::to_string(next_++);
  return s;
}

V Writer::constant(double v, const Shape& shape, const std::string& elem) {
  return op("stablehlo.constant", {}, shape, elem, "value = dense<" + literal(v, elem) + "> : " + tensor_type(shape, elem));
}

V Writer::convert(const V& x, const std::string& elem) {
  return x.elem == elem ? x : op("stablehlo.convert", {x}, x.shape, elem);
}

V Writer::reshape(const V& x, const Shape& shape) {
  return x.shape == shape ? x : op("stablehlo.reshape", {x}, shape, x.elem);
}

V Writer::broadcast(const V& x, const Shape& shape, const std::vector<int64_t>& dims) {
  if (x.shape == shape) return x;
  return op("stablehlo.broadcast_in_dim", {x}, shape, x.elem, "broadcast_dimensions = " + i64_array(dims));
}

V Writer::compare(const char* dir, const V& a, const V& b) {
  const char* kind = a.elem[0] == 'f' || a.elem == "bf16" ? "FLOAT" : a.elem[0] == 'u' || a.elem == "i1" ? "UNSIGNED" : "SIGNED";
  return op("stablehlo.compare", {a, b}, a.shape, "i1",
            std::string("comparison_direction = #stablehlo<comparison_direction ") + dir +
                ">, compare_type = #stablehlo<comparison_type " + kind + ">");
}

V Writer::iota(const Shape& shape, int64_t dim, const std::string& elem) {
  return op("stablehlo.iota", {}, shape, elem, "iota_dimension = " + std::to_string(dim) + " : i64");
}

V Writer::slice(const V& x, const std::vector<int64_t>& start, const std::vector<int64_t>& limit,
                const std::vector<int64_t>& strides) {
  Shape s(start.size());
  for (size_t d = 0; d < s.size(); ++d) s[d] = (limit[d] - start[d] + strides[d] - 1) / strides[d];
  return op("stablehlo.slice", {x}, s, x.elem,
            "start_indices = " + i64_array(start) + ", limit_indices = " + i64_array(limit) + ", strides = " + i64_array(strides));
}

V Writer::concat(const std::vector<V>& xs, int64_t dim) {
  if (xs.size() == 1) return xs[0];
  Shape s = xs[0].shape;
  s[size_t(dim)] = 0;
  for (const V& x : xs) s[size_t(dim)] += x.shape[size_t(dim)];
  return op("stablehlo.concatenate", xs, s, xs[0].elem, "dimension = " + std::to_string(dim) + " : i64");
}

std::string Writer::binary_region(const std::string& body, const std::string& elem) {
  std::string a = fresh(), b = fresh(), r = fresh(), t = tensor_type({}, elem);
  return "{\n    ^bb0(" + a + ": " + t + ", " + b + ": " + t + "):\n      " + r + " = \"" + body + "\"(" + a + ", " + b +
         ") : (" + t + ", " + t + ") -> " + t + "\n      \"stablehlo.return\"(" + r + ") : (" + t + ") -> ()\n    }";
}

V Writer::reduce(const V& x, const V& init, const std::vector<int64_t>& dims, const std::string& body) {
  Shape s;
  for (size_t d = 0; d < x.shape.size(); ++d)
    if (std::find(dims.begin(), dims.end(), int64_t(d)) == dims.end()) s.push_back(x.shape[d]);
  return op("stablehlo.reduce", {x, init}, s, x.elem, "dimensions = " + i64_array(dims), binary_region(body, x.elem));
}

V Writer::element(const V& x, int64_t i) {
  return reshape(slice(x, {i}, {i + 1}, {1}), {});
}

}  // namespace tessera::stablehlo
