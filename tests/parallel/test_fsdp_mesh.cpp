// FSDP in every mesh: ZeRO 2 and 3 with tensor and pipeline parallelism (and sequence
// parallelism, recompute, interleaved stages), HSDP (--dp-shard), ZeRO-3 without
// reshard-after-forward, and a tied head under ZeRO 3, each against single-device training of
// the same global batches (the GPT of strategy_harness.h, float64, SGD with momentum, 10
// steps: every loss and the final gathered parameters within kFloat64Tolerance relative,
// derived there). Then the model state each GPU holds between steps, asserted equal to the
// byte to the formulas of docs/zero.md ("ZeRO with tensor and pipeline parallelism").
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <map>

#include <fmt/format.h>

#include "data/text.h"
#include "models/gpt.h"
#include "strategy_harness.h"

using namespace meshsim;
using namespace meshsim::testing;

namespace {

constexpr int kFsdpSteps = 10;
constexpr int64_t kFsdpGlobalBatch = 16;

const Dataset& fsdp_text() {
  static const Dataset data = synthetic_text(512, 16, 16, 64, 3).train;
  return data;
}

HarnessRun run_fsdp_mesh(int world, const StrategyOptions& options, int steps = kFsdpSteps,
                         const AfterStep& after = {}) {
  static std::vector<std::unique_ptr<DeviceMesh>> meshes; // outlive the returned run
  meshes.push_back(std::make_unique<DeviceMesh>(mesh_options(world, int64_t{1} << 30)));
  torch::manual_seed(5); // the same permutation of the data for every run
  const bool single = world == 1 && options.zero == 0 && options.micro_batches == 1;
  return run_strategy(*meshes.back(), single ? "single" : "ddp", options, fsdp_text(),
                      kFsdpGlobalBatch, steps, after);
}

StrategyOptions fsdp_gpt(bool tied = false) {
  StrategyOptions o = tiny_gpt_sgd(torch::kFloat64);
  o.shape.tie_head = tied;
  return o;
}

// The single-device references: the untied GPT and the tied one.
const HarnessRun& fsdp_reference(bool tied) {
  static const HarnessRun untied = run_fsdp_mesh(1, fsdp_gpt(false));
  static const HarnessRun with_tie = run_fsdp_mesh(1, fsdp_gpt(true));
  return tied ? with_tie : untied;
}

StrategyOptions fsdp_layout(int tp, int pp, int zero, int micro_batches,
                            const std::string& schedule = "1f1b", bool tied = false) {
  StrategyOptions o = fsdp_gpt(tied);
  o.tp = tp;
  o.pp = pp;
  o.zero = zero;
  o.micro_batches = micro_batches;
  o.schedule = schedule;
  return o;
}

HarnessRun expect_fsdp_matches_single(int world, const StrategyOptions& options,
                                      const std::string& what) {
  const HarnessRun& ref = fsdp_reference(options.shape.tie_head);
  HarnessRun got = run_fsdp_mesh(world, options);
  EXPECT_LT(ref.losses.back(), ref.losses.front() - 0.05) << "the reference did not learn";
  EXPECT_EQ(got.losses.size(), ref.losses.size()) << what;
  for (size_t k = 0; k < std::min(got.losses.size(), ref.losses.size()); ++k)
    EXPECT_NEAR(got.losses[k], ref.losses[k], kFloat64Tolerance * std::abs(ref.losses[k]))
        << what << " step " << k + 1;
  EXPECT_EQ(got.parameters.size(), ref.parameters.size()) << what;
  double worst = 0;
  for (size_t i = 0; i < std::min(got.parameters.size(), ref.parameters.size()); ++i) {
    EXPECT_EQ(got.parameters[i].sizes(), ref.parameters[i].sizes()) << what << " parameter " << i;
    if (!got.parameters[i].sizes().equals(ref.parameters[i].sizes()))
      continue;
    // The floor: a key bias stays zero in exact arithmetic (strategy_harness.h).
    const double e = relative_error(got.parameters[i], ref.parameters[i], 1e-5);
    EXPECT_LT(e, kFloat64Tolerance) << what << " parameter " << i;
    worst = std::max(worst, e);
  }
  std::cout << what << ": final loss " << got.losses.back() << " (single " << ref.losses.back()
            << "), worst parameter rel. error " << worst << "\n";
  return got;
}

// The ZeRO all-gathers rank 0 made (with tp 1 every all-gather is ZeRO's).
int64_t all_gathers_of_rank0(const HarnessRun& run) {
  int64_t n = 0;
  for (const auto& c : run.recorders.at(0).collectives)
    n += c.op == "all_gather";
  return n;
}

} // namespace

