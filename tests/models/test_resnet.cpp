// ResNet-50: torchvision's published size and FLOPs, its blocks' shapes as the FLOP counter
// sees them, forward and backward on the meta device (meshsim's meta kernels for convolution,
// BatchNorm and ReLU), and a plan that charges each GPU what a CPU run charges it.
#include <gtest/gtest.h>

#include <array>

#include "models/layers/flops.h"
#include "data/dataset.h"
#include "mesh/device_mesh.h"
#include "mesh/meta_device.h"
#include "models/models.h"
#include "models/resnet.h"
#include "plan/plan.h"
#include "train/trainer.h"

namespace meshsim {
namespace {

ModelOptions on_meta() {
  ModelOptions o;
  o.device = torch::kMeta;
  return o;
}

// torchvision's ResNet50_Weights.IMAGENET1K_V1 lists num_params 25,557,032.
TEST(ResNet50, HasTorchvisionsParameterCountOnTheHostAndOnMeta) {
  EXPECT_EQ(count_parameters(*build_model("resnet50", {})), 25557032);
  const auto meta = build_model("resnet50", on_meta());
  EXPECT_EQ(count_parameters(*meta), 25557032);
  for (const auto& p : meta->parameters())
    EXPECT_TRUE(p.is_meta());
  const auto named = meta->named_parameters();
  EXPECT_EQ(named["layer1_0.down_conv.weight"].sizes(), (std::vector<int64_t>{256, 64, 1, 1}));
  EXPECT_EQ(named["layer4_2.conv3.weight"].sizes(), (std::vector<int64_t>{2048, 512, 1, 1}));
  EXPECT_EQ(named["fc.weight"].sizes(), (std::vector<int64_t>{1000, 2048}));
}

// torchvision publishes 4.09 GFLOPS for ResNet-50 at 224² (multiply-adds of its convolutions
// and classifier, three figures): meshsim counts a multiply-add as 2 FLOPs.
TEST(ResNet50, ForwardIsTheMultiplyAddsTorchvisionPublishes) {
  register_meta_kernels();
  const auto model = build_model("resnet50", on_meta());
  const auto input = torch::empty({1, kImageChannels, kImageSize, kImageSize},
                                  torch::TensorOptions().device(torch::kMeta));
  double gemm_flops = 0;
  int64_t gemms = 0;
  for (const LayerWork& w : count_forward(model, input)) {
    gemm_flops += w.gemm_flops;
    gemms += w.gemms;
  }
  EXPECT_GE(gemm_flops / 2, 4.085e9);
  EXPECT_LT(gemm_flops / 2, 4.095e9);
  EXPECT_EQ(gemms, 54); // 1 + 16 × 3 + 4 downsampling convolutions + fc
}

// The shapes a block tells the counter each leaf sees are the ones the leaves produce.
TEST(ResNet50, ABlocksLeafCallsAreTheShapesItRuns) {
  const auto t = torch::TensorOptions().dtype(torch::kFloat32);
  Bottleneck block(256, 128, 2, t);
  const torch::Tensor x = torch::randn({2, 256, 14, 14});
  const torch::Tensor y = block->forward(x);
  const auto calls = block->leaf_calls(x.sizes());
  EXPECT_EQ(calls.back().out, y.sizes().vec());
  EXPECT_EQ(calls.front().in, x.sizes().vec());
  int convs = 0;
  for (const auto& call : calls)
    if (call.module && call.module->as<torch::nn::Conv2d>()) {
      auto* conv = const_cast<torch::nn::Conv2dImpl*>(call.module->as<torch::nn::Conv2d>());
      EXPECT_EQ(conv->forward(torch::randn(call.in)).sizes().vec(), call.out) << call.name;
      ++convs;
    }
  EXPECT_EQ(convs, 4); // three and the downsampling one
}

TEST(ResNet50, RunsForwardAndBackwardOnMeta) {
  register_meta_kernels();
  auto model = build_model("resnet50", on_meta());
  const auto meta = torch::TensorOptions().device(torch::kMeta);
  const torch::Tensor x = torch::empty({2, kImageChannels, kImageSize, kImageSize}, meta);
  const torch::Tensor y = model->forward(x);
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{2, kImageClasses}));
  torch::nn::functional::cross_entropy(y, torch::empty({2}, meta.dtype(torch::kLong))).backward();
  for (const auto& p : model->parameters()) {
    ASSERT_TRUE(p.grad().defined());
    EXPECT_EQ(p.grad().sizes(), p.sizes());
  }
}

