// The models meshsim trains: plain LibTorch modules in a Sequential, so strategies can wrap
// them unmodified and a pipeline can cut them between layers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

namespace meshsim {

/// A mixture of experts in the llama's feed-forward (models/layers/moe.h), in every layer from
/// `dense_layers` on; 0 experts: every layer dense.
struct MoeShape {
  int64_t experts = 0;       // routed experts per MoE layer
  int64_t top_k = 2;         // experts per token
  int64_t ffn = 0;           // each routed expert's width; 0: the dense MLP's
  int64_t shared_ffn = 0;    // the shared experts' total width; 0: none
  int64_t dense_layers = 0;  // the first layers keep the dense MLP (DeepSeek's first_k_dense)
  std::string router = "softmax"; // softmax | sigmoid
  bool normalize = true;     // the chosen experts' weights sum to 1
  double routed_scale = 1;   // the routed output's factor
  int64_t groups = 1, top_groups = 1; // group-limited routing (sigmoid)
  double aux_loss = 0.01;    // the balancing loss's coefficient (Switch's α)
  double capacity_factor = 0; // 0: dropless
  /// Plans (meta tensors, which have no values to route): each expert's share of a layer's
  /// assignments, the same on every rank (plan/moe_routing.h); empty: balanced, k·N/E each.
  std::vector<double> planned_shares;
  std::string planned_routing; // what those shares assume, in one line (plan.json's "routing")
};

/// A scaling of the rotary frequencies (Hugging Face's rope_type), factor 0: unscaled.
///  - llama3 (Llama 3.1): frequencies whose wavelength exceeds original_max / low_freq_factor
///    are divided by `factor`, those below original_max / high_freq_factor kept, those between
///    interpolated smoothly;
///  - yarn (Peng et al. 2023, DeepSeek-V3): each frequency blends its interpolated value (/
///    factor) and its own by a linear ramp over the dimensions that turn between beta_fast and
///    beta_slow times in original_max positions; cos and sin are multiplied by the attention
///    factor mscale(factor, mscale) / mscale(factor, mscale_all_dim) (mscale(s, m) = 0.1·m·ln s
///    + 1), and the softmax of multi-head latent attention by mscale(factor, mscale_all_dim)².
struct RopeScaling {
  double factor = 0;
  double low_freq_factor = 1, high_freq_factor = 4;
  int64_t original_max = 8192; // original_max_position_embeddings
  bool yarn = false;           // rope_type yarn instead of llama3
  double beta_fast = 32, beta_slow = 1;
  double mscale = 0, mscale_all_dim = 0; // 0: absent
  bool operator==(const RopeScaling& o) const {
    return factor == o.factor && low_freq_factor == o.low_freq_factor &&
           high_freq_factor == o.high_freq_factor && original_max == o.original_max &&
           yarn == o.yarn && beta_fast == o.beta_fast && beta_slow == o.beta_slow &&
           mscale == o.mscale && mscale_all_dim == o.mscale_all_dim;
  }
};

/// Multi-head latent attention (DeepSeek-V2 and V3; models/layers/attention.h): q from a
/// low-rank projection (q_rank, 0: one projection) with its RMSNorm, keys and values from one
/// shared latent of kv_rank with its RMSNorm, each head's query and key nope_dim wide without
/// position plus rope_dim rotated (the key's rotated part one for every head), values v_dim
/// wide. kv_rank 0: ordinary attention.
struct LatentShape {
  int64_t q_rank = 0;      // q_lora_rank
  int64_t kv_rank = 0;     // kv_lora_rank
  int64_t nope_dim = 0;    // qk_nope_head_dim
  int64_t rope_dim = 0;    // qk_rope_head_dim
  int64_t v_dim = 0;       // v_head_dim
  bool interleave = true;  // rope_interleave: the rotated part's pairs are adjacent (x0, x1)
  bool operator==(const LatentShape& o) const {
    return q_rank == o.q_rank && kv_rank == o.kv_rank && nope_dim == o.nope_dim &&
           rope_dim == o.rope_dim && v_dim == o.v_dim && interleave == o.interleave;
  }
};

/// The decoder-only transformers, gpt (models/gpt.h) and llama (models/llama.h). Defaults: a
/// tiny byte-level model.
struct TransformerShape {
  int64_t layers = 2, hidden = 64, heads = 4, seq_len = 64, vocab = 256;
  bool tie_head = false; // the head uses the embedding's wte weight (listed once)
  int64_t kv_heads = 0;      // key/value heads (llama, grouped-query attention); 0: heads
  int64_t ffn_hidden = 0;    // the MLP's inner width; 0: the family's default
  double rope_theta = 10000; // llama's rotary base
  // The llama's variants that Hugging Face configs describe (models/hf_config.h).
  int64_t head_dim = 0;     // each head's width; 0: hidden / heads
  bool qkv_bias = false;    // biases on q, k and v (Qwen2's; attention_bias)
  bool out_bias = false;    // a bias on the output projection (attention_bias)
  bool qk_norm = false;     // an RMSNorm over each head of q and of k before rotary (Qwen3)
  double norm_eps = 1e-5;   // every RMSNorm's epsilon (rms_norm_eps)
  RopeScaling rope_scaling{}; // llama3 or yarn scaling of the rotary frequencies
  LatentShape latent{};     // multi-head latent attention (DeepSeek's); kv_rank 0: none
  /// Dropout in training on the attention probabilities and on the attention's and the MLP's
  /// outputs before their residual adds (Megatron's attention_dropout and hidden_dropout;
  /// models/layers/dropout.h); 0: none. Set from --dropout, not a part of the shape's identity.
  double dropout = 0;
  MoeShape moe{};
};

/// What a transformer keeps for backward (Korthikanti et al. 2022): None keeps every
/// activation; Selective recomputes the attention core (q kᵀ, softmax, attention over v) in
/// backward and keeps the rest; Op is torchtitan's op-level selective checkpointing, which
/// keeps a block's input and the outputs of every other matmul and of the attention kernel
/// and recomputes the rest of the block in backward (models/layers/recompute.h); Full keeps
/// only each block's input and recomputes the block.
enum class Recompute { None, Selective, Op, Full };

/// "none" | "selective" | "op" | "full" (--recompute). Throws std::invalid_argument for another
/// name.
Recompute parse_recompute(const std::string& name);

/// Why --recompute op refuses --tp 2 and more: the column-parallel q, k and v share one
/// gathered input (parallel/tensor/tensor_parallel.h), which the recompute, taking q's and v's
/// kept outputs, would gather for k alone.
inline constexpr const char* kRecomputeOpNeedsTp1 =
    "--recompute op needs --tp 1: under tensor parallelism q, k and v share one gathered input, "
    "which the recompute would gather for k alone (not built yet)";

/// The attention core of every attention module (--attention): Eager keeps the [B, heads, T, T]
/// softmax for backward (models/layers/eager_core.h); Fused keeps q, k, v, the output and one
/// log-sum-exp per row and recomputes the scores in backward (models/layers/fused_core.h).
enum class AttentionKind { Eager, Fused };

/// "eager" | "fused" (--attention). Throws std::invalid_argument for another name.
AttentionKind parse_attention(const std::string& name);

struct ModelOptions {
  uint64_t seed = 0; // torch::manual_seed(seed) before the layers are built
  int rank = 0;      // seeds this rank's dropout generator
  TransformerShape shape;    // used by "gpt" and "llama"
  /// Parameters' dtype. The weights are drawn in float32 as PyTorch draws them and then
  /// converted, so a float64 model starts from the float32 one's weights, widened.
  torch::Dtype dtype = torch::kFloat32;
  /// Where the parameters live. kMeta (for plans): created there directly in `dtype`, shapes
  /// only, nothing drawn and no host memory; only gpt, llama and resnet50 can (ModelFamily::builds_on_meta). Another
  /// device (CUDA): built on the CPU as above, then moved, so the weights equal the CPU's.
  torch::Device device = torch::kCPU;
  /// Whole parameters to start from instead of the seed's draw (meshsim train --init-from),
  /// by parameter name: every parameter of the model, of its shape, copied after the build
  /// and before the conversion to `dtype`, so that every layout splits the same weights.
  /// Ignored on the meta device.
  std::shared_ptr<const std::vector<std::pair<std::string, torch::Tensor>>> initial{};
  /// The core installed in every attention module (gpt, llama). Eager here, the library's
  /// default; `meshsim train` and `plan` default to fused (TrainConfig::attention). Last, so
  /// that positional initializers of the fields above stay valid.
  AttentionKind attention = AttentionKind::Eager;
  /// The counts take each module's elementwise steps op by op, as eager PyTorch runs them
  /// (ElementwiseWork::set_eager_kernels), instead of one fused kernel a step.
  bool eager_elementwise = false;
};

/// Builds the model in PyTorch's layer order after torch::manual_seed(seed), so its initial
/// weights equal PyTorch's for the same seed (resnet50: drawn from torchvision's
/// distributions, not its sequence). Throws std::invalid_argument for unknown names and for
/// cnn or lenet on the meta device.
torch::nn::Sequential build_model(const std::string& name, const ModelOptions& options);

/// parameters() with each tensor listed once (LibTorch 1.13's parameters() does not dedupe
/// a tensor registered under two names, unlike PyTorch's), in first-seen order.
std::vector<torch::Tensor> unique_parameters(const torch::nn::Module& module);

/// Number of scalar parameters, each shared tensor counted once.
int64_t count_parameters(const torch::nn::Module& module);

/// Dropout that draws from its own generator (seeded per rank), so ranks running as threads
/// do not share, and race on, the global generator. `channelwise` is Dropout2d.
class RankDropoutImpl : public torch::nn::Module {
public:
  RankDropoutImpl(double p, bool channelwise, uint64_t seed);
  torch::Tensor forward(const torch::Tensor& x);
  at::Generator& generator() { return generator_; }

private:
  double p_;
  bool channelwise_;
  at::Generator generator_;
};
TORCH_MODULE(RankDropout);

/// The states of every RankDropout generator in `model`, in module order, as one uint8
/// tensor (empty when there are none), and its inverse. Checkpoints carry them, so that a
/// resumed run draws the masks an uninterrupted one would.
torch::Tensor dropout_rng_state(torch::nn::Module& model);
void set_dropout_rng_state(torch::nn::Module& model, const torch::Tensor& state);

} // namespace meshsim
