// End-to-end tests of the `tessera` CLI, run as a child process exactly as a user runs it
// (stdout and stderr go to files, so stdout is not a terminal). No assertion is about speed:
// the machine running CI is shared.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <regex>
#include <set>

#include "e2e_util.h"

namespace {

using namespace e2e;

// A tiny model shared by the sampling and error tests.
const std::vector<std::string> kTiny = {"--layers", "1", "--embd", "32", "--heads", "2", "--block", "16",
                                        "--batch", "4", "--device", "cpu"};

// A bad invocation and what it tries (the Errors tests).
struct Case {
  std::string what;
  std::vector<std::string> args;
};

std::vector<std::string> cat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Trains the tiny model for a few steps into dir/ckpt and returns the checkpoint path.
fs::path make_checkpoint(const TempDir& dir) {
  Result r = cli(cat({"train", "gpt", "--steps", "3", "--out", (dir / "ckpt").string()}, kTiny), dir.path());
  EXPECT_TRUE(r.exited && r.code == 0) << r.describe();
  fs::path p = dir / "ckpt" / "ckpt.safetensors";
  EXPECT_TRUE(fs::exists(p)) << r.describe();
  return p;
}

// The safetensors header of a checkpoint: its JSON and its length.
json header_of(const std::string& bytes, uint64_t* len = nullptr) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(bytes[i]);
  if (len) *len = n;
  return json::parse(bytes.substr(8, n));
}

// One failure as the CLI promises: a non-zero exit (not a crash or abort) and exactly one line
// on stderr, starting "tessera: error:".
void expect_clean_error(const Result& r, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_TRUE(r.exited) << "crashed: " << r.describe();
  EXPECT_NE(r.code, 0) << r.describe();
  std::vector<std::string> lines = lines_of(r.err);
  ASSERT_EQ(lines.size(), 1u) << "stderr should be exactly one line: " << r.describe();
  EXPECT_EQ(lines[0].rfind("tessera: error: ", 0), 0u) << r.describe();
  EXPECT_GT(lines[0].size(), std::strlen("tessera: error: ") + 10) << "an error line should say what is wrong";
  EXPECT_FALSE(r.err.empty() || r.err.back() != '\n') << "the error line should end with a newline";
}

// The per-step fields the log promises, for a run that logged steps first_step + 1 .. steps.
void expect_log_schema(const std::vector<json>& log, int64_t first_step, int64_t steps) {
  ASSERT_EQ(int64_t(log.size()), steps - first_step);
  int64_t prev_syncs = -1, prev_graphs = -1, first_graphs = 0;
  bool evaluated = false;
  for (size_t i = 0; i < log.size(); ++i) {
    const json& j = log[i];
    SCOPED_TRACE("log line " + std::to_string(i + 1) + ": " + j.dump());
    ASSERT_TRUE(j.is_object());
    for (const char* k : {"step", "loss", "lr", "step_ms", "tokens_per_s", "graphs_compiled", "host_syncs", "peak_bytes"})
      ASSERT_TRUE(j.contains(k) && j[k].is_number()) << "missing or non-numeric '" << k << "'";
    for (const char* k : {"step", "graphs_compiled", "host_syncs", "peak_bytes"})
      EXPECT_TRUE(j[k].is_number_integer()) << k << " should be an integer";
    EXPECT_EQ(j["step"].get<int64_t>(), first_step + int64_t(i) + 1);
    EXPECT_TRUE(std::isfinite(j["loss"].get<double>()));
    EXPECT_GT(j["loss"].get<double>(), 0.0);
    EXPECT_GT(j["lr"].get<double>(), 0.0);
    EXPECT_GE(j["step_ms"].get<double>(), 0.0);
    EXPECT_GT(j["tokens_per_s"].get<double>(), 0.0);
    EXPECT_GT(j["peak_bytes"].get<int64_t>(), 0);
    int64_t syncs = j["host_syncs"].get<int64_t>(), graphs = j["graphs_compiled"].get<int64_t>();
    EXPECT_GT(syncs, prev_syncs) << "host_syncs is cumulative and each step reads its loss";
    EXPECT_GE(graphs, prev_graphs) << "graphs_compiled is cumulative";
    prev_syncs = syncs, prev_graphs = graphs;
    // Compiled graphs: the parameters' initialization and the first training step by the end
    // of step 1 (the first step also creates the optimizer's moments), the steady training
    // step at step 2, and the held-out evaluation once. Nothing else, however long the run
    // (the learning rate and step count are runtime inputs).
    if (j.contains("val_loss")) evaluated = true;
    if (i == 0) {
      first_graphs = graphs;
      EXPECT_LE(graphs, 2) << "graphs compiled by the end of step 1";
    } else {
      EXPECT_LE(graphs, first_graphs + 1 + (evaluated ? 1 : 0)) << "graphs keep compiling after step 2";
    }
    if (j.contains("val_loss")) {
      EXPECT_TRUE(j["val_loss"].is_number());
      EXPECT_TRUE(std::isfinite(j["val_loss"].get<double>()));
    }
  }
}

// ---- 1. the demo beats the bigram baseline ----

TEST(Demo, HeldOutLossBeatsBigramEntropy) {
  ASSERT_TRUE(fs::is_directory(kFortunes)) << "Debian's fortunes package is not installed";
  const double bigram = bigram_entropy_nats(fortunes_text());
  EXPECT_NEAR(bigram, 2.59, 0.1) << "unexpected corpus";
  TempDir dir;
  // The demo's own step budget (no --steps): the default configuration must get there.
  Result r = cli({"demo", "--log-json", (dir / "demo.jsonl").string()}, dir.path());
  ASSERT_TRUE(r.exited && r.code == 0) << r.describe();

  std::vector<json> log = read_log(dir / "demo.jsonl");
  ASSERT_FALSE(log.empty());
  expect_log_schema(log, 0, log.back()["step"].get<int64_t>());
  ASSERT_TRUE(log.back().contains("val_loss")) << "the last step should be evaluated: " << log.back().dump();
  const double val = log.back()["val_loss"].get<double>();
  std::printf("demo: %lld steps, held-out loss %.4f nats/char, bigram entropy %.4f\n",
              (long long)log.back()["step"].get<int64_t>(), val, bigram);
  EXPECT_LT(val, bigram) << "the demo's final held-out loss does not beat the bigram baseline";
  int evaluated = 0;
  for (const json& j : log) evaluated += j.contains("val_loss");
  EXPECT_GE(evaluated, 2) << "the demo evaluates periodically";

  // What the demo prints: the loss table, throughput, a sample and the summary.
  const std::string& out = r.out;
  EXPECT_NE(out.find("loss curve"), std::string::npos) << out;
  EXPECT_NE(out.find("held-out"), std::string::npos) << out;
  for (const json& j : log)  // one table row per evaluation, ending with the held-out loss
    if (j.contains("val_loss")) {
      char row[64];
      std::snprintf(row, sizeof row, "%lld", (long long)j["step"].get<int64_t>());
      EXPECT_NE(out.find(row), std::string::npos) << "no table row for step " << row;
    }
  EXPECT_NE(out.find("tokens/s"), std::string::npos) << out;
  size_t sample = out.find("sample");
  ASSERT_NE(sample, std::string::npos) << out;
  size_t q = out.find("Q: ", sample);
  ASSERT_NE(q, std::string::npos) << "the sample should start with its prompt: " << out;
  size_t summary = out.find("summary:", q);
  ASSERT_NE(summary, std::string::npos) << out;
  EXPECT_GT(summary - q, size_t(100)) << "the sample looks too short: " << out.substr(q, summary - q);
  for (const char* word : {"parameters", "graphs compiled", "host syncs", "peak memory"})
    EXPECT_NE(out.find(word, summary), std::string::npos) << "summary lacks '" << word << "': " << out.substr(summary);
  // Not a terminal: plain lines, no carriage returns.
  EXPECT_EQ(out.find('\r'), std::string::npos);
  EXPECT_TRUE(r.err.empty()) << r.err;
}

