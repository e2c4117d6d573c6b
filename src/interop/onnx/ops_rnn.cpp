// ONNX's recurrent ops (RNN, GRU, LSTM) unrolled over the sequence at trace time: each step is
// matmuls and elementwise gates, so every backend runs them and autodiff differentiates them.
// Directions forward, reverse and bidirectional; layout 0 ([seq, batch, ...]) and 1 ([batch,
// seq, ...]); activations Sigmoid, Tanh, Relu. Sequence lengths shorter than the sequence and
// the clip attribute are refused.
#include <algorithm>

#include "interop/onnx/ops_util.h"
#include "tessera/ops.h"

namespace tessera::onnx::detail {
namespace {

enum class Cell { Rnn, Gru, Lstm };

using Act = Tensor (*)(const Tensor&);
Act activation(const Ctx& c, const std::string& name) {
  if (name == "Sigmoid") return sigmoid;
  if (name == "Tanh") return tanh;
  if (name == "Relu") return relu;
  c.fail("activation '" + name + "' is not supported (Sigmoid, Tanh, Relu)");
}

Tensor at0(const Tensor& t, int64_t i) { return t.narrow(0, i, 1).squeeze(0); }  // t[i]

Ts recurrent(Ctx& c, Cell cell) {
  Tensor x = c.input(0);
  const Tensor &w = c.input(1), &r = c.input(2);
  int64_t gates = cell == Cell::Rnn ? 1 : cell == Cell::Gru ? 3 : 4;
  int64_t hidden = c.i("hidden_size", r.size(2));
  std::string dir = c.s("direction", "forward");
  int64_t dirs = dir == "bidirectional" ? 2 : 1;
  if (dir != "forward" && dir != "reverse" && dir != "bidirectional") c.fail("direction '" + dir + "'");
  if (c.has("clip")) c.fail("the clip attribute is not supported");
  bool batch_first = c.i("layout", 0) != 0;
  if (batch_first) x = x.transpose(0, 1);
  int64_t seq = x.size(0), batch = x.size(1);
  if (w.dim() != 3 || w.size(0) != dirs || w.size(1) != gates * hidden) c.fail("W " + shape_str(w.shape()) + " does not match hidden_size " + std::to_string(hidden));
  if (c.has_input(4))
    for (int64_t l : c.ints_input(4))
      if (l != seq) c.fail("sequence_lens shorter than the sequence (" + std::to_string(l) + " < " + std::to_string(seq) + ") are not supported");
  std::vector<std::string> names;
  if (const auto* a = c.attr("activations"))
    for (const auto& s : a->strings()) names.push_back(s);
  std::vector<std::string> defaults = cell == Cell::Rnn ? std::vector<std::string>{"Tanh"} : cell == Cell::Gru ? std::vector<std::string>{"Sigmoid", "Tanh"}
                                                                                                               : std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"};
  size_t per_dir = defaults.size();
  if (names.empty())
    for (int64_t d = 0; d < dirs; ++d) names.insert(names.end(), defaults.begin(), defaults.end());
  if (names.size() != per_dir * size_t(dirs)) c.fail("activations need " + std::to_string(per_dir * size_t(dirs)) + " names");
  TensorOptions o{x.dtype(), x.device()};
  std::vector<Tensor> ys, hs, cs;
  for (int64_t d = 0; d < dirs; ++d) {
    Act f = activation(c, names[per_dir * size_t(d)]);
    Act g = per_dir > 1 ? activation(c, names[per_dir * size_t(d) + 1]) : f;
    Act h_act = per_dir > 2 ? activation(c, names[per_dir * size_t(d) + 2]) : g;
    Tensor wb = c.has_input(3) ? at0(c.input(3), d).narrow(0, 0, gates * hidden) : zeros({gates * hidden}, o);
    Tensor rb = c.has_input(3) ? at0(c.input(3), d).narrow(0, gates * hidden, gates * hidden) : zeros({gates * hidden}, o);
    Tensor h = c.has_input(5) ? at0(c.input(5), d) : zeros({batch, hidden}, o);
    Tensor cst = cell == Cell::Lstm && c.has_input(6) ? at0(c.input(6), d) : zeros({batch, hidden}, o);
    Tensor peep = cell == Cell::Lstm && c.has_input(7) ? at0(c.input(7), d) : Tensor();
    bool reverse = dir == "reverse" || d == 1;
    std::vector<Tensor> out(static_cast<size_t>(seq));
    // Input projections of every step at once; the recurrent part per step.
    Tensor xw = matmul(x, at0(w, d).transpose(0, 1)) + wb;  // [seq, batch, gates*hidden]
    Tensor rt = at0(r, d).transpose(0, 1);                   // [hidden, gates*hidden]
    auto gate = [&](const Tensor& t, int64_t k) { return t.narrow(1, k * hidden, hidden); };
    for (int64_t s = 0; s < seq; ++s) {
      int64_t t = reverse ? seq - 1 - s : s;
      Tensor xt = at0(xw, t);
      if (cell == Cell::Rnn) {
        h = f(xt + matmul(h, rt) + rb);
      } else if (cell == Cell::Gru) {
        Tensor hr = matmul(h, rt) + rb;  // [batch, 3H]: z, r, h parts
        Tensor z = f(gate(xt, 0) + gate(hr, 0)), rr = f(gate(xt, 1) + gate(hr, 1));
        Tensor cand = c.i("linear_before_reset", 0)
                          ? g(gate(xt, 2) + rr * gate(hr, 2))
                          : g(gate(xt, 2) + matmul(rr * h, rt.narrow(1, 2 * hidden, hidden)) + gate(rb.reshape({1, -1}), 2));
        h = (1.0 - z) * cand + z * h;
      } else {
        Tensor a = xt + matmul(h, rt) + rb;  // i, o, f, c
        Tensor ig = gate(a, 0), og = gate(a, 1), fg = gate(a, 2), cg = g(gate(a, 3));
        if (peep.defined()) {
          ig = ig + peep.narrow(0, 0, hidden) * cst;
          fg = fg + peep.narrow(0, 2 * hidden, hidden) * cst;
        }
        cst = f(fg) * cst + f(ig) * cg;
        if (peep.defined()) og = og + peep.narrow(0, hidden, hidden) * cst;
        h = f(og) * h_act(cst);
      }
      out[size_t(t)] = h;
    }
    ys.push_back(stack(out, 0));  // [seq, batch, hidden]
    hs.push_back(h);
    cs.push_back(cst);
  }
  Tensor y = stack(ys, 1), yh = stack(hs, 0), yc = stack(cs, 0);  // [seq, dirs, batch, H], [dirs, batch, H]
  if (batch_first) {
    y = y.permute({2, 0, 1, 3});
    yh = yh.transpose(0, 1);
    yc = yc.transpose(0, 1);
  }
  return {y, yh, yc};
}

}  // namespace

void add_rnn_ops(OpTable& t) {
  t["RNN"] = [](Ctx& c) { return recurrent(c, Cell::Rnn); };
  t["GRU"] = [](Ctx& c) { return recurrent(c, Cell::Gru); };
  t["LSTM"] = [](Ctx& c) { return recurrent(c, Cell::Lstm); };
}

}  // namespace tessera::onnx::detail
