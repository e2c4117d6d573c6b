// Text data: the default fortunes corpus, the byte tokenizer, dataset windows and the held-out
// split, and the seeded, resumable DataLoader.
#include <gtest/gtest.h>

#include "test_util.h"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <set>

#include "tessera/data.h"
#include "tessera/tessera.h"

namespace ts = tessera;
namespace td = tessera::data;
namespace fs = std::filesystem;

namespace {

std::string message_of(const std::function<void()>& f) { return tessera::testing::error_message(f); }

bool have_fortunes() { return fs::is_directory("/usr/share/games/fortunes"); }

// A text whose byte at position i is i (so token id == position): windows reveal their start.
std::string positional_text(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s.push_back(char(i));
  return s;
}

std::vector<int64_t> row_starts(const ts::Tensor& x) {
  auto v = x.to_vector<int64_t>();
  std::vector<int64_t> s;
  for (int64_t b = 0; b < x.size(0); ++b) s.push_back(v[size_t(b * x.size(1))]);
  return s;
}

}  // namespace

// ---- corpus ----

TEST(DataCorpus, FortunesHas114DistinctBytes) {
  if (!have_fortunes()) GTEST_SKIP() << "Debian's fortunes package is not installed";
  std::string text = td::read_default_corpus();
  std::set<unsigned char> distinct(text.begin(), text.end());
  EXPECT_EQ(distinct.size(), 114u);
  EXPECT_EQ(td::CharTokenizer(text).vocab_size(), 114);
}

TEST(DataCorpus, RegularFilesInNameOrderSkippingDatAndSymlinks) {
  if (!have_fortunes()) GTEST_SKIP() << "Debian's fortunes package is not installed";
  EXPECT_EQ(td::default_corpus_path(), "/usr/share/games/fortunes");
  std::vector<std::string> names;
  for (auto& e : fs::directory_iterator(td::default_corpus_path())) {
    std::string n = e.path().filename().string();
    if (e.is_symlink() || !e.is_regular_file() || e.path().extension() == ".dat") continue;
    names.push_back(n);
  }
  std::sort(names.begin(), names.end());
  std::string want;
  for (auto& n : names) want += td::read_text_file(td::default_corpus_path() + "/" + n);
  std::string got = td::read_default_corpus();
  EXPECT_EQ(got.size(), want.size());
  EXPECT_TRUE(got == want);
  EXPECT_GT(got.size(), 1'000'000u);
}

TEST(DataCorpus, MissingFileIsAClearError) {
  std::string m = message_of([] { td::read_text_file("/nonexistent/corpus.txt"); });
  EXPECT_NE(m.find("/nonexistent/corpus.txt"), std::string::npos) << m;
  EXPECT_EQ(m.rfind("[data]", 0), 0u) << m;
  m = message_of([] { td::read_text_file("/tmp"); });
  EXPECT_NE(m.find("directory"), std::string::npos) << m;
}

// ---- tokenizer ----

TEST(DataTokenizer, IdsOrderedByByteValueAndRoundTrip) {
  td::CharTokenizer tok("hello, world");
  EXPECT_EQ(tok.vocab(), std::string(" ,dehlorw"));
  EXPECT_EQ(tok.vocab_size(), 9);
  auto ids = tok.encode("world hello");
  EXPECT_EQ(ids, (std::vector<int64_t>{8, 6, 7, 5, 2, 0, 4, 3, 5, 5, 6}));
  EXPECT_EQ(tok.decode(ids), "world hello");
  EXPECT_TRUE(tok.encode("").empty());
}

TEST(DataTokenizer, AllBytesIncludingNulAndHigh) {
  std::string all;
  for (int b = 255; b >= 0; --b) all.push_back(char(b));
  td::CharTokenizer tok(all);
  ASSERT_EQ(tok.vocab_size(), 256);
  auto ids = tok.encode(all);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(ids[size_t(i)], 255 - i);
  EXPECT_EQ(tok.decode(ids), all);
}

TEST(DataTokenizer, UnknownByteNamesByteAndPosition) {
  td::CharTokenizer tok("abc");
  std::string m = message_of([&] { tok.encode("abcaXb"); });
  EXPECT_NE(m.find("0x58"), std::string::npos) << m;
  EXPECT_NE(m.find("'X'"), std::string::npos) << m;
  EXPECT_NE(m.find("position 4"), std::string::npos) << m;
  m = message_of([&] { tok.encode(std::string("a\xff", 2)); });
  EXPECT_NE(m.find("0xff"), std::string::npos) << m;
  EXPECT_NE(m.find("position 1"), std::string::npos) << m;
  m = message_of([&] { tok.decode({0, 3}); });
  EXPECT_NE(m.find("token id 3"), std::string::npos) << m;
  td::CharTokenizer empty;
  EXPECT_EQ(empty.vocab_size(), 0);
  EXPECT_NE(message_of([&] { empty.encode("a"); }).find("position 0"), std::string::npos);
}

