// safetensors checkpoints (tessera/io.h): the format of https://github.com/huggingface/safetensors.
//   [u64 little-endian N][N bytes of JSON header, padded with spaces to a multiple of 8][data]
// The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end)} (offsets
// relative to the data section) and may hold "__metadata__": {string: string}. We write tensors
// contiguously in name order; the loader accepts any order but checks that the ranges tile the
// data section exactly (no gap, no overlap, no trailing bytes), as the reference loader does.
#include "tessera/io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <vector>

#include "io/save_hook.h"
#include "tensor/tensor_impl.h"
#include "runtime/allocator.h"
#include "tessera/error.h"

static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace tessera::io {
namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

constexpr uint64_t kMaxHeader = 100'000'000;  // the reference implementation's limit

// Only tests/fuzz/fuzz_safetensors_planted.cpp defines this, in its own copy of this file: the
// copy trusts a tensor's shape over its data_offsets, a bug its fuzzer must find.
#ifdef TESSERA_FUZZ_PLANTED_BUG
constexpr bool kPlantedBug = true;
#else
constexpr bool kPlantedBug = false;
#endif

const char* st_dtype(DType t) {
  switch (t) {
    case DType::Bool: return "BOOL";
    case DType::Int32: return "I32";
    case DType::Int64: return "I64";
    case DType::Float16: return "F16";
    case DType::BFloat16: return "BF16";
    case DType::Float32: return "F32";
    case DType::Float64: return "F64";
  }
  return "?";
}

bool parse_dtype(const std::string& s, DType* t) {
  static const std::pair<const char*, DType> table[] = {
      {"BOOL", DType::Bool},     {"I32", DType::Int32},  {"I64", DType::Int64},   {"F16", DType::Float16},
      {"BF16", DType::BFloat16}, {"F32", DType::Float32}, {"F64", DType::Float64},
  };
  for (auto& [name, dt] : table)
    if (s == name) {
      *t = dt;
      return true;
    }
  return false;
}

[[noreturn]] void save_fail(const std::string& path, const std::string& what) {
  throw Error("[save] " + path + ": " + what);
}
[[noreturn]] void load_fail(const std::string& path, const std::string& what) {
  throw Error("[load] " + path + ": " + what);
}

std::string errno_str() { return std::strerror(errno); }
// errno_str for a save that failed before its rename: the file at the path is still the old one.
std::string unsaved_str() {
  bool full = errno == ENOSPC || errno == EDQUOT;
  return errno_str() + (full ? " (the disk is full; the previous file at this path is untouched)" : "");
}

hooks::SaveHook save_hook = nullptr;

// Runs the test hook at point p: true when it injects a failure (errno set to its value).
bool injected(hooks::SavePoint p) {
  if (!save_hook) return false;
  int e = save_hook(p);
  if (e != 0) errno = e;
  return e != 0;
}

// Writes all of [p, p + n), retrying short writes and interrupted calls.
bool write_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = ::write(fd, c, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    c += w;
    n -= size_t(w);
  }
  return true;
}

std::string dir_of(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// The temporary file, removed on any failure unless released.
struct TempFile {
  std::string path;
  int fd = -1;
  bool keep = false;
  ~TempFile() {
    if (fd >= 0) ::close(fd);
    if (!keep && !path.empty()) ::unlink(path.c_str());
  }
};

}  // namespace

void hooks::set_save_hook(SaveHook hook) { save_hook = hook; }

