// Op::Rng as StableHLO: Philox4x32-10 (core/philox.h) written out in integer ops on the graph's
// runtime {seed, offset} argument, then the same uniform / Box-Muller transforms in float64, so
// every value is bit-identical to the cpu backend's (float64 log/cos are libm's on both sides).
#include "backends/stablehlo/lower.h"

namespace tessera::stablehlo {
namespace {

struct Philox {
  Writer& w;
  Shape s;
  V lo32(const V& x) { return w.convert(x, "ui32"); }  // integer converts truncate
  V hi32(const V& x) { return w.convert(w.binary("stablehlo.shift_right_logical", x, w.constant(32, x.shape, "ui64")), "ui32"); }
  V x3(const V& a, const V& b, const V& c) { return w.binary("stablehlo.xor", w.binary("stablehlo.xor", a, b), c); }
  V mul_wide(const V& x, double m) { return w.binary("stablehlo.multiply", w.convert(x, "ui64"), w.constant(m, s, "ui64")); }
};

// 24 random bits of a word as float64 in [0, 1): (w >> 8) * 2^-24.
V bits24(Writer& w, const V& word, double add) {
  V b = w.convert(w.binary("stablehlo.shift_right_logical", word, w.constant(8, word.shape, "ui32")), "f64");
  if (add != 0) b = w.binary("stablehlo.add", b, w.constant(add, word.shape, "f64"));
  return w.binary("stablehlo.multiply", b, w.constant(1.0 / 16777216.0, word.shape, "f64"));
}

}  // namespace

V lower_rng(Lowering& L, const ir::Node& n) {
  Writer& w = L.w;
  const Shape& s = n.shape;
  Philox p{w, s};
  const int64_t count = numel(s);
  V index = w.reshape(w.iota({count}, 0, "ui64"), s);
  if (n.attrs.ints.size() > 2 && n.attrs.ints[2] != 0)  // a batch slice's first element
    index = w.binary("stablehlo.add", index, w.constant(double(n.attrs.ints[2]), s, "ui64"));
  V seed = w.element(L.rng_state, 0);
  V stream = w.binary("stablehlo.add", w.element(L.rng_state, 1), w.constant(double(uint32_t(n.attrs.ints.at(0))), {}, "ui64"));
  V c0 = p.lo32(index), c1 = p.hi32(index);
  V c2 = w.splat(p.lo32(stream), s), c3 = w.splat(p.hi32(stream), s);
  V k0 = p.lo32(seed), k1 = p.hi32(seed);
  const V inc0 = w.constant(0x9E3779B9u, {}, "ui32"), inc1 = w.constant(0xBB67AE85u, {}, "ui32");
  for (int r = 0; r < 10; ++r) {
    V p0 = p.mul_wide(c0, 0xD2511F53u), p1 = p.mul_wide(c2, 0xCD9E8D57u);
    c0 = p.x3(p.hi32(p1), c1, w.splat(k0, s));
    c2 = p.x3(p.hi32(p0), c3, w.splat(k1, s));
    c1 = p.lo32(p1);
    c3 = p.lo32(p0);
    if (r < 9) {
      k0 = w.binary("stablehlo.add", k0, inc0);
      k1 = w.binary("stablehlo.add", k1, inc1);
    }
  }
  V x;
  if (n.attrs.ints.at(1) == 0) {  // uniform [0, 1)
    x = bits24(w, c0, 0);
  } else {  // standard normal: sqrt(-2 log u1) * cos(2 pi u2), u1 in (0, 1]
    V u1 = bits24(w, c0, 1), u2 = bits24(w, c1, 0);
    V rad = w.unary("stablehlo.sqrt", w.binary("stablehlo.multiply", w.constant(-2.0, s, "f64"), w.unary("stablehlo.log", u1)));
    V ang = w.binary("stablehlo.multiply", w.constant(6.283185307179586, s, "f64"), u2);
    x = w.binary("stablehlo.multiply", rad, w.unary("stablehlo.cosine", ang));
  }
  return cast(w, x, DType::Float64, n.dtype);
}

}  // namespace tessera::stablehlo
