// libFuzzer: the IR's shape rules and verifier on graphs the input spells out. The bytes are read
// as a program: constant sources of small shapes, then ops (any primitive but Leaf) over earlier
// nodes with attributes, requested shapes and dtypes from the input (mostly small numbers, now and
// then any 64-bit integer). Each op is built through ir::make, whose rule must accept it or raise
// one tessera::Error; the nodes built then form a graph that ir::verify must accept. A crash, a
// sanitizer report (an overflow in a shape rule ...) or another exception is a finding.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ir/graph.h"
#include "ir/node.h"
#include "tessera/error.h"

namespace {

namespace ir = tessera::ir;
using tessera::DType;

struct Reader {
  const uint8_t* p;
  size_t n;
  bool empty() const { return n == 0; }
  uint8_t byte() {
    if (n == 0) return 0;
    --n;
    return *p++;
  }
  // Mostly -4..27; after a 0xff byte, any int64 from the next 8 bytes.
  int64_t integer() {
    uint8_t b = byte();
    if (b != 0xff) return int64_t(b % 32) - 4;
    int64_t v = 0;
    for (int i = 0; i < 8; ++i) v = int64_t(uint64_t(v) << 8 | byte());
    return v;
  }
  tessera::Shape shape(int max_rank) {
    tessera::Shape s(byte() % (max_rank + 1));
    for (auto& d : s) d = byte() % 6;
    return s;
  }
  DType dtype() {
    static const DType all[] = {DType::Bool, DType::Int32, DType::Int64, DType::Float16, DType::BFloat16, DType::Float32, DType::Float64};
    return all[byte() % 7];
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Reader r{data, size};
  std::vector<ir::NodePtr> nodes;
  const int sources = 1 + r.byte() % 3;
  for (int i = 0; i < sources; ++i) {
    tessera::Shape s = r.shape(3);
    nodes.push_back(ir::make(ir::Op::Full, {}, {{}, 1.5}, &s, r.dtype()));
  }
  for (int step = 0; step < 24 && !r.empty(); ++step) {
    const auto op = ir::Op(1 + r.byte() % (ir::kNumOps - 1));  // never Leaf (it needs a buffer)
    const int arity = ir::info(op).arity;
    std::vector<ir::NodePtr> inputs(size_t(arity < 0 ? 1 + r.byte() % 3 : arity));
    for (auto& in : inputs) in = nodes[r.byte() % nodes.size()];
    ir::Attrs attrs;
    attrs.ints.resize(r.byte() % 13);
    for (auto& v : attrs.ints) v = r.integer();
    attrs.f = double(int8_t(r.byte())) / 4;
    const uint8_t flags = r.byte();
    tessera::Shape shape = r.shape(4);
    const DType dtype = r.dtype();
    try {
      nodes.push_back(ir::make(op, std::move(inputs), std::move(attrs), (flags & 1) ? &shape : nullptr,
                               (flags & 2) ? std::optional<DType>(dtype) : std::nullopt));
    } catch (const tessera::Error&) {
    }
  }
  // Everything built is well-formed: the verifier agrees with the rules that built it.
  ir::verify(ir::build_graph({nodes.back(), nodes[nodes.size() / 2], nodes.front()}));
  return 0;
}
