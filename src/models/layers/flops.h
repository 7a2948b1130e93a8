// FLOPs and bytes of a model's layers, counted from tensor shapes.
//
// LibTorch has no forward hooks, so the counts come from the shapes each layer sees: the
// caller runs a Sequential's children one by one (Replica::forward_backward does) and asks
// for each child's work, or count_forward() does that on a real input. Conventions (all
// fp32 unless `elem_bytes` says otherwise; docs/cost-model.md lists them):
//  - Linear(in, out) on T rows: 2·T·in·out FLOPs (+ T·out for the bias); bytes = input +
//    weight + bias + output.
//  - Conv2d: 2·N·Cout·Hout·Wout·(Cin/groups)·kh·kw (+ the bias per output element); bytes
//    as Linear.
//  - attention (a module implementing AttentionHeads, or one with children q, k, v): QK^T
//    and AV, 4·B·S²·D FLOPs (D = heads·head_dim), bytes of q, k, v and the output once.
//  - its core, by what AttentionHeads::fused_core() says it is:
//    eager: the scores go through memory (score_bytes, below);
//    fused (FlashAttention-2's algorithm, fused_core.h): they never reach memory, and
//    backward computes S = QKᵀ again before its four GEMMs (dV = PᵀdO, dP = dO Vᵀ,
//    dQ = dS K, dK = dSᵀ Q, 2·B·S²·D each): 2·B·S²·D more FLOPs, recorded as recomputation
//    (the forward's rerun_flops), with no bytes (q and k are read once for both).
//  - LayerNorm/BatchNorm/GroupNorm: 5 FLOPs per element; ReLU 1, GELU 8, dropout 2,
//    softmax 5, pooling kh·kw per output element; bytes = input + output (+ parameters).
//  - a mixture of experts (RoutedWork): the router, 2·N·H·E, and the routed experts' three
//    projections, each one grouped GEMM over the experts that ran (as Megatron's grouped GEMM
//    and torch._grouped_mm run them), 2·Σn_e·H·F, with the weights of the experts that ran;
//    and its memory-bound kernels, one each: the router's softmax and top k (N·E read and
//    written), the n = Σn_e rows copied into expert order (n·H read and written), SwiGLU's
//    SiLU and product on n·F, each output weighted and summed back into the R rows that
//    arrived (n·H read, R·H written), and the shared experts' output added;
//  - views (Flatten, Identity): nothing.
//  - the loss: not a layer; the loss that ran counts its own kernels, forward and backward
//    (LossWork; parallel/strategy.h's TrainingLoss).
//  - elementwise kernels a composite runs outside its children (ElementwiseWork): a block's
//    two residual adds (1 FLOP per element, two tensors read, one written), SwiGLU's SiLU (5,
//    one read, one written) and product (1, two read, one written), the rotation of q and k
//    (3: x·cos + rotate(x)·sin, x read and written), RMSNorm (as any norm). Those are fused
//    kernels; counted eager (ElementwiseWork::set_eager_kernels, --elementwise eager), the
//    rotation is its five ops and RMSNorm its eight (models/layers/norms.h), each a kernel.
//  - attention score traffic (LayerWork::score_bytes): what an attention core without a fused
//    kernel moves through memory, B·heads·T² elements per pass: written by QKᵀ, read and
//    written by softmax and by dropout, read by AV (6 passes forward); written by dP, read and
//    written by dropout's backward, read twice and written by softmax's, read by dQ, dK and
//    dV (9 passes backward). Only the eager core records them; the prediction adds what was
//    recorded (a fused core keeps them on chip and records none).
//  - kernels: one per leaf (a Linear, convolution, norm, activation, lookup), one for a fused
//    attention core; of them the Linears, convolutions and attention cores are GEMMs, whose
//    flops and bytes LayerWork::gemm_flops and gemm_bytes carry apart.
//  - backward = 2× forward FLOPs for matmul and attention (grad of input and of weight),
//    1× for the rest; 2× the bytes for every layer; two kernels per GEMM, one per other
//    kernel; plus, once, the forward work that
//    activation recomputation runs again (a forward's LayerWork::rerun_flops and _bytes become
//    the backward's recompute_flops and _bytes). Op-level recomputation runs the whole forward
//    again but what it keeps: the Linears a KeepsLinears module names and a fused core
//    (LayerWork::kept_*, counted for every layer, used when keeps_matmuls is set).
#pragma once

#include <string>
#include <vector>

#include <torch/torch.h>

#include "comm/recorder.h"

