// tessera::metrics(): the host<->device byte counters count exactly what uploads and downloads
// move, and report() shows every field and why graphs were compiled.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tessera/tessera.h"

namespace ts = tessera;
using ts::DType;

namespace {
int64_t to_device() { return ts::metrics().bytes_to_device; }
int64_t to_host() { return ts::metrics().bytes_to_host; }
bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }
}  // namespace

TEST(Metrics, UploadCountsExactlyTheBytesCopiedIn) {
  std::vector<float> v(1000);
  for (int i = 0; i < 1000; ++i) v[size_t(i)] = float(i) * 0.5f;
  int64_t d0 = to_device(), h0 = to_host();
  ts::Tensor x = ts::from_vector<float>(v, {10, 100});
  EXPECT_EQ(to_device() - d0, 4000);
  EXPECT_EQ(to_host() - h0, 0);
  // The device dtype decides the size: 500 doubles stored as float16 are 1000 bytes.
  int64_t d1 = to_device();
  ts::Tensor h = ts::from_vector<double>(std::vector<double>(500, 1.0), {500}, {DType::Float16, ts::Device("cpu")});
  EXPECT_EQ(to_device() - d1, 1000);
  EXPECT_EQ(to_host() - h0, 0);
}

TEST(Metrics, DownloadCountsExactlyTheBytesCopiedOut) {
  std::vector<float> v(1000, 2.0f);
  ts::Tensor x = ts::from_vector<float>(v, {1000});
  int64_t d0 = to_device(), h0 = to_host(), s0 = ts::metrics().host_syncs;
  EXPECT_EQ(x.to_vector<float>(), v);
  EXPECT_EQ(to_host() - h0, 4000);
  EXPECT_EQ(ts::metrics().host_syncs - s0, 1);
  // A computed tensor: running the graph moves nothing over the host link; reading it does.
  ts::Tensor y = x * 3 + 1;
  int64_t h1 = to_host();
  ts::sync();
  EXPECT_EQ(to_host(), h1);
  EXPECT_EQ(y.to_vector<double>()[0], 7.0);  // converted on the host: still 4000 bytes moved
  EXPECT_EQ(to_host() - h1, 4000);
  int64_t h2 = to_host();
  EXPECT_EQ(y.sum().item(), 7000.0);  // one float32 element
  EXPECT_EQ(to_host() - h2, 4);
  EXPECT_EQ(to_device(), d0) << "nothing in these graphs is uploaded";
}

TEST(Metrics, ReportShowsEveryFieldAndTheCompileReasons) {
  ts::Tensor x = ts::from_vector<float>({1, 2, 3}, {3});
  (x * 5 - 2).to_vector<float>();
  (ts::from_vector<float>({1, 2, 3, 4}, {4}) * 5 - 2).to_vector<float>();  // same structure, new shape
  ts::Metrics m = ts::metrics();
  std::string r = m.report();
  for (const char* label : {"graphs compiled:", "ms compiling", "cache hits:", "steps launched:", "ms executing",
                            "host syncs:", "host -> device:", "device -> host:", "live memory:", "peak memory:",
                            "why graphs were compiled"})
    EXPECT_TRUE(contains(r, label)) << "missing '" << label << "' in\n" << r;
  EXPECT_TRUE(contains(r, "host -> device:    " + std::to_string(m.bytes_to_device) + " B")) << r;
  EXPECT_TRUE(contains(r, "device -> host:    " + std::to_string(m.bytes_to_host) + " B")) << r;
  EXPECT_TRUE(contains(r, "graphs compiled:   " + std::to_string(m.graphs_compiled) + " (")) << r;
  EXPECT_TRUE(contains(r, "host syncs:        " + std::to_string(m.host_syncs) + "\n")) << r;
  ASSERT_FALSE(m.compile_reasons.empty());
  EXPECT_TRUE(contains(r, m.compile_reasons.back())) << r;
  EXPECT_TRUE(contains(m.compile_reasons.back(), "input 0 changed")) << m.compile_reasons.back();
  // One line per field: the report is multi-line, each line ends with a newline.
  EXPECT_GE(std::count(r.begin(), r.end(), '\n'), 11);
  EXPECT_EQ(r.back(), '\n');
}

TEST(Metrics, ReportOfNothingSaysSo) {
  ts::Metrics m;
  std::string r = m.report();
  EXPECT_TRUE(contains(r, "graphs compiled:   0 (0.000 ms compiling)")) << r;
  EXPECT_TRUE(contains(r, "why graphs were compiled: (none compiled)")) << r;
  m.live_bytes = 3 * 1024 * 1024;
  EXPECT_TRUE(contains(m.report(), "live memory:       3145728 B (3.0 MiB)")) << m.report();
}
