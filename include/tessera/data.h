// Text data for language models: a byte-level character tokenizer, a dataset of random
// contiguous windows with a held-out split, and a seeded, resumable batch loader.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tessera/tensor.h"

namespace tessera::data {

// The default corpus: the text of Debian's `fortunes` package (every regular file under
// /usr/share/games/fortunes except the .dat indexes, in name order). Throws tessera::Error
// naming the package when it is not installed.
std::string default_corpus_path();  // the directory
std::string read_default_corpus();
std::string read_text_file(const std::string& path);  // clear error when missing/unreadable

// Maps each distinct byte of a text to a token id (ids ordered by byte value).
class CharTokenizer {
 public:
  CharTokenizer() = default;
  explicit CharTokenizer(const std::string& text);
  static CharTokenizer from_vocab(const std::string& vocab);  // vocab()[id] is the byte of id
  int64_t vocab_size() const { return int64_t(vocab_.size()); }
  const std::string& vocab() const { return vocab_; }
  // Bytes not in the vocabulary are an error naming the byte and its position.
  std::vector<int64_t> encode(const std::string& s) const;
  std::string decode(const std::vector<int64_t>& ids) const;

 private:
  std::string vocab_;
  int16_t id_of_[256] = {};
};

enum class Split { Train, Val };

// Token windows of `block` + 1 tokens: inputs are the first `block`, targets the last `block`.
// The last `val_fraction` of the text is held out.
class TextDataset {
 public:
  TextDataset(const std::string& text, int64_t block, double val_fraction = 0.1);
  const CharTokenizer& tokenizer() const { return tok_; }
  int64_t vocab_size() const { return tok_.vocab_size(); }
  int64_t block() const { return block_; }
  int64_t size(Split s) const;  // number of window start positions
  const std::vector<int64_t>& tokens(Split s) const { return s == Split::Train ? train_ : val_; }
  // Inputs and targets [batch, block] (int64) for the given window start positions.
  std::pair<Tensor, Tensor> batch_at(Split s, const std::vector<int64_t>& starts, const Device& d = Device("cpu")) const;

 private:
  CharTokenizer tok_;
  int64_t block_;
  std::vector<int64_t> train_, val_;
};

// Draws batches of random window starts with its own seeded generator (std::mt19937_64), with
// an epoch-shuffled order when shuffle is true; its position can be saved and restored so a
// resumed run draws exactly the batches an uninterrupted one would.
class DataLoader {
 public:
  DataLoader(const TextDataset& ds, int64_t batch, uint64_t seed, bool shuffle = true, Split split = Split::Train);
  std::pair<Tensor, Tensor> next(const Device& d = Device("cpu"));
  // The loader's position as a few integers (seed, batches drawn), and back.
  std::vector<int64_t> state() const;
  void load_state(const std::vector<int64_t>& s);

 private:
  const TextDataset* ds_;
  int64_t batch_;
  uint64_t seed_;
  bool shuffle_;
  Split split_;
  int64_t drawn_ = 0;
  std::vector<int64_t> order_;
  void fill_order(int64_t epoch);
  std::vector<int64_t> starts_for(int64_t batch_index);
};

}  // namespace tessera::data
