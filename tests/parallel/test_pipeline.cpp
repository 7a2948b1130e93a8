// Pipeline parallelism run for real: where the models are cut, and the executor against
// single-device training of the same batches (in float64, losses and final parameters
// within kFloat64Tolerance relative, for every schedule, interleaved too), plus the activation
// memory each schedule really holds.
#include <gtest/gtest.h>

#include <iostream>
#include <mutex>

#include "data/dataset.h"
#include "memory/allocator.h"
#include "models/models.h"
#include "parallel/pipeline/pipeline.h"
#include "parallel/strategy.h"
#include "strategy_harness.h"
#include "optim/optimizer.h"

using namespace meshsim;
using meshsim::testing::relative_error;

namespace {

constexpr uint64_t kPipelineSeed = 3;
constexpr double kPipelineTolerance = meshsim::testing::kFloat64Tolerance; // in float64

OptimizerOptions pipeline_sgd() {
  OptimizerOptions o;
  o.name = "sgd";
  o.lr = 0.05;
  o.momentum = 0.9;
  return o;
}

struct Batches {
  std::vector<torch::Tensor> inputs, targets;
};

// Fixed consecutive batches of a synthetic data set (host memory).
Batches make_batches(int steps, int64_t batch, torch::Dtype dtype = torch::kFloat32) {
  const auto data =
      meshsim::testing::with_dtype(synthetic_dataset(steps * batch, 16, 11).train, dtype);
  Batches b;
  for (int k = 0; k < steps; ++k) {
    b.inputs.push_back(data.images.narrow(0, k * batch, batch));
    b.targets.push_back(data.labels.narrow(0, k * batch, batch));
  }
  return b;
}

struct TrainResult {
  std::vector<double> losses;
  std::vector<torch::Tensor> parameters; // in model order
};

// The CNN every stage cuts, of the batches' dtype, built from one seed on every rank.
ModelOptions cnn_options(int rank, const Batches& batches) {
  ModelOptions o;
  o.seed = kPipelineSeed;
  o.rank = rank;
  o.dtype = batches.inputs[0].scalar_type();
  return o;
}

// The reference: the whole model on the calling thread, whole batches.
TrainResult train_single(const Batches& batches) {
  TrainResult r;
  auto model = build_model("cnn", cnn_options(0, batches));
  auto params = model->parameters();
  allocate_gradients(params);
  Optimizer opt(params, pipeline_sgd());
  for (size_t k = 0; k < batches.inputs.size(); ++k) {
    opt.zero_grad();
    torch::Tensor loss = loss_fn(model->forward(batches.inputs[k]), batches.targets[k]);
    loss.backward();
    opt.step();
    r.losses.push_back(loss.item<double>());
  }
  for (const auto& p : params)
    r.parameters.push_back(p.detach().clone());
  return r;
}

// One rank per stage; each rank builds the whole model from the same seed and keeps its stage,
// or with virtual stages its chunks s, s + P, ... of the model cut into P·V.
TrainResult train_pipeline(DeviceMesh& mesh, const Schedule& schedule, const Batches& batches,
                           std::vector<Recorder>* recorders = nullptr) {
  const int stages = static_cast<int>(schedule.size());
  int micro_batches = 0, chunks = 0;
  for (const auto& list : schedule)
    for (const auto& a : list) {
      micro_batches = std::max(micro_batches, a.micro_batch + 1);
      chunks = std::max(chunks, a.stage + 1);
    }
  const int V = chunks / stages;
  TrainResult r;
  r.losses.assign(batches.inputs.size(), 0.0);
  std::vector<std::vector<torch::Tensor>> chunk_params(chunks);
  std::mutex mutex;
  auto records = run_ranks(mesh, [&](RankContext& ctx) {
    const int s = ctx.rank;
    torch::nn::Sequential model;
    {
      CategoryScope scope(MemoryCategory::Parameters);
      model = build_model("cnn", cnn_options(s, batches));
    }
    PipelineStage stage;
    stage.stage = s;
    stage.stages = stages;
    std::vector<torch::Tensor> params;
    if (V == 1) {
      stage.module = stage_module(model, stages, s);
      stage.prev_rank = s > 0 ? s - 1 : -1;
      stage.next_rank = s < stages - 1 ? s + 1 : -1;
      params = stage.module->parameters();
    } else {
      for (int k = 0; k < V; ++k) {
        stage.chunks.push_back(stage_module(model, chunks, s + k * stages));
        for (const auto& p : stage.chunks.back()->parameters())
          params.push_back(p);
      }
      stage.prev_rank = (s + stages - 1) % stages;
      stage.next_rank = (s + 1) % stages;
    }
    allocate_gradients(params);
    Optimizer opt(params, pipeline_sgd());
    for (size_t k = 0; k < batches.inputs.size(); ++k) {
      opt.zero_grad();
      std::vector<torch::Tensor> inputs, targets; // views: no allocation
      if (s == 0)
        inputs = batches.inputs[k].chunk(micro_batches);
      if (s == stages - 1)
        targets = batches.targets[k].chunk(micro_batches);
      const double loss = run_pipeline_step(ctx, stage, schedule[s], inputs, targets,
                                            TrainingLoss(), static_cast<int64_t>(k) + 1);
      opt.step();
      if (s == stages - 1)
        r.losses[k] = loss; // only the last stage writes
      else
        EXPECT_EQ(loss, 0.0);
    }
    GpuGuard host(nullptr);
    std::lock_guard<std::mutex> lock(mutex);
    for (int k = 0; k < V; ++k) {
      const auto& module = V == 1 ? stage.module : stage.chunks[k];
      for (const auto& p : module->parameters())
        chunk_params[s + k * stages].push_back(p.detach().clone());
    }
  });
  if (recorders)
    *recorders = records;
  for (const auto& list : chunk_params)
    r.parameters.insert(r.parameters.end(), list.begin(), list.end());
  return r;
}

std::vector<size_t> range(size_t begin, size_t end) {
  std::vector<size_t> out;
  for (size_t i = begin; i < end; ++i)
    out.push_back(i);
  return out;
}

} // namespace

