// Bucketing for dynamic lengths (tessera/bucket.h): bucket choice and its errors, padding and
// masks, and a training loop over batches of varying length that compiles one graph per bucket
// and whose masked loss equals the loss of the unpadded batch.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tessera/tessera.h"
#include "test_util.h"

namespace tessera {
namespace {

using testing::error_message;
bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }
int64_t compiled() { return metrics().graphs_compiled; }

TEST(Bucket, LengthIsTheSmallestBucketThatFits) {
  const std::vector<int64_t> b = {16, 32, 64};
  EXPECT_EQ(data::bucket_length(0, b), 16);
  EXPECT_EQ(data::bucket_length(5, b), 16);
  EXPECT_EQ(data::bucket_length(16, b), 16);
  EXPECT_EQ(data::bucket_length(17, b), 32);
  EXPECT_EQ(data::bucket_length(64, b), 64);
  std::string too_long = error_message([&] { data::bucket_length(65, b); });
  EXPECT_TRUE(contains(too_long, "[bucket_length] length 65 exceeds the largest bucket 64 (buckets {16, 32, 64})")) << too_long;
  EXPECT_TRUE(contains(error_message([&] { data::bucket_length(-1, b); }), "must not be negative"));
  EXPECT_TRUE(contains(error_message([] { data::bucket_length(3, {8, 4}); }), "strictly increasing"));
  EXPECT_TRUE(contains(error_message([] { data::bucket_length(3, {0, 4}); }), "positive"));
  // No buckets: powers of two.
  EXPECT_EQ(data::bucket_length(0), 1);
  EXPECT_EQ(data::bucket_length(1), 1);
  EXPECT_EQ(data::bucket_length(5), 8);
  EXPECT_EQ(data::bucket_length(64), 64);
  EXPECT_EQ(data::bucket_length(65), 128);
  EXPECT_EQ(data::power_of_two_buckets(16, 64), (std::vector<int64_t>{16, 32, 64}));
  EXPECT_EQ(data::power_of_two_buckets(5, 100), (std::vector<int64_t>{8, 16, 32, 64}));
  EXPECT_TRUE(contains(error_message([] { data::power_of_two_buckets(5, 7); }), "no power of two"));
}

TEST(Bucket, PadToBucketPadsOnTheHostAndMasksThePadding) {
  Tensor tok = from_vector<int64_t>({1, 2, 3, 4, 5, 6}, {2, 3}, {DType::Int64, Device("cpu")});
  int64_t c0 = compiled();
  data::Padded p = data::pad_to_bucket(tok, 1, {4, 8}, -1);
  EXPECT_EQ(compiled(), c0) << "padding traces nothing";
  EXPECT_TRUE(p.values.is_realized() && p.mask.is_realized());
  EXPECT_EQ(p.length, 3);
  EXPECT_EQ(p.bucket, 4);
  EXPECT_EQ(p.values.dtype(), DType::Int64);
  EXPECT_EQ(p.values.shape(), (Shape{2, 4}));
  EXPECT_EQ(p.values.to_vector<int64_t>(), (std::vector<int64_t>{1, 2, 3, -1, 4, 5, 6, -1}));
  EXPECT_EQ(p.mask.dtype(), DType::Float32);
  EXPECT_EQ(p.mask.shape(), (Shape{2, 4}));
  EXPECT_EQ(p.mask.to_vector<float>(), (std::vector<float>{1, 1, 1, 0, 1, 1, 1, 0}));
  EXPECT_EQ(p.lengths, (std::vector<int64_t>{3, 3}));

  // Trailing dimensions ride along; the mask covers the dimensions up to the padded one.
  Tensor x = from_vector<float>({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {2, 3, 2});
  data::Padded q = data::pad_to_bucket(x * 1, -2, {}, 0.5, DType::Bool);  // pending input: realized first
  EXPECT_EQ(q.bucket, 4);
  EXPECT_EQ(q.values.shape(), (Shape{2, 4, 2}));
  EXPECT_EQ(q.values.to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6, .5f, .5f, 7, 8, 9, 10, 11, 12, .5f, .5f}));
  EXPECT_EQ(q.mask.dtype(), DType::Bool);
  EXPECT_EQ(q.mask.to_vector<uint8_t>(), (std::vector<uint8_t>{1, 1, 1, 0, 1, 1, 1, 0}));
  // Along the first dimension: a 1-D mask.
  data::Padded r = data::pad_to_bucket(x, 0, {2, 4});
  EXPECT_EQ(r.bucket, 2);
  EXPECT_EQ(r.mask.shape(), (Shape{2}));

  EXPECT_TRUE(contains(error_message([&] { data::pad_to_bucket(tok, 1, {2}); }), "exceeds the largest bucket 2"));
  EXPECT_TRUE(contains(error_message([&] { data::pad_to_bucket(tok, 2, {4}); }), "dim 2 is out of range"));
  EXPECT_TRUE(contains(error_message([&] { data::pad_to_bucket(tok, 1, {4}, 0.5); }), "does not fit dtype int64"));

