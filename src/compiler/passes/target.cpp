// apply_target: the lowered plan as the target lays it out. Runs right after lowering, so the
// schedule, epilogues and the memory plan see the target's buffer sizes.
//   - Dtypes: a Step whose output, inputs or instructions use a dtype the target does not compute
//     is refused with an error naming the Step's first source op and its scope.
//   - float32_as: every float32 slot, Step dtype and instruction becomes that dtype (arithmetic of
//     a 16-bit float still runs in float32, as compute_dtype says).
//   - Sizes: each slot's bytes are Target::buffer_bytes (tiles, the stored dtype); each Step's
//     cost bytes are scaled by the ratio of its slots' new bytes to their traced bytes (exact when
//     a Step moves each of its buffers once, as the cost rules count them).
#include <string>

#include "compiler/passes/passes.h"
#include "core/fail.h"

namespace tessera::compiler {
namespace {

std::string dtype_list(const kir::Target& t) {
  std::string s;
  for (DType d : t.compute_dtypes) s += (s.empty() ? "" : ", ") + std::string(dtype_name(d));
  return s;
}

void check_dtypes(const Plan& plan, const kir::Target& t) {
  if (t.compute_dtypes.empty()) return;
  for (const kir::Step& st : plan.steps) {
    auto check = [&](DType d) {
      if (t.computes(t.stored(d))) return;
      const kir::Source& src = st.sources.front();
      fail(src.op, std::string(dtype_name(t.stored(d))) + " is not computed by the target device (it computes " +
                       dtype_list(t) + "); step: " + st.str(),
           src.scope);
    };
    check(st.dtype);
    for (int s : st.inputs) check(plan.slots[size_t(s)].dtype);
    for (int s : st.outputs()) check(plan.slots[size_t(s)].dtype);
    for (const kir::Instr& in : st.program) check(in.dtype);
  }
}

}  // namespace

void apply_target(Plan& plan, const kir::Target& t) {
  check_dtypes(plan, t);
  if (!t.tiled() && !t.float32_as) return;
  std::vector<double> traced(plan.slots.size());
  for (size_t k = 0; k < plan.slots.size(); ++k) {
    kir::Slot& sl = plan.slots[k];
    traced[k] = double(sl.nbytes);
    sl.nbytes = t.buffer_bytes(sl.shape, sl.dtype);
    sl.dtype = t.stored(sl.dtype);
  }
  for (kir::Step& st : plan.steps) {
    double before = 0, after = 0;
    auto add = [&](int s) {
      before += traced[size_t(s)];
      after += double(plan.slots[size_t(s)].nbytes);
    };
    for (int s : st.inputs) add(s);
    for (int s : st.outputs()) add(s);
    if (before > 0) st.cost.bytes *= after / before;
    st.dtype = t.stored(st.dtype);
    for (DType& d : st.input_dtypes) d = t.stored(d);
    for (kir::Instr& in : st.program) in.dtype = t.stored(in.dtype);
  }
}

}  // namespace tessera::compiler
