#include "compiler/passes/fuse.h"

#include <cstring>

namespace tessera::compiler {
namespace {

size_t instr_hash(const kir::Instr& in) {
  size_t h = size_t(in.code) * 0x100000001b3ull ^ size_t(in.dtype);
  auto mix = [&](size_t x) { h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
  mix(size_t(in.a + 1));
  mix(size_t(in.b + 1));
  mix(size_t(in.c + 1));
  mix(size_t(in.input + 1));
  uint64_t vb;
  std::memcpy(&vb, &in.value, 8);
  mix(size_t(vb));
  mix(size_t(in.i0));
  mix(size_t(in.i1));
  if (in.code == kir::Code::Load) mix(in.map.hash());
  return h;
}

}  // namespace

bool same_instr(const kir::Instr& x, const kir::Instr& y) {
  return x.code == y.code && x.dtype == y.dtype && x.a == y.a && x.b == y.b && x.c == y.c && x.input == y.input &&
         std::memcmp(&x.value, &y.value, 8) == 0 && x.i0 == y.i0 && x.i1 == y.i1 &&  // -0 is not 0
         (x.code != kir::Code::Load || x.map == y.map);
}

int Frag::add(const kir::Instr& in) {
  size_t h = instr_hash(in);
  auto [lo, hi] = seen_.equal_range(h);
  for (auto it = lo; it != hi; ++it)
    if (same_instr(ins[it->second], in)) return it->second;
  ins.push_back(in);
  int k = int(ins.size()) - 1;
  seen_.emplace(h, k);
  return k;
}

int Frag::paste(const Frag& other) {
  std::vector<int> at(other.ins.size());
  for (size_t k = 0; k < other.ins.size(); ++k) {
    kir::Instr in = other.ins[k];
    if (in.a >= 0) in.a = at[in.a];
    if (in.b >= 0) in.b = at[in.b];
    if (in.c >= 0) in.c = at[in.c];
    at[k] = add(in);
  }
  return at.empty() ? -1 : at.back();
}

Frag Frag::rebuilt(const std::function<void(kir::Instr&)>& edit) const {
  Frag f;
  std::vector<int> at(ins.size());
  for (size_t k = 0; k < ins.size(); ++k) {
    kir::Instr in = ins[k];
    edit(in);
    if (in.a >= 0) in.a = at[in.a];
    if (in.b >= 0) in.b = at[in.b];
    if (in.c >= 0) in.c = at[in.c];
    at[k] = f.add(in);
  }
  // The result must stay last: equal instructions may have merged it with an earlier one.
  if (!at.empty() && at.back() != int(f.ins.size()) - 1) {
    kir::Instr keep = f.ins[at.back()];
    f.ins.push_back(keep);  // a duplicate of the result, placed last (not registered)
  }
  return f;
}

int Frag::weight() const {
  int w = 0;
  for (auto& in : ins) {
    if (in.code == kir::Code::Load || in.code == kir::Code::Const) continue;
    w += (in.code == kir::Code::RowSum || in.code == kir::Code::RowMax) ? 4 : 1;
  }
  return w;
}

bool Frag::has(kir::Code c) const {
  for (auto& in : ins)
    if (in.code == c) return true;
  return false;
}

}  // namespace tessera::compiler
