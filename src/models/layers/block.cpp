// The pre-norm transformer block.
#include "models/layers/block.h"

#include <stdexcept>

namespace meshsim {

PreNormBlockImpl::PreNormBlockImpl(BlockParts parts)
    : norm1_(std::move(parts.norm1)), norm2_(std::move(parts.norm2)) {
  if (norm1_.is_empty() || norm2_.is_empty() || !parts.attention || !parts.feed_forward)
    throw std::invalid_argument("block: every part (two norms, attention, feed-forward) is needed");
  register_module(parts.norm1_name, norm1_.ptr());
  attn_ = register_module("attn", parts.attention);
  register_module(parts.norm2_name, norm2_.ptr());
  mlp_ = register_module("mlp", parts.feed_forward);
}

torch::Tensor PreNormBlockImpl::forward_plain(const torch::Tensor& x) {
  torch::Tensor h = x + attn_->forward(norm1_.forward(x));
  return h + mlp_->forward(norm2_.forward(h));
}

} // namespace meshsim
