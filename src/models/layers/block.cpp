// The pre-norm transformer block.
#include "models/layers/block.h"

#include <stdexcept>

#include "models/layers/dropout.h"

namespace meshsim {

PreNormBlockImpl::PreNormBlockImpl(BlockParts parts)
    : norm1_(std::move(parts.norm1)), norm2_(std::move(parts.norm2)), dropout_(parts.dropout),
      layer_(parts.layer) {
  if (norm1_.is_empty() || norm2_.is_empty() || !parts.attention || !parts.feed_forward)
    throw std::invalid_argument("block: every part (two norms, attention, feed-forward) is needed");
  register_module(parts.norm1_name, norm1_.ptr());
  attn_ = register_module("attn", parts.attention);
  register_module(parts.norm2_name, norm2_.ptr());
  mlp_ = register_module("mlp", parts.feed_forward);
}

torch::Tensor PreNormBlockImpl::forward_plain(const torch::Tensor& x) {
  const bool drop = is_training() && dropout_ > 0;
  torch::Tensor a = attn_->forward(norm1_.forward(x));
  if (drop) a = hidden_dropout(a, dropout_, layer_, DropoutSite::AttentionOutput);
  const torch::Tensor h = x + a;
  a = mlp_->forward(norm2_.forward(h));
  if (drop) a = hidden_dropout(a, dropout_, layer_, DropoutSite::MlpOutput);
  return h + a;
}

void PreNormBlockImpl::add_elementwise_work(LayerWork& total, double rows, double /*gathered*/,
                                            double width, double eb) const {
  for (int add = 0; add < 2; ++add)
    add_elementwise(total, rows * width, 1, 2, 1, eb);
}

} // namespace meshsim