TEST(FsdpMesh, Zero2And3WithTensorAndPipelineParallel) {
  StrategyOptions sp = fsdp_layout(2, 2, 2, 2);
  sp.sequence_parallel = true;
  expect_fsdp_matches_single(8, sp, "dp2 tp2 pp2 zero2 1f1b sequence parallel");
  expect_fsdp_matches_single(8, fsdp_layout(2, 2, 3, 2), "dp2 tp2 pp2 zero3 1f1b");
  StrategyOptions gpipe = fsdp_layout(2, 2, 3, 4, "gpipe");
  gpipe.sequence_parallel = true;
  gpipe.recompute = Recompute::Full;
  expect_fsdp_matches_single(8, gpipe, "dp2 tp2 pp2 zero3 gpipe recompute sequence parallel");
  StrategyOptions interleaved = fsdp_layout(2, 2, 3, 2);
  interleaved.virtual_stages = 2;
  interleaved.recompute = Recompute::Selective;
  expect_fsdp_matches_single(8, interleaved, "dp2 tp2 pp2 V2 zero3 1f1b selective recompute");
}

// HSDP: sharded within dp_shard ranks, averaged across the dp / dp_shard replicas.
TEST(FsdpMesh, HybridShardedDataParallel) {
  StrategyOptions z3 = fsdp_layout(1, 1, 3, 2);
  z3.dp_shard = 2;
  expect_fsdp_matches_single(4, z3, "dp4 (replicate 2 x shard 2) zero3, 2 micro-batches");
  StrategyOptions z1 = fsdp_layout(1, 1, 1, 1);
  z1.dp_shard = 2;
  expect_fsdp_matches_single(4, z1, "dp4 (replicate 2 x shard 2) zero1");
  StrategyOptions z2 = fsdp_layout(2, 1, 2, 1);
  z2.dp_shard = 2;
  expect_fsdp_matches_single(8, z2, "dp4 (replicate 2 x shard 2) tp2 zero2");
}

// Without reshard-after-forward a block stays gathered from its forward to its backward: with
// one stage and M micro-batches, M all-gathers per block and step instead of 2M, and the
// same arithmetic.
TEST(FsdpMesh, NoReshardAfterForward) {
  StrategyOptions keep = fsdp_layout(1, 1, 3, 2);
  keep.reshard_after_forward = false;
  const HarnessRun kept = expect_fsdp_matches_single(4, keep, "dp4 zero3 no reshard, 2 micro-batches");
  const HarnessRun resharded =
      expect_fsdp_matches_single(4, fsdp_layout(1, 1, 3, 2), "dp4 zero3 reshard, 2 micro-batches");
  // 7 units (embedding, 4 blocks, final norm, head); full_parameters() gathers each once more.
  const int64_t units = 7, micro = 2;
  EXPECT_EQ(all_gathers_of_rank0(kept), kFsdpSteps * units * micro + units);
  EXPECT_EQ(all_gathers_of_rank0(resharded), kFsdpSteps * units * 2 * micro + units);
  std::cout << "all-gathers of rank 0 in 10 steps: " << all_gathers_of_rank0(kept)
            << " without reshard, " << all_gathers_of_rank0(resharded) << " with\n";
  StrategyOptions mesh = fsdp_layout(2, 2, 3, 2);
  mesh.reshard_after_forward = false;
  expect_fsdp_matches_single(8, mesh, "dp2 tp2 pp2 zero3 1f1b no reshard");
}

// The tied head reads the embedding's weight: under ZeRO 3 it is gathered for the head too.
TEST(FsdpMesh, TiedHeadWithZero3) {
  expect_fsdp_matches_single(2, fsdp_layout(1, 1, 3, 2, "1f1b", true), "tied dp2 zero3");
  expect_fsdp_matches_single(4, fsdp_layout(2, 1, 3, 1, "1f1b", true), "tied dp2 tp2 zero3");
  StrategyOptions keep = fsdp_layout(1, 1, 3, 1, "1f1b", true);
  keep.reshard_after_forward = false;
  expect_fsdp_matches_single(2, keep, "tied dp2 zero3 no reshard");
}