// ---- 2. resume is bit-identical with dropout on ----

TEST(Resume, DropoutRunContinuesBitIdentically) {
  TempDir dir;
  // --warmup longer than the run keeps the learning rate schedule independent of --steps
  // (which is also the cosine length), so a 10-step first leg follows exactly the schedule of
  // the uninterrupted 15-step run; the resumed leg then continues that warmup from step 10.
  const std::vector<std::string> cfg = {"--layers", "2", "--embd", "64", "--heads", "4", "--block", "32", "--batch", "8",
                                        "--dropout", "0.1", "--warmup", "20", "--device", "cpu", "--seed", "7"};
  std::string a = (dir / "A").string(), b = (dir / "B").string();
  Result r1 = cli(cat({"train", "gpt", "--steps", "10", "--out", a, "--log-json", a + ".jsonl"}, cfg), dir.path());
  ASSERT_TRUE(r1.exited && r1.code == 0) << r1.describe();
  Result r2 = cli(cat({"train", "gpt", "--steps", "15", "--out", a, "--resume", "--log-json", a + ".jsonl"}, cfg), dir.path());
  ASSERT_TRUE(r2.exited && r2.code == 0) << r2.describe();
  EXPECT_NE(r2.out.find("resumed from"), std::string::npos) << r2.describe();
  Result rb = cli(cat({"train", "gpt", "--steps", "15", "--out", b, "--log-json", b + ".jsonl"}, cfg), dir.path());
  ASSERT_TRUE(rb.exited && rb.code == 0) << rb.describe();

  std::vector<json> la = read_log(a + ".jsonl"), lb = read_log(b + ".jsonl");
  ASSERT_EQ(la.size(), 15u) << "--log-json should append when resuming";
  ASSERT_EQ(lb.size(), 15u);
  for (size_t i = 0; i < 15; ++i) {
    SCOPED_TRACE("step " + std::to_string(i + 1));
    EXPECT_EQ(la[i]["step"], lb[i]["step"]);
    // Exact doubles (the JSON numbers round-trip), and their text too.
    EXPECT_EQ(la[i]["loss"].get<double>(), lb[i]["loss"].get<double>())
        << (i >= 10 ? "resumed" : "fresh") << " run: " << la[i]["loss"].dump() << " vs uninterrupted " << lb[i]["loss"].dump();
    EXPECT_EQ(la[i]["loss"].dump(), lb[i]["loss"].dump());
    EXPECT_EQ(la[i]["lr"].get<double>(), lb[i]["lr"].get<double>()) << "learning rate schedule differs";
  }
  // Dropout really is on: the same run without it gives other losses.
  std::vector<std::string> nodrop = cfg;
  nodrop[std::find(nodrop.begin(), nodrop.end(), "--dropout") - nodrop.begin() + 1] = "0";
  Result rc = cli(cat({"train", "gpt", "--steps", "2", "--log-json", (dir / "C.jsonl").string()}, nodrop), dir.path());
  ASSERT_TRUE(rc.exited && rc.code == 0) << rc.describe();
  std::vector<json> lc = read_log(dir / "C.jsonl");
  ASSERT_EQ(lc.size(), 2u);
  EXPECT_NE(lc[1]["loss"].get<double>(), lb[1]["loss"].get<double>()) << "--dropout 0.1 seems to have no effect";

  // Both final checkpoints hold the same step and the same weights.
  std::string ca = read_file(fs::path(a) / "ckpt.safetensors"), cb = read_file(fs::path(b) / "ckpt.safetensors");
  ASSERT_FALSE(ca.empty());
  json ha = header_of(ca), hb = header_of(cb);
  EXPECT_EQ(ha["__metadata__"]["step"], "15");
  EXPECT_EQ(ha["__metadata__"]["step"], hb["__metadata__"]["step"]);
  EXPECT_TRUE(ca == cb) << "the resumed run's final checkpoint differs from the uninterrupted run's";
}

// ---- 3. errors: one clear line and a non-zero exit ----

TEST(Errors, CorruptTruncatedAndMissingCheckpoints) {
  TempDir dir;
  fs::path good = make_checkpoint(dir);
  const std::string bytes = read_file(good);
  uint64_t hlen = 0;
  header_of(bytes, &hlen);
  ASSERT_GT(bytes.size(), 8 + hlen);
  // The intact checkpoint samples.
  Result ok = cli({"sample", "--ckpt", good.string(), "--tokens", "5", "--device", "cpu"}, dir.path());
  ASSERT_TRUE(ok.exited && ok.code == 0) << ok.describe();

  std::map<std::string, std::string> bad;
  bad["empty"] = "";
  bad["truncated to 5 bytes"] = bytes.substr(0, 5);
  bad["truncated inside the header"] = bytes.substr(0, 8 + hlen / 2);
  bad["truncated after the header"] = bytes.substr(0, 8 + hlen);
  bad["truncated to half"] = bytes.substr(0, bytes.size() / 2);
  bad["last byte missing"] = bytes.substr(0, bytes.size() - 1);
  {
    std::string s = bytes;
    s[7] = char(0x7f);  // header length ~9e18
    bad["huge header length"] = s;
  }
  {
    std::string s = bytes;
    s[0] = char(static_cast<unsigned char>(s[0]) + 3);  // header length a little too long
    bad["header length off by 3"] = s;
  }
  {
    std::string s = bytes;
    s[8] = '#';  // the header's opening brace
    bad["flipped first header byte"] = s;
  }
  {
    std::string s = bytes;
    for (uint64_t i = 8 + hlen / 3; i < 8 + hlen / 3 + 4; ++i) s[i] = char(~s[i]);
    bad["flipped header bytes (invalid UTF-8)"] = s;
  }
  {
    std::string s = bytes;
    size_t p = s.find("\"F32\"");
    ASSERT_NE(p, std::string::npos);
    s.replace(p, 5, "\"Q32\"");
    bad["unknown dtype"] = s;
  }
  {
    std::string s = bytes;  // the first tensor's end offset: all nines
    size_t p = s.find("\"data_offsets\":[");
    ASSERT_NE(p, std::string::npos) << s.substr(8, hlen);
    size_t comma = s.find(',', p), close = s.find(']', comma);
    std::string end = s.substr(comma + 1, close - comma - 1);
    std::string huge(end.size(), '9');
    s.replace(comma + 1, end.size(), huge);
    bad["data offsets disagree with the shape"] = s;
  }
  {
    std::string s = bytes;  // a tensor renamed: the model's state no longer matches
    size_t p = s.find("\"model.");
    ASSERT_NE(p, std::string::npos);
    s[p + 1] = 'M';
    bad["renamed tensor"] = s;
  }
  for (auto& [what, content] : bad) {
    fs::path p = dir / "bad.safetensors";
    write_file(p, content);
    expect_clean_error(cli({"sample", "--ckpt", p.string(), "--device", "cpu"}, dir.path()), "sample: " + what);
  }
  expect_clean_error(cli({"sample", "--ckpt", (dir / "no-such.safetensors").string()}, dir.path()), "missing file");
  expect_clean_error(cli({"sample", "--ckpt", dir.path().string()}, dir.path()), "a directory");
  // Resuming from a corrupt checkpoint fails the same way.
  fs::create_directories(dir / "R");
  write_file(dir / "R" / "ckpt.safetensors", bytes.substr(0, bytes.size() / 2));
  expect_clean_error(cli(cat({"train", "gpt", "--steps", "5", "--resume", "--out", (dir / "R").string()}, kTiny), dir.path()),
                     "train --resume from a truncated checkpoint");
  // Resuming with flags that describe another model.
  fs::create_directories(dir / "S");
  fs::copy_file(good, dir / "S" / "ckpt.safetensors");
  std::vector<std::string> other = kTiny;
  other[3] = "64";  // --embd
  expect_clean_error(cli(cat({"train", "gpt", "--steps", "5", "--resume", "--out", (dir / "S").string()}, other), dir.path()),
                     "train --resume with another model configuration");
}

