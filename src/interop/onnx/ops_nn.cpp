// ONNX ops for networks: matmul and einsum, convolution, pooling, normalization, dropout.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "interop/onnx/ops_util.h"
#include "tessera/ops.h"

namespace tessera::onnx::detail {
namespace {

// ---- convolution and pooling ----
// A per-channel vector [C] as [1, C, 1, ...] of `rank` dims.
Tensor channel_view(const Tensor& t, int64_t rank) {
  Shape s(size_t(rank), 1);
  s[1] = -1;
  return t.reshape(s);
}

struct Window {
  std::vector<int64_t> kernel, stride, dilation, lo, hi, out;
};
// Resolves ONNX's pads / auto_pad / ceil_mode for the spatial dims of `x` ([N, C, ...]).
Window window(const Ctx& c, const Tensor& x, std::vector<int64_t> kernel, bool ceil_allowed) {
  size_t sd = size_t(x.dim() - 2);
  if (x.dim() < 3) c.fail("needs [N, C, spatial...], got " + shape_str(x.shape()));
  if (kernel.size() != sd) c.fail("kernel_shape " + shape_str(kernel) + " does not match the input " + shape_str(x.shape()));
  Window w;
  w.kernel = kernel;
  w.stride = c.ints("strides", std::vector<int64_t>(sd, 1));
  w.dilation = c.ints("dilations", std::vector<int64_t>(sd, 1));
  std::vector<int64_t> pads = c.ints("pads", std::vector<int64_t>(2 * sd, 0));
  if (w.stride.size() != sd || w.dilation.size() != sd || pads.size() != 2 * sd) c.fail("strides, dilations or pads do not match the spatial rank");
  std::string ap = c.s("auto_pad", "NOTSET");
  bool ceil = ceil_allowed && c.i("ceil_mode", 0) != 0;
  for (size_t i = 0; i < sd; ++i) {
    int64_t in = x.size(int64_t(2 + i)), ek = (w.kernel[i] - 1) * w.dilation[i] + 1, s = w.stride[i];
    if (s < 1 || w.dilation[i] < 1) c.fail("strides and dilations must be positive");
    int64_t lo = pads[i], hi = pads[i + sd], out;
    if (ap == "SAME_UPPER" || ap == "SAME_LOWER") {
      out = (in + s - 1) / s;
      int64_t total = std::max<int64_t>(0, (out - 1) * s + ek - in);
      lo = ap == "SAME_UPPER" ? total / 2 : total - total / 2;
      hi = total - lo;
    } else {
      if (ap == "VALID") lo = hi = 0;
      else if (ap != "NOTSET") c.fail("auto_pad '" + ap + "' is not supported");
      int64_t span = in + lo + hi - ek;
      if (span < 0) c.fail("the kernel is larger than the padded input " + shape_str(x.shape()));
      out = (ceil ? (span + s - 1) / s : span / s) + 1;
      if (ceil && (out - 1) * s >= in + lo) --out;  // the last window must start inside the input
    }
    w.lo.push_back(lo);
    w.hi.push_back(hi);
    w.out.push_back(out);
  }
  return w;
}
// Pads the spatial dims, the window's extent past hi (ceil mode) included.
Tensor pad_spatial(const Tensor& x, const Window& w, double value, double extra_value) {
  size_t sd = w.kernel.size();
  std::vector<int64_t> p(size_t(2 * x.dim()), 0), extra(size_t(2 * x.dim()), 0);
  bool any_extra = false;
  for (size_t i = 0; i < sd; ++i) {
    int64_t in = x.size(int64_t(2 + i)), need = (w.out[i] - 1) * w.stride[i] + (w.kernel[i] - 1) * w.dilation[i] + 1;
    p[2 * (2 + i)] = w.lo[i];
    p[2 * (2 + i) + 1] = std::max<int64_t>(0, w.hi[i]);
    int64_t have = in + w.lo[i] + w.hi[i];
    extra[2 * (2 + i) + 1] = std::max<int64_t>(0, need - have);
    any_extra = any_extra || need > have;
  }
  Tensor r = pad(x, p, value);
  return any_extra ? pad(r, extra, extra_value) : r;
}
// Calls f(slicer) once per kernel tap; slicer(t) is the tap's strided window grid of a padded t.
template <class F> void for_taps(const Window& w, F f) {
  size_t sd = w.kernel.size();
  std::vector<int64_t> tap(sd, 0);
  for (;;) {
    f([&](const Tensor& t) {
      Tensor s = t;
      for (size_t i = 0; i < sd; ++i) {
        int64_t start = tap[i] * w.dilation[i];
        s = slice(s, int64_t(2 + i), start, start + (w.out[i] - 1) * w.stride[i] + 1, w.stride[i]);
      }
      return s;
    });
    size_t i = 0;
    while (i < sd && ++tap[i] == w.kernel[i]) tap[i++] = 0;
    if (i == sd) break;
  }
}
template <class F> Tensor over_taps(const Tensor& xp, const Window& w, F combine) {
  Tensor acc;
  for_taps(w, [&](const auto& at) {
    Tensor s = at(xp);
    acc = acc.defined() ? combine(acc, s) : s;
  });
  return acc;
}

// MaxPool, with the flat index of each maximum (the first one; storage_order 1: spatial dims
// counted column-major) as its second output.
Ts max_pool(Ctx& c) {
  const Tensor& x = c.input(0);
  Window w = window(c, x, c.ints("kernel_shape"), true);
  double lowest = is_floating(x.dtype()) ? -kInf : -9.2e18;
  Tensor xp = pad_spatial(x, w, lowest, lowest);
  if (c.node.output_size() < 2 || c.node.output(1).empty())
    return {over_taps(xp, w, [](const Tensor& a, const Tensor& b) { return maximum(a, b); })};
  Shape s = x.shape();
  std::vector<int64_t> perm{0, 1};
  if (c.i("storage_order", 0)) std::reverse(s.begin() + 2, s.end());
  for (int64_t d = x.dim() - 1; d >= 2; --d) perm.push_back(c.i("storage_order", 0) ? d : x.dim() + 1 - d);
  Tensor pos = arange(double(x.numel()), TensorOptions{DType::Int64, x.device()}).reshape(s).permute(perm);
  Tensor ip = pad_spatial(pos, w, -1, -1), best, best_i;
  for_taps(w, [&](const auto& at) {
    Tensor v = at(xp), i = at(ip);
    if (!best.defined()) {
      best = v, best_i = i;
      return;
    }
    Tensor take = v > best;
    best_i = where(take, i, best_i);
    best = maximum(best, v);
  });
  return {best, best_i};
}
Tensor avg_pool(Ctx& c) {
  const Tensor& x = c.input(0);
  Window w = window(c, x, c.ints("kernel_shape"), true);
  auto add_ = [](const Tensor& a, const Tensor& b) { return a + b; };
  Tensor total = over_taps(pad_spatial(x, w, 0, 0), w, add_);
  // The number of cells each window averages: the input's, plus the pads where they count.
  Shape ones_shape = x.shape();
  ones_shape[0] = ones_shape[1] = 1;
  Tensor one = ones(ones_shape, {x.dtype(), x.device()});
  bool include_pad = c.i("count_include_pad", 0) != 0;
  Tensor count = over_taps(pad_spatial(one, w, include_pad ? 1 : 0, 0), w, add_);
  return total / count;
}

Tensor conv(Ctx& c) {
  const Tensor &x = c.input(0), &wt = c.input(1);
  if (wt.dim() != x.dim()) c.fail("weight " + shape_str(wt.shape()) + " does not match input " + shape_str(x.shape()));
  Shape ks(wt.shape().begin() + 2, wt.shape().end());
  Window w = window(c, x, c.ints("kernel_shape", ks), false);
  ConvGeneralOptions o;
  o.stride = w.stride;
  o.pad_lo = w.lo;
  o.pad_hi = w.hi;
  o.rhs_dilation = w.dilation;
  o.groups = c.i("group", 1);
  Tensor y = conv_general(x, wt, o);
  return c.has_input(2) ? y + channel_view(c.input(2), y.dim()) : y;
}

Tensor conv_transpose(Ctx& c) {
  const Tensor &x = c.input(0), &wt = c.input(1);
  if (wt.dim() != x.dim() || x.dim() < 3) c.fail("weight " + shape_str(wt.shape()) + " does not match input " + shape_str(x.shape()));
  size_t sd = size_t(x.dim() - 2);
  int64_t g = c.i("group", 1), cin = wt.size(0), cout_g = wt.size(1);
  Shape ks(wt.shape().begin() + 2, wt.shape().end());
  std::vector<int64_t> stride = c.ints("strides", std::vector<int64_t>(sd, 1)), dil = c.ints("dilations", std::vector<int64_t>(sd, 1)),
                       pads = c.ints("pads", std::vector<int64_t>(2 * sd, 0)), opad = c.ints("output_padding", std::vector<int64_t>(sd, 0)),
                       oshape = c.ints("output_shape");
  if (stride.size() != sd || dil.size() != sd || pads.size() != 2 * sd || opad.size() != sd) c.fail("strides, dilations, pads or output_padding do not match the spatial rank");
  std::string ap = c.s("auto_pad", "NOTSET");
  if (!oshape.empty() && oshape.size() != sd) oshape.erase(oshape.begin(), oshape.end() - int64_t(sd));
  // The equivalent convolution: zeros between inputs, the kernel flipped with in/out swapped.
  ConvGeneralOptions o;
  o.stride.assign(sd, 1);
  o.lhs_dilation = stride;
  o.rhs_dilation = dil;
  o.groups = g;
  for (size_t i = 0; i < sd; ++i) {
    int64_t in = x.size(int64_t(2 + i)), ek = (ks[i] - 1) * dil[i] + 1;
    int64_t lo = pads[i], hi = pads[i + sd];
    if (!oshape.empty() || ap == "SAME_UPPER" || ap == "SAME_LOWER") {
      int64_t target = oshape.empty() ? in * stride[i] : oshape[i];
      int64_t total = stride[i] * (in - 1) + opad[i] + ek - target;
      int64_t half = total >= 0 ? total / 2 : -((1 - total) / 2);  // floor(total / 2), as ONNX's reference
      lo = ap == "SAME_UPPER" ? half : total - half;
      hi = total - lo;
    }
    o.pad_lo.push_back(ek - 1 - lo);
    o.pad_hi.push_back(ek - 1 - hi + opad[i]);
  }
  Shape grouped{g, cin / g, cout_g};
  grouped.insert(grouped.end(), ks.begin(), ks.end());
  Shape flat{g * cout_g, cin / g};
  flat.insert(flat.end(), ks.begin(), ks.end());
  std::vector<int64_t> sp;
  for (size_t i = 0; i < sd; ++i) sp.push_back(int64_t(2 + i));
  Tensor w2 = flip(wt.reshape(grouped).transpose(1, 2).reshape(flat), sp);
  Tensor y = conv_general(x, w2, o);
  return c.has_input(2) ? y + channel_view(c.input(2), y.dim()) : y;
}

Ts batch_norm_(Ctx& c) {
  const Tensor &x = c.input(0), &scale = c.input(1), &b = c.input(2), &rm = c.input(3), &rv = c.input(4);
  double eps = c.f("epsilon", 1e-5), momentum = c.f("momentum", 0.9);
  int64_t r = x.dim();
  auto norm = [&](const Tensor& m, const Tensor& v) {
    return (x - channel_view(m, r)) / sqrt(channel_view(v, r) + eps) * channel_view(scale, r) + channel_view(b, r);
  };
  if (c.opset < 14 || c.i("training_mode", 0) == 0) return {norm(rm, rv)};
  // Training: the batch's statistics (variance biased) normalize, the running ones are updated.
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < r; ++d)
    if (d != 1) dims.push_back(d);
  Tensor m = mean(x, dims), v = var(x, dims, 0);
  return {norm(m, v), rm * momentum + m * (1 - momentum), rv * momentum + v * (1 - momentum)};
}

// Normalizes over `dims` (kept), in float32 at least; returns y, mean and 1/std.
std::tuple<Tensor, Tensor, Tensor> normalize(const Tensor& x_in, const std::vector<int64_t>& dims, double eps) {
  Tensor x = x_in.to(compute_dtype(x_in.dtype()));
  Tensor m = mean(x, dims, true), d = x - m;
  Tensor inv = rsqrt(mean(d * d, dims, true) + eps);
  return {d * inv, m, inv};
}

Ts layer_norm_(Ctx& c) {
  const Tensor& x = c.input(0);
  int64_t axis = axis_of(c, c.i("axis", -1), x.dim());
  std::vector<int64_t> dims;
  for (int64_t d = axis; d < x.dim(); ++d) dims.push_back(d);
  auto [y, m, inv] = normalize(x, dims, c.f("epsilon", 1e-5));
  y = (y * c.input(1)).to(x.dtype());
  if (c.has_input(2)) y = y + c.input(2);
  return {y, m, inv};
}

Tensor instance_norm(Ctx& c) {
  const Tensor& x = c.input(0);
  std::vector<int64_t> dims;
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
  Tensor y = std::get<0>(normalize(x, dims, c.f("epsilon", 1e-5))).to(x.dtype());
  return y * channel_view(c.input(1), x.dim()) + channel_view(c.input(2), x.dim());
}

Tensor lrn(Ctx& c) {
  const Tensor& x = c.input(0);
  int64_t size = c.i("size", 0);
  if (size < 1) c.fail("size must be positive");
  double alpha = c.f("alpha", 1e-4), beta = c.f("beta", 0.75), bias = c.f("bias", 1.0);
  std::vector<int64_t> p(size_t(2 * x.dim()), 0);
  p[2] = (size - 1) / 2;
  p[3] = size - 1 - p[2];
  Tensor sq = pad(x * x, p, 0), acc;
  for (int64_t k = 0; k < size; ++k) {
    Tensor s = slice(sq, 1, k, k + x.size(1));
    acc = acc.defined() ? acc + s : s;
  }
  return x / pow(bias + acc * (alpha / double(size)), beta);
}

// Einsum by broadcasting: each operand laid out over every label, multiplied, the labels not
// in the output summed away; '...' and repeated labels (diagonals) included.
Tensor einsum_(Ctx& c) {
  std::string eq = c.s("equation", "");
  eq.erase(std::remove(eq.begin(), eq.end(), ' '), eq.end());
  std::string lhs = eq, out;
  size_t arrow = eq.find("->");
  bool explicit_out = arrow != std::string::npos;
  if (explicit_out) {
    lhs = eq.substr(0, arrow);
    out = eq.substr(arrow + 2);
  }
  std::vector<std::string> terms;
  for (size_t at = 0;;) {
    size_t comma = lhs.find(',', at);
    terms.push_back(lhs.substr(at, comma - at));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  if (terms.size() != c.in.size()) c.fail("equation '" + eq + "' names " + std::to_string(terms.size()) + " operands");
  // '...' becomes digit labels (never letters), right-aligned across operands as numpy does.
  const std::string digits = "0123456789";
  std::vector<Tensor> ops;
  size_t max_ell = 0;
  for (size_t k = 0; k < terms.size(); ++k) {
    ops.push_back(c.input(k));
    size_t e = terms[k].find("...");
    if (e == std::string::npos) continue;
    int64_t n = ops[k].dim() - int64_t(terms[k].size() - 3);
    if (n < 0 || n > 10) c.fail("operand " + std::to_string(k) + " " + shape_str(ops[k].shape()) + " does not match '" + terms[k] + "'");
    max_ell = std::max(max_ell, size_t(n));
    terms[k].replace(e, 3, digits.substr(10 - size_t(n)));
  }
  std::string ell = digits.substr(10 - max_ell);
  if (size_t e = out.find("..."); e != std::string::npos) out.replace(e, 3, ell);
  std::string labels;
  std::map<char, int> count;
  for (size_t k = 0; k < terms.size(); ++k) {
    std::string& t = terms[k];
    if (int64_t(t.size()) != ops[k].dim()) c.fail("operand " + std::to_string(k) + " " + shape_str(ops[k].shape()) + " does not match '" + t + "'");
    // A label repeated in one operand takes its diagonal: times the identity, summed over one.
    for (size_t p = 0; p < t.size(); ++p)
      for (size_t q = t.size() - 1; q > p; --q)
        if (t[q] == t[p]) {
          int64_t n = ops[k].size(int64_t(p));
          Shape es(t.size(), 1);
          es[p] = es[q] = n;
          ops[k] = sum(ops[k] * eye(n, n, {ops[k].dtype(), ops[k].device()}).reshape(es), {int64_t(q)});
          t.erase(q, 1);
        }
    for (char ch : t) {
      if (labels.find(ch) == std::string::npos) labels += ch;
      ++count[ch];
    }
  }
  if (!explicit_out) {
    for (char ch : labels)
      if (count[ch] == 1 || ell.find(ch) != std::string::npos) out += ch;
    std::sort(out.begin(), out.end());  // digits (the ellipsis) first, then letters
  }
  Tensor acc;
  for (size_t k = 0; k < terms.size(); ++k) {
    const Tensor& t = ops[k];
    std::vector<int64_t> perm;
    Shape s;
    for (char ch : labels) {
      size_t p = terms[k].find(ch);
      if (p != std::string::npos) perm.push_back(int64_t(p)), s.push_back(t.size(int64_t(p)));
      else s.push_back(1);
    }
    Tensor v = t.permute(perm).reshape(s);
    acc = acc.defined() ? acc * v : v;
  }
  std::vector<int64_t> summed, order;
  for (size_t i = 0; i < labels.size(); ++i)
    if (out.find(labels[i]) == std::string::npos) summed.push_back(int64_t(i));
  if (!summed.empty()) acc = sum(acc, summed);
  std::string left;
  for (char ch : labels)
    if (out.find(ch) != std::string::npos) left += ch;
  for (char ch : out) {
    size_t p = left.find(ch);
    if (p == std::string::npos) c.fail("output label '" + std::string(1, ch) + "' is in no operand");
    order.push_back(int64_t(p));
  }
  return order.empty() ? acc : acc.permute(order);
}


// MaxUnpool: X's values scattered to the flat positions MaxPool's indices name, in zeros of the
// unpooled shape ((in - 1) * stride - pads + kernel), padded at the end to output_shape if given
// (ONNX's reference semantics).
Tensor max_unpool(Ctx& c) {
  const Tensor &x = c.input(0), &idx = c.input(1);
  std::vector<int64_t> k = c.ints("kernel_shape");
  size_t sd = k.size();
  if (x.dim() != int64_t(sd) + 2 || idx.shape() != x.shape()) c.fail("needs X [N, C, spatial...] and indices of its shape");
  std::vector<int64_t> stride = c.ints("strides", std::vector<int64_t>(sd, 1)), pads = c.ints("pads", std::vector<int64_t>(2 * sd, 0));
  Shape shape{x.size(0), x.size(1)};
  for (size_t i = 0; i < sd; ++i) shape.push_back((x.size(int64_t(2 + i)) - 1) * stride[i] - pads[i] - pads[i + sd] + k[i]);
  Tensor flat = scatter_add(zeros({numel(shape)}, {x.dtype(), x.device()}), 0, idx.to(DType::Int64).reshape({-1}), x.reshape({-1}));
  Tensor y = flat.reshape(shape);
  if (!c.has_input(2)) return y;
  Shape out = c.ints_input(2);
  if (out.size() != shape.size()) c.fail("output_shape " + shape_str(out) + " does not match the input's rank");
  std::vector<int64_t> p(2 * out.size(), 0);
  for (size_t d = 0; d < out.size(); ++d) {
    if (out[d] < shape[d]) c.fail("output_shape " + shape_str(out) + " is smaller than the unpooled " + shape_str(shape));
    p[2 * d + 1] = out[d] - shape[d];
  }
  return pad(y, p, 0);
}

// Det of [..., n, n] by the Leibniz formula (n <= 6): a sum over permutations of signed products
// of gathered entries, so it runs and differentiates everywhere; larger n is refused.
Tensor det(Ctx& c) {
  const Tensor& a = c.input(0);
  if (a.dim() < 2 || a.size(-1) != a.size(-2)) c.fail("needs [..., n, n], got " + shape_str(a.shape()));
  int64_t n = a.size(-1);
  if (n > 6) c.fail("matrices larger than 6x6 are not supported (the Leibniz sum has n! terms)");
  std::vector<int64_t> perm(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) perm[size_t(i)] = i;
  Tensor total;
  do {
    int64_t inversions = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = i + 1; j < n; ++j) inversions += perm[size_t(i)] > perm[size_t(j)];
    Tensor term;
    for (int64_t i = 0; i < n; ++i) {
      Tensor e = a.narrow(-2, i, 1).narrow(-1, perm[size_t(i)], 1);
      term = term.defined() ? term * e : e;
    }
    if (inversions % 2) term = -term;
    total = total.defined() ? total + term : term;
  } while (std::next_permutation(perm.begin(), perm.end()));
  Shape s(a.shape().begin(), a.shape().end() - 2);
  return n == 0 ? ones(s, {a.dtype(), a.device()}) : total.reshape(s);
}

}  // namespace

