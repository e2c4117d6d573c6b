#include "compiler/dump.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include "tessera/error.h"

namespace tessera::compiler {
namespace {

std::mutex g_write_mu;  // keeps stderr dumps of concurrent compiles apart

std::string file_name(int graph, const char* stage) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "graph-%04d.%s.txt", graph, stage);
  return buf;
}

void emit(const DumpOptions& c, const char* stage, const std::string& text) {
  std::lock_guard<std::mutex> lock(g_write_mu);
  if (c.dir.empty()) {
    std::fprintf(stderr, "==== tessera dump: graph %d, %s ====\n%s", c.graph, stage, text.c_str());
    if (!text.empty() && text.back() != '\n') std::fputc('\n', stderr);
    std::fflush(stderr);
    return;
  }
  namespace fs = std::filesystem;
  fs::path dir(c.dir);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir))
    throw Error("[dump] cannot create the TESSERA_DUMP_DIR directory '" + c.dir + "'" +
                (ec ? ": " + ec.message() : std::string(": not a directory")));
  fs::path p = dir / file_name(c.graph, stage);
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  if (out) out << text;
  if (out) out.flush();
  if (!out) {
    int err = errno;
    throw Error("[dump] cannot write '" + p.string() + "'" + (err ? std::string(": ") + std::strerror(err) : ""));
  }
}

std::string fmt_double(double v) {
  std::ostringstream os;
  os.precision(9);
  os << v;
  return os.str();
}

std::string source_text(const kir::Source& s) { return s.op + (s.scope.empty() ? "" : "@" + s.scope); }

// Names written here rather than taken from kernel_ir, so a newly added code or kind prints as
// its number instead of reading past a table.
const char* code_name(kir::Code c) {
  using C = kir::Code;
  switch (c) {
    case C::Load: return "load";
    case C::Const: return "const";
    case C::Iota: return "iota";
    case C::Rng: return "rng";
    case C::Cast: return "cast";
    case C::Neg: return "neg";
    case C::Exp: return "exp";
    case C::Log: return "log";
    case C::Tanh: return "tanh";
    case C::Abs: return "abs";
    case C::Sign: return "sign";
    case C::Sqrt: return "sqrt";
    case C::Sin: return "sin";
    case C::Cos: return "cos";
    case C::Erf: return "erf";
    case C::Floor: return "floor";
    case C::Ceil: return "ceil";
    case C::Round: return "round";
    case C::Add: return "add";
    case C::Sub: return "sub";
    case C::Mul: return "mul";
    case C::Div: return "div";
    case C::Max: return "max";
    case C::Min: return "min";
    case C::Pow: return "pow";
    case C::Eq: return "eq";
    case C::Ne: return "ne";
    case C::Lt: return "lt";
    case C::Le: return "le";
    case C::Gt: return "gt";
    case C::Ge: return "ge";
    case C::Where: return "where";
    case C::RowSum: return "row_sum";
    case C::RowMax: return "row_max";
    default: return nullptr;
  }
}

std::string kind_name(kir::StepKind k) {
  using K = kir::StepKind;
  switch (k) {
    case K::Elementwise: return "elementwise";
    case K::Copy: return "copy";
    case K::Reduce: return "reduce";
    case K::Gemm: return "gemm";
    case K::Gather: return "gather";
    case K::ScatterAdd: return "scatter_add";
    case K::DynamicUpdateSlice: return "dynamic_update_slice";
    case K::Row: return "row";
    case K::Collective: return "collective";
    case K::Attention: return "attention";
    default: return "kind#" + std::to_string(int(k));
  }
}

const char* slot_kind_name(kir::SlotKind k) {
  switch (k) {
    case kir::SlotKind::Param: return "param";
    case kir::SlotKind::Output: return "output";
    case kir::SlotKind::Temp: return "temp";
    default: return "slot-kind?";
  }
}

std::string ints_text(const std::vector<int64_t>& v) {
  std::string s = "{";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  return s + "}";
}

}  // namespace

