// safetensors checkpoints: the exact file layout, round trips of every dtype, files written and
// read by an independent Python reader, clear errors for truncated or corrupted files, and crash
// safety (a writer SIGKILLed in the middle of 50 saves never leaves a partial checkpoint).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "test_util.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "io/save_hook.h"
#include "tessera/io.h"
#include "tessera/tessera.h"

extern char** environ;

namespace ts = tessera;
namespace tio = tessera::io;
namespace fs = std::filesystem;
using ts::DType;

namespace {

std::string message_of(const std::function<void()>& f) { return tessera::testing::error_message(f); }

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
void write_bytes(const std::string& path, const std::string& bytes) {
  // A new inode each time: rewriting a file in place makes ext4 flush it on close (auto_da_alloc).
  std::remove(path.c_str());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

// A fresh directory per test.
struct TempDir {
  std::string path;
  TempDir() {
    std::string tmpl = fs::temp_directory_path().string() + "/tessera_io_XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (!mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed");
    path = buf.data();
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return path + "/" + name; }
};

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[size_t(i)] = char((n >> (8 * i)) & 0xff);
  return s;
}
// A file from a header text and a data section.
std::string make_file(const std::string& header, const std::string& data) { return le64(header.size()) + header + data; }

bool have_python() { return access("/usr/bin/python3", X_OK) == 0; }

// Runs /usr/bin/python3 on a script with arguments; returns stdout, sets *rc.
std::string run_python(const TempDir& dir, const std::string& script, const std::string& args, int* rc) {
  std::string sp = dir / "script.py";
  write_bytes(sp, script);
  std::string cmd = "/usr/bin/python3 " + sp + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    *rc = -1;
    return "";
  }
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int st = pclose(p);
  *rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

tio::TensorMap sample_tensors() {
  tio::TensorMap m;
  m["w.f32"] = ts::from_vector<float>({1.5f, -2.25f, 3.0f, 0.1f, -0.0f, 1e30f}, {2, 3});
  m["b.f64"] = ts::from_vector<double>({3.141592653589793, -1e-300}, {2}, {DType::Float64});
  m["i.i64"] = ts::from_vector<int64_t>({-1, 0, int64_t(1) << 40, INT64_MIN}, {2, 2}, {DType::Int64});
  m["j.i32"] = ts::from_vector<int32_t>({7, -8, 2147483647}, {3}, {DType::Int32});
  m["h.f16"] = ts::from_vector<float>({0.5f, -1.0f, 65504.0f, 0.000061035156f}, {4}, {DType::Float16});
  m["g.bf16"] = ts::from_vector<float>({1.0f, -3.5f, 256.0f}, {3, 1}, {DType::BFloat16});
  m["mask"] = ts::from_vector<uint8_t>({1, 0, 1, 1}, {4}, {DType::Bool});
  m["scalar"] = ts::scalar_tensor(42.0, {DType::Float32});
  m["empty"] = ts::zeros({0, 3});
  return m;
}

void expect_same(const tio::TensorMap& got, const tio::TensorMap& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, w] : want) {
    auto it = got.find(name);
    ASSERT_NE(it, got.end()) << name;
    const ts::Tensor& g = it->second;
    EXPECT_EQ(g.dtype(), w.dtype()) << name;
    EXPECT_EQ(g.shape(), w.shape()) << name;
    EXPECT_TRUE(g.is_realized()) << name;
    auto gv = g.to_vector<double>(), wv = w.to_vector<double>();
    ASSERT_EQ(gv.size(), wv.size()) << name;
    for (size_t i = 0; i < gv.size(); ++i)
      EXPECT_EQ(std::memcmp(&gv[i], &wv[i], sizeof(double)), 0) << name << "[" << i << "]: " << gv[i] << " vs " << wv[i];
  }
}

}  // namespace

// ---- format ----

TEST(IoFormat, RoundTripEveryDtypeAndMetadata) {
  TempDir dir;
  std::string path = dir / "ckpt.safetensors";
  auto m = sample_tensors();
  tio::save_safetensors(path, m, {{"step", "10"}, {"format", "pt"}, {"note", "ünïcode \"quoted\""}});
  tio::Metadata meta;
  auto got = tio::load_safetensors(path, &meta);
  expect_same(got, m);
  EXPECT_EQ(meta.size(), 3u);
  EXPECT_EQ(meta["step"], "10");
  EXPECT_EQ(meta["note"], "ünïcode \"quoted\"");
  // No temporary file is left behind.
  int files = 0;
  for (auto& e : fs::directory_iterator(dir.path)) files += e.path().filename() != "script.py";
  EXPECT_EQ(files, 1);
  // Overwriting replaces the content; loading without metadata clears nothing.
  tio::save_safetensors(path, {{"only", ts::ones({2})}});
  auto again = tio::load_safetensors(path, &meta);
  EXPECT_EQ(again.size(), 1u);
  EXPECT_TRUE(meta.empty());
}