// The checkpoint's metadata (model configuration, vocabulary, step, RNG and loader state) is
// parsed by the CLI; corrupt values there are corrupt checkpoints too.
TEST(Errors, CorruptCheckpointMetadata) {
  TempDir dir;
  fs::path good = make_checkpoint(dir);
  const std::string bytes = read_file(good);
  uint64_t hlen = 0;
  json header = header_of(bytes, &hlen);
  // The same file with one metadata entry replaced (the header rewritten, its length updated).
  auto with_meta = [&](const std::string& key, const std::string& value) {
    json h = header;
    EXPECT_TRUE(h["__metadata__"].contains(key)) << key;
    h["__metadata__"][key] = value;
    std::string text = h.dump(), len(8, '\0');
    for (int i = 0; i < 8; ++i) len[i] = char((uint64_t(text.size()) >> (8 * i)) & 0xff);
    return len + text + bytes.substr(8 + hlen);
  };
  const std::string config = header["__metadata__"]["config"].get<std::string>();
  json bad_config = json::parse(config);
  bad_config["bias"] = 1234;
  std::map<std::string, std::string> bad;
  bad["corrupt step metadata"] = with_meta("step", "x");
  bad["corrupt model configuration (not JSON)"] = with_meta("config", "{\"vocab\":");
  bad["corrupt model configuration (wrong type)"] = with_meta("config", bad_config.dump());
  {
    std::string s = bytes;  // a corrupt vocabulary in the metadata
    size_t p = s.find("\"vocab_hex\":\"");
    ASSERT_NE(p, std::string::npos);
    s[p + 13] = 'z', s[p + 14] = 'z';
    bad["corrupt vocab_hex metadata"] = s;
  }
  bad["vocabulary and model disagree"] = with_meta("vocab_hex", "414243");
  {  // the rewriting itself keeps a loadable checkpoint
    fs::path p = dir / "rewritten.safetensors";
    write_file(p, with_meta("step", "3"));
    Result r = cli({"sample", "--ckpt", p.string(), "--tokens", "5", "--device", "cpu"}, dir.path());
    EXPECT_TRUE(r.exited && r.code == 0) << r.describe();
  }
  for (auto& [what, content] : bad) {
    fs::path p = dir / "bad.safetensors";
    write_file(p, content);
    expect_clean_error(cli({"sample", "--ckpt", p.string(), "--device", "cpu"}, dir.path()), "sample: " + what);
  }
  // Resuming from checkpoints whose metadata is corrupt.
  for (auto [what, content] : std::map<std::string, std::string>{
           {"corrupt rng_offset metadata", with_meta("rng_offset", "x")},
           {"corrupt loader metadata", with_meta("loader", "1,x")},
           {"corrupt step metadata", with_meta("step", "x")},
           {"corrupt model configuration (not JSON)", with_meta("config", "{\"vocab\":")},
           {"corrupt model configuration (wrong type)", with_meta("config", bad_config.dump())}}) {
    fs::create_directories(dir / "M");
    write_file(dir / "M" / "ckpt.safetensors", content);
    expect_clean_error(cli(cat({"train", "gpt", "--steps", "5", "--resume", "--out", (dir / "M").string()}, kTiny), dir.path()),
                       "train --resume: " + what);
  }
}

TEST(Errors, BadDevicesFlagsAndFiles) {
  TempDir dir;
  const std::string d = dir.path().string();
  const std::vector<Case> cases = {
      {"unknown device (train)", {"train", "gpt", "--device", "tpu", "--steps", "1"}},
      {"unknown device (demo)", {"demo", "--device", "tpu", "--steps", "1"}},
      {"unknown device (sample)", {"sample", "--ckpt", d + "/x.safetensors", "--device", "tpu"}},
      {"unknown device index", {"train", "gpt", "--device", "cpu:7", "--steps", "1"}},
      {"negative steps", {"train", "gpt", "--steps", "-3"}},
      {"zero steps", {"train", "gpt", "--steps", "0"}},
      {"non-numeric steps", {"train", "gpt", "--steps", "abc"}},
      {"non-numeric lr", {"train", "gpt", "--lr", "fast"}},
      {"block too small", {"train", "gpt", "--block", "1"}},
      {"dropout out of range", {"train", "gpt", "--dropout", "1.5"}},
      {"embd not divisible by heads", {"train", "gpt", "--embd", "30", "--heads", "4", "--steps", "1"}},
      {"unknown flag", {"train", "gpt", "--bogus", "1"}},
      {"missing flag value", {"train", "gpt", "--steps"}},
      {"train without a model", {"train"}},
      {"unknown model", {"train", "resnet"}},
      {"unknown command", {"frobnicate"}},
      {"resume without --out", {"train", "gpt", "--resume", "--steps", "1"}},
      {"missing --data file", {"train", "gpt", "--data", d + "/no-such.txt", "--steps", "1"}},
      {"--data is a directory", {"train", "gpt", "--data", d, "--steps", "1"}},
      {"unwritable --log-json", {"train", "gpt", "--steps", "1", "--layers", "1", "--embd", "16", "--heads", "2",
                                 "--block", "8", "--batch", "2", "--log-json", d + "/no/such/dir/log.jsonl"}},
      {"sample without --ckpt", {"sample"}},
      {"sample: zero tokens", {"sample", "--ckpt", d + "/x.safetensors", "--tokens", "0"}},
      {"sample: negative temperature", {"sample", "--ckpt", d + "/x.safetensors", "--temperature", "-1"}},
      {"sample: negative top-k", {"sample", "--ckpt", d + "/x.safetensors", "--top-k", "-2"}},
      {"demo: negative steps", {"demo", "--steps", "-1"}},
  };
  for (const Case& c : cases) expect_clean_error(cli(c.args, dir.path()), c.what);
  // A text too short for the window.
  write_file(dir / "tiny.txt", "hello world\n");
  expect_clean_error(cli({"train", "gpt", "--data", (dir / "tiny.txt").string(), "--steps", "1"}, dir.path()), "text too short");
}

// Every option of every command, read from its --help (so a new flag is covered when it is
// added), refuses malformed, non-finite and out-of-range values with one error line that names it.
TEST(Errors, EveryFlagOfEveryCommandRefusesBadValues) {
  TempDir dir;
  std::vector<std::vector<std::string>> commands = {{"train", "gpt"}, {"train", "cnn"}, {"sample"},       {"demo"},
                                                    {"profile", "gpt"}, {"advise", "gpt"}, {"export", "gpt"},
                                                    {"conformance"},    {"devices"}};
  write_file(dir / "m.onnx", "");  // `run` checks its model exists before the flags' values reach it
  if (cli({"run", "--help"}, dir.path()).code == 0)  // built with ONNX import: the commands that take a model file
    for (const char* c : {"run", "advise", "profile"}) commands.push_back({c, (dir / "m.onnx").string()});
  const std::regex option(R"(^\s+(?:-\w,)?(--[a-z0-9-]+)(?: (\S+))?)");
  const std::regex range(R"(in \[([-0-9.e]+) - ([-0-9.e]+)\])");
  int flags = 0, cases = 0;
  for (const auto& command : commands) {
    Result help = cli(cat(command, {"--help"}), dir.path());
    ASSERT_TRUE(help.exited && help.code == 0) << help.describe();
    std::set<std::string> seen;
    for (const std::string& line : lines_of(help.out)) {
      std::smatch m;
      if (!std::regex_search(line, m, option) || m[1] == "--help" || !seen.insert(m[1]).second) continue;
      const std::string flag = m[1], type = m[2];
      std::vector<std::string> bad;
      if (type.rfind("INT", 0) == 0 || type.rfind("UINT", 0) == 0) bad = {"abc", "1.5", "99999999999999999999999"};
      if (type.rfind("UINT", 0) == 0) bad.push_back("-1");
      if (type.rfind("FLOAT", 0) == 0) bad = {"abc", "nan", "inf", "1e999"};
      if (type.find("POSITIVE") != std::string::npos && type.find("NON-") == std::string::npos) bad.push_back("0");
      if (type.find("NON-NEGATIVE") != std::string::npos || type.find("POSITIVE") != std::string::npos) bad.push_back("-1");
      std::smatch r;
      if (std::regex_search(type, r, range)) bad.push_back(std::to_string(std::stod(r[2]) + 1));
      if (type.rfind("TEXT:{", 0) == 0) bad.push_back("bogus");
      if (type.find("BYTES|FRACTION") != std::string::npos) bad.push_back("lots");
      if (type.find("N|auto") != std::string::npos) bad.insert(bad.end(), {"0", "some"});
      if (type.rfind("TEXT", 0) == 0 && flag != "--prompt") bad.push_back("");
      if (bad.empty()) continue;  // a switch
      ++flags;
      for (const std::string& v : bad) {
        Result res = cli(cat(command, {flag, v}), dir.path());
        std::string what = command[0] + (command.size() > 1 ? " " + command[1] : "") + " " + flag + " '" + v + "'";
        expect_clean_error(res, what);
        EXPECT_NE(res.err.find(flag), std::string::npos) << what << ": the error should name the flag: " << res.err;
        ++cases;
      }
    }
  }
  EXPECT_GE(flags, 50) << "options found in the commands' --help";
  std::printf("%d options, %d bad values refused\n", flags, cases);
}