std::string instr_text(const kir::Instr& in) {
  std::ostringstream os;
  const char* name = code_name(in.code);
  os << dtype_short(in.dtype) << " " << (name ? name : "code#" + std::to_string(int(in.code)));
  auto operand = [&](int v) { os << " %" << v; };
  if (in.a >= 0) operand(in.a);
  if (in.b >= 0) operand(in.b);
  if (in.c >= 0) operand(in.c);
  if (in.input >= 0) os << " input " << in.input;
  if (in.code == kir::Code::Load) os << " pad=" << fmt_double(in.value);
  else if (in.code == kir::Code::Const) os << " value=" << fmt_double(in.value);
  else if (in.value != 0) os << " value=" << fmt_double(in.value);
  if (in.code == kir::Code::Iota) os << " axis=" << in.i0;
  else if (in.code == kir::Code::Rng) os << " draw=" << in.i0 << " dist=" << in.i1;
  else if (in.i0 || in.i1) os << " i0=" << in.i0 << " i1=" << in.i1;
  if (!in.map.views.empty()) os << " map " << in.map.str();
  return os.str();
}

std::string step_text(const kir::Step& st) {
  std::ostringstream os;
  os << kind_name(st.kind) << " " << dtype_short(st.dtype) << shape_str(st.shape) << " -> slot " << st.output;
  for (size_t k = 0; k < st.more_outputs.size(); ++k) {
    os << ", slot " << st.more_outputs[k];
    if (st.attention)
      os << (st.attention->backward ? (k ? " (dV)" : " (dK^T)") : " (log-sum-exp)");
    else if (k < st.more_results.size())
      os << " (instr " << st.more_results[k] << ")";
  }
  os << "\n";
  os << "  inputs:";
  if (st.inputs.empty()) os << " none";
  for (size_t i = 0; i < st.inputs.size(); ++i) {
    os << (i ? ", " : " ") << "slot " << st.inputs[i];
    if (i < st.input_dtypes.size() && (st.rounded >> i & 1))
      os << " (f32 rounded to " << dtype_short(st.input_dtypes[i]) << " as read)";
    else if (i < st.input_dtypes.size()) os << " (" << dtype_short(st.input_dtypes[i]) << ")";
  }
  os << "\n  sources (" << st.sources.size() << "):";
  for (auto& s : st.sources) os << " " << source_text(s);
  os << "\n";
  if (st.kind == kir::StepKind::Reduce)
    os << "  reduce " << ir::op_name(st.reduce_op) << " over axes " << ints_text(st.axes) << " of domain "
       << shape_str(st.domain) << "\n";
  if (st.kind == kir::StepKind::Row)
    os << "  rows of " << st.row << " positions over domain " << shape_str(st.domain)
       << (numel(st.shape) != numel(st.domain) ? ", one value per row" : "") << "\n";
  if (st.kind == kir::StepKind::Gemm && !st.input_dtypes.empty() && compute_dtype(st.input_dtypes[0]) != st.input_dtypes[0])
    os << "  product: " << dtype_name(st.input_dtypes[0]) << " operands, float32 accumulation (autocast)\n";
  if (!st.out_strides.empty()) {
    os << "  product written through strides [";
    for (size_t i = 0; i < st.out_strides.size(); ++i) os << (i ? ", " : "") << st.out_strides[i];
    os << "]" << (st.out_offset ? " from element " + std::to_string(st.out_offset) : "") << " (its reader's permuted layout)\n";
  }
  if (st.accumulate) os << "  accumulates: the product is added to what its output slot holds (in-place accumulation)\n";
  if (st.kind == kir::StepKind::Gemm && !st.program.empty()) os << "  epilogue: the program below, per row block\n";
  if (st.kind == kir::StepKind::Gather || st.kind == kir::StepKind::ScatterAdd) os << "  axis " << st.axis << "\n";
  if (st.attention) {
    const auto& a = *st.attention;
    os << "  attention: " << a.batch << " x softmax(" << fmt_double(a.scale) << " * Q K^T" << (a.causal ? ", causal" : "")
       << (a.causal && a.causal_offset ? " +" + std::to_string(a.causal_offset) : "") << ") V; Tq " << a.tq << ", Tk " << a.tk
       << ", d " << a.d << ", dv " << a.dv << " (maps: Q, K, V; the scores never stored)\n";
    if (a.bf16) os << "  attention: bfloat16 operands (P, dP and dS rounded too), float32 accumulation and softmax (autocast)\n";
    static const char* const kOut[2][3] = {{"output", "", ""}, {"dQ", "dK^T", "dV"}};
    for (size_t i = 0; i < st.out_maps.size() && i < 3; ++i)
      os << "  written through: " << kOut[a.backward ? 1 : 0][i] << " " << st.out_maps[i].str() << "\n";
  }
  for (size_t i = 0; i < st.maps.size(); ++i) os << "  map " << i << ": " << st.maps[i].str() << "\n";
  if (!st.program.empty()) {
    os << "  program (" << st.program.size() << " instructions):\n";
    for (size_t i = 0; i < st.program.size(); ++i) os << "    %" << i << " = " << instr_text(st.program[i]) << "\n";
  }
  if (!st.parts.empty()) {
    os << "  " << st.parts.size() << " parts, one launch (each an Elementwise Step as it would run alone):\n";
    for (size_t i = 0; i < st.parts.size(); ++i) os << "  part " << i << ": " << step_text(st.parts[i]);
  }
  os << "  cost: " << fmt_double(st.cost.flops) << " flops, " << fmt_double(st.cost.bytes) << " bytes\n";
  return os.str();
}

