// Collectives on tensors and the two ways ranks run (include/tessera/distributed.h).
#include "tessera/distributed.h"

#include <algorithm>
#include <mutex>

#include "autodiff/autograd.h"
#include "core/fail.h"
#include "ir/collectives.h"
#include "ir/partition.h"
#include "runtime/realize.h"
#include "tensor/tensor_impl.h"

namespace tessera::dist {
namespace {

Tensor T(ir::NodePtr n, const Tensor& input) {
  Tensor t = detail::from_node(std::move(n));
  autodiff::record(t, {&input});
  return t;
}
void check(const Tensor& x, int64_t ranks, const char* op) {
  if (!x.defined()) fail(op, "called on an undefined tensor");
  if (ranks < 1) fail(op, "needs at least one rank, got " + std::to_string(ranks));
}
int64_t dim_of(const Tensor& x, int64_t d, const char* op) {
  const int64_t n = x.dim();
  if (d < -n || d >= n) fail(op, "dimension " + std::to_string(d) + " out of range for " + shape_str(x.shape()));
  return d < 0 ? d + n : d;
}

}  // namespace

Tensor all_reduce(const Tensor& x, int64_t ranks, Reduce op) {
  check(x, ranks, "all_reduce");
  ir::ReduceKind k = op == Reduce::Sum ? ir::ReduceKind::Sum : op == Reduce::Mean ? ir::ReduceKind::Mean : ir::ReduceKind::Max;
  return T(ir::build::all_reduce(detail::node_of(x), ranks, k), x);
}
Tensor all_gather(const Tensor& x, int64_t ranks, int64_t dim) {
  check(x, ranks, "all_gather");
  return T(ir::build::all_gather(detail::node_of(x), ranks, dim_of(x, dim, "all_gather")), x);
}
Tensor reduce_scatter(const Tensor& x, int64_t ranks, int64_t dim) {
  check(x, ranks, "reduce_scatter");
  return T(ir::build::reduce_scatter(detail::node_of(x), ranks, dim_of(x, dim, "reduce_scatter")), x);
}
Tensor all_to_all(const Tensor& x, int64_t ranks, int64_t split_dim, int64_t concat_dim) {
  check(x, ranks, "all_to_all");
  return T(ir::build::all_to_all(detail::node_of(x), ranks, dim_of(x, split_dim, "all_to_all"), dim_of(x, concat_dim, "all_to_all")), x);
}
Tensor broadcast(const Tensor& x, int64_t ranks, int64_t root) {
  check(x, ranks, "broadcast");
  return T(ir::build::broadcast(detail::node_of(x), ranks, root), x);
}
Tensor collective_permute(const Tensor& x, int64_t ranks, const std::vector<std::pair<int64_t, int64_t>>& pairs) {
  check(x, ranks, "collective_permute");
  return T(ir::build::collective_permute(detail::node_of(x), ranks, pairs), x);
}

std::pair<int, int> init_mpi() { return runtime::init_mpi_group(); }
int rank() { return runtime::process_group().first; }
int world_size() { return runtime::process_group().second; }

std::vector<std::vector<Tensor>> sync_ranks(int ranks, const std::vector<std::vector<std::pair<Tensor, Tensor>>>& inputs,
                                            int64_t batch_rows, const std::vector<Tensor>& outputs) {
  return detail::sync_spmd(ranks, inputs, batch_rows, outputs);
}


// ---- Mesh, annotations, the partitioned sync ----
Mesh::Mesh(std::vector<std::pair<std::string, int64_t>> axes) : axes_(std::move(axes)) {
  if (axes_.empty()) fail("mesh", "needs at least one axis", "");
  for (size_t i = 0; i < axes_.size(); ++i) {
    if (axes_[i].first.empty()) fail("mesh", "axis " + std::to_string(i) + " has no name", "");
    if (axes_[i].second < 1) fail("mesh", "axis '" + axes_[i].first + "' has size " + std::to_string(axes_[i].second) + " (at least 1)", "");
    for (size_t j = 0; j < i; ++j)
      if (axes_[j].first == axes_[i].first) fail("mesh", "axis '" + axes_[i].first + "' named twice", "");
  }
}
namespace {
ir::MeshAxes axes_of(const Mesh& mesh) {
  ir::MeshAxes axes;
  for (const auto& [name, size] : mesh.axes()) {
    axes.names.push_back(name);
    axes.sizes.push_back(size);
  }
  return axes;
}
}  // namespace
int64_t Mesh::ranks() const { return axes_of(*this).ranks(); }
int Mesh::index(const std::string& axis) const {
  for (size_t i = 0; i < axes_.size(); ++i)
    if (axes_[i].first == axis) return int(i);
  fail("mesh", "no axis '" + axis + "' in the mesh " + str(), "");
}
int64_t Mesh::size(const std::string& axis) const { return axes_[size_t(index(axis))].second; }
std::vector<int64_t> Mesh::coords(int64_t rank) const {
  if (rank < 0 || rank >= ranks()) fail("mesh", "rank " + std::to_string(rank) + " out of range for the mesh " + str(), "");
  return axes_of(*this).coords(rank);
}
std::string Mesh::str() const {
  std::string s = "{";
  for (size_t i = 0; i < axes_.size(); ++i) s += (i ? ", " : "") + axes_[i].first + ": " + std::to_string(axes_[i].second);
  return s + "}";
}

namespace {
std::mutex g_shard_mu;
std::vector<std::pair<std::weak_ptr<TensorImpl>, Spec>>& annotations() {
  static std::vector<std::pair<std::weak_ptr<TensorImpl>, Spec>> a;
  return a;
}
std::string spec_str(const Spec& spec) {
  std::string s = "{";
  for (size_t i = 0; i < spec.size(); ++i) {
    if (i) s += ", ";
    if (spec[i].axis.empty()) s += "none";
    else s.append(spec[i].axis);
    if (spec[i].groups > 1) {
      s += '/';
      s.append(std::to_string(spec[i].groups));
    }
  }
  return s + "}";
}
}  // namespace

void shard(const Tensor& t, const Mesh& mesh, const Spec& spec) {
  if (!t.defined()) fail("shard", "called on an undefined tensor", "");
  const std::string what = std::string(dtype_name(t.dtype())) + shape_str(t.shape()) + " as " + spec_str(spec) + " over " + mesh.str();
  if (int64_t(spec.size()) != t.dim())
    fail("shard", what + ": one entry per dimension (" + std::to_string(t.dim()) + "), got " + std::to_string(spec.size()), "");
  if (!t.is_realized()) fail("shard", what + ": annotate a realized tensor (a parameter, a batch); sync() it first", "");
  for (size_t d = 0; d < spec.size(); ++d) {
    if (spec[d].axis.empty()) continue;
    const int64_t n = mesh.size(spec[d].axis), g = spec[d].groups;
    if (g < 1) fail("shard", what + ": groups must be at least 1", "");
    for (size_t e = 0; e < d; ++e)
      if (spec[e].axis == spec[d].axis) fail("shard", what + ": axis '" + spec[d].axis + "' splits two dimensions", "");
    if (t.shape()[d] % (n * g) != 0)
      fail("shard", what + ": dimension " + std::to_string(d) + " (extent " + std::to_string(t.shape()[d]) + ") does not divide into " +
                        std::to_string(n * g) + " blocks", "");
  }
  std::lock_guard<std::mutex> lock(g_shard_mu);
  auto& a = annotations();
  const TensorImpl* me = detail::impl_of(t).get();
  a.erase(std::remove_if(a.begin(), a.end(), [&](const auto& x) { return x.first.expired() || x.first.lock().get() == me; }), a.end());
  a.push_back({detail::impl_of(t), spec});
}

void clear_shardings() {
  std::lock_guard<std::mutex> lock(g_shard_mu);
  annotations().clear();
}

PartitionStats sync_partitioned(const Mesh& mesh) {
  const ir::MeshAxes axes = axes_of(mesh);
  std::vector<std::pair<Tensor, ir::Sharding>> annotated;
  {
    std::lock_guard<std::mutex> lock(g_shard_mu);
    for (const auto& [weak, spec] : annotations()) {
      std::shared_ptr<TensorImpl> impl = weak.lock();
      if (!impl) continue;
      ir::Sharding s(spec.size());
      for (size_t d = 0; d < spec.size(); ++d)
        if (!spec[d].axis.empty()) s[d] = ir::DimSharding{mesh.index(spec[d].axis), spec[d].groups};
      annotated.push_back({detail::TensorAccess::make(std::move(impl)), std::move(s)});
    }
  }
  detail::PartitionReport r = detail::sync_partitioned(axes, annotated);
  PartitionStats st;
  st.ranks = r.ranks;
  st.collectives = r.collectives;
  st.input_bytes = r.leaf_bytes;
  st.rank_input_bytes = r.rank_leaf_bytes;
  st.rank_peak_bytes = r.rank_peak_bytes;
  st.rank_comm_calls = r.rank_comm_calls;
  st.rank_comm_bytes = r.rank_comm_bytes;
  return st;
}

}  // namespace tessera::dist
