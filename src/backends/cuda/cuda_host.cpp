#include "cuda_host.h"

#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "backends/render/c_render.h"
#include "core/fail.h"
#include "core/hash.h"

namespace tessera::backends::cuda {

LaunchConfig launch_config(int64_t work_items, unsigned block) {
  if (work_items <= 0) return {0, block};
  int64_t grid = (work_items + int64_t(block) - 1) / int64_t(block);
  if (grid > int64_t(0x7fffffff))
    fail("cuda", "a kernel of " + std::to_string(work_items) + " work items needs " + std::to_string(grid) +
                     " blocks of " + std::to_string(block) + "; a grid holds at most 2^31 - 1",
         "");
  return {unsigned(grid), block};
}

// ---- GEMM plans ----

namespace {
// The operand's matrix [R, C] = its view's last two dimensions, as cuBLASLt's op(X) = X^T.
std::optional<GemmOperand> operand(const kir::View& v, size_t r) {
  if (v.masked() || v.shape.size() != r || v.strides.size() != r) return std::nullopt;
  const int64_t R = v.shape[r - 2], C = v.shape[r - 1], sr = v.strides[r - 2], sc = v.strides[r - 1];
  GemmOperand o;
  o.offset = v.offset;
  if (C == 1 || sc == 1) {  // row-major: stored column-major as X^T [C, R]
    o.transpose = false, o.rows = C, o.cols = R, o.ld = R == 1 ? C : sr;
    if (o.ld < C) return std::nullopt;
  } else if (R == 1 || sr == 1) {  // column-major: stored as X [R, C], transposed by cuBLASLt
    o.transpose = true, o.rows = R, o.cols = C, o.ld = C == 1 ? R : sc;
    if (o.ld < R) return std::nullopt;
  } else {
    return std::nullopt;
  }
  // Batch dimensions: one stride for the linear batch number (0 when broadcast).
  bool any = false;
  int64_t inner = 1;
  for (size_t d = r - 2; d-- > 0;) {
    if (v.shape[d] == 1) continue;
    if (!any) o.batch_stride = v.strides[d], any = true;
    else if (v.strides[d] != o.batch_stride * inner) return std::nullopt;
    inner *= v.shape[d];
  }
  if (o.batch_stride < 0) return std::nullopt;
  return o;
}
}  // namespace

std::optional<GemmPlan> plan_gemm(const Shape& out, const kir::View& lhs, const kir::View& rhs) {
  const size_t r = out.size();
  if (r < 2 || lhs.shape.size() != r || rhs.shape.size() != r) return std::nullopt;
  GemmPlan p;
  p.m = out[r - 1], p.n = out[r - 2], p.k = lhs.shape[r - 1];
  for (size_t d = 0; d + 2 < r; ++d) p.batch *= out[d];
  if (p.m <= 0 || p.n <= 0 || p.k <= 0 || p.batch <= 0 || p.batch > 0x7fffffff) return std::nullopt;
  auto a = operand(rhs, r), b = operand(lhs, r);
  if (!a || !b) return std::nullopt;
  p.a = *a, p.b = *b;
  return p;
}

std::optional<FusedBias> fused_bias(const kir::Step& st) {
  using kir::Code;
  const auto& p = st.program;
  const size_t r = st.shape.size();
  if (p.size() != 3 || !st.more_outputs.empty() || r == 0 || p[2].code != Code::Add || p[2].dtype != st.dtype) return std::nullopt;
  if (!((p[2].a == 0 && p[2].b == 1) || (p[2].a == 1 && p[2].b == 0))) return std::nullopt;
  std::optional<FusedBias> bias;
  bool product = false;
  for (int i = 0; i < 2; ++i) {
    const kir::Instr& I = p[size_t(i)];
    if (I.code != Code::Load || I.dtype != st.dtype || !I.map.single() || I.map.shape() != st.shape) return std::nullopt;
    const kir::View& v = I.map.views[0];
    if (st.inputs.at(size_t(I.input)) == st.output) {  // the product, in place
      if (!I.map.is_contiguous() || v.offset != 0) return std::nullopt;
      product = true;
      continue;
    }
    const size_t item = itemsize(st.dtype);
    bool broadcast = (v.strides[r - 1] == 1 || st.shape[r - 1] == 1) && v.offset >= 0 && (v.offset * int64_t(item)) % 16 == 0 &&
                     st.shape[r - 1] * int64_t(item) > 8;
    for (size_t d = 0; d + 1 < r; ++d) broadcast &= v.strides[d] == 0 || st.shape[d] == 1;
    if (!broadcast || (size_t(I.input) < st.input_dtypes.size() && st.input_dtypes[size_t(I.input)] != st.dtype)) return std::nullopt;
    bias = FusedBias{I.input, v.offset};
  }
  return product ? bias : std::nullopt;
}

size_t alignment(size_t base_align, int64_t offset, int64_t stride) {
  size_t x = std::min<size_t>(base_align, 256);
  while (x > 1 && ((offset % int64_t(x)) != 0 || (stride % int64_t(x)) != 0)) x /= 2;
  return x;
}

// ---- BlockPool ----

BlockPool::BlockPool(Grab grab, Release release, size_t chunk, size_t align)
    : grab_(std::move(grab)), release_(std::move(release)), chunk_(chunk), align_(align) {}

BlockPool::~BlockPool() = default;

uint64_t BlockPool::grab_chunk(size_t size, bool shared) {
  uint64_t a = grab_(size);
  if (!a && trim()) a = grab_(size);
  if (!a) return 0;
  chunks_[a] = {size, shared};
  reserved_ += size;
  return a;
}

uint64_t BlockPool::allocate(size_t nbytes) {
  const size_t n = std::max(align_, (nbytes + align_ - 1) / align_ * align_);
  uint64_t a = 0;
  if (n > chunk_ / 2) {
    a = grab_chunk(n, false);
  } else {
    auto it = std::find_if(free_.begin(), free_.end(), [&](const auto& f) { return f.second >= n; });
    if (it == free_.end()) {
      uint64_t c = grab_chunk(chunk_, true);
      if (!c) return 0;
      it = free_.emplace(c, chunk_).first;
    }
    a = it->first;
    size_t rest = it->second - n;
    free_.erase(it);
    if (rest) free_[a + n] = rest;
  }
  if (a) {
    used_[a] = n;
    in_use_ += n;
  }
  return a;
}

void BlockPool::free(uint64_t addr) {
  auto u = used_.find(addr);
  if (u == used_.end()) fail("cuda", "freeing device memory the allocator did not hand out", "");
  size_t n = u->second;
  used_.erase(u);
  in_use_ -= n;
  auto c = chunks_.find(addr);
  if (c != chunks_.end() && !c->second.shared) {
    release_(addr, n);
    reserved_ -= n;
    chunks_.erase(c);
    return;
  }
  // Merge with the free neighbours, never across a chunk's start (chunks may be adjacent).
  auto next = free_.find(addr + n);
  if (next != free_.end() && !chunks_.count(next->first)) {
    n += next->second;
    free_.erase(next);
  }
  auto prev = free_.lower_bound(addr);
  if (prev != free_.begin() && !chunks_.count(addr)) {
    --prev;
    if (prev->first + prev->second == addr) {
      prev->second += n;
      return;
    }
  }
  free_[addr] = n;
}

size_t BlockPool::trim() {
  size_t returned = 0;
  for (auto c = chunks_.begin(); c != chunks_.end();) {
    auto f = free_.find(c->first);
    if (c->second.shared && f != free_.end() && f->second == c->second.size) {
      release_(c->first, c->second.size);
      returned += c->second.size;
      reserved_ -= c->second.size;
      free_.erase(f);
      c = chunks_.erase(c);
    } else {
      ++c;
    }
  }
  return returned;
}

bool BlockPool::owns(uint64_t addr) const {
  auto it = chunks_.upper_bound(addr);
  if (it == chunks_.begin()) return false;
  --it;
  return addr < it->first + it->second.size;
}

// ---- the disk cache ----

std::string cache_dir() {
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v ? v : "";
  };
  if (std::string d = env("TESSERA_CUDA_CACHE"); !d.empty()) return d;
  if (std::string d = env("XDG_CACHE_HOME"); !d.empty()) return d + "/tessera/cuda";
  if (std::string d = env("HOME"); !d.empty()) return d + "/.cache/tessera/cuda";
  return "";
}

