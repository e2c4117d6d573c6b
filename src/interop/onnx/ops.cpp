// The default-domain op table (the ops_*.cpp files add their ops), and the ops refused with a reason.
#include "interop/onnx/ops_util.h"

namespace tessera::onnx::detail {

const std::map<std::string, std::string>& refused_ops() {
  static const std::map<std::string, std::string> refused{
      {"NonZero", "its output shape depends on the input's values"},
      {"Unique", "its output shape depends on the input's values"},
      {"Compress", "its output shape depends on the condition's values"},
      {"NonMaxSuppression", "its output shape depends on the input's values"},
      {"If", "control flow (subgraphs) is not supported"},
      {"Loop", "control flow (subgraphs) is not supported"},
      {"Scan", "control flow (subgraphs) is not supported"},
      {"RandomNormal", "random ops are not supported (results would not match ONNX's stream)"},
      {"RandomUniform", "random ops are not supported (results would not match ONNX's stream)"},
      {"RandomNormalLike", "random ops are not supported (results would not match ONNX's stream)"},
      {"RandomUniformLike", "random ops are not supported (results would not match ONNX's stream)"},
      {"Multinomial", "random ops are not supported (results would not match ONNX's stream)"},
      {"Bernoulli", "random ops are not supported (results would not match ONNX's stream)"},
  };
  return refused;
}

const std::map<std::string, OpFn>& op_table() {
  static const OpTable table = [] {
    OpTable t;
    add_math_ops(t);
    add_nn_ops(t);
    add_shape_ops(t);
    add_signal_ops(t);
    add_rnn_ops(t);
    return t;
  }();
  return table;
}

}  // namespace tessera::onnx::detail
