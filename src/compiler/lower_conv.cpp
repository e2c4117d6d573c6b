// conv as im2col + GEMM: the input, padded and dilated (stored densely first when it is, so its
// masked view is read once rather than once per kernel position), is read through a window view
// as columns [B, G, F/G * kernel, positions]; a GEMM batched over batch and groups multiplies the
// kernel [G, O/G, F/G * kernel] (broadcast over the batch) with them.
#include <algorithm>

#include "compiler/lowering.h"
#include "ir/conv.h"

namespace tessera::compiler::lowering {

using kir::IndexMap;

int Lowerer::conv_input(int i, IndexMap& xm) {
  const ir::Node& n = *g.nodes[i];
  int xn = g.index.at(n.inputs[0].get());
  const Shape& xs = g.nodes[xn]->shape;
  const DType operands = n.inputs[0]->dtype;  // the product's dtype is float32 for 16-bit operands
  ir::ConvAttrs c = ir::ConvAttrs::from(n.attrs);
  size_t S = c.axes.size(), r = S + 2;
  Val xv = strided(xn, i);
  int xslot = xv.slot;
  xm = xv.map;
  bool has_pad = false;
  std::vector<int64_t> pads(3 * r, 0), crop;
  Shape padded = xs;
  for (size_t d = 0; d < S; ++d) {
    const ir::ConvAxis& a = c.axes[d];
    has_pad |= a.lo != 0 || a.hi != 0;
    pads[3 * (d + 2)] = std::max<int64_t>(a.lo, 0);
    pads[3 * (d + 2) + 1] = std::max<int64_t>(a.hi, 0);
    pads[3 * (d + 2) + 2] = a.lhs_dilation - 1;
    padded[d + 2] = ir::conv_padded_extent(xs[d + 2], a);
  }
  bool dilated = false;
  for (const ir::ConvAxis& a : c.axes) dilated |= a.lhs_dilation > 1;
  if (dilated) {
    // Dilation first, as its own dense copy through one masked view: each spatial dim split
    // into [X, dilation] whose second index reads x only at 0 (interior padding would stack
    // views). The result [.., X * dilation, ..] has dilation - 1 zeros after each element.
    Shape split{xs[0], xs[1]}, merged{xs[0], xs[1]};
    std::vector<int64_t> sp(6, 0);
    for (size_t d = 0; d < S; ++d) {
      int64_t ld = c.axes[d].lhs_dilation;
      split.insert(split.end(), {xs[d + 2], 1});
      merged.push_back(xs[d + 2] * ld);
      sp.insert(sp.end(), {0, 0, 0, 0, ld - 1, 0});
    }
    xslot = copy_map(xslot, xm.reshape(split).pad(sp), operands, i);
    xm = IndexMap::contiguous(merged);
    // Its trailing zeros serve as up to dilation - 1 of the high padding.
    std::vector<int64_t> keep;
    for (size_t d = 0; d < r; ++d) {
      int64_t ext = d < 2 ? xs[d] : (xs[d] - 1) * c.axes[d - 2].lhs_dilation + 1;
      if (d >= 2) {
        const int64_t extra = std::min<int64_t>(pads[3 * d + 1], c.axes[d - 2].lhs_dilation - 1);
        ext += extra, pads[3 * d + 1] -= extra, pads[3 * d + 2] = 0;
      }
      keep.insert(keep.end(), {0, ext, 1});
    }
    xm = xm.slice(keep);
  }
  if (has_pad) {
    bool grows = false;
    for (size_t d = 2; d < r; ++d) grows |= pads[3 * d] > 0 || pads[3 * d + 1] > 0;
    for (size_t d = 0; d < r; ++d) {  // negative padding crops
      int64_t lo = d < 2 ? 0 : std::max<int64_t>(-c.axes[d - 2].lo, 0);
      crop.insert(crop.end(), {lo, lo + padded[d], 1});
    }
    if (grows) {
      xslot = copy_map(xslot, xm.pad(pads).slice(crop), operands, i);
      xm = IndexMap::contiguous(padded);
    } else {
      xm = xm.slice(crop);  // only crops: a view
    }
  }
  return xslot;
}

Val Lowerer::lower_conv(int i) {
  const ir::Node& n = *g.nodes[i];
  int xn = g.index.at(n.inputs[0].get()), wn = g.index.at(n.inputs[1].get());
  const Shape &xs = g.nodes[xn]->shape, &ks = g.nodes[wn]->shape;
  ir::ConvAttrs c = ir::ConvAttrs::from(n.attrs);
  size_t S = c.axes.size();
  int64_t B = xs[0], G = c.groups, Fg = ks[1], O = ks[0], kk = 1, pp = 1;
  for (size_t d = 0; d < S; ++d) kk *= ks[d + 2], pp *= n.shape[d + 2];
  IndexMap xm;
  int xslot = conv_input(i, xm);
  // Columns [B, G, F/G * kernel, positions] (output positions innermost) for a GEMM per batch
  // element and group, out[b, g] = kernel[g] @ cols[b, g]. When the kernel's last extent is the
  // longer (kernel gradients, whose kernel is an output gradient: [B, P] per batch element would
  // be a few columns deep), the batch is folded into the columns instead, [G, F/G * kernel,
  // B * positions], for one GEMM per group, kernel[g] @ cols[g], whose product [G, O/G, B, P]
  // is the output permuted.
  bool folded = ks.back() > n.shape.back();
  Shape ws, cols;
  std::vector<int64_t> dims, steps;
  auto add = [&](int64_t extent, int64_t dim, int64_t step) { ws.push_back(extent), dims.push_back(dim), steps.push_back(step); };
  auto add_kernel = [&] {
    add(Fg, 1, 1);
    for (size_t d = 0; d < S; ++d) add(ks[d + 2], int64_t(d + 2), c.axes[d].rhs_dilation);
  };
  auto add_positions = [&] {
    for (size_t d = 0; d < S; ++d) add(n.shape[d + 2], int64_t(d + 2), c.axes[d].stride);
  };
  if (folded) {
    add(G, 1, Fg), add_kernel(), add(B, 0, 1), add_positions();
    cols = {G, Fg * kk, B * pp};
  } else {
    add(B, 0, 1), add(G, 1, Fg), add_kernel(), add_positions();
    cols = {B, G, Fg * kk, pp};
  }
  IndexMap cm = xm.window(ws, dims, steps);
  const bool window = cm.single();
  if (window) {
    // The GEMM reads the columns through the window itself: a 1x1 kernel with unit strides is
    // the input; otherwise the backend packs each block of columns where it multiplies it.
    cm = cm.reshape(cols);
  } else {
    xslot = copy_map(xslot, cm, n.inputs[0]->dtype, i);
    cm = IndexMap::contiguous(cols);
  }
  // The kernel [O, F/G, kernel...] as [B (stride 0), G, O/G, F/G * kernel], or for the folded
  // product [G, O/G, F/G * kernel].
  Shape kshape = folded ? Shape{G, O / G, Fg * kk} : Shape{1, G, O / G, Fg * kk};
  Val wv = strided(wn, i);
  if (!wv.map.reshape(kshape).single()) wv = copy_to_slot(wn, i, kir::SlotKind::Temp, 0);
  IndexMap wm = wv.map.reshape(kshape);
  kir::Step st = begin(kir::StepKind::Gemm, i);
  st.input_dtypes = {n.inputs[0]->dtype, n.inputs[0]->dtype};  // 16-bit operands: a float32 product
  st.inputs = {wv.slot, xslot};
  if (!folded) {
    st.shape = {B, G, O / G, pp};
    st.maps = {wm.expand({B, G, O / G, Fg * kk}), cm};
    st.output = slot_for(i);
    // The product is the conv of inputs[1] (padded and dilated already, when it was copied so)
    // by the kernel inputs[0], both dense: a backend may run it with a library's conv.
    auto dense = [](const IndexMap& m) { return m.is_contiguous() && m.views[0].offset == 0; };
    if (window && dense(xm) && dense(wv.map)) {
      kir::Step::Conv conv{c, xm.shape(), ks};
      for (ir::ConvAxis& a : conv.attrs.axes) a.lo = a.hi = 0, a.lhs_dilation = 1;
      st.conv = std::move(conv);
    }
    return push(std::move(st), n.shape);
  }
  st.shape = {G, O / G, B * pp};
  st.maps = {wm, cm};
  st.output = new_slot(kir::SlotKind::Temp, 0, st.shape, n.dtype, st.sources.front());
  // The product [G, O/G, B, positions...] read as [B, O, positions...].
  Shape prod{G, O / G, B};
  std::vector<int64_t> perm{2, 0, 1};
  for (size_t d = 0; d < S; ++d) prod.push_back(n.shape[d + 2]), perm.push_back(int64_t(d + 3));
  Val v = push(std::move(st), prod);
  v.map = v.map.permute(perm).reshape(n.shape);
  return v;
}

}  // namespace tessera::compiler::lowering