TEST(IoFormat, PendingTensorsAreRealized) {
  TempDir dir;
  auto a = ts::from_vector<float>({1, 2, 3}, {3});
  ts::Tensor b = a * 2 + 1;  // pending
  ts::Tensor c = b.sum();
  EXPECT_FALSE(b.is_realized());
  tio::save_safetensors(dir / "p.safetensors", {{"b", b}, {"c", c}});
  auto got = tio::load_safetensors(dir / "p.safetensors");
  EXPECT_EQ(got["b"].to_vector<float>(), (std::vector<float>{3, 5, 7}));
  EXPECT_EQ(got["c"].item(), 15);
}

TEST(IoFormat, ExactLayout) {
  TempDir dir;
  std::string path = dir / "l.safetensors";
  tio::save_safetensors(path, sample_tensors(), {{"k", "v"}});
  std::string f = read_bytes(path);
  ASSERT_GE(f.size(), 8u);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(f[size_t(i)])) << (8 * i);
  EXPECT_EQ(n % 8, 0u);  // padded so the data starts 8-byte aligned
  std::string header = f.substr(8, n);
  EXPECT_EQ(header.front(), '{');
  size_t last = header.find_last_not_of(' ');
  EXPECT_EQ(header[last], '}');
  EXPECT_LT(header.size() - last - 1, 8u);  // only space padding after the object
  auto j = nlohmann::json::parse(header);
  EXPECT_EQ(j["__metadata__"]["k"], "v");
  EXPECT_EQ(j["w.f32"]["dtype"], "F32");
  EXPECT_EQ(j["w.f32"]["shape"], nlohmann::json::array({2, 3}));
  EXPECT_EQ(j["h.f16"]["dtype"], "F16");
  EXPECT_EQ(j["g.bf16"]["dtype"], "BF16");
  EXPECT_EQ(j["mask"]["dtype"], "BOOL");
  EXPECT_EQ(j["i.i64"]["dtype"], "I64");
  EXPECT_EQ(j["j.i32"]["dtype"], "I32");
  EXPECT_EQ(j["b.f64"]["dtype"], "F64");
  EXPECT_EQ(j["scalar"]["shape"], nlohmann::json::array());
  // Offsets are contiguous in name order and cover the data section exactly.
  uint64_t at = 0;
  for (const auto& [name, t] : sample_tensors()) {
    auto off = j[name]["data_offsets"];
    EXPECT_EQ(off[0].get<uint64_t>(), at) << name;
    at += uint64_t(t.numel()) * ts::itemsize(t.dtype());
    EXPECT_EQ(off[1].get<uint64_t>(), at) << name;
  }
  EXPECT_EQ(8 + n + at, f.size());
  // Raw little-endian data: the f32 tensor's first element and the f16 bits.
  uint64_t w0 = 8 + n + j["w.f32"]["data_offsets"][0].get<uint64_t>();
  float v;
  std::memcpy(&v, f.data() + w0, 4);
  EXPECT_EQ(v, 1.5f);
  uint64_t h0 = 8 + n + j["h.f16"]["data_offsets"][0].get<uint64_t>();
  EXPECT_EQ(uint8_t(f[h0]), 0x00);
  EXPECT_EQ(uint8_t(f[h0 + 1]), 0x38);  // 0.5 in float16 is 0x3800
  uint64_t g0 = 8 + n + j["g.bf16"]["data_offsets"][0].get<uint64_t>();
  EXPECT_EQ(uint8_t(f[g0 + 1]), 0x3f);  // 1.0 in bfloat16 is 0x3f80
  EXPECT_EQ(uint8_t(f[g0]), 0x80);
}

TEST(IoFormat, SaveErrorsAreClearAndLeaveNoTemporary) {
  TempDir dir;
  std::string m = message_of([&] { tio::save_safetensors(dir / "missing/x.safetensors", {{"a", ts::ones({2})}}); });
  EXPECT_EQ(m.rfind("[save] " + (dir / "missing/x.safetensors") + ": ", 0), 0u) << m;
  m = message_of([&] { tio::save_safetensors(dir / "x.safetensors", {{"a", ts::Tensor()}}); });
  EXPECT_NE(m.find("undefined"), std::string::npos) << m;
  m = message_of([&] { tio::save_safetensors(dir / "x.safetensors", {{"__metadata__", ts::ones({2})}}); });
  EXPECT_NE(m.find("reserved"), std::string::npos) << m;
  EXPECT_TRUE(fs::is_empty(dir.path));
  // A directory in the way of the rename: the temporary is removed.
  fs::create_directory(dir / "d.safetensors");
  fs::create_directory(dir / "d.safetensors/sub");
  m = message_of([&] { tio::save_safetensors(dir / "d.safetensors", {{"a", ts::ones({2})}}); });
  EXPECT_EQ(m.rfind("[save]", 0), 0u) << m;
  int files = 0;
  for (auto& e : fs::directory_iterator(dir.path)) files += e.is_regular_file();
  EXPECT_EQ(files, 0);
}

