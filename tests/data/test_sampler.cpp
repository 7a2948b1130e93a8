// Tests for data/sampler: the C++ DistributedSampler against PyTorch's own
// torch.utils.data.DistributedSampler (run through MESHSIM_PYTHON), plus the
// properties DDP relies on: ranks get disjoint shares that cover the data set.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "data/sampler.h"

using meshsim::DistributedSampler;

namespace {

struct SamplerCase {
  int64_t n;
  int replicas, rank;
  uint64_t seed;
  int64_t epoch;
  bool shuffle, drop_last;
  std::string str() const {
    return std::to_string(n) + "," + std::to_string(replicas) + "," + std::to_string(rank) + "," +
           std::to_string(seed) + "," + std::to_string(epoch) + "," + std::to_string(shuffle) +
           "," + std::to_string(drop_last);
  }
};

// Runs a command and returns its stdout; `status` gets pclose's result.
std::string run_capture(const std::string& cmd, int* status) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    *status = -1;
    return out;
  }
  char buf[1 << 16];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0)
    out.append(buf, n);
  *status = pclose(p);
  return out;
}

std::vector<int64_t> indices_of(const SamplerCase& c) {
  DistributedSampler s(c.n, c.replicas, c.rank, c.shuffle, c.seed, c.drop_last);
  s.set_epoch(c.epoch);
  return s.indices();
}

} // namespace

TEST(Sampler, MatchesPyTorchDistributedSampler) {
  const char* python = MESHSIM_PYTHON;
  if (!std::filesystem::exists(python))
    GTEST_SKIP() << python << " not found";
  std::vector<SamplerCase> cases;
  for (int rank = 0; rank < 3; ++rank)
    for (bool shuffle : {false, true})
      for (bool drop_last : {false, true})
        cases.push_back({10, 3, rank, 0, 0, shuffle, drop_last});
  for (int rank = 0; rank < 5; ++rank)
    cases.push_back({2, 5, rank, 7, 3, true, false}); // pad > n
  cases.push_back({3, 4, 1, 0, 0, true, true});       // drop_last with n < replicas: empty
  cases.push_back({0, 2, 1, 0, 0, true, false});      // empty data set
  cases.push_back({1, 1, 0, 5, 0, true, false});
  cases.push_back({100, 7, 6, 1234567890123ULL, 5, true, false});
  cases.push_back({100, 7, 6, 1234567890123ULL, 5, true, true});
  for (int epoch = 0; epoch < 3; ++epoch)
    cases.push_back({1000, 8, 3, 42, epoch, true, false});
  for (int rank = 0; rank < 4; ++rank)
    cases.push_back({60000, 4, rank, 0, 1, true, false});
  cases.push_back({59999, 4, 3, 17, 2, true, true});

  std::string cmd =
      std::string(python) + " -I " MESHSIM_SOURCE_DIR "/tests/data/sampler_reference.py";
  for (const SamplerCase& c : cases)
    cmd += " " + c.str();
  int status = 0;
  const std::string out = run_capture(cmd, &status);
  if (out.rfind("SKIP", 0) == 0)
    GTEST_SKIP() << out;
  ASSERT_EQ(status, 0) << "reference script failed: " << cmd << "\n" << out;

  std::istringstream lines(out);
  std::string line;
  for (const SamplerCase& c : cases) {
    ASSERT_TRUE(std::getline(lines, line)) << "missing reference output for " << c.str();
    std::istringstream in(line);
    int64_t len = -1;
    char colon = 0;
    in >> len >> colon;
    std::vector<int64_t> expected;
    for (int64_t v; in >> v;)
      expected.push_back(v);
    ASSERT_EQ(static_cast<int64_t>(expected.size()), len) << c.str();
    DistributedSampler s(c.n, c.replicas, c.rank, c.shuffle, c.seed, c.drop_last);
    EXPECT_EQ(s.num_samples(), len) << c.str();
    EXPECT_EQ(indices_of(c), expected)
        << "case n,replicas,rank,seed,epoch,shuffle,drop_last = " << c.str();
  }
}

