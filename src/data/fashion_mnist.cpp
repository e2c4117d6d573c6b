// Fashion-MNIST (tessera/data.h): the IDX files of Debian's dataset-fashion-mnist, gunzipped
// with zlib, and a loader of image batches with optional random horizontal flips.
#include <zlib.h>

#include <filesystem>

#include "tessera/data.h"
#include "core/fail.h"

namespace tessera::data {
namespace fs = std::filesystem;

namespace {

constexpr const char* kDir = "/usr/share/datasets/fashion-mnist";
constexpr const char* kPackage = "Debian's dataset-fashion-mnist package (apt-get install dataset-fashion-mnist)";

std::vector<uint8_t> gunzip(const std::string& path) {
  if (!fs::exists(path)) fail("fashion_mnist", path + " not found: install " + kPackage);
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) fail("fashion_mnist", "cannot open " + path);
  std::vector<uint8_t> out;
  uint8_t buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.insert(out.end(), buf, buf + n);
  bool bad = n < 0;
  gzclose(f);
  if (bad) fail("fashion_mnist", path + " is not a readable gzip file");
  return out;
}

uint32_t be32(const std::vector<uint8_t>& b, size_t at) {
  return uint32_t(b[at]) << 24 | uint32_t(b[at + 1]) << 16 | uint32_t(b[at + 2]) << 8 | uint32_t(b[at + 3]);
}

// An IDX file of unsigned bytes with `rank` dimensions: its dimensions, and the data after them.
std::vector<int64_t> read_idx(const std::string& path, int rank, std::vector<uint8_t>& data) {
  std::vector<uint8_t> b = gunzip(path);
  size_t header = 4 + 4 * size_t(rank);
  if (b.size() < header || be32(b, 0) != 0x800u + uint32_t(rank))
    fail("fashion_mnist", path + ": not an IDX file of " + std::to_string(rank) + "-d unsigned bytes");
  std::vector<int64_t> dims;
  unsigned __int128 total = 1;  // up to three 32-bit extents: 64 bits could overflow
  for (int d = 0; d < rank; ++d) dims.push_back(be32(b, 4 + 4 * size_t(d))), total *= uint64_t(dims.back());
  if (total != b.size() - header)
    fail("fashion_mnist", path + ": " + std::to_string(b.size() - header) + " data bytes, the header's dimensions need " +
                              (total > b.size() ? std::string("more") : std::to_string(uint64_t(total))));
  data.assign(b.begin() + int64_t(header), b.end());
  return dims;
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

std::string fashion_mnist_dir() {
  if (!fs::exists(fs::path(kDir) / "train-images-idx3-ubyte.gz"))
    fail("fashion_mnist", std::string("the Fashion-MNIST files are not in ") + kDir + ": install " + kPackage);
  return kDir;
}

FashionMNIST::FashionMNIST(Part part, const std::string& dir, ImageOptions o) : o_(o) {
  std::string d = dir.empty() ? fashion_mnist_dir() : dir, prefix = part == Part::Train ? "train" : "t10k";
  std::vector<int64_t> im = read_idx((fs::path(d) / (prefix + "-images-idx3-ubyte.gz")).string(), 3, pixels_);
  std::vector<int64_t> lb = read_idx((fs::path(d) / (prefix + "-labels-idx1-ubyte.gz")).string(), 1, labels_);
  if (im[0] != lb[0]) fail("fashion_mnist", std::to_string(im[0]) + " images but " + std::to_string(lb[0]) + " labels in " + d);
  for (uint8_t l : labels_)
    if (l > 9) fail("fashion_mnist", "label " + std::to_string(l) + " out of range [0, 9] in " + d);
  if (o_.normalize && !(o_.std > 0)) fail("fashion_mnist", "the normalization std must be positive");
  rows_ = im[1];
  cols_ = im[2];
}

const char* FashionMNIST::class_name(int64_t label) {
  static const char* names[] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  if (label < 0 || label > 9) fail("fashion_mnist", "label " + std::to_string(label) + " out of range [0, 9]");
  return names[label];
}

std::pair<Tensor, Tensor> FashionMNIST::batch_at(const std::vector<int64_t>& idx, const Device& d,
                                                 const std::vector<uint8_t>& flip) const {
  if (idx.empty()) fail("fashion_mnist", "batch_at needs at least one index");
  if (!flip.empty() && flip.size() != idx.size())
    fail("fashion_mnist", "flip needs one flag per index (" + std::to_string(idx.size()) + "), got " + std::to_string(flip.size()));
  int64_t hw = rows_ * cols_;
  float scale = 1.0f / 255.0f, shift = 0.0f;
  if (o_.normalize) scale = float(1.0 / (255.0 * o_.std)), shift = float(-o_.mean / o_.std);
  std::vector<float> x(idx.size() * size_t(hw));
  std::vector<int64_t> y(idx.size());
  for (size_t b = 0; b < idx.size(); ++b) {
    int64_t i = idx[b];
    if (i < 0 || i >= size()) fail("fashion_mnist", "index " + std::to_string(i) + " out of range [0, " + std::to_string(size()) + ")");
    const uint8_t* src = pixels_.data() + i * hw;
    float* dst = x.data() + int64_t(b) * hw;
    bool mirror = !flip.empty() && flip[b];
    for (int64_t r = 0; r < rows_; ++r)
      for (int64_t c = 0; c < cols_; ++c) dst[r * cols_ + c] = float(src[r * cols_ + (mirror ? cols_ - 1 - c : c)]) * scale + shift;
    y[b] = labels_[size_t(i)];
  }
  int64_t n = int64_t(idx.size());
  return {from_vector<float>(x, {n, 1, rows_, cols_}, {DType::Float32, d}), from_vector<int64_t>(y, {n}, {DType::Int64, d})};
}

ImageLoader::ImageLoader(const FashionMNIST& ds, int64_t batch, uint64_t seed, bool shuffle, bool random_flip)
    : ds_(&ds), batch_(batch), flip_(random_flip), stream_(ds.size(), batch, seed, shuffle, "ImageLoader", "images") {}

int64_t ImageLoader::batches_per_epoch() const { return (ds_->size() + batch_ - 1) / batch_; }

std::pair<Tensor, Tensor> ImageLoader::next(const Device& d) {
  int64_t p = stream_.position();
  std::vector<int64_t> idx = stream_.next();
  std::vector<uint8_t> flip;
  if (flip_)
    for (int64_t j = 0; j < batch_; ++j) flip.push_back(splitmix64(stream_.seed() ^ splitmix64(uint64_t(p + j))) & 1);
  return ds_->batch_at(idx, d, flip);
}

}  // namespace tessera::data