namespace {

// The parameters of each ZeRO unit of pipeline stage `stage` (of `pp`) on one tp rank of the
// GPT, in closed form (docs/zero.md): the embedding V·H/T + S·H (the word table split over the
// vocabulary when the head is untied and T divides V, else whole; positions replicated); a block
// (4H² + 2HF + 3H + F)/T + 6H (q, k, v and fc split with their biases, out and proj split
// with whole biases, two LayerNorms); the final norm 2H; an untied head V·H/T (split over the
// vocabulary when T divides V). Stage 0 has the embedding, the last the norm and the head.
std::vector<int64_t> fsdp_gpt_units(const TransformerShape& g, int tp, int pp, int stage) {
  const int64_t H = g.hidden, F = gpt_ffn_hidden(g), V = g.vocab, S = g.seq_len, T = tp;
  std::vector<int64_t> units;
  if (stage == 0)
    units.push_back((!g.tie_head && V % T == 0 ? V * H / T : V * H) + S * H);
  for (int64_t l = 0; l < g.layers / pp; ++l)
    units.push_back((4 * H * H + 2 * H * F + 3 * H + F) / T + 6 * H);
  if (stage == pp - 1) {
    units.push_back(2 * H);
    if (!g.tie_head)
      units.push_back(V % T == 0 ? V * H / T : V * H);
  }
  return units;
}

int64_t fsdp_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct FsdpModelState {
  int64_t parameters = 0, gradients = 0, optimizer = 0;
  int64_t total() const { return parameters + gradients + optimizer; }
};

// docs/zero.md's formulas, with N = dp_shard · cp, b the bytes of a parameter (4 fp32, 2
// bf16) and K the optimizer's bytes per parameter (Adam: 8; mixed precision: 12, master
// included). ZeRO 3 has one unit per child with parameters; ZeRO 0-2 one unit per stage
// (a bucket bigger than the stage). n_u is each unit's parameters, padded to a multiple of N.
FsdpModelState fsdp_formula(int zero, const std::vector<int64_t>& units, int64_t N, int64_t b, int64_t K) {
  int64_t shard = 0, whole = 0; // Σ ⌈n_u / N⌉ and Σ ⌈n_u / N⌉·N
  if (zero == 3) {
    for (int64_t n : units)
      shard += fsdp_ceil_div(n, N);
    whole = shard * N;
  } else {
    int64_t n = 0;
    for (int64_t u : units)
      n += u;
    const int64_t s = zero == 0 ? n : fsdp_ceil_div(n, N);
    shard = s;
    whole = zero == 0 ? n : s * N;
  }
  switch (zero) {
  case 0:
    return {b * whole, b * whole, K * whole};
  case 1:
    return {b * whole, b * whole, K * shard};
  case 2:
    return {b * whole, b * shard, K * shard};
  default:
    return {b * shard, b * shard, K * shard};
  }
}

int64_t fsdp_category_now(const VirtualGpu& gpu, MemoryCategory c) {
  return gpu.stats().current_by_category[static_cast<size_t>(c)];
}

// Runs `options` for 2 steps on `world` GPUs and checks every GPU after each step against
// the formula for its stage; returns stage -> what GPU of that stage held.
std::map<int, FsdpModelState> fsdp_check_model_state(int world, const StrategyOptions& options,
                                            const std::string& what) {
  const int dp = world / (options.tp * options.pp);
  const int64_t N = options.dp_shard > 0 ? options.dp_shard : dp;
  const bool mixed = options.precision != "fp32";
  const int64_t b = mixed ? 2 : 4, K = mixed ? 12 : 8;
  std::mutex mutex;
  std::map<int, FsdpModelState> seen;
  std::map<int, int64_t> peaks; // parameters' peak
  run_fsdp_mesh(world, options, 2, [&](RankContext& ctx, Strategy&, int step) {
    const int stage = ctx.rank / (world / options.pp);
    const FsdpModelState want =
        fsdp_formula(options.zero, fsdp_gpt_units(options.shape, options.tp, options.pp, stage), N, b, K);
    const FsdpModelState got{fsdp_category_now(ctx.gpu, MemoryCategory::Parameters),
                         fsdp_category_now(ctx.gpu, MemoryCategory::Gradients),
                         fsdp_category_now(ctx.gpu, MemoryCategory::Optimizer)};
    const std::string where = fmt::format("{}: gpu{} (stage {}) after step {}", what, ctx.rank,
                                          stage, step);
    EXPECT_EQ(got.parameters, want.parameters) << where;
    EXPECT_EQ(got.gradients, want.gradients) << where;
    EXPECT_EQ(got.optimizer, want.optimizer) << where;
    EXPECT_EQ(fsdp_category_now(ctx.gpu, MemoryCategory::Communication), 0) << where;
    // ZeRO 3 never holds a stage whole, not even while it is built: at most its shards and
    // three gathered units (the one whose backward ends, freed by its last gradient, the one
    // whose backward starts, and the one prefetched for the backward after; each padded to a
    // multiple of N at most).
    const int64_t peak =
        ctx.gpu.stats().peak_by_category[static_cast<size_t>(MemoryCategory::Parameters)];
    if (options.zero == 3) {
      std::vector<int64_t> units =
          fsdp_gpt_units(options.shape, options.tp, options.pp, stage);
      std::sort(units.rbegin(), units.rend());
      int64_t three = 0;
      for (size_t u = 0; u < std::min<size_t>(3, units.size()); ++u)
        three += units[u] + N - 1;
      EXPECT_LE(peak, want.parameters + b * three) << where;
    }
    std::lock_guard<std::mutex> lock(mutex);
    peaks[stage] = peak;
    seen[stage] = got;
  });
  for (const auto& [stage, s] : seen)
    std::cout << fmt::format("{}: stage {} GPU: parameters {} + gradients {} + optimizer {} = {} "
                             "bytes; parameters' peak {}\n",
                             what, stage, s.parameters, s.gradients, s.optimizer, s.total(),
                             peaks[stage]);
  return seen;
}

StrategyOptions fsdp_adam_layout(int tp, int pp, int zero, const std::string& precision = "fp32") {
  StrategyOptions o = fsdp_layout(tp, pp, zero, 2);
  o.dtype = torch::kFloat32;
  o.precision = precision;
  o.optimizer.name = "adam";
  o.optimizer.lr = 1e-3;
  o.optimizer.momentum = 0;
  o.bucket_mb = 25; // ZeRO 0-2: one unit per stage
  return o;
}

} // namespace

