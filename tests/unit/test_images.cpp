// Image data and convolutional modules: the Fashion-MNIST reader (real files of Debian's
// dataset-fashion-mnist, and hand-written IDX files in a temp dir), the seeded, resumable image
// loader with flips, the conv/pool/batch-norm layers (PyTorch's initialization bounds, buffers in
// the state dict, running statistics updated without recompiling), SmallCNN and ResNet shapes.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <filesystem>

#include "test_util.h"
#include "tessera/tessera.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using data::FashionMNIST;

void write_gz(const fs::path& p, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(p.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), unsigned(bytes.size())), int(bytes.size()));
  gzclose(f);
}
std::vector<uint8_t> idx_header(uint32_t magic, std::vector<uint32_t> dims) {
  std::vector<uint8_t> b;
  auto be = [&](uint32_t v) {
    for (int s = 24; s >= 0; s -= 8) b.push_back(uint8_t(v >> s));
  };
  be(magic);
  for (uint32_t d : dims) be(d);
  return b;
}
// A tiny dataset: 3 images of 2x3 pixels (pixel value = 10 * image + position) and labels 7, 0, 9.
fs::path tiny_dataset(const std::string& name) {
  fs::path dir = testing::scratch_dir(name);
  for (const char* part : {"train", "t10k"}) {
    std::vector<uint8_t> im = idx_header(0x803, {3, 2, 3}), lb = idx_header(0x801, {3});
    for (int i = 0; i < 3; ++i)
      for (int p = 0; p < 6; ++p) im.push_back(uint8_t(10 * i + p));
    lb.insert(lb.end(), {7, 0, 9});
    write_gz(dir / (std::string(part) + "-images-idx3-ubyte.gz"), im);
    write_gz(dir / (std::string(part) + "-labels-idx1-ubyte.gz"), lb);
  }
  return dir;
}

TEST(FashionMnist, ReadsIdxFilesScalesAndFlips) {
  fs::path dir = tiny_dataset("fmnist_tiny");
  FashionMNIST ds(FashionMNIST::Part::Test, dir.string(), {.normalize = false});
  ASSERT_EQ(ds.size(), 3);
  EXPECT_EQ(ds.height(), 2);
  EXPECT_EQ(ds.width(), 3);
  auto [x, y] = ds.batch_at({2, 0}, Device("cpu"), {1, 0});
  EXPECT_EQ(x.shape(), (Shape{2, 1, 2, 3}));
  EXPECT_EQ(y.to_vector<int64_t>(), (std::vector<int64_t>{9, 7}));
  std::vector<double> want{22, 21, 20, 25, 24, 23, 0, 1, 2, 3, 4, 5};  // image 2 mirrored, image 0 as is
  for (double& v : want) v /= 255;
  EXPECT_TRUE(testing::all_close(x.to_vector<double>(), want, 1e-6));
  FashionMNIST norm(FashionMNIST::Part::Train, dir.string(), {.normalize = true, .mean = 0.5, .std = 0.25});
  EXPECT_NEAR(norm.batch_at({0}).first.to_vector<double>()[1], (1.0 / 255 - 0.5) / 0.25, 1e-6);
  EXPECT_EQ(std::string(FashionMNIST::class_name(9)), "Ankle boot");
}

TEST(FashionMnist, MissingOrCorruptFilesAreClearErrors) {
  std::string m = testing::error_message([] { FashionMNIST(FashionMNIST::Part::Train, "/nonexistent/fmnist"); });
  EXPECT_EQ(m.rfind("[fashion_mnist] /nonexistent/fmnist/train-images-idx3-ubyte.gz not found", 0), 0u) << m;
  EXPECT_NE(m.find("dataset-fashion-mnist"), std::string::npos) << m;
  fs::path dir = tiny_dataset("fmnist_bad");
  write_gz(dir / "train-labels-idx1-ubyte.gz", idx_header(0x801, {4}));  // header says 4 labels, none follow
  m = testing::error_message([&] { FashionMNIST(FashionMNIST::Part::Train, dir.string()); });
  EXPECT_NE(m.find("0 data bytes, the header's dimensions need 4"), std::string::npos) << m;
  write_gz(dir / "train-labels-idx1-ubyte.gz", idx_header(0x803, {3}));
  m = testing::error_message([&] { FashionMNIST(FashionMNIST::Part::Train, dir.string()); });
  EXPECT_NE(m.find("not an IDX file"), std::string::npos) << m;
}

