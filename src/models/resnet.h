// resnet50: torchvision's ResNet-50 (v1.5: the stride of a downsampling block on its 3×3
// convolution) for 3×224×224 images and 1000 classes, 25,557,032 parameters. Its layers are
// one flat Sequential (the stem, the sixteen bottleneck blocks, the pool and the classifier),
// so a pipeline can cut it between blocks.
#pragma once

#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include "models/layers/flops.h"
#include "models/device_layers.h"

namespace meshsim {

/// The images ResNet-50 reads: 3 channels of kImageSize² pixels, kImageClasses labels.
constexpr int64_t kImageChannels = 3;
constexpr int64_t kImageSize = 224;
constexpr int64_t kImageClasses = 1000;

/// One bottleneck block: 1×1 (width), 3×3 (width, `stride`), 1×1 (4 × width) convolutions, each
/// followed by BatchNorm, with ReLU between them and after the residual sum; a 1×1 convolution
/// and BatchNorm carry the input to the sum where its shape changes.
class BottleneckImpl : public torch::nn::Module, public LeafCalls {
public:
  BottleneckImpl(int64_t in_channels, int64_t width, int64_t stride,
                 const torch::TensorOptions& tensors);
  torch::Tensor forward(const torch::Tensor& x);
  std::vector<Call> leaf_calls(at::IntArrayRef in) const override;

private:
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv3{nullptr}, down_conv{nullptr};
  BatchNorm bn1{nullptr}, bn2{nullptr}, bn3{nullptr}, down_bn{nullptr};
  torch::nn::ReLU relu{nullptr};
};
TORCH_MODULE(Bottleneck);

/// ResNet-50 with parameters created with `tensors` (their device and dtype; on meta: shapes
/// only). Elsewhere initialized as torchvision initializes it: convolutions Kaiming-normal
/// (fan out, ReLU gain), BatchNorm weight 1 and bias 0, the classifier as nn::Linear draws it.
torch::nn::Sequential build_resnet50(const torch::TensorOptions& tensors);

} // namespace meshsim