// ---- corrupt files ----

TEST(IoCorrupt, TruncatedAtEveryLength) {
  TempDir dir;
  std::string good = dir / "good.safetensors", bad = dir / "bad.safetensors";
  tio::save_safetensors(good, sample_tensors(), {{"k", "v"}});
  std::string f = read_bytes(good);
  for (size_t len = 0; len < f.size(); ++len) {
    write_bytes(bad, f.substr(0, len));
    std::string m = message_of([&] { tio::load_safetensors(bad); });
    EXPECT_EQ(m.rfind("[load] " + bad + ": ", 0), 0u) << "length " << len << ": " << m;
  }
  EXPECT_NE(message_of([&] { tio::load_safetensors(bad, nullptr); }).find("run past the data section"), std::string::npos);
  write_bytes(bad, f.substr(0, 5));
  EXPECT_NE(message_of([&] { tio::load_safetensors(bad); }).find("too short"), std::string::npos);
  write_bytes(bad, f.substr(0, 40));
  EXPECT_NE(message_of([&] { tio::load_safetensors(bad); }).find("exceeds the file"), std::string::npos);
  EXPECT_NE(message_of([&] { tio::load_safetensors(dir / "nope.safetensors"); }).find("cannot open"), std::string::npos);
}

TEST(IoCorrupt, FlippedBytesNeverCrash) {
  TempDir dir;
  std::string good = dir / "good.safetensors", bad = dir / "bad.safetensors";
  tio::save_safetensors(good, sample_tensors(), {{"k", "v"}});
  std::string f = read_bytes(good);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(f[size_t(i)])) << (8 * i);
  int errors = 0, loaded = 0;
  for (size_t pos = 0; pos < 8 + n; ++pos)
    for (uint8_t mask : {uint8_t(0x01), uint8_t(0x20), uint8_t(0x80), uint8_t(0xff)}) {
      std::string g = f;
      g[pos] = char(uint8_t(g[pos]) ^ mask);
      write_bytes(bad, g);
      try {
        auto m = tio::load_safetensors(bad);
        ++loaded;  // e.g. a changed letter in a name: still a consistent file
        for (auto& [name, t] : m) (void)t.numel();
      } catch (const ts::Error& e) {
        EXPECT_EQ(std::string(e.what()).rfind("[load] " + bad + ": ", 0), 0u) << e.what();
        ++errors;
      }
    }
  EXPECT_GT(errors, int(n));  // most flips are caught
  EXPECT_GT(loaded, 0);
  // Trailing garbage.
  write_bytes(bad, f + "xyz");
  EXPECT_NE(message_of([&] { tio::load_safetensors(bad); }).find("3 trailing bytes"), std::string::npos);
}

TEST(IoCorrupt, InvalidHeaders) {
  TempDir dir;
  std::string bad = dir / "bad.safetensors";
  auto err = [&](const std::string& header, const std::string& data) {
    write_bytes(bad, make_file(header, data));
    std::string m = message_of([&] { tio::load_safetensors(bad); });
    EXPECT_EQ(m.rfind("[load] " + bad + ": ", 0), 0u) << m;
    return m;
  };
  std::string d8(8, '\0'), d16(16, '\0');
  EXPECT_NE(err("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]", d8).find("not valid JSON"),
            std::string::npos);
  EXPECT_NE(err("[1, 2, 3]", "").find("not a JSON object"), std::string::npos);
  EXPECT_NE(err(R"({"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}})", d8).find("unsupported dtype 'U8'"),
            std::string::npos);
  EXPECT_NE(err(R"({"a": {"dtype": 5, "shape": [2], "data_offsets": [0, 8]}})", d8).find("dtype is not a string"),
            std::string::npos);
  EXPECT_NE(err(R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", d8).find("needs 12 bytes"),
            std::string::npos);
  EXPECT_NE(err(R"({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", d8).find("non-negative"),
            std::string::npos);
  EXPECT_NE(err(R"({"a": {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}})", d8).find("non-negative"),
            std::string::npos);
  EXPECT_NE(err(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8, 9]}})", d8).find("two non-negative"),
            std::string::npos);
  EXPECT_NE(err(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", d8).find("end before"),
            std::string::npos);
  EXPECT_NE(err(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", d8).find("run past"),
            std::string::npos);
  EXPECT_NE(err(R"({"a": {"dtype": "F32", "shape": [2]}})", d8).find("needs \"dtype\""), std::string::npos);
  EXPECT_NE(err(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                    "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", d16).find("overlaps"),
            std::string::npos);
  EXPECT_NE(err(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})", d16).find("gap"),
            std::string::npos);
  EXPECT_NE(err(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", d16).find("8 trailing bytes"),
            std::string::npos);
  EXPECT_NE(err(R"({"a": {"dtype": "F64", "shape": [4294967296, 4294967296, 16], "data_offsets": [0, 8]}})", d8)
                .find("impossible"),
            std::string::npos);
  EXPECT_NE(err(R"({"__metadata__": {"k": 1}})", "").find("not a string"), std::string::npos);
  EXPECT_NE(err(R"({"a": [1]})", "").find("not an object"), std::string::npos);
  // A header length larger than the file, and one that is absurd.
  write_bytes(bad, le64(1000) + "{}");
  EXPECT_NE(message_of([&] { tio::load_safetensors(bad); }).find("header length 1000 exceeds the file"), std::string::npos);
  write_bytes(bad, le64(~uint64_t(0)) + "{}");
  EXPECT_NE(message_of([&] { tio::load_safetensors(bad); }).find("exceeds the file"), std::string::npos);
  // Valid edge cases: an empty file body, and tensors listed out of order.
  write_bytes(bad, make_file("{}", ""));
  EXPECT_TRUE(tio::load_safetensors(bad).empty());
  write_bytes(bad, make_file(R"({"b": {"dtype": "I32", "shape": [1], "data_offsets": [4, 8]},
                                 "a": {"dtype": "I32", "shape": [1], "data_offsets": [0, 4]}})",
                             std::string("\x01\0\0\0\x02\0\0\0", 8)));
  auto m = tio::load_safetensors(bad);
  EXPECT_EQ(m["a"].item(), 1);
  EXPECT_EQ(m["b"].item(), 2);
}

