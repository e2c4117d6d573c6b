// ONNX ops on shapes and indices: views, slicing, gathers and scatters, padding, constants
// and generators. Shape operands are read on the host (Ctx::ints_input) before tracing.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>

#include "interop/onnx/ops_util.h"
#include "tessera/ops.h"

namespace tessera::onnx::detail {
namespace {

// ---- shapes and indexing ----
Tensor reshape_(Ctx& c) {
  const Tensor& x = c.input(0);
  std::vector<int64_t> s = c.opset >= 5 ? c.ints_input(1) : c.ints("shape");
  bool allowzero = c.i("allowzero", 0) != 0;
  for (size_t k = 0; k < s.size(); ++k)
    if (s[k] == 0 && !allowzero) {
      if (int64_t(k) >= x.dim()) c.fail("shape " + shape_str(s) + " copies a dimension the input " + shape_str(x.shape()) + " lacks");
      s[k] = x.size(int64_t(k));
    }
  return x.reshape(s);
}

Tensor unsqueeze_(Ctx& c) {
  Tensor x = c.input(0);
  std::vector<int64_t> axes = c.opset >= 13 ? c.ints_input(1) : c.ints("axes");
  int64_t rank = x.dim() + int64_t(axes.size());
  axes = axes_of(c, axes, rank);
  std::sort(axes.begin(), axes.end());
  for (int64_t a : axes) x = x.unsqueeze(a);
  return x;
}

Tensor squeeze_(Ctx& c) {
  Tensor x = c.input(0);
  std::vector<int64_t> axes = c.opset >= 13 ? (c.has_input(1) ? c.ints_input(1) : std::vector<int64_t>{}) : c.ints("axes");
  if (axes.empty()) return x.squeeze();
  axes = axes_of(c, axes, x.dim());
  std::sort(axes.rbegin(), axes.rend());
  for (int64_t a : axes) {
    if (x.size(a) != 1) c.fail("cannot squeeze axis " + std::to_string(a) + " of " + shape_str(x.shape()));
    x = x.squeeze(a);
  }
  return x;
}

Tensor flatten_(Ctx& c) {
  const Tensor& x = c.input(0);
  int64_t axis = c.i("axis", 1);
  if (axis < 0) axis += x.dim();
  if (axis < 0 || axis > x.dim()) c.fail("axis out of range");
  int64_t outer = std::accumulate(x.shape().begin(), x.shape().begin() + axis, int64_t(1), std::multiplies<>());
  int64_t inner = std::accumulate(x.shape().begin() + axis, x.shape().end(), int64_t(1), std::multiplies<>());
  return x.reshape({outer, inner});
}

Tensor transpose_(Ctx& c) {
  const Tensor& x = c.input(0);
  std::vector<int64_t> perm = c.ints("perm");
  if (perm.empty())
    for (int64_t d = x.dim() - 1; d >= 0; --d) perm.push_back(d);
  return x.permute(perm);
}

Ts split_(Ctx& c) {
  const Tensor& x = c.input(0);
  int64_t axis = axis_of(c, c.i("axis", 0), x.dim()), len = x.size(axis);
  std::vector<int64_t> parts = c.opset >= 13 ? (c.has_input(1) ? c.ints_input(1) : std::vector<int64_t>{}) : c.ints("split");
  int64_t n = c.node.output_size();
  if (parts.empty()) {
    if (n < 1 || len % n != 0) c.fail("cannot split extent " + std::to_string(len) + " into " + std::to_string(n) + " equal parts");
    parts.assign(size_t(n), len / n);
  }
  if (std::accumulate(parts.begin(), parts.end(), int64_t(0)) != len) c.fail("split sizes " + shape_str(parts) + " do not add up to " + std::to_string(len));
  Ts out;
  int64_t at = 0;
  for (int64_t p : parts) {
    out.push_back(x.narrow(axis, at, p));
    at += p;
  }
  return out;
}

Tensor slice_(Ctx& c) {
  Tensor x = c.input(0);
  std::vector<int64_t> starts, ends, axes, steps;
  if (c.opset < 10) {
    starts = c.ints("starts");
    ends = c.ints("ends");
    axes = c.ints("axes");
  } else {
    starts = c.ints_input(1);
    ends = c.ints_input(2);
    if (c.has_input(3)) axes = c.ints_input(3);
    if (c.has_input(4)) steps = c.ints_input(4);
  }
  if (axes.empty())
    for (size_t k = 0; k < starts.size(); ++k) axes.push_back(int64_t(k));
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
    c.fail("starts, ends, axes and steps differ in length");
  for (size_t k = 0; k < starts.size(); ++k) {
    int64_t d = axis_of(c, axes[k], x.dim()), len = x.size(d), st = steps[k];
    if (st == 0) c.fail("step 0");
    auto clampi = [](int64_t v, int64_t lo, int64_t hi) { return std::min(std::max(v, lo), hi); };
    int64_t s = starts[k], e = ends[k];
    if (s < 0) s = s < -len ? -1 - len : s + len;  // keeps -inf-like values below range
    if (e < 0) e = e < -len ? -1 - len : e + len;
    if (st > 0) {
      s = clampi(s, 0, len);
      e = clampi(e, 0, len);
      x = slice(x, d, s, std::max(s, e), st);
    } else {
      s = clampi(s, 0, len - 1);
      e = clampi(e, -1, len - 1);
      int64_t fs = len - 1 - s, fe = len - 1 - e;  // in the flipped dim
      x = slice(flip(x, {d}), d, fs, std::max(fs, fe), -st);
    }
  }
  return x;
}

Tensor gather_(Ctx& c) {
  const Tensor &x = c.input(0), &idx_in = c.input(1);
  int64_t axis = axis_of(c, c.i("axis", 0), x.dim());
  Tensor idx = idx_in.to(DType::Int64);
  idx = where(idx < 0.0, idx + x.size(axis), idx);
  Tensor r = index_select(x, axis, idx.reshape({idx.numel()}));
  Shape s(x.shape().begin(), x.shape().begin() + axis);
  s.insert(s.end(), idx.shape().begin(), idx.shape().end());
  s.insert(s.end(), x.shape().begin() + axis + 1, x.shape().end());
  return r.reshape(s);
}

Tensor gather_elements(Ctx& c) {
  const Tensor& x = c.input(0);
  int64_t axis = axis_of(c, c.i("axis", 0), x.dim());
  Tensor idx = c.input(1).to(DType::Int64);
  return gather(x, axis, where(idx < 0.0, idx + x.size(axis), idx));
}

Tensor scatter_elements(Ctx& c) {
  const Tensor &x = c.input(0), &upd = c.input(2);
  int64_t axis = axis_of(c, c.i("axis", 0), x.dim());
  Tensor idx = c.input(1).to(DType::Int64);
  idx = where(idx < 0.0, idx + x.size(axis), idx);
  std::string red = c.s("reduction", "none");
  Tensor added = scatter_add(zeros_like(x), axis, idx, upd);
  if (red == "add") return x + added;
  if (red != "none") c.fail("reduction '" + red + "' is not supported");
  Tensor hit = scatter_add(zeros_like(x), axis, idx, ones_like(upd)) > 0.0;
  return where(hit, added, x);
}

// Linear row indices of GatherND/ScatterND index tuples (read on the host) into `data`
// viewed as [prod(shape[:b + k]), rest...].
std::vector<int64_t> nd_rows(const Ctx& c, const Shape& data, const Tensor& indices, int64_t b, int64_t* k_out) {
  if (indices.dim() < 1) c.fail("indices need at least one dimension");
  int64_t k = indices.shape().back();
  if (b < 0 || b + k > int64_t(data.size())) c.fail("index tuples of " + std::to_string(k) + " do not fit " + shape_str(data));
  std::vector<int64_t> v = indices.to(DType::Int64).to_vector<int64_t>();
  int64_t batch = std::accumulate(data.begin(), data.begin() + b, int64_t(1), std::multiplies<>());
  int64_t per_batch = k ? int64_t(v.size()) / k / std::max<int64_t>(batch, 1) : 0;
  std::vector<int64_t> rows;
  for (size_t t = 0; k && t < v.size() / size_t(k); ++t) {
    int64_t row = batch > 0 && per_batch > 0 ? int64_t(t) / per_batch : 0;
    for (int64_t j = 0; j < k; ++j) {
      int64_t extent = data[size_t(b + j)], i = v[t * size_t(k) + size_t(j)];
      if (i < -extent || i >= extent) c.fail("index " + std::to_string(i) + " out of range for extent " + std::to_string(extent));
      row = row * extent + (i < 0 ? i + extent : i);
    }
    rows.push_back(row);
  }
  *k_out = k;
  return rows;
}

Tensor gather_nd(Ctx& c) {
  const Tensor &x = c.input(0), &indices = c.input(1);
  int64_t b = c.i("batch_dims", 0), k;
  std::vector<int64_t> rows = nd_rows(c, x.shape(), indices, b, &k);
  Shape rest(x.shape().begin() + b + k, x.shape().end()), flat{-1};
  flat.insert(flat.end(), rest.begin(), rest.end());
  Tensor r = index_select(x.reshape(flat), 0, from_vector(rows, {int64_t(rows.size())}, {DType::Int64, x.device()}));
  Shape s(indices.shape().begin(), indices.shape().end() - 1);
  s.insert(s.end(), rest.begin(), rest.end());
  return r.reshape(s);
}

// ScatterND. The row indices are known on the host, so updates are applied in rounds whose rows
// are distinct: the k-th round takes each row's k-th update. "add" sums every round at once;
// "none" writes (the last update to a row wins) and "mul" multiplies, round by round.
Tensor scatter_nd(Ctx& c) {
  const Tensor &x = c.input(0), &indices = c.input(1), &upd = c.input(2);
  int64_t k;
  std::vector<int64_t> rows = nd_rows(c, x.shape(), indices, 0, &k);
  std::string red = c.s("reduction", "none");
  if (red != "none" && red != "add" && red != "mul") c.fail("reduction '" + red + "' is not supported");
  Shape rest(x.shape().begin() + k, x.shape().end()), flat{-1};
  flat.insert(flat.end(), rest.begin(), rest.end());
  Tensor xf = x.reshape(flat);
  Shape us{int64_t(rows.size())};
  us.insert(us.end(), rest.begin(), rest.end());
  Tensor u = upd.reshape(us);
  auto scatter = [&](const std::vector<int64_t>& picked, const std::vector<int64_t>& to, const Tensor& values) {
    Shape ps = us, is(us.size(), 1);
    ps[0] = is[0] = int64_t(picked.size());
    TensorOptions io{DType::Int64, x.device()};
    Tensor v = index_select(values, 0, from_vector(picked, {ps[0]}, io));
    return scatter_add(zeros_like(xf), 0, from_vector(to, is, io).expand(ps), v);
  };
  if (red == "add") {
    std::vector<int64_t> all(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) all[i] = int64_t(i);
    return (xf + scatter(all, rows, u)).reshape(x.shape());
  }
  std::map<int64_t, int64_t> seen;  // row -> updates to it so far
  std::vector<std::vector<int64_t>> picked, to;
  for (size_t i = 0; i < rows.size(); ++i) {
    size_t round = size_t(seen[rows[i]]++);
    if (round == picked.size()) picked.emplace_back(), to.emplace_back();
    picked[round].push_back(int64_t(i));
    to[round].push_back(rows[i]);
  }
  for (size_t r = 0; r < picked.size(); ++r) {
    Tensor hit = scatter(picked[r], to[r], ones_like(u)) > 0.0, v = scatter(picked[r], to[r], u);
    xf = where(hit, red == "mul" ? xf * v : v, xf);
  }
  return xf.reshape(x.shape());
}

// Pad: constant (negative pads crop), reflect and edge (by gathering the rows each pad repeats).
Tensor pad_(Ctx& c) {
  Tensor x = c.input(0);
  int64_t r = x.dim();
  std::vector<int64_t> pads = c.opset >= 11 ? c.ints_input(1) : c.ints("pads");
  double value = c.opset >= 11 ? (c.has_input(2) ? c.doubles_input(2).at(0) : 0.0) : c.f("value", 0.0);
  std::vector<int64_t> axes;
  if (c.has_input(3)) axes = axes_of(c, c.ints_input(3), r);
  else
    for (int64_t d = 0; d < r; ++d) axes.push_back(d);
  if (pads.size() != 2 * axes.size()) c.fail("pads " + shape_str(pads) + " need 2 entries per padded axis of " + shape_str(x.shape()));
  std::string mode = c.s("mode", "constant");
  size_t n = axes.size();
  for (size_t k = 0; k < n; ++k) {  // crops first
    int64_t d = axes[k], lo = pads[k], hi = pads[k + n];
    if (lo < 0 || hi < 0) x = slice(x, d, std::max<int64_t>(0, -lo), x.size(d) - std::max<int64_t>(0, -hi));
  }
  if (mode == "constant") {
    std::vector<int64_t> p(size_t(2 * r), 0);
    for (size_t k = 0; k < n; ++k) {
      p[size_t(2 * axes[k])] = std::max<int64_t>(0, pads[k]);
      p[size_t(2 * axes[k] + 1)] = std::max<int64_t>(0, pads[k + n]);
    }
    return pad(x, p, value);
  }
  if (mode != "reflect" && mode != "edge") c.fail("mode '" + mode + "' is not supported");
  for (size_t k = 0; k < n; ++k) {
    int64_t d = axes[k], lo = std::max<int64_t>(0, pads[k]), hi = std::max<int64_t>(0, pads[k + n]), len = x.size(d);
    if (lo == 0 && hi == 0) continue;
    if (mode == "reflect" && (lo >= len || hi >= len)) c.fail("reflect padding must be smaller than the extent " + std::to_string(len));
    std::vector<int64_t> rows;
    for (int64_t i = -lo; i < len + hi; ++i) {
      int64_t j = i;
      if (mode == "edge") j = std::min(std::max<int64_t>(i, 0), len - 1);
      else if (i < 0) j = -i;
      else if (i >= len) j = 2 * (len - 1) - i;
      rows.push_back(j);
    }
    x = index_select(x, d, from_vector(rows, {int64_t(rows.size())}, {DType::Int64, x.device()}));
  }
  return x;
}

Tensor expand_(Ctx& c) {
  const Tensor& x = c.input(0);
  return x.expand(broadcast_shapes(x.shape(), c.ints_input(1), "Expand"));
}

Tensor tile_(Ctx& c) {
  std::vector<int64_t> reps = c.ints_input(1);
  if (int64_t(reps.size()) != c.input(0).dim()) c.fail("repeats " + shape_str(reps) + " need one entry per dimension");
  return c.input(0).repeat(reps);
}

// Einsum by broadcasting: each operand laid out over every label, multiplied, the labels not

Tensor depth_to_space(Ctx& c) {
  const Tensor& x = c.input(0);
  int64_t b = c.i("blocksize", 0);
  if (x.dim() != 4 || b < 1 || x.size(1) % (b * b)) c.fail("needs [N, C, H, W] with C divisible by blocksize^2");
  int64_t n = x.size(0), ch = x.size(1) / (b * b), h = x.size(2), w = x.size(3);
  if (c.s("mode", "DCR") == "CRD")
    return x.reshape({n, ch, b, b, h, w}).permute({0, 1, 4, 2, 5, 3}).reshape({n, ch, h * b, w * b});
  return x.reshape({n, b, b, ch, h, w}).permute({0, 3, 4, 1, 5, 2}).reshape({n, ch, h * b, w * b});
}

Tensor space_to_depth(Ctx& c) {
  const Tensor& x = c.input(0);
  int64_t b = c.i("blocksize", 0);
  if (x.dim() != 4 || b < 1 || x.size(2) % b || x.size(3) % b) c.fail("needs [N, C, H, W] with H and W divisible by blocksize");
  int64_t n = x.size(0), ch = x.size(1), h = x.size(2) / b, w = x.size(3) / b;
  return x.reshape({n, ch, h, b, w, b}).permute({0, 3, 5, 1, 2, 4}).reshape({n, ch * b * b, h, w});
}

// ---- constants and generators ----
Tensor constant_(Ctx& c) {
  const ::onnx::AttributeProto* a = c.attr("value");
  if (a) return to_tensor(a->t(), "", c.device, "Constant node " + node_label(c.node, c.index));
  if (c.has("value_float")) return scalar_tensor(c.f("value_float", 0), {DType::Float32, c.device});
  if (c.has("value_int")) return full({}, double(c.i("value_int", 0)), {DType::Int64, c.device});
  if (c.has("value_floats")) {
    auto v = c.floats("value_floats");
    return from_vector(v, {int64_t(v.size())}, {DType::Float32, c.device});
  }
  if (c.has("value_ints")) {
    auto v = c.ints("value_ints");
    return from_vector(v, {int64_t(v.size())}, {DType::Int64, c.device});
  }
  c.fail("only value, value_float(s) and value_int(s) are supported (not sparse or string values)");
}

Tensor constant_of_shape(Ctx& c) {
  Shape s = c.ints_input(0);
  for (int64_t d : s)
    if (d < 0) c.fail("negative extent in " + shape_str(s));
  const ::onnx::AttributeProto* a = c.attr("value");
  if (!a) return zeros(s, {DType::Float32, c.device});
  Tensor v = to_tensor(a->t(), "", c.device, "ConstantOfShape node " + node_label(c.node, c.index));
  if (v.numel() != 1) c.fail("value must hold one element");
  return v.reshape({}).expand(s).clone();
}

Tensor range_(Ctx& c) {
  double start = c.doubles_input(0).at(0), limit = c.doubles_input(1).at(0), delta = c.doubles_input(2).at(0);
  if (delta == 0 || !std::isfinite(start) || !std::isfinite(limit) || !std::isfinite(delta))
    c.fail("start, limit and delta must be finite and delta non-zero");
  int64_t n = std::max<int64_t>(0, int64_t(std::ceil((limit - start) / delta)));
  if (n > (int64_t(1) << 32)) c.fail("more than 2^32 elements");
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) v[size_t(k)] = start + double(k) * delta;
  return from_vector(v, {n}, {c.input(0).dtype(), c.input(0).device()});
}

Tensor eye_like(Ctx& c) {
  const Tensor& x = c.input(0);
  if (x.dim() != 2) c.fail("needs a 2-D input");
  DType dt = c.has("dtype") ? to_dtype(int32_t(c.i("dtype", 1)), "EyeLike") : x.dtype();
  int64_t n = x.size(0), m = x.size(1), k = c.i("k", 0);
  std::vector<double> v(static_cast<size_t>(n * m), 0.0);
  for (int64_t i = 0; i < n; ++i)
    if (i + k >= 0 && i + k < m) v[size_t(i * m + i + k)] = 1;
  return from_vector(v, {n, m}, {dt, x.device()});
}

Tensor one_hot(Ctx& c) {
  Tensor idx = c.input(0).to(DType::Int64);
  int64_t depth = int64_t(c.doubles_input(1).at(0));
  const Tensor& values = c.input(2);
  int64_t axis = axis_of(c, c.i("axis", -1), idx.dim() + 1);
  idx = where(idx < 0.0, idx + depth, idx).unsqueeze(axis);
  Shape s(size_t(idx.dim()), 1);
  s[size_t(axis)] = depth;
  Tensor pos = arange(double(depth), TensorOptions{DType::Int64, idx.device()}).reshape(s);
  Tensor off = values.narrow(0, 0, 1).reshape({}), on = values.narrow(0, 1, 1).reshape({});
  return where(eq(pos, idx), on, off);
}

Tensor trilu(Ctx& c) {
  int64_t k = c.has_input(1) ? c.ints_input(1).at(0) : 0;
  return c.i("upper", 1) ? triu(c.input(0), k) : tril(c.input(0), k);
}

}  // namespace