TEST(PipelinePartition, CnnStagesFollowItsFourUnits) {
  const auto cnn = build_model("cnn", {});
  // units: conv1 relu1 pool1 | conv2 relu2 pool2 flatten | fc1 relu3 | fc2
  EXPECT_EQ(pipeline_units(cnn), 4);
  EXPECT_EQ(stage_children(cnn, 1, 0), range(0, 10));
  EXPECT_EQ(stage_children(cnn, 2, 0), range(0, 7));
  EXPECT_EQ(stage_children(cnn, 2, 1), range(7, 10));
  EXPECT_EQ(stage_children(cnn, 3, 0), range(0, 7)); // the extra unit goes to stage 0
  EXPECT_EQ(stage_children(cnn, 3, 1), range(7, 9));
  EXPECT_EQ(stage_children(cnn, 3, 2), range(9, 10));
  EXPECT_EQ(stage_children(cnn, 4, 0), range(0, 3));
  EXPECT_EQ(stage_children(cnn, 4, 1), range(3, 7));
  EXPECT_EQ(stage_children(cnn, 4, 2), range(7, 9));
  EXPECT_EQ(stage_children(cnn, 4, 3), range(9, 10));
  EXPECT_THROW(stage_children(cnn, 5, 0), std::invalid_argument);
  EXPECT_THROW(stage_children(cnn, 4, 4), std::invalid_argument);
  EXPECT_THROW(stage_children(cnn, 0, 0), std::invalid_argument);
  try {
    stage_module(cnn, 5, 0);
    FAIL() << "expected invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "cannot cut the model into 5 pipeline stages: it has only 4 units "
                           "(layers with parameters, or transformer blocks)");
  }
}

TEST(PipelinePartition, StageModuleSharesTheChildrenUnderTheirNames) {
  const auto cnn = build_model("cnn", {});
  const auto stage = stage_module(cnn, 4, 1);
  std::vector<std::string> names;
  for (const auto& item : stage->named_children())
    names.push_back(item.key());
  EXPECT_EQ(names, (std::vector<std::string>{"conv2", "relu2", "pool2", "flatten"}));
  EXPECT_TRUE(
      stage->named_parameters()["conv2.weight"].is_same(cnn->named_parameters()["conv2.weight"]));
  // The four stages together hold every parameter once.
  int64_t total = 0;
  for (int s = 0; s < 4; ++s)
    total += count_parameters(*stage_module(cnn, 4, s));
  EXPECT_EQ(total, 421642);
}

