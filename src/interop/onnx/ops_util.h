// Internal to the ONNX importer: helpers the op files share, and the functions that add each
// file's ops to the table.
#pragma once
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "interop/onnx/graph.h"

namespace tessera::onnx::detail {

using Ts = std::vector<Tensor>;
using OpTable = std::map<std::string, OpFn>;
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kPi = 3.14159265358979323846;

inline int64_t axis_of(const Ctx& c, int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= std::max<int64_t>(rank, 1)) c.fail("axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  return axis < 0 ? axis + rank : axis;
}
inline std::vector<int64_t> axes_of(const Ctx& c, std::vector<int64_t> axes, int64_t rank) {
  for (auto& a : axes) a = axis_of(c, a, rank);
  return axes;
}
inline Tensor like(double v, const Tensor& t) { return full({}, v, {t.dtype(), t.device()}); }
inline Tensor cast(const Tensor& t, DType d) { return t.dtype() == d ? t : t.to(d); }

void add_math_ops(OpTable& t);   // ops_math.cpp: elementwise, reductions, softmax, losses
void add_nn_ops(OpTable& t);     // ops_nn.cpp: matmul, convolution, pooling, normalization
void add_shape_ops(OpTable& t);  // ops_shape.cpp: views, indexing, constants and generators
void add_signal_ops(OpTable& t);  // ops_signal.cpp: Resize, Upsample, GridSample, RoiAlign, DFT, STFT, windows, ReverseSequence
void add_rnn_ops(OpTable& t);     // ops_rnn.cpp: RNN, GRU, LSTM

}  // namespace tessera::onnx::detail