// Values in range but too large for the machine, and conflicting flags: one error line before
// anything heavy runs.
TEST(Errors, TooLargeAndConflictingFlags) {
  TempDir dir;
  const std::vector<Case> cases = {
      {"a model over the memory", {"train", "gpt", "--layers", "1000000", "--steps", "1"}},
      {"a batch over the memory", {"train", "gpt", "--batch", "10000000", "--steps", "1"}},
      {"a batch over the training set", {"train", "cnn", "--batch", "70000", "--steps", "1"}},
      {"micro-batches not dividing the batch", {"train", "gpt", "--batch", "6", "--micro-batches", "4", "--steps", "1"}},
      {"auto micro-batches without a budget", {"train", "gpt", "--micro-batches", "auto", "--steps", "1"}},
      {"checkpoints every N without --out", {"train", "gpt", "--ckpt-every", "5", "--steps", "1"}},
      {"resume without --out (cnn)", {"train", "cnn", "--resume", "--steps", "1"}},
  };
  for (const Case& c : cases) {
    Result r = cli(c.args, dir.path());
    expect_clean_error(r, c.what);
  }
}

// ---- 4 and 5. the JSON log and plain progress lines ----

TEST(TrainLog, EveryLineParsesWithTheDocumentedFields) {
  TempDir dir;
  fs::path log = dir / "log.jsonl";
  Result r = cli(cat({"train", "gpt", "--steps", "12", "--eval-every", "5", "--log-json", log.string()}, kTiny), dir.path());
  ASSERT_TRUE(r.exited && r.code == 0) << r.describe();
  std::vector<json> lines;
  ASSERT_NO_THROW(lines = read_log(log)) << read_file(log);
  expect_log_schema(lines, 0, 12);
  std::set<int64_t> evaluated;
  for (const json& j : lines)
    if (j.contains("val_loss")) evaluated.insert(j["step"].get<int64_t>());
  EXPECT_EQ(evaluated, (std::set<int64_t>{5, 10, 12})) << "held-out loss every --eval-every steps and at the end";
  // Warmup: the learning rate rises over the first steps.
  EXPECT_LT(lines[0]["lr"].get<double>(), lines[5]["lr"].get<double>());
  // The run's summary line.
  EXPECT_NE(r.out.find("held-out loss"), std::string::npos) << r.out;

  // Progress when stdout is not a terminal: plain periodic lines, no carriage returns or bars.
  EXPECT_EQ(r.out.find('\r'), std::string::npos) << "carriage return in non-terminal output";
  EXPECT_EQ(r.out.find("\x1b["), std::string::npos) << "escape sequence in non-terminal output";
  int progress = 0;
  for (const std::string& l : lines_of(r.out))
    if (l.rfind("step ", 0) == 0) {
      ++progress;
      EXPECT_NE(l.find("loss"), std::string::npos) << l;
      EXPECT_NE(l.find("tok/s"), std::string::npos) << l;
      EXPECT_NE(l.find("ETA"), std::string::npos) << l;
    }
  EXPECT_GE(progress, 3) << r.out;
  EXPECT_LE(progress, 12 + 3) << "progress lines should be periodic, not per-step noise";
  EXPECT_NE(r.out.find("step 12/12"), std::string::npos) << "the last step is always reported: " << r.out;
}

// One device's training step is captured (tessera/capture.h): from the fourth step on it replays
// the compiled step instead of tracing it, with the traced run's losses bit for bit (dropout and
// the held-out evaluations between steps included); TESSERA_CAPTURE=0 traces every step.
TEST(TrainLog, TheCapturedStepReplaysWithTheTracedLosses) {
  TempDir dir;
  std::vector<std::vector<json>> logs;
  for (const char* capture : {"1", "0"}) {
    fs::path log = dir / (std::string("capture") + capture + ".jsonl");
    setenv("TESSERA_CAPTURE", capture, 1);
    Result r = cli(cat({"train", "gpt", "--steps", "8", "--dropout", "0.1", "--eval-every", "3", "--log-json", log.string()}, kTiny),
                   dir.path());
    unsetenv("TESSERA_CAPTURE");
    ASSERT_TRUE(r.exited && r.code == 0) << r.describe();
    logs.push_back(read_log(log));
    ASSERT_EQ(logs.back().size(), 8u);
  }
  for (size_t s = 0; s < 8; ++s) {
    EXPECT_EQ(logs[0][s]["loss"].get<double>(), logs[1][s]["loss"].get<double>()) << "step " << s + 1;
    EXPECT_EQ(logs[0][s]["replayed"].get<bool>(), s >= 3) << "step " << s + 1;
    EXPECT_FALSE(logs[1][s]["replayed"].get<bool>()) << "step " << s + 1;
  }
}

// --tensor-parallel 2: the GPT's attention and MLP weights split over 2 in-process ranks (one
// per-rank graph, dist::sync_partitioned) trains with one device's losses, dropout included (every
// rank draws the whole mask and keeps its block); with --data-parallel 2 on a 2 x 2 mesh too.
TEST(TrainLog, TensorParallelTrainsWithOneDevicesLosses) {
  TempDir dir;
  std::vector<std::vector<json>> logs;
  for (auto [tp, dp] : {std::pair{"1", "1"}, std::pair{"2", "1"}, std::pair{"2", "2"}}) {
    fs::path log = dir / (std::string("tp") + tp + dp + ".jsonl");
    Result r = cli(cat({"train", "gpt", "--steps", "4", "--dropout", "0.1", "--tensor-parallel", tp, "--data-parallel", dp, "--log-json",
                        log.string()},
                       kTiny),
                   dir.path());
    ASSERT_TRUE(r.exited && r.code == 0) << r.describe();
    logs.push_back(read_log(log));
    ASSERT_EQ(logs.back().size(), 4u);
  }
  for (size_t k = 1; k < logs.size(); ++k)
    for (size_t s = 0; s < 4; ++s) {
      const double a = logs[0][s]["loss"].get<double>(), b = logs[k][s]["loss"].get<double>();
      EXPECT_NEAR(b, a, 1e-5 * std::fabs(a)) << "run " << k << ", step " << s + 1;
    }
  Result bad = cli(cat({"train", "gpt", "--steps", "1", "--tensor-parallel", "2", "--zero1"}, kTiny), dir.path());
  expect_clean_error(bad, "--zero1 does not combine with --tensor-parallel");
}