// ---- other tools ----

// An independent reader in plain Python (struct + json) parses our file; where torch and
// safetensors are installed, the reference implementation reads it too.
TEST(IoPython, StdlibReaderReadsOurFile) {
  if (!have_python()) GTEST_SKIP() << "/usr/bin/python3 is not installed";
  TempDir dir;
  std::string path = dir / "ours.safetensors";
  tio::save_safetensors(path, sample_tensors(), {{"step", "10"}});
  const char* script = R"PY(
import json, struct, sys
fmt = {"F16": "e", "F32": "f", "F64": "d", "I32": "i", "I64": "q", "BOOL": "?"}
size = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8, "I32": 4, "I64": 8, "BOOL": 1}
with open(sys.argv[1], "rb") as f:
    raw = f.read()
n, = struct.unpack("<Q", raw[:8])
header = json.loads(raw[8:8 + n].decode("utf-8"))
data = raw[8 + n:]
print("meta", header.pop("__metadata__"))
for name in sorted(header):
    e = header[name]
    b, end = e["data_offsets"]
    count = 1
    for d in e["shape"]:
        count *= d
    assert end - b == count * size[e["dtype"]], name
    buf = data[b:end]
    if e["dtype"] == "BF16":
        vals = [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in struct.unpack("<%dH" % count, buf)]
    else:
        vals = list(struct.unpack("<%d%s" % (count, fmt[e["dtype"]]), buf))
    print(name, e["dtype"], e["shape"], " ".join(repr(v) for v in vals))
)PY";
  int rc = 0;
  std::string out = run_python(dir, script, path, &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("meta {'step': '10'}"), std::string::npos) << out;
  EXPECT_NE(out.find("w.f32 F32 [2, 3] 1.5 -2.25 3.0 0.10000000149011612 -0.0 1.0000000150474662e+30"), std::string::npos)
      << out;
  EXPECT_NE(out.find("b.f64 F64 [2] 3.141592653589793 -1e-300"), std::string::npos) << out;
  EXPECT_NE(out.find("i.i64 I64 [2, 2] -1 0 1099511627776 -9223372036854775808"), std::string::npos) << out;
  EXPECT_NE(out.find("j.i32 I32 [3] 7 -8 2147483647"), std::string::npos) << out;
  EXPECT_NE(out.find("h.f16 F16 [4] 0.5 -1.0 65504.0 6.103515625e-05"), std::string::npos) << out;
  EXPECT_NE(out.find("g.bf16 BF16 [3, 1] 1.0 -3.5 256.0"), std::string::npos) << out;
  EXPECT_NE(out.find("mask BOOL [4] True False True True"), std::string::npos) << out;
  EXPECT_NE(out.find("scalar F32 [] 42.0"), std::string::npos) << out;
  EXPECT_NE(out.find("empty F32 [0, 3] \n"), std::string::npos) << out;

  // The reference implementation, where present.
  int has_ref = 0;
  run_python(dir, "import safetensors\n", "", &has_ref);  // cheap; torch is imported only then
  if (has_ref == 0) {
    const char* ref = R"PY(
import sys
from safetensors.torch import load_file
m = load_file(sys.argv[1])
print(m["w.f32"].tolist(), m["i.i64"].tolist(), m["h.f16"].tolist(), m["mask"].tolist())
)PY";
    out = run_python(dir, ref, path, &rc);
    ASSERT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("[[1.5, -2.25, 3.0]"), std::string::npos) << out;
  }
}