void add_shape_ops(OpTable& t) {
  t["Identity"] = [](Ctx& c) { return Ts{c.input(0)}; };
  t["Cast"] = [](Ctx& c) { return Ts{cast(c.input(0), to_dtype(int32_t(c.i("to", 0)), "Cast node " + node_label(c.node, c.index)))}; };
  t["CastLike"] = [](Ctx& c) { return Ts{cast(c.input(0), c.input(1).dtype())}; };
  t["Where"] = [](Ctx& c) { return Ts{where(cast(c.input(0), DType::Bool), c.input(1), c.input(2))}; };
  t["Reshape"] = [](Ctx& c) { return Ts{reshape_(c)}; };
  t["Flatten"] = [](Ctx& c) { return Ts{flatten_(c)}; };
  t["Squeeze"] = [](Ctx& c) { return Ts{squeeze_(c)}; };
  t["Unsqueeze"] = [](Ctx& c) { return Ts{unsqueeze_(c)}; };
  t["Transpose"] = [](Ctx& c) { return Ts{transpose_(c)}; };
  t["Concat"] = [](Ctx& c) {
    Ts xs;
    for (size_t k = 0; k < c.in.size(); ++k) xs.push_back(c.input(k));
    return Ts{cat(xs, axis_of(c, c.i("axis", 0), xs.at(0).dim()))};
  };
  t["Split"] = split_;
  t["Slice"] = [](Ctx& c) { return Ts{slice_(c)}; };
  t["Expand"] = [](Ctx& c) { return Ts{expand_(c)}; };
  t["Tile"] = [](Ctx& c) { return Ts{tile_(c)}; };
  t["Pad"] = [](Ctx& c) { return Ts{pad_(c)}; };
  t["Gather"] = [](Ctx& c) { return Ts{gather_(c)}; };
  t["GatherElements"] = [](Ctx& c) { return Ts{gather_elements(c)}; };
  t["GatherND"] = [](Ctx& c) { return Ts{gather_nd(c)}; };
  t["ScatterElements"] = [](Ctx& c) { return Ts{scatter_elements(c)}; };
  t["Scatter"] = t["ScatterElements"];
  t["ScatterND"] = [](Ctx& c) { return Ts{scatter_nd(c)}; };
  t["DepthToSpace"] = [](Ctx& c) { return Ts{depth_to_space(c)}; };
  t["SpaceToDepth"] = [](Ctx& c) { return Ts{space_to_depth(c)}; };
  t["Trilu"] = [](Ctx& c) { return Ts{trilu(c)}; };
  t["OneHot"] = [](Ctx& c) { return Ts{one_hot(c)}; };
  t["Shape"] = [](Ctx& c) {
    const Shape& s = c.input(0).shape();
    int64_t r = int64_t(s.size()), b = c.i("start", 0), e = c.i("end", r);
    b = std::clamp<int64_t>(b < 0 ? b + r : b, 0, r);
    e = std::clamp<int64_t>(e < 0 ? e + r : e, 0, r);
    std::vector<int64_t> v(s.begin() + b, s.begin() + std::max(b, e));
    return Ts{from_vector(v, {int64_t(v.size())}, {DType::Int64, c.input(0).device()})};
  };
  t["Size"] = [](Ctx& c) { return Ts{full({}, double(c.input(0).numel()), {DType::Int64, c.input(0).device()})}; };
  t["Constant"] = [](Ctx& c) { return Ts{constant_(c)}; };
  t["ConstantOfShape"] = [](Ctx& c) { return Ts{constant_of_shape(c)}; };
  t["Range"] = [](Ctx& c) { return Ts{range_(c)}; };
  t["EyeLike"] = [](Ctx& c) { return Ts{eye_like(c)}; };
}

}  // namespace tessera::onnx::detail
