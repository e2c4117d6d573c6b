// Text data for language models: a byte-level character tokenizer, a dataset of random
// contiguous windows with a held-out split, and a seeded, resumable batch loader.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tessera/tensor.h"

#pragma GCC visibility push(default)  // the public API: exported (cmake/libtessera.map)
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
  // `batch` windows at uniformly random starts drawn from the dataset's own generator (seeded
  // with 0, or by seed()): quick loops, auto [x, y] = data.batch(16, dev). DataLoader gives
  // epochs without repeats and a position that checkpoints can save.
  std::pair<Tensor, Tensor> batch(int64_t batch, const Device& d = Device("cpu"), Split s = Split::Train);
  void seed(uint64_t s);

 private:
  CharTokenizer tok_;
  int64_t block_;
  std::vector<int64_t> train_, val_;
  uint64_t seed_ = 0, drawn_ = 0;  // batch(): batches drawn since seeding
};

// An endless, seeded stream of dataset indices in batches: epoch e is a permutation of [0, n)
// drawn from (seed, e) with std::mt19937_64 (the identity without shuffle), and batch k takes
// stream positions [k * batch, (k + 1) * batch), so a batch may straddle two epochs. Its
// position is the number of batches drawn, which can be saved and restored so a resumed run
// draws exactly the batches an uninterrupted one would.
class IndexStream {
 public:
  // `what` names the caller and `items` what is indexed, for error messages.
  IndexStream(int64_t n, int64_t batch, uint64_t seed, bool shuffle, std::string what = "DataLoader",
              std::string items = "windows");
  std::vector<int64_t> next();
  int64_t drawn() const { return drawn_; }
  int64_t position() const { return drawn_ * batch_; }  // stream position of the next batch's first index
  uint64_t seed() const { return seed_; }
  // {seed (bit pattern), batches drawn, batch size, n, shuffle}; the last three guard against
  // restoring into a stream that would draw differently.
  std::vector<int64_t> state() const;
  void load_state(const std::vector<int64_t>& s);

 private:
  int64_t n_, batch_;
  uint64_t seed_;
  bool shuffle_;
  std::string what_, items_;
  int64_t drawn_ = 0;
  std::vector<int64_t> order_;  // one epoch's permutation, its epoch number appended
  void fill_order(int64_t epoch);
};

// Draws batches of random window starts through an IndexStream.
class DataLoader {
 public:
  DataLoader(const TextDataset& ds, int64_t batch, uint64_t seed, bool shuffle = true, Split split = Split::Train);
  std::pair<Tensor, Tensor> next(const Device& d = Device("cpu"));
  // The loader's position as a few integers (seed, batches drawn), and back.
  std::vector<int64_t> state() const { return stream_.state(); }
  void load_state(const std::vector<int64_t>& s) { stream_.load_state(s); }

 private:
  const TextDataset* ds_;
  Split split_;
  IndexStream stream_;
};

// ---- images: Fashion-MNIST ----

// The directory of Debian's dataset-fashion-mnist (/usr/share/datasets/fashion-mnist); throws
// tessera::Error naming the package when its files are not there.
std::string fashion_mnist_dir();

// Pixels are scaled to [0, 1]; with normalize, then shifted and scaled to (x - mean) / std
// (Fashion-MNIST's training-set statistics by default).
struct ImageOptions {
  bool normalize = true;
  double mean = 0.2860, std = 0.3530;
};

// One part of Fashion-MNIST read from its IDX .gz files (zlib): 28x28 grayscale images and
// labels 0-9 (60,000 training images, 10,000 test images).
class FashionMNIST {
 public:
  enum class Part { Train, Test };
  explicit FashionMNIST(Part part, const std::string& dir = "", ImageOptions o = {});  // dir "": fashion_mnist_dir()
  int64_t size() const { return int64_t(labels_.size()); }
  int64_t height() const { return rows_; }
  int64_t width() const { return cols_; }
  const std::vector<uint8_t>& pixels() const { return pixels_; }  // size() * height() * width(), row-major
  const std::vector<uint8_t>& labels() const { return labels_; }
  static const char* class_name(int64_t label);  // "T-shirt/top", ... "Ankle boot"
  // Images [n, 1, H, W] (float32) and labels [n] (int64) of the given indices; flip (empty, or
  // one flag per index) mirrors an image left to right.
  std::pair<Tensor, Tensor> batch_at(const std::vector<int64_t>& idx, const Device& d = Device("cpu"),
                                     const std::vector<uint8_t>& flip = {}) const;
  const ImageOptions& options() const { return o_; }

 private:
  ImageOptions o_;
  int64_t rows_ = 0, cols_ = 0;
  std::vector<uint8_t> pixels_, labels_;
};

// Batches of images through an IndexStream, with optional random horizontal flips: whether
// the image at stream position p is flipped is drawn from (seed, p), so a restored loader
// flips exactly as an uninterrupted one.
class ImageLoader {
 public:
  ImageLoader(const FashionMNIST& ds, int64_t batch, uint64_t seed, bool shuffle = true, bool random_flip = false);
  std::pair<Tensor, Tensor> next(const Device& d = Device("cpu"));
  int64_t batches_per_epoch() const;  // ceil(size / batch)
  std::vector<int64_t> state() const { return stream_.state(); }
  void load_state(const std::vector<int64_t>& s) { stream_.load_state(s); }

 private:
  const FashionMNIST* ds_;
  int64_t batch_;
  bool flip_;
  IndexStream stream_;
};

}  // namespace tessera::data
#pragma GCC visibility pop