// On a terminal the same run draws a progress bar redrawn in place.
TEST(TrainLog, TerminalGetsAProgressBar) {
  Result r = run_in_terminal(TESSERA_CLI, cat({"train", "gpt", "--steps", "12"}, kTiny));
  ASSERT_TRUE(r.exited && r.code == 0) << r.describe();
  EXPECT_NE(r.out.find("\r["), std::string::npos) << "no progress bar redrawn with a carriage return: " << r.out;
  EXPECT_NE(r.out.find("step 12/12"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ETA"), std::string::npos) << r.out;
}

// ---- 7. sampling ----

TEST(Sample, PromptThenExactlyTokensFromTheVocabularyDeterministically) {
  TempDir dir;
  fs::path ckpt = make_checkpoint(dir);
  json meta = header_of(read_file(ckpt))["__metadata__"];
  std::string vocab;
  {
    std::string h = meta["vocab_hex"].get<std::string>();
    for (size_t i = 0; i + 1 < h.size(); i += 2) vocab += char(std::stoi(h.substr(i, 2), nullptr, 16));
  }
  ASSERT_GT(vocab.size(), 50u);
  const std::string prompt = "Q: Why";
  // 100 tokens from a block-16 model also crosses the context refill.
  auto sample = [&](const std::string& seed, const std::string& tokens, std::vector<std::string> extra = {}) {
    Result r = cli(cat({"sample", "--ckpt", ckpt.string(), "--prompt", prompt, "--tokens", tokens, "--seed", seed,
                        "--device", "cpu"},
                       extra),
                   dir.path());
    EXPECT_TRUE(r.exited && r.code == 0) << r.describe();
    EXPECT_TRUE(r.err.empty()) << r.err;
    return r.out;
  };
  for (int tokens : {1, 7, 100}) {
    SCOPED_TRACE("--tokens " + std::to_string(tokens));
    std::string out = sample("5", std::to_string(tokens));
    ASSERT_EQ(out.rfind(prompt, 0), 0u) << "output should start with the prompt: " << out;
    ASSERT_FALSE(out.empty());
    ASSERT_EQ(out.back(), '\n') << "output should end with a newline";
    std::string gen = out.substr(prompt.size(), out.size() - prompt.size() - 1);
    EXPECT_EQ(gen.size(), size_t(tokens)) << "generated: '" << gen << "'";
    for (char c : gen) EXPECT_NE(vocab.find(c), std::string::npos) << "byte " << int((unsigned char)c) << " not in the vocabulary";
  }
  std::string a = sample("5", "100"), b = sample("5", "100"), c = sample("6", "100");
  EXPECT_EQ(a, b) << "the same seed should give the same sample";
  EXPECT_NE(a, c) << "another seed should give another sample";
  // Greedy sampling ignores the seed.
  EXPECT_EQ(sample("1", "40", {"--top-k", "1"}), sample("2", "40", {"--top-k", "1"}));
  // A prompt byte outside the vocabulary is a clear error.
  std::string outside;
  for (int byte = 1; byte < 128 && outside.empty(); ++byte)
    if (vocab.find(char(byte)) == std::string::npos) outside = std::string("a") + char(byte);
  if (!outside.empty())
    expect_clean_error(cli({"sample", "--ckpt", ckpt.string(), "--prompt", outside, "--device", "cpu"}, dir.path()),
                       "prompt outside the vocabulary");
  expect_clean_error(cli({"sample", "--ckpt", ckpt.string(), "--prompt", "", "--device", "cpu"}, dir.path()), "empty prompt");
}

// `tessera devices` and `--version` work and say something.
TEST(Cli, DevicesAndVersion) {
  TempDir dir;
  Result d = cli({"devices"}, dir.path());
  ASSERT_TRUE(d.exited && d.code == 0) << d.describe();
  EXPECT_NE(d.out.find("cpu:0"), std::string::npos) << d.out;
  Result v = cli({"--version"}, dir.path());
  ASSERT_TRUE(v.exited && v.code == 0) << v.describe();
  EXPECT_EQ(v.out.rfind("tessera ", 0), 0u) << v.out;
}

// --metrics on the commands that run work prints tessera::metrics().report() after their output
// (every field and why graphs were compiled); without it nothing of the report appears.
TEST(Cli, MetricsFlagPrintsTheReportAtTheEnd) {
  TempDir dir;
  auto expect_report = [](const Result& r, const std::string& what) {
    SCOPED_TRACE(what);
    ASSERT_TRUE(r.exited && r.code == 0) << r.describe();
    size_t at = r.out.find("tessera metrics\n");
    ASSERT_NE(at, std::string::npos) << r.describe();
    std::string rep = r.out.substr(at);
    for (const char* label : {"graphs compiled:", "cache hits:", "steps launched:", "host syncs:", "host -> device:",
                              "device -> host:", "live memory:", "peak memory:", "why graphs were compiled", "graph 1: "})
      EXPECT_NE(rep.find(label), std::string::npos) << "missing '" << label << "' in\n" << rep;
    EXPECT_EQ(rep.find("graphs compiled:   0 "), std::string::npos) << "work was compiled:\n" << rep;
  };
  fs::path ckpt_dir = dir / "ckpt";
  Result t = cli(cat({"train", "gpt", "--steps", "2", "--out", ckpt_dir.string(), "--metrics"}, kTiny), dir.path());
  expect_report(t, "train gpt --metrics");
  EXPECT_LT(t.out.find("checkpoint: "), t.out.find("tessera metrics")) << "the report comes last";
  Result s = cli({"sample", "--ckpt", (ckpt_dir / "ckpt.safetensors").string(), "--tokens", "5", "--device", "cpu",
                  "--metrics"},
                 dir.path());
  expect_report(s, "sample --metrics");
  Result plain = cli({"sample", "--ckpt", (ckpt_dir / "ckpt.safetensors").string(), "--tokens", "5", "--device", "cpu"},
                     dir.path());
  ASSERT_TRUE(plain.exited && plain.code == 0) << plain.describe();
  EXPECT_EQ(plain.out.find("tessera metrics"), std::string::npos) << plain.out;
  // The demo trains for a minute: only its help is checked here.
  Result h = cli({"demo", "--help"}, dir.path());
  EXPECT_NE(h.out.find("--metrics"), std::string::npos) << h.describe();
}

// ---- tessera profile / train --profile --------------------------------------------------------

// profile gpt: the trace parses with a Step per executed Step (each naming its fused ops), a
// compile and the host syncs; the CSV has every group with <runtime>; the memory viewer is one
// self-contained page; stdout has the op table (rows summing to the wall time) and the peak.
TEST(Profile, GptWritesTraceTableAndMemoryViewer) {
  TempDir dir;
  Result r = cli(cat({"profile", "gpt", "--steps", "3", "--skip", "0", "--trace", (dir / "t.json").string(), "--memory",
                      (dir / "m.html").string(), "--table", (dir / "t.csv").string()}, kTiny), dir.path());
  ASSERT_TRUE(r.exited && r.code == 0) << r.describe();
  for (const char* s : {"by Step kind", "by module path", "by op and module", "<runtime>", "<compile>", "peak ", "live buffers"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;

  json trace = json::parse(read_file(dir / "t.json"));
  int steps = 0, compiles = 0, syncs = 0;
  for (auto& e : trace.at("traceEvents")) {
    ASSERT_TRUE(e.contains("name") && e.contains("ph") && e.contains("pid") && e.contains("tid")) << e.dump();
    if (e["ph"] != "X") continue;
    std::string cat_ = e.at("cat");
    compiles += cat_ == "compile";
    syncs += cat_ == "sync";
    if (cat_ != "step") continue;
    ++steps;
    ASSERT_FALSE(e.at("args").at("ops").empty()) << e.dump();
    EXPECT_NE(e.at("name").get<std::string>().find(": "), std::string::npos) << e.dump();
  }
  EXPECT_GT(steps, 3 * 40);
  EXPECT_GE(compiles, 1);
  EXPECT_GE(syncs, 3);

  std::vector<std::string> csv = lines_of(read_file(dir / "t.csv"));
  ASSERT_GT(csv.size(), 10u);
  EXPECT_EQ(csv[0], "group,name,ms,calls,flops,bytes,gflops_per_s,gbytes_per_s,percent");
  double kind_ms = 0;
  std::set<std::string> groups;
  bool runtime_row = false;
  for (size_t i = 1; i < csv.size(); ++i) {
    std::string group = csv[i].substr(0, csv[i].find(','));
    groups.insert(group);
    runtime_row = runtime_row || csv[i].rfind("kind,<runtime>,", 0) == 0;
    if (group == "kind") {
      size_t a = csv[i].find(',', 5) + 1;
      kind_ms += std::stod(csv[i].substr(a, csv[i].find(',', a) - a));
    }
  }
  EXPECT_EQ(groups, (std::set<std::string>{"kind", "module", "op"}));
  EXPECT_TRUE(runtime_row);
  size_t w = r.out.find("profile: ");
  ASSERT_NE(w, std::string::npos);
  double wall = std::stod(r.out.substr(w + 9));
  EXPECT_NEAR(kind_ms, wall, 0.01 * wall + 0.01) << "the kind rows sum to the profiled wall time";

  std::string html = read_file(dir / "m.html");
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("id=\"peak\""), std::string::npos);
  EXPECT_NE(html.find("<rect class=\"buf"), std::string::npos);
  EXPECT_EQ(html.find("src=\"http"), std::string::npos);
}

// profile gpt prints the memory one rank holds: parameters and AdamW's moments beside the whole
// model's, and the step graph's activations and temporaries (one rank's graph on several ranks).
// By hand for kTiny (1 block, embd 32): --tensor-parallel 2 splits qkv (96 x 32 + 96), the MLP's
// first layer (128 x 32 + 128), the attention's output projection (32 x 32) and the MLP's second
// layer (32 x 128): 12512 float32 elements, half of them (25024 bytes) off each rank; the moments
// follow (2 x). ZeRO-1 on 2 ranks holds half the moments (and at most a bucket's padding more).
// Half the batch per rank plans fewer activation bytes than the whole batch on one device.
TEST(Profile, MemoryPerRankShowsShardedParametersAndOptimizerState) {
  TempDir dir;
  struct Figures {
    int64_t param = 0, full_param = 0, opt = 0, full_opt = 0, act = 0;
  };
  auto run_profile = [&](std::vector<std::string> extra) {
    std::vector<std::string> args{"profile", "gpt", "--steps", "1", "--skip", "0", "--memory", (dir / "m.html").string()};
    args.insert(args.end(), extra.begin(), extra.end());
    Result r = cli(cat(args, kTiny), dir.path());
    Figures f;
    EXPECT_TRUE(r.exited && r.code == 0) << r.describe();
    const size_t at = r.out.find("bytes: parameters ");
    EXPECT_NE(at, std::string::npos) << r.out;
    if (at == std::string::npos) return f;
    long long a, b, c, d, e;
    EXPECT_EQ(std::sscanf(r.out.c_str() + at, "bytes: parameters %lld/%lld, optimizer %lld/%lld, activations %lld", &a, &b, &c, &d, &e), 5)
        << r.out;
    f = {a, b, c, d, e};
    EXPECT_NE(read_file(dir / "m.html").find("memory per rank"), std::string::npos) << "the viewer's title";
    return f;
  };
  Figures one = run_profile({}), tp = run_profile({"--tensor-parallel", "2"}), zero = run_profile({"--data-parallel", "2", "--zero1"});
  EXPECT_EQ(one.param, one.full_param);
  EXPECT_EQ(one.opt, 2 * one.param);
  EXPECT_EQ(tp.full_param, one.full_param);
  EXPECT_EQ(tp.param, one.full_param - 12512 * 4 / 2);
  EXPECT_EQ(tp.opt, 2 * tp.param);
  EXPECT_EQ(zero.param, one.full_param);
  EXPECT_GE(zero.opt, one.full_opt / 2);
  EXPECT_LE(zero.opt, one.full_opt / 2 + 1024);
  EXPECT_LT(zero.act, one.act);
  EXPECT_GT(zero.act, 0);
}

// train gpt --profile DIR writes every file; a --skip past the last step is a clean error.
TEST(Profile, TrainProfileDirAndErrors) {
  TempDir dir;
  Result r = cli(cat({"train", "gpt", "--steps", "2", "--profile", (dir / "prof").string()}, kTiny), dir.path());
  ASSERT_TRUE(r.exited && r.code == 0) << r.describe();
  for (const char* f : {"trace.json", "ops.csv", "ops.txt", "memory.html"})
    EXPECT_GT(fs::file_size(dir / "prof" / f), 100u) << f;
  EXPECT_NE(read_file(dir / "prof" / "ops.txt").find("<runtime>"), std::string::npos);
  EXPECT_NO_THROW(json::parse(read_file(dir / "prof" / "trace.json")));
  EXPECT_NE(r.out.find("held-out loss"), std::string::npos) << r.out;

  Result bad = cli(cat({"profile", "gpt", "--steps", "2", "--skip", "2"}, kTiny), dir.path());
  EXPECT_TRUE(bad.exited && bad.code != 0) << bad.describe();
  EXPECT_NE(bad.err.find("--skip"), std::string::npos) << bad.describe();
}

// The memory viewer rendered by headless Chromium (Debian's chromium): the page's script runs
// without errors and draws one rect per buffer, and a screenshot is written (look at it:
// $TMPDIR/tessera-memory-viewer.png is kept). Skips when chromium is absent, unless CI=true.
TEST(Profile, MemoryViewerRendersInHeadlessChromium) {
  const char* ci = std::getenv("CI");
  const bool in_ci = ci && std::string(ci) == "true";
  const std::string chromium = "/usr/bin/chromium";
  if (!fs::exists(chromium)) {
    if (in_ci) FAIL() << chromium << " is missing (Debian's chromium package, listed in scripts/run) and CI=true";
    GTEST_SKIP() << chromium << " is missing: install Debian's chromium (scripts/run installs it) to render the memory viewer";
  }
  TempDir dir;
  fs::path page = dir / "m.html", png = dir / "m.png";
  Result r = cli(cat({"profile", "gpt", "--steps", "2", "--memory", page.string()}, kTiny), dir.path());
  ASSERT_TRUE(r.exited && r.code == 0) << r.describe();
  std::string html = read_file(page);
  size_t rects = 0;
  for (size_t p = 0; (p = html.find("<rect class=\"buf", p)) != std::string::npos; ++p) ++rects;
  ASSERT_GT(rects, 10u);
  auto browse = [&](const std::string& what, const std::string& profile) {
    return run(chromium, {"--headless", "--no-sandbox", "--disable-gpu", "--user-data-dir=" + (dir / profile).string(),
                          "--window-size=1250,900", what, "file://" + page.string()}, dir.path());
  };
  Result dom = browse("--dump-dom", "profile-dom");
  ASSERT_TRUE(dom.exited && dom.code == 0) << dom.describe();
  size_t error = dom.out.find("data-error=\"");
  EXPECT_EQ(error, std::string::npos) << "script error: " << dom.out.substr(error == std::string::npos ? 0 : error, 300);
  EXPECT_NE(dom.out.find("data-rects=\"" + std::to_string(rects) + "\""), std::string::npos)
      << "the script should see one rect per buffer (" << rects << ")";
  EXPECT_NE(dom.out.find("data-buffers=\"" + std::to_string(rects) + "\""), std::string::npos);
  Result shot = browse("--screenshot=" + png.string(), "profile-shot");
  ASSERT_TRUE(shot.exited && shot.code == 0) << shot.describe();
  ASSERT_TRUE(fs::exists(png)) << shot.describe();
  std::string bytes = read_file(png);
  ASSERT_GT(bytes.size(), 5000u);
  EXPECT_EQ(bytes.substr(1, 3), "PNG");
  std::error_code ec;
  fs::copy_file(png, fs::temp_directory_path() / "tessera-memory-viewer.png", fs::copy_options::overwrite_existing, ec);
}

}  // namespace

#ifdef TESSERA_GPT_EXAMPLE
namespace {
// examples/gpt trains (briefly here), reports its held-out loss, samples and prints metrics.
TEST(Example, GptTrainsEvaluatesAndSamples) {
  e2e::TempDir dir;
  e2e::Result r = e2e::run(TESSERA_GPT_EXAMPLE, {"5"}, dir.path());
  ASSERT_TRUE(r.exited && r.code == 0) << r.describe();
  for (const char* s : {"parameters", "step     5  loss", "held-out loss:", "sample:\nQ: "})
    EXPECT_NE(r.out.find(s), std::string::npos) << "missing '" << s << "':\n" << r.out;
}
}  // namespace
#endif

// ---- tessera advise ---------------------------------------------------------------------------
namespace {

const std::vector<std::string> kAdviseTiny = {"advise", "gpt", "--layers", "1", "--embd", "32", "--heads", "2",
                                              "--block", "16", "--vocab", "28", "--batch", "4"};

}  // namespace

// The table names every device asked for with its columns, then a plain recommendation.
TEST(Cli, AdviseTableForATinyModel) {
  TempDir dir;
  Result r = cli(cat(kAdviseTiny, {"--devices", "t4,p100,tpu-v3-8,h100"}), dir.path());
  ASSERT_TRUE(r.exited && r.code == 0) << r.describe();
  for (const char* s : {"DEVICE", "STEP", "TOKENS/S", "PEAK / CAPACITY", "FITS", "MAX BATCH", "TOKENS/J", "BOTTLENECK", "t4",
                        "p100", "tpu-v3-8", "h100", "Fastest: "})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  EXPECT_TRUE(r.err.empty()) << r.err;
}

// --json: one object with every device's prediction; a tiny model fits everywhere, in bfloat16
// too (autocast; its rates: test_advise), and data parallelism adds communication time.
TEST(Cli, AdviseJsonHasEveryFieldAndDtypeAndDataParallelBehave) {
  TempDir dir;
  auto run_json = [&](std::vector<std::string> extra) {
    Result r = cli(cat(cat(kAdviseTiny, {"--devices", "t4,a100-40,tpu-v3-8", "--json"}), extra), dir.path());
    EXPECT_TRUE(r.exited && r.code == 0) << r.describe();
    return json::parse(r.out);
  };
  json f = run_json({});
  ASSERT_EQ(f["devices"].size(), 3u);
  for (auto& d : f["devices"]) {
    for (const char* k : {"device", "step_s", "tokens_per_s", "peak_bytes", "capacity_bytes", "fits", "max_batch",
                          "tokens_per_joule", "bottleneck", "communication_s"})
      EXPECT_TRUE(d.contains(k)) << k << " in " << d.dump();
    EXPECT_TRUE(d["fits"].get<bool>());
    EXPECT_GE(d["max_batch"].get<int64_t>(), 4);
    EXPECT_GT(d["step_s"].get<double>(), 0);
  }
  EXPECT_EQ(f["devices"][2]["replicas"].get<int64_t>(), 8);
  EXPECT_GT(f["devices"][2]["communication_s"].get<double>(), 0) << "a TPU v3-8 all-reduces over its 8 cores";
  EXPECT_FALSE(f["recommendation"].get<std::string>().empty());
  json b = run_json({"--dtype", "bfloat16", "--data-parallel", "2"});
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(b["devices"][i]["fits"].get<bool>());
    EXPECT_GT(b["devices"][i]["communication_s"].get<double>(), 0);
    const double scaling = b["devices"][i]["scaling_efficiency"].get<double>();
    EXPECT_GT(scaling, 0);
    EXPECT_LT(scaling, 1);
    EXPECT_FALSE(b["devices"][i]["link"].get<std::string>().empty());
    EXPECT_GT(b["devices"][i]["gradient_bytes"].get<double>(), 0);
  }
  // ZeRO-1: the same traffic, less memory per replica.
  json z = run_json({"--dtype", "bfloat16", "--data-parallel", "2", "--zero1"});
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_DOUBLE_EQ(z["devices"][i]["communication_s"].get<double>(), b["devices"][i]["communication_s"].get<double>());
    EXPECT_LT(z["devices"][i]["peak_bytes"].get<double>(), b["devices"][i]["peak_bytes"].get<double>());
  }
}

