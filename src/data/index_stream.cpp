// The seeded, resumable index stream shared by the text and image loaders (tessera/data.h).
#include <random>

#include "tessera/data.h"
#include "core/fail.h"

namespace tessera::data {

IndexStream::IndexStream(int64_t n, int64_t batch, uint64_t seed, bool shuffle, std::string what, std::string items)
    : n_(n), batch_(batch), seed_(seed), shuffle_(shuffle), what_(std::move(what)), items_(std::move(items)) {
  if (batch < 1) fail(what_, "batch must be at least 1, got " + std::to_string(batch));
  if (n < 1) fail(what_, "nothing to draw from: 0 " + items_);
}

void IndexStream::fill_order(int64_t epoch) {
  order_.resize(size_t(n_) + 1);
  for (int64_t i = 0; i < n_; ++i) order_[size_t(i)] = i;
  if (shuffle_) {
    // Epoch e has its own generator seeded by (seed, e); Fisher-Yates with a multiply-shift
    // bounded draw, so the order is the same with every standard library.
    std::seed_seq seq{uint32_t(seed_), uint32_t(seed_ >> 32), uint32_t(uint64_t(epoch)), uint32_t(uint64_t(epoch) >> 32)};
    std::mt19937_64 rng(seq);
    for (int64_t i = n_ - 1; i > 0; --i) {
      auto j = int64_t((static_cast<unsigned __int128>(rng()) * static_cast<unsigned __int128>(i + 1)) >> 64);
      std::swap(order_[size_t(i)], order_[size_t(j)]);
    }
  }
  order_[size_t(n_)] = epoch;
}

std::vector<int64_t> IndexStream::next() {
  std::vector<int64_t> idx(size_t(batch_), 0);
  for (int64_t j = 0; j < batch_; ++j) {
    int64_t p = drawn_ * batch_ + j, epoch = p / n_;
    if (order_.size() != size_t(n_) + 1 || order_.back() != epoch) fill_order(epoch);
    idx[size_t(j)] = order_[size_t(p % n_)];
  }
  ++drawn_;
  return idx;
}

std::vector<int64_t> IndexStream::state() const { return {int64_t(seed_), drawn_, batch_, n_, shuffle_ ? 1 : 0}; }

void IndexStream::load_state(const std::vector<int64_t>& s) {
  if (s.size() < 2)
    fail(what_, "a loader state holds at least {seed, batches drawn}, got " + std::to_string(s.size()) + " values");
  if (s[1] < 0) fail(what_, "negative batch count " + std::to_string(s[1]) + " in loader state");
  if (s.size() >= 4 && (s[2] != batch_ || s[3] != n_))
    fail(what_, "state was saved by a loader of batch " + std::to_string(s[2]) + " over " + std::to_string(s[3]) + " " + items_ +
                    "; this one has batch " + std::to_string(batch_) + " over " + std::to_string(n_) + " " + items_);
  if (s.size() >= 5 && (s[4] != 0) != shuffle_)
    fail(what_, std::string("state was saved by a loader ") + (s[4] ? "with" : "without") + " shuffling; this one is " +
                    (shuffle_ ? "shuffled" : "sequential"));
  seed_ = uint64_t(s[0]);
  drawn_ = s[1];
  order_.clear();
}

}  // namespace tessera::data