TEST(PipelinePartition, TransformerBlocksAreTheUnits) {
  torch::nn::Sequential gpt;
  gpt->push_back("embed", torch::nn::Embedding(16, 8));
  for (int i = 0; i < 3; ++i)
    gpt->push_back("block" + std::to_string(i), torch::nn::Linear(8, 8));
  gpt->push_back("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({8})));
  gpt->push_back("head", torch::nn::Linear(8, 16));
  EXPECT_EQ(pipeline_units(gpt), 3);
  EXPECT_EQ(stage_children(gpt, 1, 0), range(0, 6));
  EXPECT_EQ(stage_children(gpt, 2, 0), range(0, 3)); // embed block0 block1
  EXPECT_EQ(stage_children(gpt, 2, 1), range(3, 6)); // block2 ln_f head
  EXPECT_EQ(stage_children(gpt, 3, 0), range(0, 2));
  EXPECT_EQ(stage_children(gpt, 3, 1), range(2, 3));
  EXPECT_EQ(stage_children(gpt, 3, 2), range(3, 6));
  EXPECT_THROW(stage_children(gpt, 4, 0), std::invalid_argument);

  // Leading parameter-less children join the first unit.
  torch::nn::Sequential mlp;
  mlp->push_back("flatten", torch::nn::Flatten());
  mlp->push_back("fc1", torch::nn::Linear(4, 4));
  mlp->push_back("relu", torch::nn::ReLU());
  mlp->push_back("fc2", torch::nn::Linear(4, 2));
  EXPECT_EQ(stage_children(mlp, 2, 0), range(0, 3));
  EXPECT_EQ(stage_children(mlp, 2, 1), range(3, 4));
}

namespace {

// A pipeline run's losses and final parameters against single-device training's, within
// kTolerance, with the worst relative error printed.
void expect_pipeline_matches_single(const TrainResult& got, const TrainResult& ref, const std::string& what) {
  ASSERT_EQ(got.losses.size(), ref.losses.size()) << what;
  double worst = 0;
  for (size_t k = 0; k < ref.losses.size(); ++k) {
    EXPECT_NEAR(got.losses[k], ref.losses[k], kPipelineTolerance * std::abs(ref.losses[k]))
        << what << " step " << k + 1;
    worst = std::max(worst, std::abs(got.losses[k] - ref.losses[k]) / std::abs(ref.losses[k]));
  }
  ASSERT_EQ(got.parameters.size(), ref.parameters.size()) << what;
  for (size_t i = 0; i < ref.parameters.size(); ++i) {
    const double err = relative_error(got.parameters[i], ref.parameters[i]);
    EXPECT_LT(err, kPipelineTolerance) << what << " parameter " << i;
    worst = std::max(worst, err);
  }
  std::cout << what << ": final loss " << got.losses.back() << " (single " << ref.losses.back()
            << "), worst relative error " << worst << "\n";
}

} // namespace

TEST(PipelineExecutor, EverySchedulerMatchesSingleDeviceTraining) {
  const Batches batches = make_batches(10, 32, torch::kFloat64);
  const TrainResult ref = train_single(batches);
  EXPECT_LT(ref.losses.back(), ref.losses.front()); // it did learn something
  for (int stages : {2, 4}) {
    for (const auto& name : schedule_names()) {
      const std::string what = name + " pp=" + std::to_string(stages);
      DeviceMesh mesh(meshsim::testing::mesh_options(stages));
      const TrainResult got = train_pipeline(mesh, make_schedule(name, stages, 4), batches);
      expect_pipeline_matches_single(got, ref, what);
    }
  }
}

TEST(PipelineExecutor, InterleavedMatchesSingleDeviceTraining) {
  // The CNN's 4 units as 4 chunks on 2 ranks: rank 0 runs conv1 and fc1, rank 1 conv2 and fc2,
  // so every activation crosses ranks, both ways between the same two ranks.
  const Batches batches = make_batches(10, 32, torch::kFloat64);
  const TrainResult ref = train_single(batches);
  for (int micro_batches : {2, 4, 8}) {
    const std::string what = "pp=2 V=2 M=" + std::to_string(micro_batches);
    DeviceMesh mesh(meshsim::testing::mesh_options(2));
    const TrainResult got =
        train_pipeline(mesh, make_schedule("1f1b", 2, micro_batches, 2), batches);
    expect_pipeline_matches_single(got, ref, what);
  }
}

TEST(PipelineExecutor, OneFOneBHoldsFewerActivationsThanGPipe) {
  // P=4, M=8: stage 0 holds 8 micro-batches' activations under GPipe and 4 under 1F1B.
  const Batches batches = make_batches(2, 64);
  int64_t peak[2];
  const char* names[2] = {"gpipe", "1f1b"};
  for (int i = 0; i < 2; ++i) {
    DeviceMesh mesh(meshsim::testing::mesh_options(4));
    train_pipeline(mesh, make_schedule(names[i], 4, 8), batches);
    peak[i] =
        mesh.gpu(0).stats().peak_by_category[static_cast<size_t>(MemoryCategory::Activations)];
  }
  const double ratio = static_cast<double>(peak[0]) / static_cast<double>(peak[1]);
  std::cout << "stage 0 peak activations, P=4 M=8 batch 64: gpipe " << peak[0] << " B, 1f1b "
            << peak[1] << " B, ratio " << ratio << "\n";
  RecordProperty("gpipe_over_1f1b", std::to_string(ratio));
  EXPECT_GE(ratio, 1.8);
  // The difference is exactly the 8 - 4 = 4 extra micro-batches of 8 samples that GPipe holds:
  // each keeps conv1's ReLU output (32x28x28 floats), pool1's output (32x14x14 floats) and
  // pool1's indices (32x14x14 int64).
  const int64_t per_micro_batch = 8 * (32 * 28 * 28 * 4 + 32 * 14 * 14 * 4 + 32 * 14 * 14 * 8);
  EXPECT_EQ(peak[0] - peak[1], 4 * per_micro_batch);
}

TEST(PipelineExecutor, RecordsEveryActionAndSendsTheCutActivation) {
  // pp=2 cuts the CNN after flatten: each message is [8, 64*7*7] floats, 100,352 bytes.
  const Batches batches = make_batches(1, 16);
  DeviceMesh mesh(meshsim::testing::mesh_options(2));
  std::vector<Recorder> recorders;
  train_pipeline(mesh, make_schedule("1f1b", 2, 2), batches, &recorders);
  ASSERT_EQ(recorders.size(), 2u);
  std::vector<std::string> compute, comm;
  for (const auto& c : recorders[0].compute)
    compute.push_back(c.name);
  EXPECT_EQ(compute, (std::vector<std::string>{"forward", "forward", "backward", "backward"}));
  for (const auto& c : recorders[0].collectives) {
    comm.push_back(c.op);
    EXPECT_EQ(c.peer, 1);
    EXPECT_EQ(c.bytes, 8 * 64 * 7 * 7 * 4) << c.op;
  }
  EXPECT_EQ(comm, (std::vector<std::string>{"send", "send", "recv", "recv"}));
  std::vector<std::string> phases;
  for (const auto& sample : mesh.timeline().samples())
    if (sample.phase.front() == '0')
      phases.push_back(sample.phase);
  EXPECT_EQ(phases, (std::vector<std::string>{"0F0", "0F1", "0B0", "0B1"}));
}

TEST(PipelineExecutor, RejectsActionsOfAnotherStageAndMissingInputs) {
  DeviceMesh mesh(meshsim::testing::mesh_options(1));
  run_ranks(mesh, [&](RankContext& ctx) {
    PipelineStage stage;
    stage.module = stage_module(build_model("cnn", {}), 1, 0);
    const auto schedule = gpipe_schedule(2, 2);
    EXPECT_THROW(run_pipeline_step(ctx, stage, schedule[1], {}, {}, TrainingLoss(), 1),
                 std::invalid_argument);
    const auto one = gpipe_schedule(1, 2);
    EXPECT_THROW(run_pipeline_step(ctx, stage, one[0], {}, {}, TrainingLoss(), 1),
                 std::invalid_argument);

    // Rank 0 of 2 holding chunks 0 and 2: chunk 4 is no chunk of it, and it needs both peers.
    PipelineStage chunked;
    chunked.stages = 2;
    chunked.chunks = {stage_module(build_model("cnn", {}), 4, 0),
                      stage_module(build_model("cnn", {}), 4, 2)};
    chunked.next_rank = 0;
    try {
      run_pipeline_step(ctx, chunked, interleaved_one_f_one_b_schedule(2, 2, 2)[0], {}, {},
                        TrainingLoss(), 1);
      FAIL() << "expected invalid_argument";
    } catch (const std::invalid_argument& e) {
      EXPECT_STREQ(e.what(), "pipeline stage 0 has no prev_rank"); // rank 0's chunk 2 receives
    }
    chunked.prev_rank = 0;
    const std::vector<Action> wrong{{4, ActionKind::Forward, 0}};
    EXPECT_THROW(run_pipeline_step(ctx, chunked, wrong, {}, {}, TrainingLoss(), 1),
                 std::invalid_argument);
  });
}