TEST(FashionMnist, DebianFilesHaveTheDocumentedSizes) {
  std::string dir;
  try {
    dir = data::fashion_mnist_dir();
  } catch (const Error& e) {
    if (testing::in_ci()) FAIL() << e.what();
    GTEST_SKIP() << e.what();
  }
  FashionMNIST train(FashionMNIST::Part::Train), test(FashionMNIST::Part::Test);
  EXPECT_EQ(train.size(), 60000);
  EXPECT_EQ(test.size(), 10000);
  EXPECT_EQ(train.height() * train.width(), 784);
  std::vector<int64_t> count(10, 0);
  for (uint8_t l : test.labels()) count[l]++;
  EXPECT_EQ(count, std::vector<int64_t>(10, 1000));  // the test set is balanced
  // Normalized with the training statistics: the training set's mean is ~0 and its std ~1.
  double s = 0, ss = 0;
  for (uint8_t p : train.pixels()) s += p / 255.0, ss += (p / 255.0) * (p / 255.0);
  double n = double(train.pixels().size()), mu = s / n;
  EXPECT_NEAR(mu, 0.2860, 5e-4);
  EXPECT_NEAR(std::sqrt(ss / n - mu * mu), 0.3530, 5e-4);
}

TEST(ImageLoader, SeededResumableAndFlipsDependOnThePosition) {
  fs::path dir = tiny_dataset("fmnist_loader");
  FashionMNIST ds(FashionMNIST::Part::Train, dir.string(), {.normalize = false});
  data::ImageLoader a(ds, 2, 5, true, true), b(ds, 2, 5, true, true);
  EXPECT_EQ(a.batches_per_epoch(), 2);
  std::vector<std::vector<double>> first;
  for (int k = 0; k < 6; ++k) first.push_back(a.next().first.to_vector<double>());
  for (int k = 0; k < 3; ++k) b.next();
  data::ImageLoader c(ds, 2, 99, true, true);
  c.load_state(b.state());  // the state's seed and position win
  for (int k = 3; k < 6; ++k) EXPECT_EQ(c.next().first.to_vector<double>(), first[size_t(k)]) << "batch " << k;
  // Every epoch shows each image once; some image is flipped somewhere in 6 batches.
  data::ImageLoader d(ds, 3, 5, true, false);
  std::vector<int64_t> labels = d.next().second.to_vector<int64_t>();
  std::sort(labels.begin(), labels.end());
  EXPECT_EQ(labels, (std::vector<int64_t>{0, 7, 9}));
  bool flipped = false;
  data::ImageLoader e(ds, 2, 5, true, false);
  for (int k = 0; k < 6; ++k) flipped |= e.next().first.to_vector<double>() != first[size_t(k)];
  EXPECT_TRUE(flipped) << "random_flip never flipped an image";
  data::ImageLoader other(ds, 3, 5);
  EXPECT_NE(testing::error_message([&] { other.load_state(a.state()); }).find("batch 2 over 3 images"), std::string::npos);
}