TEST(IoPython, WeLoadAFileWrittenByPython) {
  if (!have_python()) GTEST_SKIP() << "/usr/bin/python3 is not installed";
  TempDir dir;
  std::string path = dir / "theirs.safetensors";
  // Another writer's choices: pretty-printed JSON with no 8-byte padding, keys out of order,
  // data laid out in reverse name order.
  const char* script = R"PY(
import json, struct, sys
tensors = [
    ("z.weight", "F32", [2, 2], struct.pack("<4f", 1.0, -2.0, 0.25, 8.0)),
    ("y.ids", "I64", [3], struct.pack("<3q", 5, -6, 1 << 50)),
    ("x.half", "F16", [2], struct.pack("<2e", 0.5, -65504.0)),
    ("w.flag", "BOOL", [2], bytes([1, 0])),
    ("v.bf", "BF16", [1], struct.pack("<H", 0x4049)),
    ("u.d", "F64", [], struct.pack("<d", 2.718281828459045)),
    ("t.i", "I32", [1, 1], struct.pack("<i", -123456)),
]
header = {"__metadata__": {"source": "python", "epoch": "3"}}
data = b""
for name, dt, shape, buf in tensors:
    header[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(data), len(data) + len(buf)]}
    data += buf
h = json.dumps(header, indent=1).encode("utf-8")
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + data)
)PY";
  int rc = 0;
  std::string out = run_python(dir, script, path, &rc);
  ASSERT_EQ(rc, 0) << out;
  tio::Metadata meta;
  auto m = tio::load_safetensors(path, &meta);
  EXPECT_EQ(meta["source"], "python");
  EXPECT_EQ(meta["epoch"], "3");
  ASSERT_EQ(m.size(), 7u);
  EXPECT_EQ(m["z.weight"].shape(), (ts::Shape{2, 2}));
  EXPECT_EQ(m["z.weight"].to_vector<float>(), (std::vector<float>{1.0f, -2.0f, 0.25f, 8.0f}));
  EXPECT_EQ(m["y.ids"].dtype(), DType::Int64);
  EXPECT_EQ(m["y.ids"].to_vector<int64_t>(), (std::vector<int64_t>{5, -6, int64_t(1) << 50}));
  EXPECT_EQ(m["x.half"].dtype(), DType::Float16);
  EXPECT_EQ(m["x.half"].to_vector<float>(), (std::vector<float>{0.5f, -65504.0f}));
  EXPECT_EQ(m["w.flag"].dtype(), DType::Bool);
  EXPECT_EQ(m["w.flag"].to_vector<uint8_t>(), (std::vector<uint8_t>{1, 0}));
  EXPECT_EQ(m["v.bf"].dtype(), DType::BFloat16);
  EXPECT_EQ(m["v.bf"].item(), 3.140625);
  EXPECT_EQ(m["u.d"].shape(), ts::Shape{});
  EXPECT_EQ(m["u.d"].item(), 2.718281828459045);
  EXPECT_EQ(m["t.i"].to_vector<int32_t>(), (std::vector<int32_t>{-123456}));
  // And a round trip through us keeps every value.
  tio::save_safetensors(dir / "back.safetensors", m, meta);
  expect_same(tio::load_safetensors(dir / "back.safetensors"), m);
}

// ---- crash safety ----
//
// The writer is this test binary re-executed (fresh process: no inherited threads or OpenMP
// state): when TESSERA_IO_CRASH_CHILD is set, a static initializer runs the writer loop before
// main and never returns. It builds two ~4 MB checkpoints (versions 1 and 2) with from_vector
// (no kernels run), reports ready on a pipe, then saves them alternately to one path forever,
// starting with the version the file does not hold, so a completed save is visible.

