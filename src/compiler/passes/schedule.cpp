// The schedule pass: reorders plan.steps into a topological order with a lower peak of live
// bytes. Dependencies go through slots: a Step comes after the last earlier writer of each slot
// it reads (read after write), and a Step writing a slot comes after every earlier reader and
// writer of that slot (write after read / write), so any order we emit computes the same values.
// One more ordering is kept so that scheduling never costs a donation (donate() runs after us
// and needs that no Step reads a parameter after the output overwriting it is produced): a Step
// that could write its output into a parameter it reads stays after the parameter's earlier
// readers.
//
// Candidates, each O(edges log steps): the lowering order; a greedy list schedule (among ready
// Steps the one freeing the most bytes net -- temporaries it reads last minus the temporary it
// writes first; parameters and outputs are allocated for the whole run -- ties by lowering order); and a post-order DFS from the sinks that visits the
// heavier operand subtree first (after XLA's DFS memory scheduler), which sees past the greedy's
// horizon when two branches each start by allocating. The one with the lowest peak wins; ties
// keep the earlier candidate, so the lowering order stays when nothing is gained.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <set>

#include "compiler/passes/passes.h"

namespace tessera::compiler {
namespace {

using kir::SlotKind;

struct Deps {
  std::vector<std::vector<int>> preds, succs;  // deduplicated
};

Deps build_deps(const Plan& plan) {
  const size_t n = plan.steps.size(), ns = plan.slots.size();
  Deps d;
  d.preds.resize(n);
  d.succs.resize(n);
  std::vector<int> last_writer(ns, -1);
  std::vector<std::vector<int>> readers(ns);  // readers since the last write
  std::vector<std::vector<int>> param_readers(ns);  // all readers so far (params only)
  std::vector<int> mark(n, -1);
  auto edge = [&](int from, int to) {
    if (from < 0 || from == to || mark[from] == to) return;
    mark[from] = to;
    d.preds[to].push_back(from);
    d.succs[from].push_back(to);
  };
  for (size_t i = 0; i < n; ++i) {
    const kir::Step& st = plan.steps[i];
    int si = int(i);
    for (int x : st.inputs) edge(last_writer[x], si);
    int o = st.output;
    // Every slot written (a fused attention Step writes several already here).
    for (int w : st.outputs())
      if (w >= 0) {
        edge(last_writer[w], si);
        for (int r : readers[w]) edge(r, si);
      }
    // Keep a possible donation possible: readers of a same-sized parameter before this Step.
    if (o >= 0 && plan.slots[o].kind == SlotKind::Output &&
        (st.kind == kir::StepKind::Elementwise || st.kind == kir::StepKind::Copy))
      for (int x : st.inputs)
        if (plan.slots[x].kind == SlotKind::Param && plan.slots[x].nbytes == plan.slots[o].nbytes)
          for (int r : param_readers[x]) edge(r, si);
    for (int x : st.inputs) {
      if (readers[x].empty() || readers[x].back() != si) readers[x].push_back(si);
      if (plan.slots[x].kind == SlotKind::Param && (param_readers[x].empty() || param_readers[x].back() != si))
        param_readers[x].push_back(si);
    }
    for (int w : st.outputs())
      if (w >= 0) {
        last_writer[w] = si;
        readers[w].clear();
      }
  }
  return d;
}

// Distinct slots a Step touches (inputs, then its output).
std::vector<std::vector<int>> touched_slots(const Plan& plan) {
  std::vector<std::vector<int>> t(plan.steps.size());
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    auto& v = t[i];
    v = plan.steps[i].inputs;
    for (int w : plan.steps[i].outputs())
      if (w >= 0) v.push_back(w);
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
  }
  return t;
}

// Only temporaries come and go: parameters and outputs are allocated for the whole run.
bool counted(const kir::Slot& s) { return s.kind == SlotKind::Temp; }

// Peak of live temporary bytes over `order`, by plan_memory's rule: from first write to last use.
size_t peak_of(const Plan& plan, const std::vector<std::vector<int>>& touched, const std::vector<int>& order) {
  const size_t ns = plan.slots.size();
  std::vector<int> first(ns, -1), last(ns, -1);
  for (size_t p = 0; p < order.size(); ++p) {
    const kir::Step& st = plan.steps[order[p]];
    for (int w : st.outputs())
      if (w >= 0 && first[w] < 0) first[w] = int(p);
    for (int x : touched[order[p]]) last[x] = int(p);
  }
  size_t live = 0, peak = 0;
  for (size_t p = 0; p < order.size(); ++p) {
    const std::vector<int> outs = plan.steps[order[p]].outputs();
    for (size_t k = 0; k < outs.size(); ++k)  // each slot once (an attention backward may write one slot as all three)
      if (const int o = outs[k]; o >= 0 && first[o] == int(p) && counted(plan.slots[o]) && std::find(outs.begin(), outs.begin() + k, o) == outs.begin() + k)
        live += plan.slots[o].nbytes;
    peak = std::max(peak, live);
    for (int x : touched[order[p]])
      if (counted(plan.slots[x]) && last[x] == int(p) && first[x] >= 0) live -= plan.slots[x].nbytes;
  }
  return peak;
}

std::vector<int> list_schedule(const Plan& plan, const Deps& d, const std::vector<std::vector<int>>& touched) {
  const size_t n = plan.steps.size(), ns = plan.slots.size();
  std::vector<int> remaining(ns, 0);            // unscheduled Steps touching the slot
  std::vector<std::vector<int>> users(ns);      // Steps touching the slot
  for (size_t i = 0; i < n; ++i)
    for (int x : touched[i]) {
      remaining[x]++;
      users[x].push_back(int(i));
    }
  std::vector<bool> written(ns, false), done(n, false);
  std::vector<int64_t> score(n, 0);
  for (size_t i = 0; i < n; ++i) {
    int o = plan.steps[i].output;
    if (o >= 0 && counted(plan.slots[o])) score[i] -= int64_t(plan.slots[o].nbytes);
  }
  std::vector<int> indeg(n);
  std::set<std::pair<int64_t, int>> ready;  // (-score, index): best first, ties by lowering order
  for (size_t i = 0; i < n; ++i) {
    indeg[i] = int(d.preds[i].size());
    if (!indeg[i]) ready.insert({-score[i], int(i)});
  }
  auto adjust = [&](int step, int64_t delta) {
    if (done[step]) return;
    if (!indeg[step]) ready.erase({-score[step], step});
    score[step] += delta;
    if (!indeg[step]) ready.insert({-score[step], step});
  };
  std::vector<int> order;
  order.reserve(n);
  while (!ready.empty()) {
    int s = ready.begin()->second;
    ready.erase(ready.begin());
    done[s] = true;
    order.push_back(s);
    int o = plan.steps[s].output;
    if (o >= 0 && !written[o]) {
      written[o] = true;
      // Writers after the first allocate nothing.
      if (counted(plan.slots[o]))
        for (int u : users[o])
          if (!done[u] && plan.steps[u].output == o) adjust(u, int64_t(plan.slots[o].nbytes));
    }
    for (int x : touched[s])
      if (--remaining[x] == 1 && plan.slots[x].kind == SlotKind::Temp && written[x])
        for (int u : users[x])
          if (!done[u] && plan.steps[u].output != x) adjust(u, int64_t(plan.slots[x].nbytes));
    for (int t : d.succs[s])
      if (--indeg[t] == 0) ready.insert({-score[t], t});
  }
  return order;
}

std::vector<int> dfs_schedule(const Plan& plan, const Deps& d) {
  const size_t n = plan.steps.size();
  // Bytes allocated by the part of a Step's ancestry that only it uses: a predecessor with other
  // users counts its own bytes only (so the sums stay bounded on deep shared DAGs).
  std::vector<double> own(n, 0), total(n, 0);
  for (size_t i = 0; i < n; ++i) {  // the lowering order is topological
    int o = plan.steps[i].output;
    own[i] = total[i] = o >= 0 ? double(plan.slots[o].nbytes) : 0;
    for (int p : d.preds[i]) total[i] += d.succs[p].size() == 1 ? total[p] : own[p];
  }
  std::vector<std::vector<int>> kids = d.preds;
  for (auto& k : kids)
    std::stable_sort(k.begin(), k.end(), [&](int a, int b) { return total[a] > total[b] || (total[a] == total[b] && a < b); });
  std::vector<int> order;
  order.reserve(n);
  std::vector<char> state(n, 0);  // 0 new, 1 open, 2 done
  std::vector<std::pair<int, size_t>> stack;
  for (size_t r = 0; r < n; ++r) {
    if (!d.succs[r].empty() || state[r]) continue;
    stack.push_back({int(r), 0});
    state[r] = 1;
    while (!stack.empty()) {
      auto& [s, next] = stack.back();
      if (next < kids[s].size()) {
        int c = kids[s][next++];
        if (!state[c]) {
          state[c] = 1;
          stack.push_back({c, 0});
        }
        continue;
      }
      state[s] = 2;
      order.push_back(s);
      stack.pop_back();
    }
  }
  return order;
}

// Overlap (docs/architecture.md "Parallelism"): the runtime keeps an all-reduce in flight until
// the first Step touching its buffers, so the Steps reading its result go as late as their
// dependencies allow: `order` is kept, except that a ready Step reading an all-reduce's output
// waits while any other Step is ready. Data parallelism's bucket all-reduces then stay in flight
// across the rest of the backward (their cut-backs and the update come after it).
std::vector<int> defer_collective_readers(const Plan& plan, const Deps& d, const std::vector<int>& order) {
  const size_t n = plan.steps.size();
  std::vector<char> deferred(n, 0);
  bool any = false;
  for (size_t i = 0; i < n; ++i)
    for (int p : d.preds[i]) {
      const kir::Step& c = plan.steps[size_t(p)];
      if (c.kind == kir::StepKind::Collective && c.collective == ir::Op::AllReduce &&
          std::find(plan.steps[i].inputs.begin(), plan.steps[i].inputs.end(), c.output) != plan.steps[i].inputs.end())
        deferred[i] = 1, any = true;
    }
  if (!any) return order;
  std::vector<int> pos(n), indeg(n);
  for (size_t k = 0; k < n; ++k) pos[size_t(order[k])] = int(k);
  std::set<int> now, later;  // ready Steps by their position in `order`
  for (size_t i = 0; i < n; ++i) {
    indeg[i] = int(d.preds[i].size());
    if (!indeg[i]) (deferred[i] ? later : now).insert(pos[i]);
  }
  std::vector<int> out;
  out.reserve(n);
  while (!now.empty() || !later.empty()) {
    std::set<int>& from = now.empty() ? later : now;
    const int s = order[size_t(*from.begin())];
    from.erase(from.begin());
    out.push_back(s);
    for (int t : d.succs[size_t(s)])
      if (--indeg[size_t(t)] == 0) (deferred[size_t(t)] ? later : now).insert(pos[size_t(t)]);
  }
  return out;
}

}  // namespace

void schedule(Plan& plan) {
  const size_t n = plan.steps.size();
  if (n < 3) return;
  Deps d = build_deps(plan);
  auto touched = touched_slots(plan);
  std::vector<int> best(n);
  std::iota(best.begin(), best.end(), 0);
  size_t best_peak = peak_of(plan, touched, best);
  for (auto&& cand : {list_schedule(plan, d, touched), dfs_schedule(plan, d)}) {
    if (cand.size() != n) continue;  // cannot happen: the lowering order is topological
    size_t p = peak_of(plan, touched, cand);
    if (p < best_peak) {
      best_peak = p;
      best = cand;
    }
  }
  best = defer_collective_readers(plan, d, best);
  std::vector<kir::Step> steps;
  steps.reserve(n);
  for (int i : best) steps.push_back(std::move(plan.steps[i]));
  plan.steps = std::move(steps);
}

}  // namespace tessera::compiler
