// Test accuracy at an epoch's end, for every strategy and any test-set size.
#pragma once

#include <cstdint>

#include "data/dataset.h"
#include "mesh/rank_runner.h"
#include "parallel/strategy.h"

namespace meshsim {

struct Evaluation {
  double accuracy = 0;    // over every test sample scored, on every rank
  int64_t samples = 0;    // test samples scored, over every rank (each once)
  int64_t peak_bytes = 0; // this rank's GPU peak during the evaluation alone
};

/// Collective over the world. Shard i of `shard.replicas` scores test samples i, i + replicas,
/// ... of the first `limit` (0: all). Every rank runs the same number of evaluate() calls,
/// since strategies whose model is split or replicated per call (dp, ZeRO 3, pipelines)
/// evaluate collectively: a rank with fewer samples than the others, or none, scores a
/// stand-in batch and counts nothing from it. The evaluation's memory is kept out of the
/// GPU's training peaks and returned as `peak_bytes`.
Evaluation evaluate(RankContext& ctx, Strategy& strategy, DataShard shard, const Dataset& test,
                    int64_t limit, int64_t batch_size);

} // namespace meshsim