// The table's data-parallel section: each device's replicas, link, gradient bytes, all-reduce time
// and scaling (t4x2: Kaggle's pair); --zero1 without replicas to shard over is refused.
TEST(Cli, AdviseDataParallelSectionAndZeroOneNeedsReplicas) {
  TempDir dir;
  Result r = cli(cat(kAdviseTiny, {"--devices", "t4x2,tpu-v3-8,t4", "--no-max-batch"}), dir.path());
  ASSERT_TRUE(r.exited && r.code == 0) << r.describe();
  for (const char* s : {"Data parallel:", "REPLICAS", "LINK", "ALL-REDUCE", "SCALING", "PCIe 3.0 x16 via host", "ICI (v3)"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  expect_clean_error(cli(cat(kAdviseTiny, {"--devices", "t4", "--zero1"}), dir.path()), "zero1 without replicas");
}

// --tensor-parallel 2: the tensor-parallel section (mesh, activation all-reduces, scaling), the
// JSON's tensor-parallel communication, less memory per device than data parallel at the same
// per-replica batch (tpu-v3-8: 4 x 2 against 8 replicas, both 1 row each); splits that do not
// divide the devices or the heads, and a memory budget, are refused.
TEST(Cli, AdviseTensorParallelSectionAndRefusals) {
  TempDir dir;
  Result r = cli(cat(kAdviseTiny, {"--devices", "t4x2,tpu-v3-8", "--no-max-batch", "--tensor-parallel", "2"}), dir.path());
  ASSERT_TRUE(r.exited && r.code == 0) << r.describe();
  for (const char* s : {"Tensor parallel over 2 devices", "DP x TP", "4 x 2", "1 x 2", "TP COMM", "DP COMM", "SCALING"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  auto run_json = [&](std::vector<std::string> extra) {
    Result j = cli(cat(cat(kAdviseTiny, {"--devices", "tpu-v3-8", "--no-max-batch", "--json"}), extra), dir.path());
    EXPECT_TRUE(j.exited && j.code == 0) << j.describe();
    return json::parse(j.out)["devices"][0];
  };
  json dp = run_json({}), tp = run_json({"--tensor-parallel", "2"});
  EXPECT_DOUBLE_EQ(tp["tensor_parallel_allreduce_bytes"].get<double>(), 1.0 * 16 * 32 * 4);  // B_local 1 x T 16 x C 32 float32
  EXPECT_GT(tp["tensor_parallel_communication_s"].get<double>(), 0);
  EXPECT_DOUBLE_EQ(dp["tensor_parallel_communication_s"].get<double>(), 0);
  EXPECT_LT(tp["peak_bytes"].get<double>(), dp["peak_bytes"].get<double>());
  const double scaling = tp["scaling_efficiency"].get<double>();
  EXPECT_GT(scaling, 0);
  EXPECT_LT(scaling, 1);
  Result bad = cli(cat(kAdviseTiny, {"--devices", "tpu-v3-8", "--tensor-parallel", "3", "--no-max-batch"}), dir.path());
  EXPECT_NE(bad.err.find("--tensor-parallel 3 does not divide the 8 devices of 'tpu-v3-8'"), std::string::npos) << bad.describe();
  expect_clean_error(bad, "tensor parallel 3");
  bad = cli(cat(kAdviseTiny, {"--devices", "tpu-v3-8", "--tensor-parallel", "4", "--no-max-batch"}), dir.path());
  EXPECT_NE(bad.err.find("does not divide the model's 2 heads"), std::string::npos) << bad.describe();
  expect_clean_error(cli(cat(kAdviseTiny, {"--devices", "t4x2", "--tensor-parallel", "2", "--memory-budget", "auto"}), dir.path()),
                     "tensor parallel with a budget");
}

// --memory-budget: what rematerialization and micro-batches fit. A budget below batch 8's own
// footprint (a block of 64: activations outweigh the parameters) is met by a rewrite whose
// footprint is under it and which costs time; a tiny one leaves nothing that fits; a fraction is
// refused.
TEST(Cli, AdviseMemoryBudgetReportsWhatTheRewritesFit) {
  TempDir dir;
  // The advisor's ladder is one graph, remat, micro-batches: it does not price batch unstacking
  // inside the step apart yet (it would show as one graph with nothing recomputed), so the CLI
  // runs here with that budget pass off.
  setenv("TESSERA_DISABLE_PASSES", "unstack", 1);
  const std::vector<std::string> model = {"advise", "gpt", "--layers", "1", "--embd", "32", "--heads", "2",
                                          "--block", "64", "--vocab", "28", "--batch", "8", "--devices", "t4"};
  auto run_json = [&](const std::string& budget) {
    Result r = cli(cat(model, {"--json", "--memory-budget", budget}), dir.path());
    EXPECT_TRUE(r.exited && r.code == 0) << r.describe();
    return json::parse(r.out)["devices"][0];
  };
  json a = run_json("auto");
  ASSERT_TRUE(a.contains("rewrites")) << a.dump();
  EXPECT_TRUE(a["rewrites"]["at_batch"]["fits"].get<bool>());
  EXPECT_EQ(a["rewrites"]["at_batch"]["micro_batches"].get<int64_t>(), 1);
  EXPECT_DOUBLE_EQ(a["rewrites"]["at_batch"]["slowdown"].get<double>(), 1.0);
  const double own = a["peak_bytes"].get<double>();
  const int64_t budget = int64_t(0.8 * own);
  json b = run_json(std::to_string(budget));
  const json& at = b["rewrites"]["at_batch"];
  EXPECT_FALSE(b["fits"].get<bool>());
  EXPECT_TRUE(at["fits"].get<bool>()) << b.dump();
  EXPECT_LE(at["peak_bytes"].get<double>(), double(budget));
  EXPECT_TRUE(at["micro_batches"].get<int64_t>() > 1 || at["recomputed_steps"].get<int64_t>() > 0) << b.dump();
  EXPECT_GT(at["slowdown"].get<double>(), 1.0);
  EXPECT_GE(b["rewrites"]["max_slice_rows"].get<int64_t>(), 1);
  EXPECT_FALSE(run_json("1KB")["rewrites"]["at_batch"]["fits"].get<bool>());
  Result t = cli(cat(model, {"--memory-budget", std::to_string(budget)}), dir.path());  // the table
  ASSERT_TRUE(t.exited && t.code == 0) << t.describe();
  for (const char* s : {"REMAT MAX (SLOWDOWN)", "SLICE ROWS", "AT BATCH 8", "With the rewrites"})
    EXPECT_NE(t.out.find(s), std::string::npos) << s << "\n" << t.out;
  expect_clean_error(cli(cat(model, {"--memory-budget", "0.5"}), dir.path()), "a fraction");
  unsetenv("TESSERA_DISABLE_PASSES");
}

// --validate runs the step here and prints predicted vs measured; bad input is one clean line.
TEST(Cli, AdviseValidateAndErrors) {
  TempDir dir;
  setenv("XDG_CACHE_HOME", (dir / "cache").c_str(), 1);  // the host calibration lands in the test's dir
  Result r = cli(cat(kAdviseTiny, {"--devices", "host", "--validate", "--no-max-batch"}), dir.path());
  unsetenv("XDG_CACHE_HOME");
  ASSERT_TRUE(r.exited && r.code == 0) << r.describe();
  EXPECT_NE(r.out.find("validate on host"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("RESULT advise_validate"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(dir / "cache" / "tessera")) << "the calibration is cached";
  expect_clean_error(cli(cat(kAdviseTiny, {"--devices", "abacus"}), dir.path()), "unknown device");
  expect_clean_error(cli(cat(kAdviseTiny, {"--dtype", "float8"}), dir.path()), "bad dtype");
  expect_clean_error(cli(cat(kAdviseTiny, {"--device-file", (dir / "missing.json").string()}), dir.path()), "missing file");
}

// The same program on opencl by changing only --device: the tiny model's losses equal the cpu's
// (to 1e-4 relative), `tessera devices` lists the OpenCL device, and a missing index is a clean
// error. With CI=true a missing OpenCL device fails; elsewhere it skips.
TEST(Cli, OpenCLDeviceRunsTheSameTraining) {
  TempDir dir;
  Result d = cli({"devices"}, dir.path());
  ASSERT_TRUE(d.exited && d.code == 0) << d.describe();
  if (d.out.find("opencl:0") == std::string::npos) {
    const char* ci = std::getenv("CI");
    if (ci && std::string(ci) == "true") FAIL() << "no OpenCL device listed (CI=true requires pocl-opencl-icd):\n" << d.out;
    GTEST_SKIP() << "no OpenCL device";
  }
  EXPECT_NE(d.out.find("compute units"), std::string::npos) << d.out;
  std::vector<std::vector<json>> logs;
  for (std::string dev : {"cpu", "opencl"}) {
    std::vector<std::string> args = cat({"train", "gpt", "--steps", "3", "--out", (dir / dev).string(), "--log-json",
                                         (dir / (dev + ".jsonl")).string()}, kTiny);
    args.back() = dev;  // kTiny ends with --device cpu
    Result r = cli(args, dir.path());
    ASSERT_TRUE(r.exited && r.code == 0) << r.describe();
    logs.push_back(read_log(dir / (dev + ".jsonl")));
  }
  ASSERT_EQ(logs[0].size(), logs[1].size());
  for (size_t i = 0; i < logs[0].size(); ++i) {
    double a = logs[0][i]["loss"].get<double>(), b = logs[1][i]["loss"].get<double>();
    EXPECT_NEAR(b, a, 1e-4 * std::abs(a)) << "step " << i + 1;
  }
  std::vector<std::string> bad = cat({"train", "gpt", "--steps", "1", "--out", (dir / "bad").string()}, kTiny);
  bad.back() = "opencl:99";
  Result e = cli(bad, dir.path());
  expect_clean_error(e, "--device opencl:99");
  EXPECT_NE(e.err.find("opencl:99"), std::string::npos) << e.describe();
}

// ---- tessera conformance ----------------------------------------------------------------------
// The matrix: a line per op with one cell per backend, the totals and the time per backend.
TEST(Cli, ConformanceMatrix) {
  TempDir dir;
  Result r = cli({"conformance", "--backend", "cpu,null", "--op", "add", "--op", "softmax"}, dir.path());
  ASSERT_TRUE(r.exited && r.code == 0) << r.describe();
  for (const char* s : {"op ", "cpu", "null", "add (P)", "softmax", "ok ", "compiles ", " 0 failed", "time on cpu"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  EXPECT_NE(r.err.find("softmax"), std::string::npos) << "progress lines on stderr: " << r.err;
  Result l = cli({"conformance", "--list"}, dir.path());
  ASSERT_TRUE(l.exited && l.code == 0) << l.describe();
  for (const char* s : {"matmul (primitive)", "layer_norm\n", "random_graphs\n"}) EXPECT_NE(l.out.find(s), std::string::npos) << s;
  expect_clean_error(cli({"conformance", "--op", "frobnicate"}, dir.path()), "unknown op 'frobnicate'");
  expect_clean_error(cli({"conformance", "--backend", "abacus"}, dir.path()), "unknown device");
}