std::string steps_text(const Plan& plan) {
  std::ostringstream os;
  os << plan.steps.size() << " steps\n";
  for (size_t s = 0; s < plan.steps.size(); ++s) os << "step " << s << ": " << step_text(plan.steps[s]);
  return os.str();
}

std::string plan_text(const ir::Graph& g, const Plan& plan) {
  std::ostringstream os;
  os << "graph: " << g.nodes.size() << " nodes, " << g.params.size() << " parameters, " << g.outputs.size()
     << " outputs; " << plan.steps.size() << " steps, " << plan.slots.size() << " slots\n";
  os << "slots:\n";
  for (size_t i = 0; i < plan.slots.size(); ++i) {
    const kir::Slot& sl = plan.slots[i];
    os << "  slot " << i << ": " << slot_kind_name(sl.kind);
    if (sl.kind != kir::SlotKind::Temp) os << " " << sl.index;
    os << " " << dtype_short(sl.dtype) << shape_str(sl.shape) << " " << sl.nbytes << " B";
    if (sl.kind == kir::SlotKind::Temp) os << " @arena+" << sl.offset;
    os << " from " << source_text(sl.source) << "\n";
  }
  os << "outputs:";
  for (size_t k = 0; k < plan.output_slot.size(); ++k) {
    os << " " << k << "=slot " << plan.output_slot[k];
    if (k < plan.donated.size() && plan.donated[k] >= 0) os << " (into parameter " << plan.donated[k] << ")";
  }
  os << "\narena: " << plan.arena_bytes << " B (lower bound " << plan.memory.max_live_temp_bytes << " B)\n";
  os << "memory peak: " << plan.memory.peak_bytes << " B at step " << plan.memory.peak_step << "; live slots:";
  if (plan.memory.live_at_peak.empty()) os << " none";
  for (int s : plan.memory.live_at_peak) os << " " << s;
  os << "\nstep bytes: " << plan.memory.step_bytes << " B (parameters + outputs + arena)";
  if (plan.memory.budget_bytes)
    os << "; budget " << plan.memory.budget_bytes << " B, " << plan.memory.natural_step_bytes << " B before the budget passes; remat: "
       << plan.memory.recomputed_steps << " Steps recomputed (" << plan.memory.recompute_flops << " flops); unstack: "
       << (plan.memory.unstacked_slices ? plan.memory.unstacked : "none") << "; accumulated in place: "
       << plan.memory.accumulated_in_place << " Steps; cost " << plan.memory.extra_cost
       << " flops + bytes over the natural plan's";
  os << "\n";
  return os.str();
}

void dump_graph(const DumpOptions& opts, const char* stage, const ir::Graph& g) {
  if (opts.ir) emit(opts, stage, ir::to_text(g));
}

void dump_plan(const DumpOptions& opts, const ir::Graph& g, const Plan& plan) {
  if (opts.fused) emit(opts, "fused", steps_text(plan));
  if (opts.plan) emit(opts, "plan", plan_text(g, plan));
}

}  // namespace tessera::compiler