// Model state per GPU (parameters, gradients, optimizer state) between steps, exactly.
TEST(FsdpMemory, ModelStatePerGpuMatchesTheFormulas) {
  // The tiny GPT: H 32, F 128, V 64, S 16, 4 layers; tp 2: a block is 6,448 parameters, the
  // embedding 1,536 (its word table's 32 rows and the 16 positions), the final norm 64, the
  // head 1,024.
  const auto z3 = fsdp_check_model_state(8, fsdp_adam_layout(2, 2, 3), "zero3 tp2 pp2 dp2 fp32");
  // Stage 0 holds (1,536 + 2·6,448)/2 = 7,216 parameters' shards: 16 bytes each.
  EXPECT_EQ(z3.at(0).total(), 16 * 7216);
  StrategyOptions sp = fsdp_adam_layout(2, 2, 2);
  sp.sequence_parallel = true;
  fsdp_check_model_state(8, sp, "zero2 tp2 pp2 dp2 fp32 sequence parallel");
  fsdp_check_model_state(8, fsdp_adam_layout(2, 2, 3, "bf16"), "zero3 tp2 pp2 dp2 bf16");
  StrategyOptions hsdp = fsdp_adam_layout(1, 1, 3);
  hsdp.dp_shard = 2;
  fsdp_check_model_state(4, hsdp, "zero3 dp4 (replicate 2 x shard 2) fp32");
  StrategyOptions tied = fsdp_adam_layout(2, 1, 3);
  tied.shape.tie_head = true;
  fsdp_check_model_state(4, tied, "zero3 tied tp2 dp2 fp32");
}
