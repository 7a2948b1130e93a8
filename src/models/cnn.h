// The two small convolutional nets for 28×28 grey images: cnn, the original project's
// Fashion-MNIST network (421,642 parameters), and lenet, the classic MNIST net of PyTorch's
// DDP/MNIST examples. Built on the host only (models/family.h: builds_on_meta is false).
#pragma once

#include <torch/torch.h>

#include "models/models.h"

namespace meshsim {

/// conv 1→32, pool, conv 32→64, pool, fc 3136→128, fc 128→10, in PyTorch's layer order.
torch::nn::Sequential build_cnn();

/// conv 1→10 (5×5), conv 10→20 with channel dropout, fc 320→50 with dropout, fc 50→10 and
/// log-softmax; the dropouts draw from generators seeded by `options.seed` and `options.rank`.
torch::nn::Sequential build_lenet(const ModelOptions& options);

} // namespace meshsim
