// ResNet-50 (He et al. 2016, torchvision's layout).
#include "models/resnet.h"

#include <cmath>
#include <string>

#include <fmt/format.h>

#include "models/device_layers.h"

namespace meshsim {
namespace {

namespace nn = torch::nn;

// Each stage: bottleneck width and blocks; the first block of stages 2–4 halves the resolution.
struct Stage {
  int64_t width, blocks, stride;
};
constexpr Stage kStages[] = {{64, 3, 1}, {128, 4, 2}, {256, 6, 2}, {512, 3, 2}};
constexpr int64_t kExpansion = 4;

// Output size over `size` pixels of a convolution made by conv() below (square kernel and
// stride, padded by kernel / 2).
int64_t conv_out(const nn::Conv2dImpl& conv, int64_t size) {
  const int64_t kernel = (*conv.options.kernel_size())[0], stride = (*conv.options.stride())[0];
  return (size + 2 * (kernel / 2) - kernel) / stride + 1;
}

// Kaiming-normal with fan out and ReLU's gain, as torchvision initializes its convolutions.
void init_conv(const nn::Conv2d& conv) {
  const auto& w = conv->weight;
  if (w.device().is_meta())
    return;
  torch::NoGradGuard no_grad;
  const double fan_out = static_cast<double>(w.size(0) * w.size(2) * w.size(3));
  w.normal_(0, std::sqrt(2.0 / fan_out));
}

nn::Conv2d conv(int64_t in, int64_t out, int64_t kernel, int64_t stride,
                const torch::TensorOptions& t) {
  nn::Conv2d c = make_conv2d(in, out, kernel, stride, kernel / 2, t);
  init_conv(c);
  return c;
}

} // namespace

BottleneckImpl::BottleneckImpl(int64_t in_channels, int64_t width, int64_t stride,
                               const torch::TensorOptions& t) {
  const int64_t out = width * kExpansion;
  conv1 = register_module("conv1", conv(in_channels, width, 1, 1, t));
  bn1 = register_module("bn1", BatchNorm(width, t));
  conv2 = register_module("conv2", conv(width, width, 3, stride, t));
  bn2 = register_module("bn2", BatchNorm(width, t));
  conv3 = register_module("conv3", conv(width, out, 1, 1, t));
  bn3 = register_module("bn3", BatchNorm(out, t));
  relu = register_module("relu", nn::ReLU());
  if (stride != 1 || in_channels != out) {
    down_conv = register_module("down_conv", conv(in_channels, out, 1, stride, t));
    down_bn = register_module("down_bn", BatchNorm(out, t));
  }
}

torch::Tensor BottleneckImpl::forward(const torch::Tensor& x) {
  torch::Tensor y = relu(bn1(conv1(x)));
  y = relu(bn2(conv2(y)));
  y = bn3(conv3(y));
  const torch::Tensor identity = down_conv ? down_bn(down_conv(x)) : x;
  return relu(y + identity);
}

std::vector<LeafCalls::Call> BottleneckImpl::leaf_calls(at::IntArrayRef in) const {
  const int64_t n = in[0], c = in[1], h = in[2], w = in[3];
  const int64_t width = conv1->options.out_channels(), out = conv3->options.out_channels();
  const int64_t ho = conv_out(*conv2, h), wo = conv_out(*conv2, w);
  const std::vector<int64_t> x{n, c, h, w}, a{n, width, h, w}, b{n, width, ho, wo},
      o{n, out, ho, wo};
  std::vector<Call> calls = {
      {"conv1", conv1.get(), x, a}, {"bn1", bn1.get(), a, a},    {"relu", relu.get(), a, a},
      {"conv2", conv2.get(), a, b}, {"bn2", bn2.get(), b, b},    {"relu", relu.get(), b, b},
      {"conv3", conv3.get(), b, o}, {"bn3", bn3.get(), o, o}};
  if (down_conv) {
    calls.push_back({"down_conv", down_conv.get(), x, o});
    calls.push_back({"down_bn", down_bn.get(), o, o});
  }
  calls.push_back({"add", nullptr, o, o});
  calls.push_back({"relu", relu.get(), o, o});
  return calls;
}

nn::Sequential build_resnet50(const torch::TensorOptions& t) {
  nn::Sequential m;
  m->push_back("conv1", conv(kImageChannels, 64, 7, 2, t));
  m->push_back("bn1", BatchNorm(64, t));
  m->push_back("relu", nn::ReLU());
  m->push_back("maxpool", nn::MaxPool2d(nn::MaxPool2dOptions(3).stride(2).padding(1)));
  int64_t channels = 64;
  for (size_t s = 0; s < std::size(kStages); ++s)
    for (int64_t b = 0; b < kStages[s].blocks; ++b) {
      const int64_t stride = b == 0 ? kStages[s].stride : 1;
      m->push_back(fmt::format("layer{}_{}", s + 1, b),
                   Bottleneck(channels, kStages[s].width, stride, t));
      channels = kStages[s].width * kExpansion;
    }
  m->push_back("avgpool", nn::AdaptiveAvgPool2d(nn::AdaptiveAvgPool2dOptions({1, 1})));
  m->push_back("flatten", nn::Flatten());
  // Elsewhere than meta, drawn on the host as nn::Linear draws it (build_model converts).
  m->push_back("fc", t.device().is_meta() ? make_linear(channels, kImageClasses, true, t)
                                          : nn::Linear(channels, kImageClasses));
  return m;
}

} // namespace meshsim