TEST(DataTokenizer, FromVocab) {
  td::CharTokenizer a("the quick brown fox");
  td::CharTokenizer b = td::CharTokenizer::from_vocab(a.vocab());
  EXPECT_EQ(b.vocab(), a.vocab());
  EXPECT_EQ(b.encode("fox"), a.encode("fox"));
  td::CharTokenizer c = td::CharTokenizer::from_vocab("zyx");  // any order: vocab()[id] is the byte
  EXPECT_EQ(c.encode("xyz"), (std::vector<int64_t>{2, 1, 0}));
  EXPECT_NE(message_of([] { td::CharTokenizer::from_vocab("abca"); }).find("repeats"), std::string::npos);
}

// ---- dataset ----

TEST(DataDataset, SplitIsTheTailAndWindowsStayInside) {
  std::string text = positional_text(200);
  td::TextDataset ds(text, 8, 0.1);
  EXPECT_EQ(ds.vocab_size(), 200);
  EXPECT_EQ(ds.block(), 8);
  ASSERT_EQ(ds.tokens(td::Split::Train).size(), 180u);
  ASSERT_EQ(ds.tokens(td::Split::Val).size(), 20u);
  EXPECT_EQ(ds.tokens(td::Split::Val).front(), 180);
  EXPECT_EQ(ds.size(td::Split::Train), 172);
  EXPECT_EQ(ds.size(td::Split::Val), 12);

  // The last train window ends at the last train token; the first val window starts at the split.
  auto [x, y] = ds.batch_at(td::Split::Train, {0, 171});
  EXPECT_EQ(x.shape(), (ts::Shape{2, 8}));
  EXPECT_EQ(x.dtype(), ts::DType::Int64);
  EXPECT_EQ(y.dtype(), ts::DType::Int64);
  auto xv = x.to_vector<int64_t>(), yv = y.to_vector<int64_t>();
  for (int j = 0; j < 8; ++j) {
    EXPECT_EQ(xv[size_t(j)], j);
    EXPECT_EQ(yv[size_t(j)], j + 1);
    EXPECT_EQ(xv[size_t(8 + j)], 171 + j);
    EXPECT_EQ(yv[size_t(8 + j)], 172 + j);
  }
  EXPECT_EQ(yv.back(), 179);  // never reaches into val
  auto [vx, vy] = ds.batch_at(td::Split::Val, {0, 11});
  auto vxv = vx.to_vector<int64_t>(), vyv = vy.to_vector<int64_t>();
  EXPECT_EQ(vxv[0], 180);
  EXPECT_EQ(vyv.back(), 199);
  EXPECT_NE(message_of([&] { ds.batch_at(td::Split::Train, {172}); }).find("outside the train split"), std::string::npos);
  EXPECT_NE(message_of([&] { ds.batch_at(td::Split::Val, {-1}); }).find("outside the val split"), std::string::npos);
}

TEST(DataDataset, BadArguments) {
  EXPECT_NE(message_of([] { td::TextDataset("abcdef", 8); }).find("fewer than one window"), std::string::npos);
  EXPECT_NE(message_of([] { td::TextDataset("abcdef", 0); }).find("block"), std::string::npos);
  EXPECT_NE(message_of([] { td::TextDataset("abcdef", 2, 1.0); }).find("val_fraction"), std::string::npos);
  td::TextDataset no_val(positional_text(50), 4, 0.0);
  EXPECT_EQ(no_val.size(td::Split::Val), 0);
  EXPECT_NE(message_of([&] { td::DataLoader(no_val, 2, 1, true, td::Split::Val); }).find("val split"), std::string::npos);
  EXPECT_NE(message_of([&] { td::DataLoader(no_val, 0, 1); }).find("batch"), std::string::npos);
}