namespace {

constexpr int64_t kCrashElems = 1 << 20;  // 4 MB of int32

int32_t crash_value(int64_t i, int64_t version) { return int32_t(uint32_t(i) * 2654435761u + uint32_t(version) * 40503u); }

tio::TensorMap crash_checkpoint(int64_t version) {
  std::vector<int32_t> w(static_cast<size_t>(kCrashElems));
  for (int64_t i = 0; i < kCrashElems; ++i) w[size_t(i)] = crash_value(i, version);
  return {{"weights", ts::from_vector<int32_t>(w, {1024, 1024}, {DType::Int32})},
          {"version", ts::from_vector<int64_t>({version}, {1}, {DType::Int64})}};
}

// Returns the version of a complete, consistent checkpoint, or fails the test.
int64_t verify_crash_checkpoint(const std::string& path) {
  tio::Metadata meta;
  tio::TensorMap m = tio::load_safetensors(path, &meta);  // throws on a partial file
  if (m.size() != 2 || !m.count("weights") || !m.count("version")) throw std::runtime_error("wrong tensors");
  int64_t v = m["version"].to_vector<int64_t>()[0];
  if (meta["version"] != std::to_string(v)) throw std::runtime_error("metadata/version mismatch");
  auto w = m["weights"].to_vector<int32_t>();
  if (int64_t(w.size()) != kCrashElems) throw std::runtime_error("wrong size");
  for (int64_t i = 0; i < kCrashElems; ++i)
    if (w[size_t(i)] != crash_value(i, v)) throw std::runtime_error("corrupt element " + std::to_string(i));
  return v;
}

// The point and save at which a crash child kills itself (SavePoint index and 1-based save
// count; -1: never, the parent kills it at a random moment).
int kill_point = -1, kill_save = 0, saves_started = 0;
int kill_at_point(tio::hooks::SavePoint p) {
  if (p == tio::hooks::SavePoint::Created) ++saves_started;
  if (int(p) == kill_point && saves_started == kill_save) raise(SIGKILL);
  return 0;
}

[[noreturn]] void crash_child(const char* spec) {
  // spec: "<ready fd>:<first version>:<kill point>:<kill save>:<path>"
  try {
    int fd = -1, first = 1, used = 0;
    if (std::sscanf(spec, "%d:%d:%d:%d:%n", &fd, &first, &kill_point, &kill_save, &used) != 4 || used == 0) _exit(3);
    std::string path = spec + used;
    tio::TensorMap ck[2] = {crash_checkpoint(1), crash_checkpoint(2)};
    tio::Metadata meta[2] = {{{"version", "1"}}, {{"version", "2"}}};
    tio::hooks::set_save_hook(kill_at_point);
    char ok = 'r';
    if (write(fd, &ok, 1) != 1) _exit(4);
    close(fd);
    for (uint64_t k = uint64_t(first - 1);; ++k) tio::save_safetensors(path, ck[k % 2], meta[k % 2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "crash child: %s\n", e.what());
  }
  _exit(5);
}

const bool crash_child_hook = [] {
  if (const char* spec = std::getenv("TESSERA_IO_CRASH_CHILD")) crash_child(spec);
  return false;
}();

}  // namespace

// 200 writers killed: even rounds at a random moment, odd rounds by the writer itself at each
// point of a save in turn (through the save hook: between the rename and the directory's fsync
// too, which random timing rarely hits), during its first, second or third save.
TEST(IoCrash, SigkillAtTwoHundredPointsNeverLeavesAPartialFile) {
  (void)crash_child_hook;
  TempDir dir;
  const std::string path = dir / "ckpt.safetensors";
  tio::save_safetensors(path, crash_checkpoint(2), {{"version", "2"}});
  ASSERT_EQ(verify_crash_checkpoint(path), 2);

  std::mt19937 rng(20240611);
  std::uniform_int_distribution<int> delay_us(0, 30000);
  int seen[3] = {}, mid_save = 0, changed = 0, points[tio::hooks::kSavePoints] = {};
  int64_t last = 2;
  auto t0 = std::chrono::steady_clock::now();
  constexpr int kRounds = ts::testing::kSanitized ? 48 : 200;  // 48: each point of each of the three saves once, and 24 at random
  for (int round = 0; round < kRounds; ++round) {
    const bool targeted = round % 2 == 1;
    const int point = targeted ? (round / 2) % tio::hooks::kSavePoints : -1;
    const int save = 1 + (round / 2 / tio::hooks::kSavePoints) % 3;
    int fds[2];
    ASSERT_EQ(pipe2(fds, O_CLOEXEC), 0);
    int child_fd = fcntl(fds[1], F_DUPFD, 10);  // an inheritable copy of the write end
    ASSERT_GE(child_fd, 0);
    std::string var = "TESSERA_IO_CRASH_CHILD=" + std::to_string(child_fd) + ":" + std::to_string(3 - last) + ":" +
                      std::to_string(point) + ":" + std::to_string(save) + ":" + path;
    std::vector<char*> envp;
    for (char** e = environ; *e; ++e)
      if (std::strncmp(*e, "TESSERA_IO_CRASH_CHILD=", 23) != 0) envp.push_back(*e);
    envp.push_back(var.data());
    envp.push_back(nullptr);
    char arg0[] = "tessera_io_crash_child";
    char* argv[] = {arg0, nullptr};
    pid_t pid = -1;
    int rc = posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data());
    close(child_fd);
    close(fds[1]);
    ASSERT_EQ(rc, 0) << std::strerror(rc);
    // Wait for the child to be ready (its data built), then let it save for a random while.
    pollfd pfd{fds[0], POLLIN, 0};
    char c = 0;
    bool ready = poll(&pfd, 1, 10000) == 1 && read(fds[0], &c, 1) == 1 && c == 'r';
    close(fds[0]);
    if (!ready) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      FAIL() << "round " << round << ": the writer never became ready";
    }
    int status = 0;
    if (targeted) {  // it kills itself within a few saves; give up after 10 s
      pid_t w = 0;
      for (int i = 0; i < 1000 && (w = waitpid(pid, &status, WNOHANG)) == 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (w == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
        FAIL() << "round " << round << ": the writer did not stop at point " << point;
      }
      ASSERT_EQ(w, pid);
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(delay_us(rng)));
      ASSERT_EQ(kill(pid, SIGKILL), 0);
      ASSERT_EQ(waitpid(pid, &status, 0), pid);
    }
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "round " << round << ": writer exited early, status " << status;

