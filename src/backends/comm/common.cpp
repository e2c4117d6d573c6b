// Shared by the communicators: the current communicator, reductions on raw buffers, signatures.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "backends/comm/reduce.h"
#include "core/fail.h"
#include "core/half.h"

namespace tessera::backends {

namespace {
std::shared_ptr<Communicator> g_process;
thread_local Communicator* t_current = nullptr;
}  // namespace

Communicator::Communicator() : timeout_(comm::default_timeout()) {
  static std::atomic<uint64_t> next{1};
  serial_ = next++;
}

Communicator& Communicator::group(const std::vector<int>& members) {
  if (auto it = groups_.find(members); it != groups_.end()) return *it->second;
  std::string list;
  for (int m : members) list += (list.empty() ? "" : ", ") + std::to_string(m);
  std::vector<bool> seen(size_t(std::max(size(), 0)), false);
  bool mine = false;
  for (int m : members) {
    if (m < 0 || m >= size() || seen[size_t(m)])
      fail(name(), "a sub-group {" + list + "} of a communicator of " + std::to_string(size()) + " ranks: members must be distinct ranks in range", "");
    seen[size_t(m)] = true;
    mine |= m == rank();
  }
  if (!mine) fail(name(), "rank " + std::to_string(rank()) + " asked for a sub-group {" + list + "} it is not in", "");
  std::shared_ptr<Communicator> g = make_group(members);
  g->set_timeout(timeout());
  return *(groups_[members] = std::move(g));
}

namespace {
struct Complete final : PendingCollective {
  bool test() override { return true; }
  void wait() override {}
};
}  // namespace

std::unique_ptr<PendingCollective> Communicator::start_all_reduce(const void* send, void* recv, size_t count, DType t,
                                                                  ir::ReduceKind kind) {
  all_reduce(send, recv, count, t, kind);
  return std::make_unique<Complete>();
}

std::shared_ptr<Communicator> Communicator::make_group(const std::vector<int>&) {
  fail(name(), "this communicator has no sub-groups (collectives over one axis of a mesh need them)", "");
}

Communicator* current_communicator() { return t_current ? t_current : g_process.get(); }
void set_process_communicator(std::shared_ptr<Communicator> c) { g_process = std::move(c); }
CommunicatorScope::CommunicatorScope(Communicator* c) : saved_(t_current) { t_current = c; }
CommunicatorScope::~CommunicatorScope() { t_current = saved_; }

namespace comm {
namespace {

template <typename T>
T combine(T a, T b, ir::ReduceKind k) {
  if (k != ir::ReduceKind::Max) return T(a + b);
  if constexpr (std::is_floating_point_v<T>)
    if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
  return a > b ? a : b;
}

template <typename T>
void acc_plain(void* acc, const void* x, size_t n, ir::ReduceKind k) {
  T* a = static_cast<T*>(acc);
  const T* b = static_cast<const T*>(x);
  for (size_t i = 0; i < n; ++i) a[i] = combine(a[i], b[i], k);
}

template <float (*to)(uint16_t), uint16_t (*from)(float)>
void acc_half(void* acc, const void* x, size_t n, ir::ReduceKind k) {
  uint16_t* a = static_cast<uint16_t*>(acc);
  const uint16_t* b = static_cast<const uint16_t*>(x);
  for (size_t i = 0; i < n; ++i) a[i] = from(combine(to(a[i]), to(b[i]), k));
}

}  // namespace

void accumulate(void* acc, const void* x, size_t count, DType t, ir::ReduceKind kind) {
  switch (t) {
    case DType::Bool: {
      uint8_t* a = static_cast<uint8_t*>(acc);
      const uint8_t* b = static_cast<const uint8_t*>(x);
      for (size_t i = 0; i < count; ++i) a[i] = kind == ir::ReduceKind::Max ? (a[i] | b[i]) : uint8_t(a[i] + b[i] != 0);
      return;
    }
    case DType::Int32: return acc_plain<int32_t>(acc, x, count, kind);
    case DType::Int64: return acc_plain<int64_t>(acc, x, count, kind);
    case DType::Float32: return acc_plain<float>(acc, x, count, kind);
    case DType::Float64: return acc_plain<double>(acc, x, count, kind);
    case DType::Float16: return acc_half<half::f16_to_float, half::float_to_f16>(acc, x, count, kind);
    case DType::BFloat16: return acc_half<half::bf16_to_float, half::float_to_bf16>(acc, x, count, kind);
  }
}

void divide(void* x, size_t count, DType t, int n) {
  switch (t) {
    case DType::Float32: for (size_t i = 0; i < count; ++i) static_cast<float*>(x)[i] /= float(n); return;
    case DType::Float64: for (size_t i = 0; i < count; ++i) static_cast<double*>(x)[i] /= double(n); return;
    case DType::Float16: {
      uint16_t* p = static_cast<uint16_t*>(x);
      for (size_t i = 0; i < count; ++i) p[i] = half::float_to_f16(half::f16_to_float(p[i]) / float(n));
      return;
    }
    case DType::BFloat16: {
      uint16_t* p = static_cast<uint16_t*>(x);
      for (size_t i = 0; i < count; ++i) p[i] = half::float_to_bf16(half::bf16_to_float(p[i]) / float(n));
      return;
    }
    default: fail("all_reduce", std::string("mean of ") + dtype_name(t) + " values: a floating dtype is needed");
  }
}

std::string Signature::str() const {
  const ir::Op o = ir::Op(op);
  std::string s = ir::op_name(o);
  if (o == ir::Op::AllReduce) s += std::string(" ") + ir::reduce_kind_name(ir::ReduceKind(extra));
  if (o == ir::Op::Broadcast || o == ir::Op::Reduce) s += " from root " + std::to_string(extra);
  if (o == ir::Op::CollectivePermute)
    s += " (to " + std::to_string(extra / 65536 - 1) + ", from " + std::to_string(extra % 65536 - 1) + ")";
  return s + " of " + std::to_string(count) + " " + dtype_name(DType(dtype));
}

bool same_call(const Signature& a, const Signature& b) {
  if (a.op != b.op || a.count != b.count || a.dtype != b.dtype) return false;
  return a.op == int64_t(ir::Op::CollectivePermute) || a.extra == b.extra;
}

std::chrono::milliseconds default_timeout() {
  const char* s = std::getenv("TESSERA_COLLECTIVE_TIMEOUT_S");
  double v = s ? std::atof(s) : 0;
  return std::chrono::milliseconds(int64_t((v > 0 ? v : 30.0) * 1000));
}

}  // namespace comm
}  // namespace tessera::backends