// As PlanMatchesTraining (tests/train/test_plan.cpp) holds the transformers: a DDP step of
// ResNet-50 planned on meta and trained on the CPU charge each GPU the same bytes of each
// category, at the end of the forward and of the backward, and the same peaks of everything
// but activations and `other`:
//  - a CPU convolution works in a transient buffer that a meta kernel never allocates, so the
//    CPU run's activation peak is higher by one such buffer, whose size is the kernel
//    library's choice: oneDNN reorders a weight into its blocked layout (9 MiB, layer4's 3×3
//    weight, with AVX2 or AVX-512), its SSE4.1 kernels take 37 MiB, ATen's own im2col 1.7 MiB
//    (all checked). Between kernels, where the samples are taken, none is live.
//  - `other`: Adam's 0-dim float32 bias-correction operand on the CPU, at most 4 bytes (as
//    there).
TEST(ResNet50, APlanChargesWhatACpuRunCharges) {
  TrainConfig c;
  c.model = "resnet50";
  c.gpus = 2;
  c.batch_size = 2;
  c.max_steps = kPlanSteps;
  c.synthetic_train = 4;
  c.synthetic_test = 2;
  c.eval_limit = 2;
  c.progress = false;
  validate(c);
  EXPECT_EQ(c.data, "synthetic");
  const Plan plan = make_plan(c, int64_t{1} << 40);

  MeshOptions mo;
  mo.world_size = c.gpus;
  mo.capacity_bytes = int64_t{1} << 33;
  DeviceMesh mesh(mo);
  const DataSplit data = synthetic_images(c.synthetic_train, c.synthetic_test, kImageChannels,
                                          kImageSize, kImageClasses, c.seed);
  train(c, mesh, data, nullptr);
  ASSERT_EQ(plan.ranks.size(), 1u);

  // GPU 0's bytes by category when its rank's `phase` of step 1 ended.
  const auto at_end_of = [](const std::vector<MemorySample>& samples, const std::string& phase) {
    for (const MemorySample& s : samples)
      if (s.step == 1 && s.phase == phase && s.rank == 0 && !s.by_category.empty())
        return s.by_category[0];
    ADD_FAILURE() << "no sample of rank 0 after " << phase;
    return CategoryBytes{};
  };
  const std::vector<MemorySample> cpu = mesh.timeline().samples();
  for (const char* phase : {"forward", "backward"}) {
    const auto planned = at_end_of(plan.timeline, phase), real = at_end_of(cpu, phase);
    for (int k = 0; k < kNumCategories; ++k) {
      if (static_cast<MemoryCategory>(k) != MemoryCategory::Other) {
        EXPECT_EQ(planned[static_cast<size_t>(k)], real[static_cast<size_t>(k)])
            << phase << " " << category_name(static_cast<MemoryCategory>(k));
      }
    }
  }
  EXPECT_GT(at_end_of(cpu, "forward")[static_cast<size_t>(MemoryCategory::Activations)],
            int64_t{100} << 20); // two images' saved activations

  const auto peak = [](const MemoryStats& s, MemoryCategory k) {
    return s.peak_by_category[static_cast<size_t>(k)];
  };
  for (int r = 0; r < c.gpus; ++r) {
    const MemoryStats real = mesh.gpu(r).stats();
    for (MemoryCategory k : {MemoryCategory::Parameters, MemoryCategory::Gradients,
                             MemoryCategory::Optimizer, MemoryCategory::Communication})
      EXPECT_EQ(peak(plan.ranks[0].stats, k), peak(real, k)) << "gpu" << r << " " << category_name(k);
    EXPECT_GE(peak(real, MemoryCategory::Activations),
              peak(plan.ranks[0].stats, MemoryCategory::Activations))
        << "gpu" << r;
    const int64_t other = peak(real, MemoryCategory::Other) - peak(plan.ranks[0].stats, MemoryCategory::Other);
    EXPECT_GE(other, 0) << "gpu" << r;
    EXPECT_LE(other, 4) << "gpu" << r;
  }
}

} // namespace
} // namespace meshsim