    const std::string tmp = path + ".tmp." + std::to_string(pid);
    const bool litter = fs::exists(tmp);
    if (litter) {
      ++mid_save;
      fs::remove(tmp);  // a killed writer's litter; never the checkpoint itself
    }
    int64_t v = -1;
    try {
      v = verify_crash_checkpoint(path);
    } catch (const std::exception& e) {
      FAIL() << "round " << round << ": checkpoint not loadable after SIGKILL: " << e.what();
    }
    ASSERT_TRUE(v == 1 || v == 2) << v;
    if (targeted) {  // exactly the saves before the point's rename took effect
      const bool renamed = point >= int(tio::hooks::SavePoint::Renamed);
      const int completed = save - 1 + int(renamed);
      EXPECT_EQ(v, completed % 2 == 0 ? last : 3 - last) << "round " << round << ", point " << point << ", save " << save;
      EXPECT_EQ(litter, !renamed) << "round " << round << ", point " << point;
      ++points[point];
    }
    ++seen[v];
    changed += v != last;
    last = v;
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[crash] %d kills in %.2f s: %d mid-save (temporary present), versions seen 1:%d 2:%d, %d rounds completed a save\n",
              kRounds, secs, mid_save, seen[1], seen[2], changed);
  const int per_point = kRounds / 2 / tio::hooks::kSavePoints;  // 12 (3 sanitized)
  for (int p = 0; p < tio::hooks::kSavePoints; ++p) EXPECT_GE(points[p], per_point) << "point " << p;
  EXPECT_GE(mid_save, kRounds * 3 / 10);  // every targeted kill before a rename, and typically half the random ones
  // Only the checkpoint is left.
  int files = 0;
  for (auto& e : fs::directory_iterator(dir.path)) files += e.exists();
  EXPECT_EQ(files, 1);
}

// A save that fails at any point (a full disk while writing, an I/O error at a sync) is one
// error; before the rename the previous checkpoint stays whole and no temporary is left; after
// it the new one is in place and the error says the save happened but may not be durable.
namespace {
int fail_point = -1, fail_errno = 0;
int fail_at_point(tio::hooks::SavePoint p) { return int(p) == fail_point ? fail_errno : 0; }
}  // namespace

TEST(IoCrash, FullDiskOrIoErrorAtEveryPointKeepsACompleteCheckpoint) {
  TempDir dir;
  const std::string path = dir / "ckpt.safetensors";
  tio::save_safetensors(path, crash_checkpoint(1), {{"version", "1"}});
  struct Reset {
    ~Reset() { tio::hooks::set_save_hook(nullptr); }
  } reset;
  tio::hooks::set_save_hook(fail_at_point);
  int64_t expected = 1;
  for (int p = 0; p < tio::hooks::kSavePoints; ++p)
    for (int e : {ENOSPC, EIO}) {
      fail_point = p;
      fail_errno = e;
      const int64_t next = 3 - expected;
      std::string msg;
      try {
        tio::save_safetensors(path, crash_checkpoint(next), {{"version", std::to_string(next)}});
      } catch (const ts::Error& err) {
        msg = err.what();
      }
      SCOPED_TRACE("point " + std::to_string(p) + ", " + std::strerror(e) + ": " + msg);
      ASSERT_FALSE(msg.empty()) << "the save did not fail";
      EXPECT_EQ(msg.find("[save] " + path + ": "), 0u);
      EXPECT_NE(msg.find(std::strerror(e)), std::string::npos);
      const bool renamed = p >= int(tio::hooks::SavePoint::Renamed);
      EXPECT_EQ(msg.find("saved, but") != std::string::npos, renamed);
      EXPECT_EQ(msg.find("the disk is full") != std::string::npos, e == ENOSPC && !renamed);
      if (renamed) expected = next;
      EXPECT_EQ(verify_crash_checkpoint(path), expected);
      int files = 0;
      for (auto& f : fs::directory_iterator(dir.path)) files += f.exists();
      EXPECT_EQ(files, 1) << "a temporary was left";
    }
}

// ---- .npy (the CLI's `tessera run` inputs and outputs) ----

