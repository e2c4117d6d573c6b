// Property test of the compiler's optimizations: random small graphs must compute the same
// values with every pass on (the default) and with every pass off (set_disabled_passes("all")):
// normalized error ||on - off||_max / max(||off||_max, tiny) <= 1e-6, NaN and infinities at the
// same places. That covers the IR passes (simplify, cse, dce) now and operator fusion, epilogues
// and scheduling as they land, since "all" switches every pass in passes.h off. Float64 graphs
// are also checked against the float64 reference evaluator.
//
// Graphs: kGraphs of the compiler's random graphs (conformance/random_graph.h describes them),
// graph i drawn from std::mt19937(kRandomGraphSeed + i). On failure the message gives the graph
// index, its seed, both graphs (ir::to_text, before and after the IR passes) and the worst
// element. TESSERA_PROPERTY_GRAPH=i runs graph i alone and prints it.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <cstdio>
#include <sstream>

#include "compiler/passes/passes.h"
#include "runtime/compile_options.h"
#include "conformance/random_graph.h"
#include "tensor/tensor_impl.h"
#include "ir/graph.h"
#include "reference/evaluator.h"
#include "test_util.h"
#include "tessera/tessera.h"

namespace tessera {
namespace {

constexpr uint32_t kSeed = conformance::kRandomGraphSeed;
constexpr int kGraphs = 1200;
constexpr double kTol = 1e-6;

std::vector<std::vector<double>> run(const std::vector<ir::NodePtr>& nodes, const std::string& disabled) {
  runtime::set_disabled_passes(disabled);
  std::vector<Tensor> ts;
  for (auto& n : nodes) ts.push_back(detail::from_node(n));
  sync();
  std::vector<std::vector<double>> v;
  for (auto& t : ts) v.push_back(t.to_vector<double>());
  runtime::set_disabled_passes("");
  return v;
}

std::string describe(int i, const std::vector<ir::NodePtr>& nodes) {
  ir::Graph g = ir::build_graph(nodes);
  ir::Graph h = compiler::dce(compiler::cse(compiler::simplify(g)));
  std::ostringstream os;
  os << "graph " << i << " (std::mt19937 seed " << kSeed + uint32_t(i) << ")\n"
     << ir::to_text(g) << "after the IR passes:\n"
     << ir::to_text(h);
  return os.str();
}

TEST(FusionProperty, PassesOnAndOffAgreeOnRandomGraphs) {
  auto t0 = std::chrono::steady_clock::now();
  int simplified = 0, merged = 0, ref_checked = 0, failures = 0, first = 0, last = kGraphs;
  const char* only = std::getenv("TESSERA_PROPERTY_GRAPH");
  if (only) first = std::atoi(only), last = first + 1;
  std::map<std::string, int> ops;
  for (int i = first; i < last && failures < 3; ++i) {
    const std::vector<ir::NodePtr> outputs = conformance::random_graph(i, Device("cpu"));
    if (only) std::printf("%s", describe(i, outputs).c_str());
    ir::Graph g = ir::build_graph(outputs);
    for (auto& n : g.nodes) ops[ir::op_name(n->op)]++;
    ir::Graph s = compiler::simplify(g);
    simplified += s.key != g.key;
    merged += compiler::cse(s).nodes.size() < s.nodes.size();
    std::vector<reference::Value> ref;
    bool f64 = true;
    for (auto& n : g.nodes) f64 &= n->dtype != DType::Float32;
    if (f64) ref = reference::evaluate(g, 0, 0);

    auto on = run(outputs, ""), off = run(outputs, "all");
    for (size_t k = 0; k < outputs.size(); ++k) {
      double err = testing::normalized_error(on[k], off[k]);
      if (!(err <= kTol)) {
        ++failures;
        ADD_FAILURE() << "output " << k << ": passes on vs off, normalized error " << err << "\n  on:  "
                      << testing::values_str(on[k], 64) << "\n  off: " << testing::values_str(off[k], 64) << "\n"
                      << describe(i, outputs);
        break;
      }
      if (f64) {
        ++ref_checked;
        auto res = testing::all_close(on[k], ref[k].data, 1e-9);
        if (!res) {
          ++failures;
          ADD_FAILURE() << "output " << k << ": passes on vs the float64 reference: " << res.message() << "\n"
                        << describe(i, outputs);
          break;
        }
      }
    }
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[ property ] %d graphs in %.2f s: simplify changed %d, cse merged in %d, %d outputs checked "
              "against the float64 reference\n",
              last - first, secs, simplified, merged, ref_checked);
  std::string hist;
  for (auto& [name, n] : ops) hist += " " + name + ":" + std::to_string(n);
  std::printf("[ property ] nodes by op:%s\n", hist.c_str());
  if (only) return;
  // The mix must keep exercising the passes.
  EXPECT_GT(simplified, kGraphs / 4);
  EXPECT_GT(merged, kGraphs / 100);
}

}  // namespace
}  // namespace tessera
