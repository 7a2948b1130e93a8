// Same seed, same initial weights as PyTorch itself (Debian's python3-torch, same version).
#include <gtest/gtest.h>

#include <cstdio>

#include "models/models.h"
#include "../python_torch.h"

using namespace meshsim;
using meshsim::testing::python_torch_available;

namespace {

std::vector<double> python_parameter_sums(const std::string& model, int seed) {
  const std::string cmd = MESHSIM_PYTHON " " MESHSIM_SOURCE_DIR "/tests/models/reference_init.py " +
                          model + " " + std::to_string(seed);
  std::vector<double> sums;
  FILE* pipe = popen(cmd.c_str(), "r");
  double v;
  while (pipe && std::fscanf(pipe, "%lf", &v) == 1) sums.push_back(v);
  if (pipe) pclose(pipe);
  return sums;
}

} // namespace

TEST(ModelsInit, SameSeedSameWeightsAsPyTorch) {
  if (!python_torch_available()) GTEST_SKIP() << meshsim::testing::no_python_torch();
  for (const std::string name : {"cnn", "lenet"}) {
    for (int seed : {0, 42}) {
      auto model = build_model(name, ModelOptions{static_cast<uint64_t>(seed), 0, {}});
      const auto expected = python_parameter_sums(name, seed);
      const auto params = model->parameters();
      ASSERT_EQ(expected.size(), params.size() * 2) << name;
      for (size_t i = 0; i < params.size(); ++i) {
        const auto p = params[i].to(torch::kFloat64);
        EXPECT_NEAR(p.sum().item<double>(), expected[2 * i], 1e-9) << name << " param " << i;
        EXPECT_NEAR(p.abs().sum().item<double>(), expected[2 * i + 1], 1e-9) << name << " param " << i;
      }
    }
  }
}