namespace meshsim {

/// Implemented by a mixture of experts (models/layers/moe.h): the work of its router and its
/// routed experts in its last forward, which the routing decides and shapes alone cannot say
/// (each expert runs the tokens sent to it). Its shared experts are counted as any MLP.
class RoutedWork {
public:
  virtual ~RoutedWork() = default;
  /// Adds that work to `total`, elements of `element_bytes` bytes.
  virtual void add_routed_work(LayerWork& total, double element_bytes) const = 0;
};

/// One GEMM kernel (a Linear, a convolution, the attention core, an expert's matmul) added to
/// `w`: its flops and bytes, in the totals and the GEMM share, and one kernel.
void add_gemm(LayerWork& w, double flops, double bytes);

/// One memory-bound kernel added to `w`: `elements` outputs of `flops_per_element` FLOPs each,
/// reading `read` and writing `written` tensors of `elements` elements.
void add_elementwise(LayerWork& w, double elements, double flops_per_element, double read,
                     double written, double eb);

/// One memory-bound kernel of `flops` that moves `bytes` (a cast reads and writes two widths).
void add_kernel(LayerWork& w, double flops, double bytes);

/// Implemented by composite modules whose forward runs elementwise kernels outside any child
/// module, which counting by modules would not see: a block's residual adds, SwiGLU's
/// activation and product, the rotation of q and k. `rows`: the rows of the module's input
/// (sequence-parallel: this rank's part), `gathered`: the rows its Linears see, `width`: its
/// input's features. Each add_elementwise is one kernel as the module runs it: one kernel a
/// step as a fused run (torch.compile, Transformer Engine) runs it, or, with
/// set_eager_kernels, every op of the module's own forward as eager PyTorch launches it (a
/// leaf module, RMSNorm, is counted by this instead of as a norm).
class ElementwiseWork {
public:
  virtual ~ElementwiseWork() = default;
  virtual void add_elementwise_work(LayerWork& total, double rows, double gathered, double width,
                                    double eb) const = 0;
  void set_eager_kernels(bool eager) { eager_kernels_ = eager; }
  bool eager_kernels() const { return eager_kernels_; }

private:
  bool eager_kernels_ = false;
};

/// Implemented by attention modules (models/layers/attention.h), which is how the counts find
/// attention: the width of one head, so that they know the [B, heads, T, T] score matrices an
/// attention core without a fused kernel writes, and the features of the queries this module
/// computes (all heads, or a tensor-parallel share of them).
class AttentionHeads {
public:
  virtual ~AttentionHeads() = default;
  virtual int64_t head_dim() const = 0;
  /// heads · head_dim of the queries this module computes.
  virtual int64_t query_features() const = 0;
  /// heads · the values' width (multi-head latent attention's differs from the queries').
  virtual int64_t value_features() const { return query_features(); }
  /// Its core is fused (AttentionCore::fused): no score traffic, the scores recomputed in
  /// backward.
  virtual bool fused_core() const { return false; }
  /// How many times its queries' tokens the keys span (context parallelism: the cp size).
  virtual int64_t context_parts() const { return 1; }
  /// Whether op-level recomputation keeps its core's output rather than run the core again.
  virtual bool core_kept_under_op() const { return fused_core(); }
};

/// Implemented by composite modules whose leaves see tensors of different shapes (a ResNet
/// block, whose convolutions change the channels and the resolution): the leaves it runs for
/// an input of shape `in`, in order, each with the shapes it sees. count_layer counts each
/// like a top-level leaf and sums them. A call without a module is an elementwise sum of two
/// tensors of its output shape (a residual connection): 1 FLOP per element, two read and one
/// written.
class LeafCalls {
public:
  struct Call {
    std::string name;
    const torch::nn::Module* module = nullptr;
    std::vector<int64_t> in, out;
  };
  virtual ~LeafCalls() = default;
  virtual std::vector<Call> leaf_calls(at::IntArrayRef in) const = 0;
};

/// Forward work of `module` (named `name`) that turned an input of shape `in` into one of
/// shape `out`. Composite modules other than Sequential are counted from their leaves,
/// assuming every leaf sees rows of the input's last dimension (a transformer block). Under
/// sequence parallelism a block's input [B, S/k, D] is one of `sequence_parts` = k parts of
/// the sequence: its normalizations run on that part, its Linears and attention on the whole
/// sequence, gathered.
LayerWork count_layer(const std::string& name, const torch::nn::Module& module, at::IntArrayRef in,
                      at::IntArrayRef out, double elem_bytes = 4, int64_t sequence_parts = 1);

/// Forward work of every child of `model` for `input`, running the children one by one
/// (under NoGradGuard) to learn the shapes.
std::vector<LayerWork> count_forward(torch::nn::Sequential model, const torch::Tensor& input);

/// The backward of `forward`: the layers last to first, with the factors above and each
/// layer's recomputed forward work.
std::vector<LayerWork> backward_work(const std::vector<LayerWork>& forward);

/// A loss's kernels, forward and backward, counted by the loss itself (its backward is not
/// backward_work's rule of twice the forward's bytes).
struct LossWork {
  LayerWork forward, backward;
};

/// A backward that starts from a loss: the loss's own backward kernels, then
/// backward_work(forward).
std::vector<LayerWork> backward_work(const std::vector<LayerWork>& forward,
                                     const LayerWork& loss);

/// One optimizer step over `params` parameters: Adam reads p, g, m, v and writes p, m, v
/// (28 bytes, ~12 FLOPs per fp32 parameter); SGD reads p, g (and the momentum buffer) and
/// writes p (and it): 12 or 20 bytes, 2 or 4 FLOPs. One kernel per parameter tensor
/// (`tensors`; 0 when unknown).
LayerWork optimizer_work(int64_t params, const std::string& optimizer, bool momentum,
                         int64_t tensors = 0);

/// Sums `layers` into `record` (flops, bytes, op = the class with most FLOPs, layers).
void attach_work(ComputeRecord& record, std::vector<LayerWork> layers);

} // namespace meshsim
