// cnn and lenet (models/cnn.h): the layers in PyTorch's creation order, so that the initial
// weights equal PyTorch's for the same seed.
#include "models/cnn.h"

namespace meshsim {

namespace nn = torch::nn;

nn::Sequential build_cnn() {
  nn::Sequential m;
  m->push_back("conv1", nn::Conv2d(nn::Conv2dOptions(1, 32, 3).padding(1)));
  m->push_back("relu1", nn::ReLU());
  m->push_back("pool1", nn::MaxPool2d(2));
  m->push_back("conv2", nn::Conv2d(nn::Conv2dOptions(32, 64, 3).padding(1)));
  m->push_back("relu2", nn::ReLU());
  m->push_back("pool2", nn::MaxPool2d(2));
  m->push_back("flatten", nn::Flatten());
  m->push_back("fc1", nn::Linear(64 * 7 * 7, 128));
  m->push_back("relu3", nn::ReLU());
  m->push_back("fc2", nn::Linear(128, 10));
  return m;
}

nn::Sequential build_lenet(const ModelOptions& o) {
  // Layer creation order (conv1, conv2, fc1, fc2) is PyTorch's example order, so the
  // initial weights match it; dropout has no weights.
  nn::Conv2d conv1(nn::Conv2dOptions(1, 10, 5));
  nn::Conv2d conv2(nn::Conv2dOptions(10, 20, 5));
  nn::Linear fc1(320, 50);
  nn::Linear fc2(50, 10);
  const uint64_t dropout_seed = o.seed * 1000003ULL + static_cast<uint64_t>(o.rank) + 1;
  nn::Sequential m;
  m->push_back("conv1", conv1);
  m->push_back("pool1", nn::MaxPool2d(2));
  m->push_back("relu1", nn::ReLU());
  m->push_back("conv2", conv2);
  m->push_back("conv2_drop", RankDropout(0.5, true, dropout_seed));
  m->push_back("pool2", nn::MaxPool2d(2));
  m->push_back("relu2", nn::ReLU());
  m->push_back("flatten", nn::Flatten());
  m->push_back("fc1", fc1);
  m->push_back("relu3", nn::ReLU());
  m->push_back("drop", RankDropout(0.5, false, dropout_seed + 7919));
  m->push_back("fc2", fc2);
  m->push_back("log_softmax", nn::LogSoftmax(1));
  return m;
}

} // namespace meshsim
