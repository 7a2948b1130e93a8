// --micro-batch-size (Megatron's convention): validate makes the micro-batch count from the
// global batch, global ÷ (micro-batch size × dp), refuses in one line a batch it does not
// divide and an explicit --micro-batches that disagrees, and config.json keeps the size
// given, so a rerun that changes the batch gets the count anew.
#include <gtest/gtest.h>

#include <functional>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "error_of.h"

namespace meshsim {
namespace {

using testing::error_of;

// A GPT on `gpus` GPUs as tp × pp (dp the rest), with a global batch and a micro-batch size.
TrainConfig layout(int gpus, int tp, int pp, int64_t global, int64_t micro_batch_size) {
  TrainConfig c;
  c.model = "gpt";
  c.data = "synthetic";
  c.gpus = gpus;
  c.tp = tp;
  c.pp = pp;
  c.global_batch_size = global;
  c.micro_batch_size = micro_batch_size;
  return c;
}

TEST(MicroBatchSize, MicroBatchesAreTheGlobalBatchOverSizeTimesDp) {
  const struct {
    int gpus, tp, pp;
    int64_t global, size;
    int micro_batches;
    int64_t batch_per_replica;
  } cases[] = {
      {8, 2, 1, 32, 2, 4, 8},   // dp 4: 32 / (2 × 4)
      {8, 2, 2, 32, 1, 16, 16}, // dp 2: 32 / (1 × 2)
      {8, 4, 2, 24, 3, 8, 24},  // dp 1: 24 / 3
      {4, 1, 1, 16, 4, 1, 4},   // dp 4: one micro-batch of the whole replica's batch
      {1, 1, 1, 1536, 1, 1536, 1536},
  };
  for (const auto& k : cases) {
    TrainConfig c = layout(k.gpus, k.tp, k.pp, k.global, k.size);
    validate(c);
    const std::string what = "gpus " + std::to_string(k.gpus) + " tp " + std::to_string(k.tp) +
                             " pp " + std::to_string(k.pp);
    EXPECT_EQ(c.micro_batches, k.micro_batches) << what;
    EXPECT_EQ(c.batch_size, k.batch_per_replica) << what;
    EXPECT_EQ(c.batch_size / c.micro_batches, k.size) << what;
  }
}

TEST(MicroBatchSize, WithoutAGlobalBatchTheReplicaBatchIsCut) {
  TrainConfig c = layout(4, 1, 2, 0, 2); // dp 2, --batch-size 8 per replica
  c.batch_size = 8;
  validate(c);
  EXPECT_EQ(c.micro_batches, 4);
  EXPECT_EQ(c.batch_size, 8);
}

TEST(MicroBatchSize, NoneGivenMeansOneMicroBatch) {
  TrainConfig c;
  validate(c);
  EXPECT_EQ(c.micro_batches, 1);
  EXPECT_EQ(c.micro_batch_size, 0);
}

TEST(MicroBatchSize, AnExplicitCountThatAgreesIsAccepted) {
  TrainConfig c = layout(8, 2, 2, 32, 4); // dp 2: 32 / (4 × 2) = 4
  c.micro_batches = 4;
  validate(c);
  EXPECT_EQ(c.micro_batches, 4);
}

TEST(MicroBatchSize, WhatDoesNotDivideOrConflictsIsOneLine) {
  TrainConfig odd = layout(4, 1, 2, 30, 4); // dp 2
  EXPECT_EQ(error_of([&] { validate(odd); }),
            "global batch 30 is not divisible by --micro-batch-size 4 × dp 2 = 8");
  TrainConfig replica = layout(4, 2, 1, 0, 3); // dp 2, --batch-size 8: global 16
  replica.batch_size = 8;
  EXPECT_EQ(error_of([&] { validate(replica); }),
            "global batch 16 is not divisible by --micro-batch-size 3 × dp 2 = 6");
  TrainConfig conflict = layout(8, 2, 2, 32, 4);
  conflict.micro_batches = 2;
  EXPECT_EQ(error_of([&] { validate(conflict); }),
            "--micro-batches 2 conflicts with --micro-batch-size 4: global batch 32 ÷ (4 × dp 2) "
            "= 4 micro-batches; give one of the two");
  TrainConfig naive = layout(4, 1, 2, 16, 2);
  naive.schedule = "naive";
  EXPECT_NE(error_of([&] { validate(naive); }).find("--schedule naive runs the whole batch"),
            std::string::npos);
  TrainConfig negative = layout(4, 1, 1, 16, -1);
  EXPECT_NE(error_of([&] { validate(negative); }).find("--micro-batch-size must be between 1 and"),
            std::string::npos);
  TrainConfig huge = layout(4, 1, 1, 16, int64_t{1} << 62);
  EXPECT_NE(error_of([&] { validate(huge); }).find("--micro-batch-size must be between 1 and"),
            std::string::npos);
}

TEST(MicroBatchSize, ConfigJsonKeepsTheSizeAndDerivesTheCountAgain) {
  TrainConfig c = layout(8, 2, 2, 32, 4);
  validate(c);
  const nlohmann::json saved = to_json(c);
  EXPECT_EQ(saved["micro_batch_size"], 4);
  EXPECT_EQ(saved["micro_batches"], 4);
  EXPECT_EQ(saved["global_batch_size"], 32);
  // Read back: the same configuration.
  TrainConfig back = config_from_json(saved);
  validate(back);
  EXPECT_EQ(to_json(back).dump(), saved.dump());
  // A rerun that doubles the global batch keeps the micro-batch size, not the count.
  TrainConfig bigger = config_from_json(saved);
  bigger.global_batch_size = 64;
  validate(bigger);
  EXPECT_EQ(bigger.micro_batches, 8);
  EXPECT_EQ(bigger.batch_size / bigger.micro_batches, 4);
  // Without a micro-batch size the file's count is the run's.
  TrainConfig counted = layout(8, 2, 2, 32, 0);
  counted.micro_batches = 2;
  validate(counted);
  const nlohmann::json plain = to_json(counted);
  EXPECT_EQ(plain["micro_batch_size"], 0);
  TrainConfig again = config_from_json(plain);
  validate(again);
  EXPECT_EQ(again.micro_batches, 2);
  EXPECT_NE(error_of([] {
              config_from_json(nlohmann::json{{"micro_batch_size", "4"}});
            }).find("\"micro_batch_size\" must be an integer"),
            std::string::npos);
}

} // namespace
} // namespace meshsim