TEST(ConvModules, InitializationBoundsAndShapes) {
  manual_seed(3);
  nn::Conv2d conv(4, 6, {3, 2}, {.stride = {2}, .padding = {1}, .groups = 2});
  EXPECT_EQ(conv.weight.shape(), (Shape{6, 2, 3, 2}));
  double bound = 1 / std::sqrt(2.0 * 3 * 2);  // fan_in = in/groups * kernel
  for (double v : conv.weight.to_vector<double>()) EXPECT_LE(std::fabs(v), bound);
  EXPECT_EQ(conv(zeros({1, 4, 9, 8})).shape(), (Shape{1, 6, 5, 5}));
  nn::ConvTranspose2d up(6, 4, {2}, {.stride = {2}});
  EXPECT_EQ(up.weight.shape(), (Shape{6, 4, 2, 2}));
  EXPECT_EQ(up(zeros({1, 6, 5, 5})).shape(), (Shape{1, 4, 10, 10}));
  nn::Conv1d c1(3, 5, 4, {.padding = {2}});
  EXPECT_EQ(c1(zeros({2, 3, 10})).shape(), (Shape{2, 5, 11}));
  nn::SmallCNN small;
  EXPECT_EQ(small.num_parameters(), 421642);
  EXPECT_EQ(small(zeros({2, 1, 28, 28})).shape(), (Shape{2, 10}));
  nn::ResNet resnet;
  Tensor logits = resnet(zeros({2, 1, 28, 28}));
  EXPECT_EQ(logits.shape(), (Shape{2, 10}));
  auto sd = resnet.state_dict();
  EXPECT_TRUE(sd.count("stages.1.down_bn.running_var"));
  EXPECT_TRUE(sd.count("stem_bn.num_batches_tracked"));
  EXPECT_EQ(nn::Flatten()(zeros({2, 3, 4})).shape(), (Shape{2, 12}));
}

TEST(ConvModules, BatchNormUpdatesRunningStatisticsWithoutRecompiling) {
  manual_seed(4);
  nn::BatchNorm2d bn(2, 1e-5, 0.25);
  optim::SGD opt(bn.parameters(), {.lr = 0.1});
  std::vector<double> rm{0, 0};
  for (int step = 0; step < 4; ++step) {
    Tensor x = testing::random_tensor({3, 2, 2, 2}, DType::Float32, uint32_t(10 + step), -1, 3);
    std::vector<double> xv = x.to_vector<double>();
    for (int c = 0; c < 2; ++c) {
      double s = 0;
      for (int n = 0; n < 3; ++n)
        for (int k = 0; k < 4; ++k) s += xv[size_t(n * 8 + c * 4 + k)];
      rm[size_t(c)] = 0.75 * rm[size_t(c)] + 0.25 * s / 12;
    }
    Tensor y = bn(x);
    Tensor loss = (y * y).sum();
    loss.backward();
    opt.step();
    opt.zero_grad();
    int64_t before = metrics().graphs_compiled;
    loss.item();
    if (step > 1) {
      EXPECT_EQ(metrics().graphs_compiled, before) << "step " << step << " recompiled";
    }
  }
  EXPECT_TRUE(testing::all_close(bn.running_mean.to_vector<double>(), rm, 1e-5));
  EXPECT_EQ(bn.num_batches_tracked.item(), 4);
  bn.eval();
  Tensor x = testing::random_tensor({1, 2, 2, 2}, DType::Float32, 50);
  std::vector<double> got = bn(x).to_vector<double>(), rv = bn.running_var.to_vector<double>();
  std::vector<double> xv = x.to_vector<double>(), w = bn.weight.to_vector<double>(), b = bn.bias.to_vector<double>();
  for (size_t i = 0; i < xv.size(); ++i) {
    size_t c = i / 4;
    EXPECT_NEAR(got[i], (xv[i] - rm[c]) / std::sqrt(rv[c] + 1e-5) * w[c] + b[c], 1e-5);
  }
  EXPECT_EQ(bn.num_batches_tracked.item(), 4);  // eval leaves the statistics alone
  std::string m = testing::error_message([&] { bn(zeros({2, 2, 3})); });
  EXPECT_EQ(m.rfind("[BatchNorm2d] expects [N, C, H, W]", 0), 0u) << m;
}

}  // namespace
}  // namespace tessera