namespace {
std::string header(const std::string& payload) {
  char h[80];
  std::snprintf(h, sizeof h, "tessera-cubin 1 %zu %016" PRIx64 "\n", payload.size(), fnv1a(payload));
  return h;
}
std::string path_of(const std::string& dir, const std::string& key) { return dir + "/" + key + ".cubin"; }
}  // namespace

bool read_cached(const std::string& dir, const std::string& key, std::string* payload) {
  if (dir.empty()) return false;
  std::ifstream f(path_of(dir, key), std::ios::binary);
  if (!f) return false;
  std::stringstream ss;
  ss << f.rdbuf();
  std::string all = ss.str();
  size_t eol = all.find('\n');
  if (eol != std::string::npos) {
    std::string body = all.substr(eol + 1);
    if (all.compare(0, eol + 1, header(body)) == 0) {
      *payload = std::move(body);
      return true;
    }
  }
  std::remove(path_of(dir, key).c_str());  // torn or corrupt: compiled again, rewritten
  return false;
}

void write_cached(const std::string& dir, const std::string& key, const std::string& payload) {
  if (dir.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  std::string tmp = path_of(dir, key) + ".tmp" + std::to_string(getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return;
    f << header(payload) << payload;
    if (!f.flush()) {
      f.close();
      std::remove(tmp.c_str());
      return;
    }
  }
  if (std::rename(tmp.c_str(), path_of(dir, key).c_str()) != 0) std::remove(tmp.c_str());
}

}  // namespace tessera::backends::cuda
