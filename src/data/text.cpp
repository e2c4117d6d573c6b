// Text data for language models (tessera/data.h): the default fortunes corpus, a byte-level
// character tokenizer, a dataset of contiguous token windows with a held-out tail, and a seeded,
// resumable loader whose epochs are permutations of the split's window starts.
#include "tessera/data.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "core/fail.h"

namespace tessera::data {
namespace fs = std::filesystem;

namespace {

constexpr const char* kFortunesDir = "/usr/share/games/fortunes";

std::string byte_str(unsigned char c) {
  char buf[32];
  if (c >= 0x20 && c < 0x7f) std::snprintf(buf, sizeof buf, "0x%02x ('%c')", c, c);
  else std::snprintf(buf, sizeof buf, "0x%02x", c);
  return buf;
}

const char* split_name(Split s) { return s == Split::Train ? "train" : "val"; }

}  // namespace

// ---- corpus ----

std::string default_corpus_path() {
  std::error_code ec;
  if (!fs::is_directory(kFortunesDir, ec))
    fail("data", std::string("the default corpus ") + kFortunesDir +
                     " is missing: install Debian's `fortunes` package (apt-get install fortunes) or pass a text file");
  return kFortunesDir;
}

std::string read_text_file(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) fail("data", "'" + path + "' is a directory, not a text file");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("data", "cannot read '" + path + "': " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail("data", "error while reading '" + path + "'");
  return ss.str();
}

std::string read_default_corpus() {
  std::string dir = default_corpus_path();
  std::vector<std::string> names;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    fs::file_status st = e.symlink_status();  // symlinks (the .u8 aliases) are skipped
    if (!fs::is_regular_file(st)) continue;
    std::string name = e.path().filename().string();
    if (name.size() >= 4 && name.compare(name.size() - 4, 4, ".dat") == 0) continue;
    names.push_back(name);
  }
  if (ec) fail("data", "cannot list " + dir + ": " + ec.message());
  if (names.empty())
    fail("data", "the default corpus " + dir + " holds no text files: reinstall Debian's `fortunes` package");
  std::sort(names.begin(), names.end());
  std::string text;
  for (const std::string& n : names) text += read_text_file(dir + "/" + n);
  return text;
}

// ---- CharTokenizer ----

CharTokenizer::CharTokenizer(const std::string& text) {
  bool seen[256] = {};
  for (unsigned char c : text) seen[c] = true;
  std::fill(std::begin(id_of_), std::end(id_of_), int16_t(-1));
  for (int b = 0; b < 256; ++b)
    if (seen[b]) {
      id_of_[b] = int16_t(vocab_.size());
      vocab_.push_back(char(b));
    }
}

CharTokenizer CharTokenizer::from_vocab(const std::string& vocab) {
  CharTokenizer t;
  std::fill(std::begin(t.id_of_), std::end(t.id_of_), int16_t(-1));
  for (size_t i = 0; i < vocab.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(vocab[i]);
    if (t.id_of_[c] >= 0)
      fail("CharTokenizer", "vocabulary repeats byte " + byte_str(c) + " (ids " + std::to_string(t.id_of_[c]) +
                                " and " + std::to_string(i) + ")");
    t.id_of_[c] = int16_t(i);
  }
  t.vocab_ = vocab;
  return t;
}

std::vector<int64_t> CharTokenizer::encode(const std::string& s) const {
  std::vector<int64_t> ids(s.size());
  const int64_t v = vocab_size();
  for (size_t i = 0; i < s.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    int64_t id = v > 0 ? id_of_[c] : -1;  // a default-constructed tokenizer knows no bytes
    if (id < 0 || id >= v || static_cast<unsigned char>(vocab_[size_t(id)]) != c)
      fail("encode", "byte " + byte_str(c) + " at position " + std::to_string(i) + " is not in the vocabulary (" +
                         std::to_string(v) + " tokens)");
    ids[i] = id;
  }
  return ids;
}