// batch(n, device): random windows from the dataset's own generator, reproducible from its seed.
TEST(DataDataset, RandomBatches) {
  td::TextDataset ds(positional_text(200), 8, 0.1);  // 172 train windows, 12 val
  std::set<int64_t> seen;
  std::vector<std::vector<int64_t>> first;
  for (int k = 0; k < 40; ++k) {
    auto [x, y] = ds.batch(5);
    ASSERT_EQ(x.shape(), (ts::Shape{5, 8}));
    auto xv = x.to_vector<int64_t>(), yv = y.to_vector<int64_t>();
    for (int b = 0; b < 5; ++b)
      for (int j = 0; j < 8; ++j) {  // a window of the positional text: start + j, shifted by one
        EXPECT_EQ(xv[size_t(b * 8 + j)], xv[size_t(b * 8)] + j);
        EXPECT_EQ(yv[size_t(b * 8 + j)], xv[size_t(b * 8)] + j + 1);
      }
    for (int64_t s : row_starts(x)) {
      EXPECT_GE(s, 0);
      EXPECT_LT(s, 172);
      seen.insert(s);
    }
    if (k < 3) first.push_back(row_starts(x));
  }
  EXPECT_GT(seen.size(), 100u);  // 200 draws over 172 starts reach most of them
  ds.seed(0);  // the same draws again
  for (int k = 0; k < 3; ++k) EXPECT_EQ(row_starts(ds.batch(5).first), first[size_t(k)]);
  ds.seed(7);
  EXPECT_NE(row_starts(ds.batch(5).first), first[0]);
  for (int k = 0; k < 10; ++k)
    for (int64_t s : row_starts(ds.batch(4, ts::Device("cpu"), td::Split::Val).first)) {
      EXPECT_GE(s, 180);
      EXPECT_LT(s, 192);
    }
  EXPECT_NE(message_of([&] { ds.batch(0); }).find("batch size"), std::string::npos);
  td::TextDataset no_val(positional_text(50), 4, 0.0);
  EXPECT_NE(message_of([&] { no_val.batch(2, ts::Device("cpu"), td::Split::Val); }).find("val split"), std::string::npos);
}

TEST(DataDataset, FortunesBatches) {
  if (!have_fortunes()) GTEST_SKIP() << "Debian's fortunes package is not installed";
  std::string text = td::read_default_corpus();
  td::TextDataset ds(text, 64);
  EXPECT_EQ(ds.vocab_size(), 114);
  int64_t n = int64_t(text.size());
  EXPECT_EQ(int64_t(ds.tokens(td::Split::Val).size()), n - (n - int64_t(double(n) * 0.1)));
  td::DataLoader dl(ds, 16, 1234);
  auto [x, y] = dl.next();
  EXPECT_EQ(x.shape(), (ts::Shape{16, 64}));
  auto xv = x.to_vector<int64_t>(), yv = y.to_vector<int64_t>();
  for (int b = 0; b < 16; ++b)
    for (int j = 0; j + 1 < 64; ++j) EXPECT_EQ(yv[size_t(b * 64 + j)], xv[size_t(b * 64 + j + 1)]);
  std::string decoded = ds.tokenizer().decode(std::vector<int64_t>(xv.begin(), xv.begin() + 64));
  EXPECT_NE(text.find(decoded), std::string::npos);
}

// ---- loader ----

TEST(DataLoaderTest, ShuffledEpochIsAPermutationOfWindowStarts) {
  td::TextDataset ds(positional_text(200), 8, 0.1);  // 172 train windows
  const int64_t W = ds.size(td::Split::Train), B = 4;
  ASSERT_EQ(W % B, 0);
  td::DataLoader dl(ds, B, 7);
  std::vector<int64_t> e0, e1;
  for (int64_t k = 0; k < W / B; ++k)
    for (int64_t s : row_starts(dl.next().first)) e0.push_back(s);
  for (int64_t k = 0; k < W / B; ++k)
    for (int64_t s : row_starts(dl.next().first)) e1.push_back(s);
  std::vector<int64_t> ident(static_cast<size_t>(W));
  for (int64_t i = 0; i < W; ++i) ident[size_t(i)] = i;
  EXPECT_NE(e0, ident);  // shuffled
  EXPECT_NE(e0, e1);     // each epoch has its own order
  std::sort(e0.begin(), e0.end());
  std::sort(e1.begin(), e1.end());
  EXPECT_EQ(e0, ident);
  EXPECT_EQ(e1, ident);
}

TEST(DataLoaderTest, BatchesStraddleEpochsWhenBatchDoesNotDivide) {
  td::TextDataset ds(positional_text(60), 5, 0.0);  // 55 windows
  const int64_t W = ds.size(td::Split::Train);
  ASSERT_EQ(W, 55);
  td::DataLoader dl(ds, 8, 3);
  std::vector<int64_t> stream;
  for (int k = 0; k < 14; ++k)  // 112 positions: two full epochs and a bit
    for (int64_t s : row_starts(dl.next().first)) stream.push_back(s);
  for (int e = 0; e < 2; ++e) {
    std::vector<int64_t> ep(stream.begin() + e * W, stream.begin() + (e + 1) * W);
    std::sort(ep.begin(), ep.end());
    for (int64_t i = 0; i < W; ++i) EXPECT_EQ(ep[size_t(i)], i);
  }
}

