// The threading contract (docs/architecture.md, "Threading"): the lazy graph -- pending tensors,
// traced random draws, the generator, sync -- has one owner thread at a time; another thread's
// call that would build on it, run it or draw while the owner holds unsynced work raises without
// changing anything; values, metrics and host uploads are for every thread at any time. These
// tests also run in the ThreadSanitizer build (scripts/run, label `threads`).
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tessera/tessera.h"
#include "test_util.h"

namespace tessera {
namespace {

using testing::error_message;

// A small regression trained with AdamW; batches are host uploads (values, no graph).
struct Trainer {
  nn::Linear layer;
  optim::AdamW opt;
  explicit Trainer(uint64_t seed) : layer(seeded(seed), 3), opt(layer.parameters(), {.lr = 1e-2}) { sync(); }
  static int64_t seeded(uint64_t seed) {
    manual_seed(seed);
    return 4;
  }
  static std::pair<Tensor, Tensor> batch(int step) {
    std::vector<float> x(8 * 4), y(8 * 3);
    for (size_t i = 0; i < x.size(); ++i) x[i] = float((step * 7 + int(i) * 3) % 11) / 11.0f - 0.5f;
    for (size_t i = 0; i < y.size(); ++i) y[i] = float((step * 5 + int(i)) % 7) / 7.0f;
    return {from_vector(x, {8, 4}), from_vector(y, {8, 3})};
  }
  Tensor step(const Tensor& x, const Tensor& y) {
    Tensor loss = mse_loss(layer(x), y);
    loss.backward();
    opt.step();
    opt.zero_grad();
    return loss;
  }
};

bool refused(const std::function<void()>& f) {
  std::string e = error_message(f);
  return e.find("holds unsynced work") != std::string::npos;
}

// Two trainings on two threads, taking turns step by step (each step synced inside its turn),
// give the losses each gives alone on one thread, bit for bit.
TEST(Threads, TrainingsTakingTurnsMatchEachAlone) {
  constexpr int kSteps = 6;
  auto alone = [&](uint64_t seed) {
    Trainer r(seed);
    std::vector<float> losses;
    for (int s = 0; s < kSteps; ++s) {
      auto [x, y] = Trainer::batch(s + int(seed));
      losses.push_back(r.step(x, y).item<float>());
    }
    return losses;
  };
  std::vector<float> want[2] = {alone(1), alone(2)};
  std::mutex turn;
  std::vector<float> got[2];
  auto worker = [&](int k) {
    std::unique_ptr<Trainer> r;
    {
      std::lock_guard<std::mutex> lock(turn);
      r = std::make_unique<Trainer>(uint64_t(k + 1));
    }
    for (int s = 0; s < kSteps; ++s) {
      auto [x, y] = Trainer::batch(s + k + 1);  // uploads: no turn needed
      std::lock_guard<std::mutex> lock(turn);
      got[k].push_back(r->step(x, y).item<float>());
    }
    std::lock_guard<std::mutex> lock(turn);
    r.reset();
  };
  std::thread a(worker, 0), b(worker, 1);
  a.join(), b.join();
  EXPECT_EQ(got[0], want[0]);
  EXPECT_EQ(got[1], want[1]);
}

// While this thread holds unsynced work, every graph call from another thread raises and changes
// nothing: the owner's values, parameters and random draws are those of a run without it.
TEST(Threads, ASecondThreadIsRefusedWhileTheOwnerHoldsWork) {
  auto draw = [](bool intrude) {
    manual_seed(7);
    Tensor p = from_vector<float>({1, 2, 3, 4}, {4});
    Trainer other(5);  // built and synced here; stepped from the intruding thread
    std::pair<Tensor, Tensor> xy = Trainer::batch(0);
    Tensor noise = rand({64});
    Tensor doubled = p * 2.0;
    std::vector<std::string> errors;
    std::vector<float> read;
    if (intrude) {
      std::thread t([&] {
        auto expect = [&](const char* what, const std::function<void()>& f) {
          if (!refused(f)) errors.push_back(what);
        };
        expect("an op", [&] { p + 1.0; });
        expect("an in-place update", [&] { p.add_(1.0); });
        expect("sync", [&] { sync(); });
        expect("reading a pending tensor", [&] { doubled.to_vector<float>(); });
        expect("a random draw", [&] { rand({4}); });
        expect("manual_seed", [&] { manual_seed(1); });
        expect("set_rng_state", [&] { set_rng_state({1, 2, 0}); });
        expect("a training step", [&] { other.step(xy.first, xy.second); });
        read = p.to_vector<float>();  // a value: read without touching the owner's work
        Tensor upload = from_vector<float>({5, 6}, {2});  // uploads are values too
        read.push_back(upload.to_vector<float>()[1]);
      });
      t.join();
    }
    EXPECT_EQ(errors, std::vector<std::string>{}) << "calls that were not refused";
    if (intrude) {
      EXPECT_EQ(read, (std::vector<float>{1, 2, 3, 4, 6}));
    }
    std::vector<float> v = noise.to_vector<float>();
    std::vector<float> d = doubled.to_vector<float>();
    v.insert(v.end(), d.begin(), d.end());
    std::vector<float> pv = p.to_vector<float>();
    v.insert(v.end(), pv.begin(), pv.end());
    for (const Tensor& q : other.layer.parameters()) {
      std::vector<float> w = q.to_vector<float>();
      v.insert(v.end(), w.begin(), w.end());
    }
    EXPECT_EQ(other.opt.steps(), 0);
    v.push_back(rand({1}).item<float>());  // the generator's next draw
    return v;
  };
  EXPECT_EQ(draw(true), draw(false));
}

// Once the owner's work is synced (or dropped), another thread may take the graph over.
TEST(Threads, TheGraphPassesOnWhenTheOwnersWorkIsDone) {
  Tensor a = from_vector<float>({1, 2}, {2}) * 3.0;
  a.to_vector<float>();  // synced: nothing pending, no draws
  Tensor dropped = a + 1.0;
  dropped = Tensor();  // dropped: nothing pending
  std::vector<float> got;
  std::thread([&] { got = (a + 1.0).to_vector<float>(); }).join();
  EXPECT_EQ(got, (std::vector<float>{4, 7}));
  Tensor b = a * a;  // and back
  EXPECT_EQ(b.to_vector<float>(), (std::vector<float>{9, 36}));
}

// A thread that exits holding unsynced work gives the graph up; what it left is computed by the
// thread that takes over.
TEST(Threads, WorkLeftByAnExitedThreadIsTakenOver) {
  Tensor left;
  std::thread([&] { left = from_vector<float>({1, 2, 3}, {3}) * 2.0 + rand({3}) * 0.0; }).join();
  EXPECT_FALSE(left.is_realized());
  EXPECT_EQ(left.to_vector<float>(), (std::vector<float>{2, 4, 6}));
}

// One optimizer, one step at a time: a second thread entering the step of an optimizer another
// thread is inside (here while that thread waits, its graph synced) raises.
TEST(Threads, OneOptimizerStepsOnOneThreadAtATime) {
  struct Paused : optim::SGD {
    using SGD::SGD;
    std::atomic<int> phase{0};  // 1: inside the step, waiting; 2: let it finish; 3: do not wait
    void step() override {
      StepScope scope(*this);
      if (phase != 3) {
        phase = 1;
        while (phase == 1) std::this_thread::yield();
      }
      scope.done();
    }
  };
  Tensor w = zeros({2}).requires_grad_();
  sync();
  Paused opt({w}, {.lr = 0.1});
  std::thread t([&] { opt.step(); });
  while (opt.phase != 1) std::this_thread::yield();
  std::string e = error_message([&] { opt.step(); });
  opt.phase = 2;
  t.join();
  EXPECT_NE(e.find("another thread is inside this optimizer's step"), std::string::npos) << e;
  EXPECT_NE(e.find("SGD.step"), std::string::npos) << e;
  opt.phase = 3;
  std::string after;
  std::thread([&] { after = error_message([&] { opt.step(); }); }).join();
  EXPECT_EQ(after, "(no error)") << "after the first thread's step, another thread may step";
}

// A reader of a realized value never claims the graph, even between two of the owner's syncs:
// the owner's next op must not find the graph held by the reader (it did: a reader's item() ran
// sync(), which made it the owner for the length of an empty sync).
TEST(Threads, ReadingARealizedValueNeverTakesTheGraph) {
  Tensor seen = from_vector(std::vector<float>{2.0f}, {1}) * 3.0f;
  EXPECT_EQ(seen.item<float>(), 6.0f);
  std::atomic<bool> done{false};
  std::atomic<int> reads{0};
  std::thread reader([&] {
    while (!done) reads += seen.item<float>() == 6.0f;
  });
  while (reads == 0) std::this_thread::yield();
  std::string e = "(no error)";
  float sum = 0;
  for (int i = 0; i < 2000 && e == "(no error)"; ++i)
    e = error_message([&] { sum += (from_vector(std::vector<float>{float(i)}, {1}) + 1.0f).item<float>(); });
  done = true;
  reader.join();
  EXPECT_EQ(e, "(no error)");
  EXPECT_GT(reads.load(), 0);
}

// Beside a training thread: a loader thread uploading batches, a monitor reading metrics and the
// last loss (a value), and handles dropped on other threads; the losses are those of one thread.
TEST(Threads, LoadersAndMonitorsRunBesideTraining) {
  constexpr int kSteps = 12;
  std::vector<float> want;
  {
    Trainer r(3);
    for (int s = 0; s < kSteps; ++s) {
      auto [x, y] = Trainer::batch(s);
      want.push_back(r.step(x, y).item<float>());
    }
  }
  Trainer r(3);
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<Tensor, Tensor>> queue;
  Tensor last;  // the last loss, published for the monitor
  std::atomic<bool> done{false};
  std::thread loader([&] {
    for (int s = 0; s < kSteps; ++s) {
      auto b = Trainer::batch(s);
      std::lock_guard<std::mutex> lock(mu);
      queue.push_back(std::move(b));
      cv.notify_all();
    }
  });
  std::atomic<int> reads{0};
  std::thread monitor([&] {
    while (!done) {
      Tensor seen;
      {
        std::lock_guard<std::mutex> lock(mu);
        seen = last;
      }
      if (seen.defined() && std::isfinite(seen.item<float>())) ++reads;
      (void)metrics().graphs_compiled;
      seen = Tensor();  // dropped here, not on the training thread
      std::this_thread::yield();
    }
  });
  std::vector<float> got;
  for (int s = 0; s < kSteps; ++s) {
    std::pair<Tensor, Tensor> b;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return !queue.empty(); });
      b = std::move(queue.front());
      queue.pop_front();
    }
    Tensor loss = r.step(b.first, b.second);
    got.push_back(loss.item<float>());
    std::lock_guard<std::mutex> lock(mu);
    last = loss;
  }
  done = true;
  loader.join(), monitor.join();
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace tessera
