// The memory plan: temporaries share one arena by lifetime, and plan.memory records the peak of
// live bytes (parameters and outputs throughout, as the runtime allocates outputs before the
// first Step; temporaries from first write to last use), the Step at the peak and what is live.
//
// Placement: an online best-fit sweep in Step order (O(temps x free blocks)); when that leaves
// the arena more than 2% above the most bytes live at once, also an offline one (largest buffer
// first into the smallest gap among placed buffers alive at the same time: "greedy by size",
// Pisarchyk & Lee 2020; O(temps^2)), keeping the smaller arena.
//
// Debug guards (Options::arena_guard): each temporary's block gets a guard of that many bytes
// before and after it (rounded up to the alignment); the runtime fills and checks them around
// every Step that writes the temporary.
#include <algorithm>
#include <map>

#include "compiler/passes/passes.h"
#include "core/fail.h"

namespace tessera::compiler {
namespace {
size_t padded(size_t n, size_t align) { return (n + align - 1) / align * align; }

struct Block {
  int slot;
  size_t size;  // bytes reserved, guards included
  int first, last;
  size_t offset = 0;
};
bool overlap(const Block& a, const Block& b) { return a.first <= b.last && b.first <= a.last; }

// Largest first, each into the smallest gap left by placed blocks alive at the same time. The
// placed blocks are kept sorted by offset, so each placement is one scan.
size_t place_by_size(std::vector<Block>& blocks) {
  std::vector<int> order(blocks.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return blocks[a].size > blocks[b].size || (blocks[a].size == blocks[b].size && blocks[a].first < blocks[b].first);
  });
  std::vector<int> placed;  // by offset
  size_t arena = 0;
  for (int i : order) {
    Block& b = blocks[i];
    size_t prev = 0, best = SIZE_MAX, best_gap = SIZE_MAX;
    for (int j : placed) {
      const Block& p = blocks[j];
      if (!overlap(b, p)) continue;
      if (p.offset > prev && p.offset - prev >= b.size && p.offset - prev < best_gap) {
        best_gap = p.offset - prev;
        best = prev;
      }
      prev = std::max(prev, p.offset + p.size);
    }
    b.offset = best != SIZE_MAX ? best : prev;
    arena = std::max(arena, b.offset + b.size);
    auto at = std::upper_bound(placed.begin(), placed.end(), b.offset, [&](size_t off, int j) { return off < blocks[j].offset; });
    placed.insert(at, i);
  }
  return arena;
}

// The most block bytes live at once (a lower bound for any placement).
size_t max_live_blocks(const std::vector<Block>& blocks, size_t nsteps) {
  std::vector<int64_t> delta(nsteps + 1, 0);
  for (const Block& b : blocks) {
    delta[b.first] += int64_t(b.size);
    delta[b.last + 1] -= int64_t(b.size);
  }
  int64_t live = 0, most = 0;
  for (int64_t d : delta) most = std::max(most, live += d);
  return size_t(most);
}

// In Step order: allocate at first write (best fit, else grow the arena, extending a free block
// that ends at the top), free after the last use.
size_t place_online(std::vector<Block>& blocks, size_t nsteps, bool reuse) {
  std::vector<std::vector<int>> starts(nsteps), ends(nsteps);
  for (size_t i = 0; i < blocks.size(); ++i) {
    starts[blocks[i].first].push_back(int(i));
    ends[blocks[i].last].push_back(int(i));
  }
  std::map<size_t, size_t> free_list;  // offset -> size, coalesced
  size_t end = 0;
  auto release = [&](size_t off, size_t sz) {
    auto it = free_list.emplace(off, sz).first;
    auto next = std::next(it);
    if (next != free_list.end() && off + it->second == next->first) {
      it->second += next->second;
      free_list.erase(next);
    }
    if (it != free_list.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second == it->first) {
        prev->second += it->second;
        free_list.erase(it);
      }
    }
  };
  for (size_t s = 0; s < nsteps; ++s) {
    for (int i : starts[s]) {
      Block& b = blocks[i];
      auto best = free_list.end();
      for (auto it = free_list.begin(); it != free_list.end(); ++it)
        if (it->second >= b.size && (best == free_list.end() || it->second < best->second)) best = it;
      if (best != free_list.end()) {
        b.offset = best->first;
        size_t off = best->first + b.size, rest = best->second - b.size;
        free_list.erase(best);
        if (rest) free_list.emplace(off, rest);
      } else if (!free_list.empty() && std::prev(free_list.end())->first + std::prev(free_list.end())->second == end) {
        auto top = std::prev(free_list.end());
        b.offset = top->first;
        end = b.offset + b.size;
        free_list.erase(top);
      } else {
        b.offset = end;
        end += b.size;
      }
    }
    if (reuse)
      for (int i : ends[s])
        if (blocks[i].size) release(blocks[i].offset, blocks[i].size);
  }
  return end;
}

}  // namespace