TEST(DataLoaderTest, SequentialWithoutShuffle) {
  td::TextDataset ds(positional_text(100), 4, 0.2);  // train 80 tokens, 76 windows; val 20, 16
  td::DataLoader dl(ds, 5, 99, /*shuffle=*/false);
  EXPECT_EQ(row_starts(dl.next().first), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(row_starts(dl.next().first), (std::vector<int64_t>{5, 6, 7, 8, 9}));
  td::DataLoader val(ds, 5, 99, false, td::Split::Val);
  std::vector<int64_t> starts;
  for (int k = 0; k < 4; ++k) {
    auto [x, y] = val.next();
    auto yv = y.to_vector<int64_t>();
    for (int64_t v : x.to_vector<int64_t>()) EXPECT_GE(v, 80);  // val windows never see train tokens
    for (int64_t v : yv) EXPECT_LE(v, 99);
    for (int64_t s : row_starts(x)) starts.push_back(s);
  }
  EXPECT_EQ(starts[0], 80);
  EXPECT_EQ(starts[15], 95);
  EXPECT_EQ(starts[16], 80);  // wraps to the next epoch
}

TEST(DataLoaderTest, TrainWindowsNeverCrossIntoVal) {
  td::TextDataset ds(positional_text(120), 10, 0.25);  // train 90 tokens
  td::DataLoader dl(ds, 16, 5);
  for (int k = 0; k < 20; ++k) {
    auto [x, y] = dl.next();
    for (int64_t v : y.to_vector<int64_t>()) EXPECT_LT(v, 90);
  }
}

TEST(DataLoaderTest, SeedDeterminesTheStream) {
  td::TextDataset ds(positional_text(200), 8, 0.1);
  td::DataLoader a(ds, 4, 11), b(ds, 4, 11), c(ds, 4, 12);
  bool differs = false;
  for (int k = 0; k < 5; ++k) {
    auto sa = row_starts(a.next().first), sb = row_starts(b.next().first), sc = row_starts(c.next().first);
    EXPECT_EQ(sa, sb);
    differs |= sa != sc;
  }
  EXPECT_TRUE(differs);
}

TEST(DataLoaderTest, StateRestoresTheExactContinuation) {
  auto check = [](const td::TextDataset& ds, int64_t batch, uint64_t seed) {
    td::DataLoader a(ds, batch, seed);
    for (int k = 0; k < 7; ++k) a.next();
    std::vector<int64_t> st = a.state();
    ASSERT_GE(st.size(), 2u);
    EXPECT_EQ(uint64_t(st[0]), seed);
    EXPECT_EQ(st[1], 7);
    std::vector<std::vector<int64_t>> want, got;
    for (int k = 0; k < 5; ++k) {
      auto [x, y] = a.next();
      want.push_back(x.to_vector<int64_t>());
      want.push_back(y.to_vector<int64_t>());
    }
    td::DataLoader b(ds, batch, /*seed=*/seed + 1000);  // the state's seed wins
    b.load_state(st);
    for (int k = 0; k < 5; ++k) {
      auto [x, y] = b.next();
      got.push_back(x.to_vector<int64_t>());
      got.push_back(y.to_vector<int64_t>());
    }
    EXPECT_EQ(got, want);
  };
  td::TextDataset small(positional_text(40), 4, 0.1);  // 32 windows: 7 batches of 6 cross epochs
  check(small, 6, 0xfeedfacecafebeefull);                  // a seed with the top bit set
  if (have_fortunes()) {
    td::TextDataset big(td::read_default_corpus(), 64);
    check(big, 16, 42);
  }
}

TEST(DataLoaderTest, LoadStateRejectsMismatchedLoaders) {
  td::TextDataset ds(positional_text(100), 4, 0.1);
  td::DataLoader a(ds, 4, 1);
  a.next();
  td::DataLoader b(ds, 8, 1);
  EXPECT_NE(message_of([&] { b.load_state(a.state()); }).find("batch 4"), std::string::npos);
  EXPECT_NE(message_of([&] { b.load_state({1}); }).find("at least"), std::string::npos);
  td::DataLoader c(ds, 4, 1, false);
  EXPECT_NE(message_of([&] { c.load_state(a.state()); }).find("shuffling"), std::string::npos);
  b.load_state({5, 3});  // {seed, drawn} alone is accepted
  EXPECT_EQ(b.state()[1], 3);
}
