// ONNX Resize (and the older Upsample) by separable interpolation: for each resized axis a
// weight matrix [out, in] is built on the host (nearest, linear or cubic taps at the coordinates
// the transformation mode gives) and applied as a matmul along that axis, so every backend runs
// it and autodiff differentiates it. Also GridSample (gathers at sample positions computed as
// tensors), RoiAlign (per-region sample-weight matrices), DFT and STFT (matmuls with host-made
// cosine and sine matrices), the window generators (Hann, Hamming, Blackman), ReverseSequence.
#include <algorithm>
#include <cmath>

#include "interop/onnx/ops_util.h"
#include "tessera/ops.h"

namespace tessera::onnx::detail {
namespace {

struct ResizeMode {
  std::string mode, coord, nearest;
  double cubic_a = -0.75, extrapolation = 0;
  bool exclude_outside = false;
};

// The source coordinate of output index i along an axis of `in` elements; `out` is the resized
// length before rounding (in * scale), as ONNX's reference uses it.
double source_coord(const Ctx& c, const ResizeMode& m, int64_t i, int64_t in, double out, double scale, double roi_lo, double roi_hi) {
  const std::string& t = m.coord;
  if (t == "half_pixel") return (double(i) + 0.5) / scale - 0.5;
  if (t == "pytorch_half_pixel") return out > 1 ? (double(i) + 0.5) / scale - 0.5 : 0.0;
  if (t == "align_corners") return out == 1 ? 0.0 : double(i) * double(in - 1) / (out - 1);
  if (t == "asymmetric") return double(i) / scale;
  if (t == "tf_half_pixel_for_nn") return (double(i) + 0.5) / scale;
  if (t == "tf_crop_and_resize")
    return out > 1 ? roi_lo * double(in - 1) + double(i) * (roi_hi - roi_lo) * double(in - 1) / (out - 1)
                   : 0.5 * (roi_lo + roi_hi) * double(in - 1);
  c.fail("coordinate_transformation_mode '" + t + "' is not supported");
}

int64_t nearest_index(const Ctx& c, const std::string& mode, double x) {
  double f = std::floor(x);
  if (mode == "floor") return int64_t(f);
  if (mode == "ceil") return int64_t(std::ceil(x));
  bool half = x - f == 0.5;
  if (mode == "round_prefer_floor") return int64_t(half ? f : std::round(x));
  if (mode == "round_prefer_ceil") return int64_t(half ? f + 1 : std::round(x));
  c.fail("nearest_mode '" + mode + "' is not supported");
}

// Weights [out, in] and the per-row constant (extrapolation outside the crop) for one axis.
std::pair<std::vector<double>, std::vector<double>> axis_weights(const Ctx& c, const ResizeMode& m, int64_t in, int64_t out, double scale,
                                                                  double roi_lo, double roi_hi) {
  std::vector<double> w(size_t(out * in), 0.0), bias(size_t(out), 0.0);
  auto clampi = [in](int64_t k) { return std::min(std::max<int64_t>(k, 0), in - 1); };
  for (int64_t i = 0; i < out; ++i) {
    double x = source_coord(c, m, i, in, double(in) * scale, scale, roi_lo, roi_hi);
    double* row = w.data() + i * in;
    if (m.coord == "tf_crop_and_resize" && (x < 0 || x > double(in - 1))) {
      bias[size_t(i)] = m.extrapolation;
      continue;
    }
    if (m.mode == "nearest") {
      row[clampi(nearest_index(c, m.nearest, x))] = 1;
    } else if (m.mode == "linear") {
      double f = std::floor(x), r = x - f;
      row[clampi(int64_t(f))] += 1 - r;
      row[clampi(int64_t(f) + 1)] += r;
    } else if (m.mode == "cubic") {
      double f = std::floor(x), r = x - f, a = m.cubic_a;
      auto far = [a](double d) { return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a; };         // 1 < |d| < 2
      auto near = [a](double d) { return ((a + 2) * d - (a + 3)) * d * d + 1; };              // |d| <= 1
      double coef[4] = {far(r + 1), near(r), near(1 - r), far(2 - r)};
      double total = 0;
      for (int k = 0; k < 4; ++k) {
        int64_t j = int64_t(f) - 1 + k;
        if (m.exclude_outside && (j < 0 || j >= in)) coef[k] = 0;
        total += coef[k];
      }
      for (int k = 0; k < 4; ++k) row[clampi(int64_t(f) - 1 + k)] += m.exclude_outside ? coef[k] / total : coef[k];
    } else {
      c.fail("mode '" + m.mode + "' is not supported");
    }
  }
  return {w, bias};
}

Tensor resize(Ctx& c) {
  const Tensor& x = c.input(0);
  int64_t r = x.dim();
  ResizeMode m;
  m.mode = c.s("mode", "nearest");
  bool legacy = c.node.op_type() == "Upsample" || c.opset < 11;  // scales only, asymmetric, floor
  m.coord = legacy ? "asymmetric" : c.s("coordinate_transformation_mode", "half_pixel");
  m.nearest = legacy ? "floor" : c.s("nearest_mode", "round_prefer_floor");
  m.cubic_a = c.f("cubic_coeff_a", -0.75);
  m.exclude_outside = c.i("exclude_outside", 0) != 0;
  m.extrapolation = c.f("extrapolation_value", 0.0);
  std::vector<double> scales, roi;
  std::vector<int64_t> sizes;
  if (legacy) {
    scales = c.node.op_type() == "Upsample" && c.opset < 9 ? c.floats("scales") : c.doubles_input(1);
  } else {
    if (c.has_input(1)) roi = c.doubles_input(1);
    if (c.has_input(2)) scales = c.doubles_input(2);
    if (c.has_input(3)) sizes = c.ints_input(3);
  }
  if (!sizes.empty() && !scales.empty()) c.fail("scales and sizes are both given");
  if (scales.empty() && sizes.empty()) c.fail("neither scales nor sizes is given");
  if ((!scales.empty() && int64_t(scales.size()) != r) || (!sizes.empty() && int64_t(sizes.size()) != r))
    c.fail("scales/sizes need one entry per dimension of " + shape_str(x.shape()));
  if (m.coord == "tf_crop_and_resize" && int64_t(roi.size()) != 2 * r) c.fail("tf_crop_and_resize needs roi with 2 entries per dimension");
  if (c.s("keep_aspect_ratio_policy", "stretch") != "stretch") c.fail("keep_aspect_ratio_policy other than stretch is not supported");
  Tensor y = x.to(compute_dtype(x.dtype()));
  for (int64_t d = 0; d < r; ++d) {
    int64_t in = x.size(d);
    int64_t out = sizes.empty() ? int64_t(std::floor(double(in) * scales[size_t(d)])) : sizes[size_t(d)];
    double scale = sizes.empty() ? scales[size_t(d)] : double(out) / double(in);
    if (out < 0 || (out > 0 && scale <= 0)) c.fail("invalid output extent " + std::to_string(out) + " along axis " + std::to_string(d));
    bool crop = m.coord == "tf_crop_and_resize";
    if (out == in && scale == 1.0 && !crop) continue;
    auto [w, bias] = axis_weights(c, m, in, out, scale, crop ? roi[size_t(d)] : 0, crop ? roi[size_t(d + r)] : 1);
    TensorOptions o{y.dtype(), y.device()};
    Tensor wt = from_vector(w, {out, in}, o).transpose(0, 1);
    Tensor moved = y.transpose(d, r - 1);
    Tensor res = matmul(moved, wt);
    if (crop) res = res + from_vector(bias, {out}, o);
    y = res.transpose(d, r - 1);
  }
  return y.to(x.dtype());
}

// Hann, Hamming and Blackman windows: sum_k a_k cos(2 pi k n / N), N = size (periodic) or size - 1.
OpFn window_op(std::vector<double> a) {
  return [a](Ctx& c) {
    int64_t size = c.ints_input(0).at(0);
    if (size < 0) c.fail("negative size");
    double n_den = c.i("periodic", 1) ? double(size) : double(size - 1);
    std::vector<double> v(static_cast<size_t>(size));
    for (int64_t n = 0; n < size; ++n) {
      double s = 0;
      for (size_t k = 0; k < a.size(); ++k) s += a[k] * std::cos(2 * kPi * double(k) * double(n) / n_den);
      v[size_t(n)] = s;
    }
    DType dt = to_dtype(int32_t(c.i("output_datatype", 1)), c.node.op_type());
    return Ts{from_vector(v, {size}, {dt, c.device})};
  };
}

// ReverseSequence: a gather along the time axis whose indices (made on the host from the
// sequence lengths) reverse each batch entry's first len elements.
Tensor reverse_sequence(Ctx& c) {
  const Tensor& x = c.input(0);
  int64_t ta = axis_of(c, c.i("time_axis", 0), x.dim()), ba = axis_of(c, c.i("batch_axis", 1), x.dim());
  std::vector<int64_t> lens = c.ints_input(1);
  int64_t t_len = x.size(ta), b_len = x.size(ba);
  if (int64_t(lens.size()) != b_len) c.fail("sequence_lens needs one entry per batch element");
  std::vector<int64_t> idx(size_t(t_len * b_len));
  for (int64_t t = 0; t < t_len; ++t)
    for (int64_t b = 0; b < b_len; ++b) {
      int64_t l = std::min(std::max<int64_t>(lens[size_t(b)], 0), t_len);
      int64_t v = t < l ? l - 1 - t : t;
      idx[size_t(ta < ba ? t * b_len + b : b * t_len + t)] = v;
    }
  Shape s(size_t(x.dim()), 1);
  s[size_t(ta)] = t_len;
  s[size_t(ba)] = b_len;
  Tensor it = from_vector(idx, s, {DType::Int64, x.device()}).expand(x.shape());
  return gather(x, ta, it);
}

// GridSample (opset 16, 2-D): X [N, C, H, W] sampled at grid [N, Ho, Wo, 2] (x, y in [-1, 1]).
// The sample positions are runtime values, so taps are gathers at indices computed as tensors.
struct Grid {
  std::string padding;
  bool align;
};
// Reflects coordinates into [lo, hi] (twice the bounds given, as integers), as PyTorch does.
Tensor reflect(const Tensor& x, double twice_lo, double twice_hi) {
  if (twice_lo == twice_hi) return zeros_like(x);
  double lo = twice_lo / 2, span = (twice_hi - twice_lo) / 2;
  Tensor in = abs(x - lo), flips = floor(in / span), extra = in - flips * span;
  Tensor even = eq(flips - 2.0 * floor(flips / 2.0), zeros_like(flips));
  return where(even, extra + lo, (span - extra) + lo);
}
// Applies the padding mode to source coordinates (border and reflection keep them in range).
Tensor pad_coord(const Grid& g, const Tensor& x, int64_t size) {
  if (g.padding == "border") return clamp(x, 0.0, double(size - 1));
  if (g.padding == "reflection") {
    Tensor r = g.align ? reflect(x, 0, 2.0 * double(size - 1)) : reflect(x, -1, 2.0 * double(size) - 1);
    return clamp(r, 0.0, double(size - 1));
  }
  return x;
}
// Values of X at integer-valued coordinates (yi, xi) [N, Ho, Wo]; zero outside (zeros padding).
Tensor tap(const Tensor& x, const Tensor& yi, const Tensor& xi) {
  int64_t n = x.size(0), ch = x.size(1), h = x.size(2), w = x.size(3), ho = yi.size(1), wo = yi.size(2);
  Tensor valid = logical_and(logical_and(xi >= 0.0, xi <= double(w - 1)), logical_and(yi >= 0.0, yi <= double(h - 1)));
  Tensor flat = (clamp(yi, 0.0, double(h - 1)) * double(w) + clamp(xi, 0.0, double(w - 1))).to(DType::Int64);
  Tensor idx = flat.reshape({n, 1, ho * wo}).expand({n, ch, ho * wo});
  Tensor v = gather(x.reshape({n, ch, h * w}), 2, idx).reshape({n, ch, ho, wo});
  return where(valid.unsqueeze(1), v, zeros_like(v));
}

Tensor grid_sample(Ctx& c) {
  const Tensor &x = c.input(0), &grid = c.input(1);
  if (x.dim() != 4 || grid.dim() != 4 || grid.size(3) != 2 || grid.size(0) != x.size(0))
    c.fail("needs X [N, C, H, W] and grid [N, Ho, Wo, 2]");
  Grid g{c.s("padding_mode", "zeros"), c.i("align_corners", 0) != 0};
  std::string mode = c.s("mode", "bilinear");
  if (g.padding != "zeros" && g.padding != "border" && g.padding != "reflection") c.fail("padding_mode '" + g.padding + "'");
  int64_t h = x.size(2), w = x.size(3);
  auto unnorm = [&](const Tensor& v, int64_t size) {
    return g.align ? (v + 1.0) * (0.5 * double(size - 1)) : ((v + 1.0) * double(size) - 1.0) * 0.5;
  };
  Tensor ix = unnorm(grid.narrow(3, 0, 1).squeeze(3), w), iy = unnorm(grid.narrow(3, 1, 1).squeeze(3), h);
  if (mode == "nearest") return tap(x, round(pad_coord(g, iy, h)), round(pad_coord(g, ix, w)));
  if (mode == "bilinear") {
    ix = pad_coord(g, ix, w);
    iy = pad_coord(g, iy, h);
    Tensor x0 = floor(ix), y0 = floor(iy), wx = (ix - x0).unsqueeze(1), wy = (iy - y0).unsqueeze(1);
    return tap(x, y0, x0) * (1.0 - wx) * (1.0 - wy) + tap(x, y0, x0 + 1.0) * wx * (1.0 - wy) + tap(x, y0 + 1.0, x0) * (1.0 - wx) * wy +
           tap(x, y0 + 1.0, x0 + 1.0) * wx * wy;
  }
  if (mode != "bicubic") c.fail("mode '" + mode + "' is not supported");
  const double a = -0.75;
  auto near = [a](const Tensor& d) { return ((a + 2) * d - (a + 3)) * d * d + 1.0; };
  auto far = [a](const Tensor& d) { return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a; };
  Tensor x0 = floor(ix), y0 = floor(iy), tx = ix - x0, ty = iy - y0;
  Tensor cx[4] = {far(tx + 1.0), near(tx), near(1.0 - tx), far(2.0 - tx)}, cy[4] = {far(ty + 1.0), near(ty), near(1.0 - ty), far(2.0 - ty)};
  Tensor out;
  for (int j = 0; j < 4; ++j)
    for (int i = 0; i < 4; ++i) {
      Tensor v = tap(x, pad_coord(g, y0 + double(j - 1), h), pad_coord(g, x0 + double(i - 1), w)) * (cx[i] * cy[j]).unsqueeze(1);
      out = out.defined() ? out + v : v;
    }
  return out;
}

// The discrete Fourier transform of real or complex signals ([..., n, 1] or [..., n, 2]) along
// the last signal dim, as matmuls with host-made cosine and sine matrices [n, bins]. Returns
// [..., bins, 2].
Tensor dft_last(const Tensor& re, const Tensor& im, int64_t bins, bool inverse) {
  int64_t n = re.size(-1);
  std::vector<double> cs(static_cast<size_t>(n * bins)), sn(static_cast<size_t>(n * bins));
  for (int64_t j = 0; j < n; ++j)
    for (int64_t k = 0; k < bins; ++k) {
      double ang = 2 * kPi * double((j * k) % std::max<int64_t>(n, 1)) / double(n);
      cs[size_t(j * bins + k)] = std::cos(ang) / (inverse ? double(n) : 1.0);
      sn[size_t(j * bins + k)] = std::sin(ang) / (inverse ? double(n) : 1.0) * (inverse ? 1.0 : -1.0);
    }
  TensorOptions o{re.dtype(), re.device()};
  Tensor c = from_vector(cs, {n, bins}, o), s = from_vector(sn, {n, bins}, o);
  Tensor out_re = matmul(re, c), out_im = matmul(re, s);
  if (im.defined()) {
    out_re = out_re - matmul(im, s);
    out_im = out_im + matmul(im, c);
  }
  return stack({out_re, out_im}, -1);
}

// Splits [..., n, 1|2] into real and imaginary parts (undefined for a real signal).
std::pair<Tensor, Tensor> complex_parts(const Ctx& c, const Tensor& x) {
  if (x.dim() < 2 || (x.size(-1) != 1 && x.size(-1) != 2)) c.fail("the signal's last dim must be 1 (real) or 2 (complex), got " + shape_str(x.shape()));
  Tensor re = x.narrow(-1, 0, 1).squeeze(-1);
  return {re, x.size(-1) == 2 ? x.narrow(-1, 1, 1).squeeze(-1) : Tensor()};
}

Tensor dft(Ctx& c) {
  const Tensor& x = c.input(0);
  int64_t axis = axis_of(c, c.i("axis", 1), x.dim() - 1);
  bool inverse = c.i("inverse", 0) != 0, onesided = c.i("onesided", 0) != 0;
  auto [re, im] = complex_parts(c, x);
  re = re.transpose(axis, -1);
  if (im.defined()) im = im.transpose(axis, -1);
  int64_t n = re.size(-1), len = c.has_input(1) ? c.ints_input(1).at(0) : n;
  if (len < 1) c.fail("dft_length must be positive");
  auto fit = [&](Tensor t) {  // zero-pad or truncate to dft_length
    if (!t.defined() || len == n) return t;
    if (len < n) return t.narrow(-1, 0, len);
    std::vector<int64_t> p(size_t(2 * t.dim()), 0);
    p.back() = len - n;
    return pad(t, p, 0);
  };
  re = fit(re);
  im = fit(im);
  if (onesided && im.defined()) c.fail("onesided needs a real signal");
  Tensor y = dft_last(re, im, onesided ? len / 2 + 1 : len, inverse);  // [..., bins, 2] with the signal axis last-but-one
  return y.transpose(axis, -2);
}

// STFT: frames of frame_length every frame_step along dim 1 of [batch, n, 1|2], windowed, then a
// DFT of each: [batch, frames, bins, 2].
Tensor stft(Ctx& c) {
  const Tensor& x = c.input(0);
  auto [re, im] = complex_parts(c, x);
  if (re.dim() != 2) c.fail("needs a signal [batch, n, 1|2]");
  int64_t n = re.size(1), step = c.ints_input(1).at(0);
  Tensor window = c.has_input(2) ? c.input(2) : Tensor();
  int64_t len = c.has_input(3) ? c.ints_input(3).at(0) : window.defined() ? window.size(0) : 0;
  if (step < 1 || len < 1 || len > n) c.fail("frame_step and frame_length must be positive, frame_length at most the signal's " + std::to_string(n));
  int64_t frames = (n - len) / step + 1;
  std::vector<int64_t> rows;
  for (int64_t f = 0; f < frames; ++f)
    for (int64_t k = 0; k < len; ++k) rows.push_back(f * step + k);
  Tensor idx = from_vector(rows, {int64_t(rows.size())}, {DType::Int64, x.device()});
  auto framed = [&](const Tensor& t) {
    if (!t.defined()) return t;
    Tensor fr = index_select(t, 1, idx).reshape({t.size(0), frames, len});
    return window.defined() ? fr * window : fr;
  };
  bool onesided = c.i("onesided", 1) != 0 && !im.defined();
  return dft_last(framed(re), framed(im), onesided ? len / 2 + 1 : len, false);
}

// RoiAlign, average mode: the regions (read on the host like shape operands) give, per region,
// a matrix [oh * ow, H * W] of bilinear sample weights averaged per output cell, applied to that
// region's image as a matmul. Max mode is refused.
Tensor roi_align(Ctx& c) {
  const Tensor& x = c.input(0);
  if (x.dim() != 4) c.fail("needs X [N, C, H, W]");
  if (c.s("mode", "avg") != "avg") c.fail("mode 'max' is not supported");
  std::vector<double> rois = c.input(1).to(DType::Float64).to_vector<double>();
  std::vector<int64_t> batch = c.ints_input(2);
  int64_t n_rois = int64_t(batch.size()), ch = x.size(1), h = x.size(2), w = x.size(3);
  int64_t oh = c.i("output_height", 1), ow = c.i("output_width", 1), ratio = c.i("sampling_ratio", 0);
  double scale = c.f("spatial_scale", 1.0);
  bool half_pixel = c.s("coordinate_transformation_mode", "half_pixel") == "half_pixel";
  if (int64_t(rois.size()) != 4 * n_rois || oh < 1 || ow < 1) c.fail("rois must be [num_rois, 4] with one batch index each");
  std::vector<Tensor> outs;
  for (int64_t r = 0; r < n_rois; ++r) {
    if (batch[size_t(r)] < 0 || batch[size_t(r)] >= x.size(0)) c.fail("batch index " + std::to_string(batch[size_t(r)]) + " out of range");
    double off = half_pixel ? 0.5 : 0.0, x0 = rois[size_t(4 * r)] * scale - off, y0 = rois[size_t(4 * r + 1)] * scale - off;
    double rw = rois[size_t(4 * r + 2)] * scale - off - x0, rh = rois[size_t(4 * r + 3)] * scale - off - y0;
    if (!half_pixel) rw = std::max(rw, 1.0), rh = std::max(rh, 1.0);
    double bh = rh / double(oh), bw = rw / double(ow);
    int64_t gh = ratio > 0 ? ratio : int64_t(std::ceil(rh / double(oh))), gw = ratio > 0 ? ratio : int64_t(std::ceil(rw / double(ow)));
    double count = double(std::max<int64_t>(gh * gw, 1));
    std::vector<double> m(static_cast<size_t>(oh * ow * h * w), 0.0);
    for (int64_t py = 0; py < oh; ++py)
      for (int64_t px = 0; px < ow; ++px) {
        double* row = m.data() + (py * ow + px) * h * w;
        for (int64_t iy = 0; iy < gh; ++iy)
          for (int64_t ix = 0; ix < gw; ++ix) {
            double y = y0 + double(py) * bh + (double(iy) + 0.5) * bh / double(gh);
            double xx = x0 + double(px) * bw + (double(ix) + 0.5) * bw / double(gw);
            if (y < -1.0 || y > double(h) || xx < -1.0 || xx > double(w)) continue;
            y = std::max(y, 0.0);
            xx = std::max(xx, 0.0);
            int64_t yl = int64_t(y), xl = int64_t(xx), yh = yl + 1, xh = xl + 1;
            if (yl >= h - 1) yh = yl = h - 1, y = double(yl);
            if (xl >= w - 1) xh = xl = w - 1, xx = double(xl);
            double ly = y - double(yl), lx = xx - double(xl), hy = 1 - ly, hx = 1 - lx;
            row[yl * w + xl] += hy * hx / count;
            row[yl * w + xh] += hy * lx / count;
            row[yh * w + xl] += ly * hx / count;
            row[yh * w + xh] += ly * lx / count;
          }
      }
    Tensor weights = from_vector(m, {oh * ow, h * w}, {x.dtype(), x.device()});
    Tensor img = x.narrow(0, batch[size_t(r)], 1).reshape({ch, h * w});
    outs.push_back(matmul(img, weights.transpose(0, 1)).reshape({ch, oh, ow}));
  }
  return stack(outs, 0);
}

// MelWeightMatrix [dft_length / 2 + 1, num_mel_bins]: triangular filters between mel-spaced
// edges, rounded down to DFT bins as ONNX's reference does.
Tensor mel_weight_matrix(Ctx& c) {
  int64_t mels = c.ints_input(0).at(0), dft_len = c.ints_input(1).at(0), rate = c.ints_input(2).at(0);
  double lo = c.doubles_input(3).at(0), hi = c.doubles_input(4).at(0);
  if (mels < 1 || dft_len < 1 || rate < 1 || mels > 4096 || dft_len > (1 << 20)) c.fail("num_mel_bins, dft_length and sample_rate must be positive (and sane)");
  int64_t bins = dft_len / 2 + 1;
  auto to_mel = [](double hz) { return 2595.0 * std::log10(1.0 + hz / 700.0); };
  double mel_lo = to_mel(lo), step = (to_mel(hi) - mel_lo) / double(mels + 2);
  std::vector<int64_t> edge(static_cast<size_t>(mels + 2));
  for (int64_t i = 0; i < mels + 2; ++i) {
    double hz = 700.0 * (std::pow(10.0, (double(i) * step + mel_lo) / 2595.0) - 1.0);
    edge[size_t(i)] = int64_t(std::floor(double(dft_len + 1) * hz / double(rate)));
  }
  std::vector<double> m(static_cast<size_t>(bins * mels), 0.0);
  auto at = [&](int64_t j, int64_t i) -> double& {
    if (j < 0 || j >= bins) c.fail("a filter edge falls outside the " + std::to_string(bins) + " DFT bins");
    return m[size_t(j * mels + i)];
  };
  for (int64_t i = 0; i < mels; ++i) {
    int64_t left = edge[size_t(i)], center = edge[size_t(i + 1)], right = edge[size_t(i + 2)];
    if (center == left) at(center, i) = 1;
    else
      for (int64_t j = left; j <= center; ++j) at(j, i) = double(j - left) / double(center - left);
    for (int64_t j = center; j < right; ++j) at(j, i) = double(right - j) / double(right - center);
  }
  DType dt = to_dtype(int32_t(c.i("output_datatype", 1)), "MelWeightMatrix");
  return from_vector(m, {bins, mels}, {dt, c.device});
}

}  // namespace

void add_signal_ops(OpTable& t) {
  t["MelWeightMatrix"] = [](Ctx& c) { return Ts{mel_weight_matrix(c)}; };
  t["RoiAlign"] = [](Ctx& c) { return Ts{roi_align(c)}; };
  t["DFT"] = [](Ctx& c) { return Ts{dft(c)}; };
  t["STFT"] = [](Ctx& c) { return Ts{stft(c)}; };
  t["GridSample"] = [](Ctx& c) { return Ts{grid_sample(c)}; };
  t["Resize"] = [](Ctx& c) { return Ts{resize(c)}; };
  t["Upsample"] = t["Resize"];
  t["HannWindow"] = window_op({0.5, -0.5});
  t["HammingWindow"] = window_op({25.0 / 46.0, -21.0 / 46.0});
  t["BlackmanWindow"] = window_op({0.42, -0.5, 0.08});
  t["ReverseSequence"] = [](Ctx& c) { return Ts{reverse_sequence(c)}; };
}

}  // namespace tessera::onnx::detail