void save_safetensors(const std::string& path, const TensorMap& tensors, const Metadata& meta) {
  if (path.empty()) save_fail(path, "empty path");
  // Validate, then realize everything pending in one graph.
  bool pending = false;
  for (const auto& [name, t] : tensors) {
    if (name.empty()) save_fail(path, "a tensor has an empty name");
    if (name == "__metadata__") save_fail(path, "'__metadata__' is reserved and cannot name a tensor");
    if (!t.defined()) save_fail(path, "tensor '" + name + "' is undefined");
    if (!t.is_realized()) pending = true;
  }
  if (pending) sync();

  // Header: metadata first, then tensors in name order with contiguous offsets (std::map order).
  ordered_json header = ordered_json::object();
  if (!meta.empty()) {
    ordered_json m = ordered_json::object();
    for (const auto& [k, v] : meta) m[k] = v;
    header["__metadata__"] = std::move(m);
  }
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    const auto& impl = detail::impl_of(t);
    if (!impl->buffer) save_fail(path, "tensor '" + name + "' could not be realized on " + impl->device.str());
    uint64_t nbytes = uint64_t(numel(impl->shape)) * itemsize(impl->dtype);
    ordered_json e = ordered_json::object();
    e["dtype"] = st_dtype(impl->dtype);
    e["shape"] = impl->shape;
    e["data_offsets"] = {offset, offset + nbytes};
    header[name] = std::move(e);
    offset += nbytes;
  }
  std::string hjson;
  try {
    hjson = header.dump();  // compact; throws on names or values that are not valid UTF-8
  } catch (const std::exception& ex) {
    save_fail(path, std::string("cannot encode the header: ") + ex.what());
  }
  hjson.append((8 - hjson.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned
  unsigned char len[8];
  uint64_t n = hjson.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));

  TempFile tmp;
  tmp.path = path + ".tmp." + std::to_string(::getpid());
  tmp.fd = ::open(tmp.path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (tmp.fd < 0) {
    std::string why = unsaved_str();
    tmp.path.clear();  // nothing created
    save_fail(path, "cannot create temporary file " + path + ".tmp." + std::to_string(::getpid()) + ": " + why);
  }
  using P = hooks::SavePoint;
  if (injected(P::Created) || !write_all(tmp.fd, len, 8) || !write_all(tmp.fd, hjson.data(), hjson.size()) || injected(P::Header))
    save_fail(path, "write failed: " + unsaved_str());
  std::vector<char> bytes;
  for (const auto& [name, t] : tensors) {
    const auto& impl = detail::impl_of(t);
    size_t nbytes = size_t(numel(impl->shape)) * itemsize(impl->dtype);
    if (nbytes == 0) continue;
    bytes.resize(nbytes);
    runtime::download(*impl->buffer, bytes.data(), nbytes);
    if (!write_all(tmp.fd, bytes.data(), nbytes) || injected(P::Data)) save_fail(path, "write failed: " + unsaved_str());
  }
  if (::fsync(tmp.fd) != 0 || injected(P::FileSynced)) save_fail(path, "fsync failed: " + unsaved_str());
  int fd = tmp.fd;
  tmp.fd = -1;
  if (::close(fd) != 0 || injected(P::Closed)) save_fail(path, "close failed: " + unsaved_str());
  if (::rename(tmp.path.c_str(), path.c_str()) != 0) save_fail(path, "rename from " + tmp.path + " failed: " + errno_str());
  tmp.keep = true;
  // Make the rename itself durable. From here on the new file is in place: a failure reports
  // that its durability is not assured, not that the save failed to happen.
  if (injected(P::Renamed)) save_fail(path, "saved, but making the rename durable failed: " + errno_str());
  int dfd = ::open(dir_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    int rc = injected(P::DirectoryOpened) ? -1 : ::fsync(dfd);
    int err = errno;
    ::close(dfd);
    if (rc == 0 && injected(P::DirectorySynced)) rc = -1, err = errno;
    if (rc != 0 && err != EINVAL) {  // some file systems cannot fsync directories
      errno = err;
      save_fail(path, "saved, but the fsync of directory " + dir_of(path) + " failed: " + errno_str());
    }
  }
}