void plan_memory(Plan& plan, const Options& opts) {
  const size_t alignment = opts.target.alignment;
  const size_t round = std::max<size_t>(opts.allocation_round, 1);
  if (alignment == 0 || (alignment & (alignment - 1)) || alignment % 64)
    fail("memplan", "target alignment " + std::to_string(alignment) + " is not a power of two multiple of 64", "");
  plan.alignment = alignment;
  const size_t ns = plan.slots.size(), nsteps = plan.steps.size();
  std::vector<int> first(ns, -1), last(ns, -1);
  for (size_t s = 0; s < nsteps; ++s) {
    const kir::Step& st = plan.steps[s];
    for (int o : st.outputs()) {
      if (first[o] < 0) first[o] = int(s);
      last[o] = std::max(last[o], int(s));
    }
    for (int x : st.inputs) last[x] = std::max(last[x], int(s));
  }
  // An all-reduce stays in flight until the first later Step that touches its output (the
  // runtime's overlap, docs/architecture.md "Parallelism"), reading its input meanwhile: the input
  // lives until then, so no Step in between is placed over it (which would make the runtime
  // complete the all-reduce there).
  for (size_t s = 0; s < nsteps; ++s) {
    const kir::Step& st = plan.steps[s];
    if (st.kind != kir::StepKind::Collective || st.collective != ir::Op::AllReduce || st.inputs.empty()) continue;
    size_t r = s + 1;
    while (r < nsteps && std::find(plan.steps[r].inputs.begin(), plan.steps[r].inputs.end(), st.output) == plan.steps[r].inputs.end() &&
           plan.steps[r].output != st.output)
      ++r;
    last[size_t(st.inputs[0])] = std::max(last[size_t(st.inputs[0])], int(std::min(r, nsteps - 1)));
  }

  const size_t g = padded(opts.arena_guard, alignment);
  plan.arena_guard = g;
  std::vector<Block> blocks;
  for (size_t k = 0; k < ns; ++k)
    if (plan.slots[k].kind == kir::SlotKind::Temp && first[k] >= 0)
      blocks.push_back({int(k), padded(plan.slots[k].nbytes, alignment) + 2 * g, first[k], last[k]});
  const bool reuse = opts.enabled("memplan");
  std::vector<Block> online = blocks;
  size_t arena = place_online(online, nsteps, reuse);
  // The offline placement only when the online one left more than 2% above the lower bound.
  if (reuse && double(arena) > 1.02 * double(max_live_blocks(blocks, nsteps))) {
    size_t by_size = place_by_size(blocks);
    if (by_size < arena) {
      online = blocks;
      arena = by_size;
    }
  }
  for (const Block& b : online) plan.slots[b.slot].offset = b.offset + g;
  plan.arena_bytes = arena;

  // Peak of live bytes over the program, by a sweep over first writes and last uses. Outputs
  // count from the start: the runtime allocates them before the first Step (an output slot
  // that no Step writes any more, its value going into a donated parameter, counts nothing).
  // The step bytes (what a budget bounds) count parameters, outputs and the arena as the
  // allocator rounds them; the peak counts the bytes the values hold.
  MemoryInfo& m = plan.memory;
  m = {};
  size_t fixed = 0, fixed_allocated = 0;
  std::vector<std::vector<int>> starts(nsteps), ends(nsteps);
  for (size_t k = 0; k < ns; ++k) {
    const kir::Slot& sl = plan.slots[k];
    if (sl.kind == kir::SlotKind::Param || (sl.kind == kir::SlotKind::Output && first[k] >= 0))
      fixed += sl.nbytes, fixed_allocated += padded(sl.nbytes, round);
    else if (sl.kind == kir::SlotKind::Temp && first[k] >= 0) {
      starts[first[k]].push_back(int(k));
      ends[last[k]].push_back(int(k));
    }
  }
  size_t temps = 0;
  for (size_t s = 0; s < nsteps; ++s) {
    for (int k : starts[s]) temps += plan.slots[k].nbytes;
    if (temps > m.max_live_temp_bytes || m.peak_step < 0) {
      m.max_live_temp_bytes = temps;
      m.peak_step = int(s);
    }
    for (int k : ends[s]) temps -= plan.slots[k].nbytes;
  }
  m.peak_bytes = fixed + m.max_live_temp_bytes;
  m.step_bytes = fixed_allocated + padded(plan.arena_bytes, round);
  if (m.peak_step >= 0)
    for (size_t k = 0; k < ns; ++k) {
      const kir::Slot& sl = plan.slots[k];
      bool is_live = sl.kind == kir::SlotKind::Param || (sl.kind == kir::SlotKind::Output && first[k] >= 0) ||
                     (first[k] >= 0 && first[k] <= m.peak_step && last[k] >= m.peak_step);
      if (is_live) m.live_at_peak.push_back(int(k));
    }
}

}  // namespace tessera::compiler
