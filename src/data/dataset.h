// Training data for meshsim: the IDX (MNIST-format) reader used for Fashion-MNIST, the
// normalization that turns raw pixels into model inputs, and a synthetic stand-in data set
// for machines without the real files.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "base/errors.h"

namespace meshsim {

/// Normalization constants: mean and std of Fashion-MNIST's training pixels scaled to [0,1].
constexpr double kFashionMnistMean = 0.2860;
constexpr double kFashionMnistStd = 0.3530;
constexpr int64_t kImageSide = 28;
constexpr int64_t kNumClasses = 10;

struct Dataset {
  torch::Tensor images; // [N,1,28,28] float32, normalized (pixel/255 - 0.2860)/0.3530, or
                        // synthetic_images' [N,C,S,S]
  torch::Tensor labels; // [N] int64
  int64_t size() const;
};

struct DataSplit {
  Dataset train;
  Dataset test;
};

/// Raw IDX file (gzip-compressed or raw, detected by the gzip magic 1f 8b) -> uint8 tensor with
/// the file's dims (idx3 -> [N,28,28], idx1 -> [N]). Throws DataError naming the file for a
/// missing file, truncated or over-long data, wrong magic, unsupported type code, absurd dims,
/// or a corrupt gzip stream.
torch::Tensor read_idx(const std::string& path);

/// Loads the four Fashion-MNIST files from `dir` (each with or without .gz; the uncompressed one
/// wins when both exist). Throws DataError for a missing folder or file, images that are not
/// 28x28, label/image counts that disagree, and labels outside 0..9.
DataSplit load_idx_dataset(const std::string& dir);

/// Validates and normalizes raw uint8 tensors ([N,28,28] images, [N] labels) into a Dataset.
/// `what` names the source in error messages.
Dataset make_dataset(const torch::Tensor& images_u8, const torch::Tensor& labels_u8,
                     const std::string& what);

/// Deterministic, learnable 10-class data of the same shape and normalization: one smooth random
/// prototype per class, plus per-sample contrast jitter and pixel noise. Same seed -> identical
/// tensors; train and test share prototypes but not noise.
DataSplit synthetic_dataset(int64_t train_size, int64_t test_size, uint64_t seed);

/// Normalized noise images [N, channels, side, side] (standard normal) with uniform labels in
/// 0..classes-1: the shapes of an image data set, nothing to learn (ResNet-50's timing and
/// memory). Same seed -> identical tensors.
DataSplit synthetic_images(int64_t train_size, int64_t test_size, int64_t channels, int64_t side,
                           int64_t classes, uint64_t seed);

/// images.index_select(0, idx), labels.index_select(0, idx) for the given sample indices.
std::pair<torch::Tensor, torch::Tensor> gather_batch(const Dataset& d,
                                                     const std::vector<int64_t>& indices);

} // namespace meshsim