TensorMap load_safetensors(const std::string& path, Metadata* meta, const Device& device) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) load_fail(path, "cannot open: " + errno_str());
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) load_fail(path, "cannot stat: " + errno_str());
  if (!S_ISREG(st.st_mode)) load_fail(path, "not a regular file");
  const uint64_t size = uint64_t(st.st_size);

  std::vector<char> file(size);
  for (uint64_t got = 0; got < size;) {
    ssize_t r = ::read(fd, file.data() + got, size_t(size - got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) load_fail(path, "read failed: " + errno_str());
    if (r == 0) load_fail(path, "file shrank while reading (" + std::to_string(got) + " of " + std::to_string(size) + " bytes)");
    got += uint64_t(r);
  }

  if (size < 8) load_fail(path, "file too short (" + std::to_string(size) + " bytes) for the 8-byte header length");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(static_cast<unsigned char>(file[size_t(i)])) << (8 * i);
  if (n > size - 8)
    load_fail(path, "header length " + std::to_string(n) + " exceeds the file (" + std::to_string(size) +
                        " bytes): truncated or not a safetensors file");
  if (n > kMaxHeader) load_fail(path, "header length " + std::to_string(n) + " exceeds the 100 MB limit");
  if (n < 2) load_fail(path, "header of " + std::to_string(n) + " bytes is too short to be a JSON object");

  json header;
  try {
    header = json::parse(file.begin() + 8, file.begin() + 8 + int64_t(n));
  } catch (const json::exception& ex) {
    load_fail(path, std::string("header is not valid JSON (") + ex.what() + ")");
  }
  if (!header.is_object()) load_fail(path, "header is not a JSON object");

  const uint64_t data_begin = 8 + n, data_size = size - data_begin;
  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    uint64_t begin, end;
  };
  std::vector<Entry> entries;
  Metadata md;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) load_fail(path, "__metadata__ is not an object of strings");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) load_fail(path, "__metadata__ entry '" + m.key() + "' is not a string");
        md[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string what = "tensor '" + name + "': ";
    if (!v.is_object()) load_fail(path, what + "entry is not an object");
    auto dt = v.find("dtype");
    auto sh = v.find("shape");
    auto off = v.find("data_offsets");
    if (dt == v.end() || sh == v.end() || off == v.end())
      load_fail(path, what + "needs \"dtype\", \"shape\" and \"data_offsets\"");
    Entry e;
    e.name = name;
    if (!dt->is_string()) load_fail(path, what + "dtype is not a string");
    if (!parse_dtype(dt->get<std::string>(), &e.dtype))
      load_fail(path, what + "unsupported dtype '" + dt->get<std::string>() + "' (supported: F16, BF16, F32, F64, I32, I64, BOOL)");
    if (!sh->is_array()) load_fail(path, what + "shape is not an array");
    uint64_t count = 1;
    bool overflow = false;
    for (const json& d : *sh) {
      if (!d.is_number_unsigned()) load_fail(path, what + "shape " + sh->dump() + " has an entry that is not a non-negative integer");
      uint64_t x = d.get<uint64_t>();
      if (x > uint64_t(std::numeric_limits<int64_t>::max())) overflow = true;
      e.shape.push_back(int64_t(x));
      if (x != 0 && count > std::numeric_limits<uint64_t>::max() / x) overflow = true;
      else count *= x;
    }
    if (!off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned())
      load_fail(path, what + "data_offsets must be two non-negative integers [begin, end]");
    e.begin = (*off)[0].get<uint64_t>();
    e.end = (*off)[1].get<uint64_t>();
    const std::string range = "[" + std::to_string(e.begin) + ", " + std::to_string(e.end) + ")";
    if (e.begin > e.end) load_fail(path, what + "data_offsets " + range + " end before they begin");
    if (e.end > data_size)
      load_fail(path, what + "data_offsets " + range + " run past the data section (" + std::to_string(data_size) +
                          " bytes): truncated file?");
    if (!kPlantedBug && (overflow || count > (std::numeric_limits<uint64_t>::max() / itemsize(e.dtype)) ||
                         count * itemsize(e.dtype) != e.end - e.begin))
      load_fail(path, what + "shape " + sh->dump() + " of " + dt->get<std::string>() + " needs " +
                          (overflow ? std::string("an impossible number of") : std::to_string(count * itemsize(e.dtype))) +
                          " bytes, but data_offsets " + range + " hold " + std::to_string(e.end - e.begin));
    entries.push_back(std::move(e));
  }

  // The ranges must tile [0, data_size) exactly.
  std::vector<const Entry*> order;
  for (const Entry& e : entries) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t at = 0;
  const Entry* prev = nullptr;
  for (const Entry* e : order) {
    if (e->begin < at)
      load_fail(path, "tensor '" + e->name + "' data [" + std::to_string(e->begin) + ", " + std::to_string(e->end) +
                          ") overlaps tensor '" + prev->name + "' [" + std::to_string(prev->begin) + ", " +
                          std::to_string(prev->end) + ")");
    if (e->begin > at)
      load_fail(path, "gap in the data section: bytes [" + std::to_string(at) + ", " + std::to_string(e->begin) +
                          ") belong to no tensor");
    at = e->end;
    prev = e;
  }
  if (at != data_size)
    load_fail(path, std::to_string(data_size - at) + " trailing bytes after the last tensor's data");

  runtime::check_device(device);
  TensorMap out;
  for (Entry& e : entries) {
    char* p = file.data() + data_begin + e.begin;
    size_t nbytes = kPlantedBug ? size_t(numel(e.shape)) * itemsize(e.dtype) : size_t(e.end - e.begin);
    if (e.dtype == DType::Bool)
      for (size_t i = 0; i < nbytes; ++i) p[i] = p[i] != 0;  // normalize to 0/1
    auto buf = runtime::upload(device, p, nbytes);
    out.emplace(e.name, detail::from_buffer(std::move(buf), std::move(e.shape), e.dtype));
  }
  if (meta) *meta = std::move(md);
  return out;
}

}  // namespace tessera::io