std::string CharTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string s(ids.size(), '\0');
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size())
      fail("decode", "token id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                         " is outside the vocabulary [0, " + std::to_string(vocab_size()) + ")");
    s[i] = vocab_[size_t(ids[i])];
  }
  return s;
}

// ---- TextDataset ----

TextDataset::TextDataset(const std::string& text, int64_t block, double val_fraction) : tok_(text), block_(block) {
  if (block < 1) fail("TextDataset", "block must be at least 1, got " + std::to_string(block));
  if (!(val_fraction >= 0.0 && val_fraction < 1.0))
    fail("TextDataset", "val_fraction must lie in [0, 1), got " + std::to_string(val_fraction));
  std::vector<int64_t> ids = tok_.encode(text);
  const int64_t n = int64_t(ids.size());
  const int64_t n_val = std::min(n, int64_t(double(n) * val_fraction));
  const int64_t n_train = n - n_val;
  if (n_train < block + 1)
    fail("TextDataset", "the training text has " + std::to_string(n_train) + " tokens, fewer than one window of block + 1 = " +
                            std::to_string(block + 1));
  train_.assign(ids.begin(), ids.begin() + n_train);
  val_.assign(ids.begin() + n_train, ids.end());
}

int64_t TextDataset::size(Split s) const {
  // A window starting at i covers tokens i..i+block, all inside the split.
  return std::max<int64_t>(0, int64_t(tokens(s).size()) - block_);
}

std::pair<Tensor, Tensor> TextDataset::batch_at(Split s, const std::vector<int64_t>& starts, const Device& d) const {
  const std::vector<int64_t>& toks = tokens(s);
  const int64_t n = size(s);
  if (starts.empty()) fail("batch_at", "needs at least one window start");
  std::vector<int64_t> x(starts.size() * size_t(block_)), y(x.size());
  for (size_t b = 0; b < starts.size(); ++b) {
    int64_t st = starts[b];
    if (st < 0 || st >= n)
      fail("batch_at", "window start " + std::to_string(st) + " is outside the " + split_name(s) + " split's [0, " +
                           std::to_string(n) + ")");
    std::copy(toks.begin() + st, toks.begin() + st + block_, x.begin() + int64_t(b) * block_);
    std::copy(toks.begin() + st + 1, toks.begin() + st + block_ + 1, y.begin() + int64_t(b) * block_);
  }
  Shape shape{int64_t(starts.size()), block_};
  TensorOptions o{DType::Int64, d};
  return {from_vector<int64_t>(x, shape, o), from_vector<int64_t>(y, shape, o)};
}

void TextDataset::seed(uint64_t s) {
  seed_ = s;
  drawn_ = 0;
}

std::pair<Tensor, Tensor> TextDataset::batch(int64_t batch, const Device& d, Split s) {
  if (batch < 1) fail("batch", "batch size must be positive, got " + std::to_string(batch));
  if (size(s) < 1)
    fail("batch", std::string("the ") + split_name(s) + " split has no window of block + 1 = " + std::to_string(block_ + 1) + " tokens");
  // Batch k draws from its own generator, seeded from (seed, k).
  std::mt19937_64 gen(seed_ * 0x9E3779B97F4A7C15ull + drawn_++);
  std::uniform_int_distribution<int64_t> start(0, size(s) - 1);
  std::vector<int64_t> starts(static_cast<size_t>(batch));
  for (int64_t& st : starts) st = start(gen);
  return batch_at(s, starts, d);
}

// ---- DataLoader ----

DataLoader::DataLoader(const TextDataset& ds, int64_t batch, uint64_t seed, bool shuffle, Split split)
    : ds_(&ds), split_(split), stream_(std::max<int64_t>(ds.size(split), 1), batch, seed, shuffle) {
  if (ds.size(split) < 1)
    fail("DataLoader", std::string("the ") + split_name(split) + " split has " + std::to_string(ds.tokens(split).size()) +
                           " tokens, fewer than one window of block + 1 = " + std::to_string(ds.block() + 1));
}

std::pair<Tensor, Tensor> DataLoader::next(const Device& d) { return ds_->batch_at(split_, stream_.next(), d); }

}  // namespace tessera::data