  // Ragged rows: one mask row per sequence.
  data::Padded s = data::pad_sequences({{7, 8, 9}, {1}, {}}, {2, 4}, 0);
  EXPECT_EQ(s.bucket, 4);
  EXPECT_EQ(s.length, 3);
  EXPECT_EQ(s.lengths, (std::vector<int64_t>{3, 1, 0}));
  EXPECT_EQ(s.values.to_vector<int64_t>(), (std::vector<int64_t>{7, 8, 9, 0, 1, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(s.mask.to_vector<float>(), (std::vector<float>{1, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0}));
}

// Next-token negative log-likelihood per position: logits [B, T, V], targets [B, T] -> [B, T].
Tensor token_nll(const Tensor& logits, const Tensor& targets) {
  Tensor lp = log_softmax(logits, -1);
  return -squeeze(gather(lp, 2, unsqueeze(targets, -1)), -1);
}

// A GPT with block size 64 trained on batches whose length varies from 5 to 64, padded to the
// buckets {16, 32, 64}. The rule: a step compiles a graph exactly when the pair (bucket, is the
// optimizer's first step) is new. AdamW creates its moments inside its first step, so that step's
// graph also initializes them and is never met again; every later step of a bucket reuses the
// bucket's graph. So the loop compiles (buckets used) + 1 graphs, here 3 + 1. Each step's masked
// loss equals the mean loss of the same batch unpadded, computed with the same parameters just
// before the step (outside the count: it compiles one forward graph per distinct length).
TEST(Bucket, VariableLengthTrainingCompilesOncePerBucketAndMatchesTheUnpaddedLoss) {
  nn::GPTConfig cfg;
  cfg.vocab = 11;
  cfg.block = 64;
  cfg.embd = 16;
  cfg.heads = 2;
  cfg.layers = 1;
  manual_seed(7);
  nn::GPT model(cfg);
  sync();  // the parameters' initialization: its own graph, before counting
  optim::AdamW opt(model.parameters(), {.lr = 1e-2, .weight_decay = 0.01});
  const std::vector<int64_t> buckets = {16, 32, 64};
  const int64_t B = 2;
  // Lengths as a random draw from 5..64 would give them, with the bucket edges included.
  std::vector<int64_t> lengths = {5, 16, 17, 64, 33};
  std::mt19937 rng(123);
  for (int i = 0; i < 9; ++i) lengths.push_back(5 + int64_t(rng() % 60));

  std::set<std::pair<int64_t, bool>> seen;
  std::set<int64_t> used;
  int64_t c_start = 0, counted = 0;
  for (size_t it = 0; it < lengths.size(); ++it) {
    int64_t T = lengths[it];
    SCOPED_TRACE("step " + std::to_string(it) + ", length " + std::to_string(T));
    std::vector<int64_t> in(size_t(B * T)), tg(size_t(B * T));
    for (auto& v : in) v = int64_t(rng() % 11);
    for (auto& v : tg) v = int64_t(rng() % 11);
    Tensor inputs = from_vector<int64_t>(in, {B, T}, {DType::Int64, Device("cpu")});
    Tensor targets = from_vector<int64_t>(tg, {B, T}, {DType::Int64, Device("cpu")});
    double want;
    {
      NoGradGuard no_grad;
      want = mean(token_nll(model.forward(inputs), targets)).item();
    }

    data::Padded pin = data::pad_to_bucket(inputs, 1, buckets);
    data::Padded ptg = data::pad_to_bucket(targets, 1, buckets);
    ASSERT_EQ(pin.bucket, data::bucket_length(T, buckets));
    int64_t c0 = compiled();
    if (it == 0) c_start = c0;
    Tensor nll = token_nll(model.forward(pin.values), ptg.values);
    Tensor loss = (nll * pin.mask).sum() / pin.mask.sum();
    loss.backward();
    opt.step();
    opt.zero_grad();
    double got = loss.item();
    int64_t delta = compiled() - c0;
    counted += delta;

    bool first_step = it == 0;
    bool is_new = seen.insert({pin.bucket, first_step}).second;
    used.insert(pin.bucket);
    EXPECT_EQ(delta, is_new ? 1 : 0) << "bucket " << pin.bucket;
    EXPECT_NEAR(got, want, 1e-5);
    EXPECT_TRUE(std::isfinite(got));
  }
  EXPECT_EQ(used.size(), 3u);
  EXPECT_EQ(counted, int64_t(used.size()) + 1);
  EXPECT_GT(compiled() - c_start, counted) << "the unpadded reference forwards compile per length";
}

}  // namespace
}  // namespace tessera