void add_nn_ops(OpTable& t) {
  t["MaxUnpool"] = [](Ctx& c) { return Ts{max_unpool(c)}; };
  t["Det"] = [](Ctx& c) { return Ts{det(c)}; };
  auto spatial = [](const Tensor& x) {
    std::vector<int64_t> d;
    for (int64_t k = 2; k < x.dim(); ++k) d.push_back(k);
    return d;
  };
  t["MatMul"] = [](Ctx& c) { return Ts{matmul(c.input(0), c.input(1))}; };
  t["Gemm"] = [](Ctx& c) {
    Tensor a = c.input(0), b = c.input(1);
    if (c.i("transA", 0)) a = a.transpose(0, 1);
    if (c.i("transB", 0)) b = b.transpose(0, 1);
    Tensor y = matmul(a, b) * c.f("alpha", 1.0);
    if (c.has_input(2)) y = y + c.input(2) * c.f("beta", 1.0);
    return Ts{y};
  };
  t["Einsum"] = [](Ctx& c) { return Ts{einsum_(c)}; };
  t["Conv"] = [](Ctx& c) { return Ts{conv(c)}; };
  t["ConvTranspose"] = [](Ctx& c) { return Ts{conv_transpose(c)}; };
  t["MaxPool"] = max_pool;
  t["AveragePool"] = [](Ctx& c) { return Ts{avg_pool(c)}; };
  t["GlobalAveragePool"] = [spatial](Ctx& c) { return Ts{mean(c.input(0), spatial(c.input(0)), true)}; };
  t["GlobalMaxPool"] = [spatial](Ctx& c) { return Ts{amax(c.input(0), spatial(c.input(0)), true)}; };
  t["BatchNormalization"] = batch_norm_;
  t["InstanceNormalization"] = [](Ctx& c) { return Ts{instance_norm(c)}; };
  t["LayerNormalization"] = layer_norm_;
  t["MeanVarianceNormalization"] = [](Ctx& c) {
    const Tensor& x = c.input(0);
    auto axes = axes_of(c, c.ints("axes", {0, 2, 3}), x.dim());
    Tensor m = mean(x, axes, true), d = x - m;
    return Ts{d / sqrt(mean(d * d, axes, true) + 1e-9)};
  };
  t["LRN"] = [](Ctx& c) { return Ts{lrn(c)}; };
  t["Dropout"] = [](Ctx& c) {
    bool training = c.has_input(2) && c.doubles_input(2).at(0) != 0;
    double ratio = c.opset >= 12 ? (c.has_input(1) ? c.doubles_input(1).at(0) : 0.5) : c.f("ratio", 0.5);
    if (training && ratio != 0) c.fail("training_mode=true draws random masks: not supported");
    const Tensor& x = c.input(0);
    return Ts{x, ones(x.shape(), {DType::Bool, x.device()})};
  };
}

}  // namespace tessera::onnx::detail