// NumPy writes each dtype and odd shapes; we read them; we write them back; NumPy reads ours.
TEST(IoNpy, RoundTripWithNumPy) {
  if (!have_python()) GTEST_SKIP() << "/usr/bin/python3 is not installed";
  TempDir dir;
  const char* write = R"PY(
import sys, numpy as np
d = sys.argv[1]
np.save(d + "/f4.npy", np.array([[1.5, -2.25, 3.0], [0.1, -0.0, 1e30]], dtype="<f4"))
np.save(d + "/f8.npy", np.array([3.141592653589793, -1e-300]))
np.save(d + "/f2.npy", np.array([0.5, -1.0, 65504.0], dtype="<f2"))
np.save(d + "/i4.npy", np.array([7, -8, 2147483647], dtype="<i4"))
np.save(d + "/i8.npy", np.arange(6, dtype="<i8").reshape(3, 1, 2) - 2**40)
np.save(d + "/b1.npy", np.array([True, False, True]))
np.save(d + "/scalar.npy", np.float32(42))
np.save(d + "/empty.npy", np.zeros((0, 3), dtype="<f4"))
np.save(d + "/fortran.npy", np.asfortranarray(np.ones((2, 3), dtype="<f4")))
np.save(d + "/big.npy", np.ones(3, dtype=">f4"))
np.save(d + "/u1.npy", np.ones(3, dtype="u1"))
)PY";
  int rc = 0;
  std::string out = run_python(dir, write, dir.path, &rc);
  if (rc != 0 && out.find("No module named 'numpy'") != std::string::npos) GTEST_SKIP() << "numpy is not installed";
  ASSERT_EQ(rc, 0) << out;
  auto f4 = tio::load_npy(dir / "f4.npy");
  EXPECT_EQ(f4.shape(), (ts::Shape{2, 3}));
  EXPECT_EQ(f4.to_vector<float>(), (std::vector<float>{1.5f, -2.25f, 3.0f, 0.1f, -0.0f, 1e30f}));
  EXPECT_EQ(tio::load_npy(dir / "f8.npy").to_vector<double>(), (std::vector<double>{3.141592653589793, -1e-300}));
  auto f2 = tio::load_npy(dir / "f2.npy");
  EXPECT_EQ(f2.dtype(), DType::Float16);
  EXPECT_EQ(f2.to_vector<float>(), (std::vector<float>{0.5f, -1.0f, 65504.0f}));
  EXPECT_EQ(tio::load_npy(dir / "i4.npy").to_vector<int32_t>(), (std::vector<int32_t>{7, -8, 2147483647}));
  auto i8 = tio::load_npy(dir / "i8.npy");
  EXPECT_EQ(i8.shape(), (ts::Shape{3, 1, 2}));
  EXPECT_EQ(i8.to_vector<int64_t>()[5], 5 - (int64_t(1) << 40));
  auto b1 = tio::load_npy(dir / "b1.npy");
  EXPECT_EQ(b1.dtype(), DType::Bool);
  EXPECT_EQ(b1.to(DType::Int32).to_vector<int32_t>(), (std::vector<int32_t>{1, 0, 1}));
  EXPECT_EQ(tio::load_npy(dir / "scalar.npy").shape(), ts::Shape{});
  EXPECT_EQ(tio::load_npy(dir / "empty.npy").shape(), (ts::Shape{0, 3}));
  EXPECT_NE(message_of([&] { tio::load_npy(dir / "fortran.npy"); }).find("Fortran-order"), std::string::npos);
  EXPECT_NE(message_of([&] { tio::load_npy(dir / "big.npy"); }).find("dtype '>f4' is not supported"), std::string::npos);
  EXPECT_NE(message_of([&] { tio::load_npy(dir / "u1.npy"); }).find("dtype '|u1' is not supported"), std::string::npos);
  for (const char* name : {"f4", "f8", "f2", "i4", "i8", "b1", "scalar", "empty"})
    tio::save_npy(dir / (std::string("ours_") + name + ".npy"), tio::load_npy(dir / (std::string(name) + ".npy")));
  const char* check = R"PY(
import sys, numpy as np
d = sys.argv[1]
for n in ["f4", "f8", "f2", "i4", "i8", "b1", "scalar", "empty"]:
    a, b = np.load(d + "/" + n + ".npy"), np.load(d + "/ours_" + n + ".npy")
    assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), n
print("same")
)PY";
  out = run_python(dir, check, dir.path, &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("same"), std::string::npos) << out;
}

// Truncations and lies in the header are one error each, before any allocation.
TEST(IoNpy, CorruptFilesAreRefused) {
  TempDir dir;
  std::string p = dir / "t.npy";
  tio::save_npy(p, ts::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3}));
  std::string bytes = read_bytes(p);
  for (size_t len = 0; len < bytes.size(); ++len) {
    write_bytes(p, bytes.substr(0, len));
    EXPECT_FALSE(message_of([&] { tio::load_npy(p); }).empty()) << len;
  }
  std::string huge = bytes;
  size_t s = huge.find("(2, 3)");
  huge.replace(s, 6, "(9, 9)");  // same header length, 81 elements claimed
  write_bytes(p, huge);
  EXPECT_NE(message_of([&] { tio::load_npy(p); }).find("needs 324 data bytes, the file holds 24"), std::string::npos);
}