TEST(Sampler, RanksCoverEverySampleAndPadFromTheStart) {
  for (int64_t n : {1, 5, 10, 11, 97}) {
    for (int r : {1, 2, 3, 4, 8}) {
      std::vector<int64_t> count(n, 0);
      int64_t total = 0;
      for (int rank = 0; rank < r; ++rank) {
        DistributedSampler s(n, r, rank, true, 3);
        s.set_epoch(2);
        const auto idx = s.indices();
        ASSERT_EQ(static_cast<int64_t>(idx.size()), s.num_samples());
        EXPECT_EQ(s.num_samples(), (n + r - 1) / r);
        EXPECT_EQ(s.total_size(), s.num_samples() * r);
        for (int64_t i : idx) {
          ASSERT_GE(i, 0);
          ASSERT_LT(i, n);
          ++count[i];
        }
        total += static_cast<int64_t>(idx.size());
      }
      const DistributedSampler s(n, r, 0, true, 3);
      EXPECT_EQ(total, s.total_size());
      // Every sample appears; the extra (total - n) copies cycle through the epoch order.
      DistributedSampler epoch_s(n, r, 0, true, 3);
      epoch_s.set_epoch(2);
      const auto order = epoch_s.epoch_order();
      std::vector<int64_t> expect(n, 1);
      for (int64_t k = n; k < s.total_size(); ++k)
        ++expect[order[(k - n) % n]];
      for (int64_t k = n; k < s.total_size(); ++k)
        EXPECT_EQ(order[k], order[(k - n) % n]);
      EXPECT_EQ(count, expect) << "n=" << n << " r=" << r;
    }
  }
}

TEST(Sampler, DropLastGivesDisjointEqualShares) {
  for (int64_t n : {3, 10, 11, 97, 100}) {
    for (int r : {1, 2, 3, 4, 8}) {
      std::set<int64_t> seen;
      for (int rank = 0; rank < r; ++rank) {
        DistributedSampler s(n, r, rank, true, 0, /*drop_last=*/true);
        const auto idx = s.indices();
        EXPECT_EQ(static_cast<int64_t>(idx.size()), n / r) << "n=" << n << " r=" << r;
        for (int64_t i : idx)
          EXPECT_TRUE(seen.insert(i).second) << "duplicate " << i;
      }
      EXPECT_EQ(static_cast<int64_t>(seen.size()), (n / r) * r);
    }
  }
}

TEST(Sampler, EpochReshufflesDeterministicallyAndNoShuffleStrides) {
  DistributedSampler a(50, 2, 1), b(50, 2, 1);
  EXPECT_EQ(a.indices(), b.indices());
  const auto epoch0 = a.indices();
  a.set_epoch(1);
  EXPECT_EQ(a.epoch(), 1);
  EXPECT_NE(a.indices(), epoch0);
  DistributedSampler other_seed(50, 2, 1, true, 1); // seed 1, epoch 0 == seed 0, epoch 1
  EXPECT_EQ(other_seed.indices(), a.indices());

  DistributedSampler plain(7, 3, 1, /*shuffle=*/false);
  EXPECT_EQ(plain.indices(), (std::vector<int64_t>{1, 4, 0})); // 0..6 padded with 0, 1
  plain.set_epoch(9);
  EXPECT_EQ(plain.indices(), (std::vector<int64_t>{1, 4, 0}));
}

TEST(Sampler, RejectsInvalidArguments) {
  EXPECT_THROW(DistributedSampler(10, 2, 2), std::invalid_argument);
  EXPECT_THROW(DistributedSampler(10, 2, -1), std::invalid_argument);
  EXPECT_THROW(DistributedSampler(10, 0, 0), std::invalid_argument);
  EXPECT_THROW(DistributedSampler(-1, 1, 0), std::invalid_argument);
}
