// The StableHLO emitter's text writer: SSA values with their tensor types, and one method per
// StableHLO op the emitter uses, each printed in MLIR's generic form ("stablehlo.add"(...) : type),
// which every StableHLO parser accepts whatever its pretty syntax. Internal to src/backends/stablehlo.
#pragma once
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "tessera/dtype.h"
#include "tessera/shape.h"

namespace tessera::stablehlo {

// An SSA value: its name, shape and MLIR element type ("f32", "i1", "ui32", ...).
struct V {
  std::string id;
  Shape shape;
  std::string elem;
  std::string type() const;
};

std::string elem_of(DType t);                     // f32, f16, bf16, f64, i32, i64, i1
std::string tensor_type(const Shape& s, const std::string& elem);
std::string i64_array(const std::vector<int64_t>& v);  // array<i64: 1, 2> / array<i64>
std::string int_list(const std::vector<int64_t>& v);   // [1, 2]
std::vector<int64_t> iota_vec(int64_t n, int64_t from = 0);
// A scalar literal of `elem` for a dense attribute: exact (hex bits for floats), rounded to the
// element type as the reference rounds (float16/bfloat16 through float32).
std::string literal(double v, const std::string& elem);
std::string quote(const std::string& s);  // an MLIR string literal

class Writer {
 public:
  std::string loc;  // appended to every op: "" or " loc(\"scope\")"

  // Generic op: `"name"(args) ({regions}) {attrs} : (arg types) -> result type`.
  V op(const std::string& name, const std::vector<V>& args, const Shape& shape, const std::string& elem,
       const std::string& attrs = "", const std::string& region = "");
  V unary(const std::string& name, const V& x) { return op(name, {x}, x.shape, x.elem); }
  V binary(const std::string& name, const V& a, const V& b) { return op(name, {a, b}, a.shape, a.elem); }
  V constant(double v, const Shape& shape, const std::string& elem);
  V convert(const V& x, const std::string& elem);
  V reshape(const V& x, const Shape& shape);
  V broadcast(const V& x, const Shape& shape, const std::vector<int64_t>& dims);
  V splat(const V& scalar, const Shape& shape) { return broadcast(scalar, shape, {}); }
  V compare(const char* dir, const V& a, const V& b);  // dir: EQ NE LT LE GT GE
  V select(const V& c, const V& a, const V& b) { return op("stablehlo.select", {c, a, b}, a.shape, a.elem); }
  V iota(const Shape& shape, int64_t dim, const std::string& elem);
  V slice(const V& x, const std::vector<int64_t>& start, const std::vector<int64_t>& limit,
          const std::vector<int64_t>& strides);
  V concat(const std::vector<V>& xs, int64_t dim);
  // Reduces `dims` of x with the binary op `body` ("stablehlo.add", ...) from `init` (a scalar);
  // the reduced dimensions are dropped.
  V reduce(const V& x, const V& init, const std::vector<int64_t>& dims, const std::string& body);
  // A region ^bb0(a, b: tensor<elem>) returning body(a, b): reduce and scatter bodies.
  std::string binary_region(const std::string& body, const std::string& elem);
  // A scalar of x (rank 1) at position i, as tensor<elem>.
  V element(const V& x, int64_t i);

  std::string fresh();  // a new SSA name
  std::string text() const { return out_.str(); }
  void line(const std::string& s) { out_ << "    " << s << "\n"; }

 private:
  std::ostringstream out_;
  int next_ = 0;
};

}  // namespace tessera::stablehlo
