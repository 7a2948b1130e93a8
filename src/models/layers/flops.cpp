// Shape-based FLOP and byte counts for the layers meshsim's models are built from.
#include "models/layers/flops.h"

#include <algorithm>
#include <map>

#include "models/layers/recompute.h"
#include "models/layers/slots.h"

namespace meshsim {
namespace {

// Passes over the attention scores of an unfused attention core (flops.h).
constexpr double kScorePassesForward = 6;
constexpr double kScorePassesBackward = 9;

double numel(at::IntArrayRef shape) {
  double n = 1;
  for (int64_t d : shape)
    n *= static_cast<double>(d);
  return n;
}

int64_t param_bytes_of(const torch::nn::Module& m) {
  int64_t bytes = 0;
  for (const auto& p : m.parameters())
    bytes += p.numel() * static_cast<int64_t>(p.element_size());
  return bytes;
}

LayerWork work(const std::string& name, const char* op, double flops, double bytes,
               int64_t param_bytes = 0, int64_t kernels = 1) {
  LayerWork w{name, op, flops, bytes, param_bytes};
  w.kernels = kernels;
  return w;
}

// FLOPs per element of an elementwise leaf, by its type name; 1 for anything unknown.
double elementwise_flops(const std::string& type) {
  static const std::map<std::string, double> table = {
      {"ReLU", 1}, {"GELU", 8},    {"Tanh", 4},    {"Sigmoid", 4},
      {"SiLU", 5}, {"Dropout", 2}, {"Softmax", 5}, {"LogSoftmax", 5}};
  for (const auto& [key, flops] : table)
    if (type.find(key) != std::string::npos)
      return flops;
  return 1;
}

std::string type_of(const torch::nn::Module& m) {
  const std::string name = m.name(); // e.g. "torch::nn::LinearImpl"
  const auto colon = name.rfind("::");
  return colon == std::string::npos ? name : name.substr(colon + 2);
}

// The [out, in] weight of a Linear-like leaf (torch Linear, or a column/row-parallel
// shard), or an undefined tensor.
torch::Tensor linear_weight(const torch::nn::Module& m) {
  const std::string type = type_of(m);
  if (!m.children().empty() || type.find("Norm") != std::string::npos ||
      type.find("Embedding") != std::string::npos)
    return {};
  return slot_weight(m);
}

bool has_bias(const torch::nn::Module& m) {
  for (const auto& p : m.named_parameters(false))
    if (p.key() == "bias" && p.value().defined()) return true;
  return false;
}

// Whether op-level recomputation keeps the output of `parent`'s Linear child `name`.
bool keeps_linear(const torch::nn::Module& parent, const std::string& name) {
  const auto* keeps = dynamic_cast<const KeepsLinears*>(&parent);
  return keeps && keeps->keeps_linear(name);
}

// A composite module (a transformer block, an attention or MLP module): its normalization
// leaves see `rows` rows, its Linear leaves `rows` × `parts` (sequence parallelism gathers
// the sequence for them); attention modules add their score matmuls over `seq` × `parts`.
void count_composite(const torch::nn::Module& m, double rows, double width, double batch,
                     double seq, double eb, double parts, LayerWork& total) {
  if (const auto* own = dynamic_cast<const ElementwiseWork*>(&m))
    own->add_elementwise_work(total, rows, rows * parts, width, eb);
  const auto* heads = dynamic_cast<const AttentionHeads*>(&m);
  if (heads) {
    // The heads this module computes: all of them, or a tensor-parallel share, as its
    // queries' features say.
    const double d = static_cast<double>(heads->query_features());
    const double dv = static_cast<double>(heads->value_features()); // d but in latent attention
    const double whole = seq * parts;
    // Under context parallelism the queries' tokens see keys of the whole sequence.
    const double keys = whole * static_cast<double>(heads->context_parts());
    // QK^T and AV as one kernel: q, k, v read, the output written.
    const double score_flops = 2 * batch * whole * keys * (d + dv);
    add_gemm(total, score_flops, 2 * rows * parts * (d + dv) * eb);
    if (heads->core_kept_under_op()) { // op-level recomputation keeps its output
      total.kept_core_flops += score_flops;
      total.kept_core_bytes += 2 * rows * parts * (d + dv) * eb;
    }
    if (heads->fused_core())
      total.rerun_flops += 2 * batch * whole * keys * d; // backward's S = QKᵀ again
    else if (heads->head_dim() > 0)
      total.score_bytes += kScorePassesForward * batch * (d / static_cast<double>(heads->head_dim())) *
                           whole * keys * eb;
    total.attention_flops += score_flops;
    total.attention_bytes += 2 * rows * parts * (d + dv) * eb;
  }
  for (const auto& item : m.named_children()) {
    const torch::nn::Module& child = *item.value();
    if (const auto* routed = dynamic_cast<const RoutedWork*>(&child)) {
      routed->add_routed_work(total, eb);
      count_composite(child, rows, width, batch, seq, eb, parts, total); // shared experts
    } else if (const torch::Tensor w = linear_weight(child); w.defined()) {
      // A Linear, or a tensor-parallel shard of one: weight [out, in] as this rank holds it.
      const double out = static_cast<double>(w.size(0));
      const double in = static_cast<double>(w.size(1));
      const double r = rows * parts;
      const double flops = 2 * r * in * out + (has_bias(child) ? r * out : 0);
      const double bytes = (r * in + r * out) * eb + static_cast<double>(param_bytes_of(child));
      add_gemm(total, flops, bytes);
      if (keeps_linear(m, item.key())) { // op-level recomputation keeps its output
        total.kept_flops += flops;
        total.kept_bytes += bytes;
        ++total.kept_gemms;
      }
      width = out;
    } else if (!child.children().empty()) {
      count_composite(child, rows, width, batch, seq, eb, parts, total);
    } else if (const auto* steps = dynamic_cast<const ElementwiseWork*>(&child)) {
      steps->add_elementwise_work(total, rows, rows, width, eb); // RMSNorm
    } else if (type_of(child).find("Norm") != std::string::npos) {
      total.flops += 5 * rows * width;
      total.bytes += 2 * rows * width * eb + static_cast<double>(param_bytes_of(child));
      ++total.kernels;
    } else if (child.parameters().empty()) {
      total.flops += elementwise_flops(type_of(child)) * rows * width;
      total.bytes += 2 * rows * width * eb;
      ++total.kernels;
    } else { // an embedding-like lookup
      total.bytes += rows * width * eb;
      ++total.kernels;
    }
  }
}

} // namespace

void add_gemm(LayerWork& w, double flops, double bytes) {
  w.flops += flops;
  w.bytes += bytes;
  w.gemm_flops += flops;
  w.gemm_bytes += bytes;
  ++w.gemms;
  ++w.kernels;
}

void add_elementwise(LayerWork& w, double elements, double flops_per_element, double read,
                     double written, double eb) {
  add_kernel(w, flops_per_element * elements, (read + written) * elements * eb);
}

void add_kernel(LayerWork& w, double flops, double bytes) {
  w.flops += flops;
  w.bytes += bytes;
  ++w.kernels;
}

LayerWork count_layer(const std::string& name, const torch::nn::Module& m, at::IntArrayRef in,
                      at::IntArrayRef out, double eb, int64_t sequence_parts) {
  const double n_in = numel(in), n_out = numel(out);
  const int64_t pbytes = param_bytes_of(m);
  const double pb = static_cast<double>(pbytes);
  if (const auto* lin = m.as<torch::nn::Linear>()) {
    const double k = static_cast<double>(lin->options.in_features());
    const double n = static_cast<double>(lin->options.out_features());
    const double rows = n_in / k;
    LayerWork w = work(name, "matmul", 0, 0, pbytes, 0);
    add_gemm(w, 2 * rows * k * n + (lin->bias.defined() ? rows * n : 0), (n_in + n_out) * eb + pb);
    return w;
  }
  if (const auto* leaf = dynamic_cast<const MatmulLeaf*>(&m)) { // a tied or vocab-parallel head
    const torch::Tensor weight = leaf->matmul_weight();
    const double k = static_cast<double>(weight.size(1));
    const double n = static_cast<double>(weight.size(0));
    const double rows = n_in / k;
    LayerWork w = work(name, "matmul", 0, 0, pbytes, 0);
    add_gemm(w, 2 * rows * k * n,
             (n_in + rows * n) * eb +
                 static_cast<double>(weight.numel() * static_cast<int64_t>(weight.element_size())));
    return w;
  }
  if (const auto* conv = m.as<torch::nn::Conv2d>()) {
    const auto& o = conv->options;
    const double per_output = static_cast<double>(o.in_channels() / o.groups()) *
                              static_cast<double>((*o.kernel_size())[0] * (*o.kernel_size())[1]);
    LayerWork w = work(name, "matmul", 0, 0, pbytes, 0);
    add_gemm(w, 2 * n_out * per_output + (o.bias() ? n_out : 0), (n_in + n_out) * eb + pb);
    return w;
  }
  const std::string type = type_of(m);
  if (type == "FlattenImpl" || type == "IdentityImpl" || type == "UnflattenImpl")
    return work(name, "elementwise", 0, 0, pbytes, 0); // views: no kernel
  if (type.find("Pool") != std::string::npos) {
    double window = n_out > 0 ? n_in / n_out : 1; // an adaptive pool: the input it averages
    if (const auto* p = m.as<torch::nn::MaxPool2d>())
      window = static_cast<double>((*p->options.kernel_size())[0] * (*p->options.kernel_size())[1]);
    else if (const auto* a = m.as<torch::nn::AvgPool2d>())
      window = static_cast<double>((*a->options.kernel_size())[0] * (*a->options.kernel_size())[1]);
    return work(name, "elementwise", window * n_out, (n_in + n_out) * eb, pbytes);
  }
  if (const auto* steps = dynamic_cast<const ElementwiseWork*>(&m); steps && m.children().empty()) {
    LayerWork w = work(name, "normalization", 0, 0, pbytes, 0); // RMSNorm
    const double width = in.empty() ? 1 : static_cast<double>(in.back());
    steps->add_elementwise_work(w, n_in / width, n_in / width, width, eb);
    return w;
  }
  if (type.find("Norm") != std::string::npos)
    return work(name, "normalization", 5 * n_out, (n_in + n_out) * eb + pb, pbytes);
  if (type.find("Embedding") != std::string::npos)
    return work(name, "elementwise", 0, n_out * eb + n_in * 8, pbytes);
  if (m.children().empty())
    return work(name, "elementwise", elementwise_flops(type) * n_out, (n_in + n_out) * eb, pbytes);
  if (const auto* calls = dynamic_cast<const LeafCalls*>(&m)) {
    LayerWork total = work(name, "matmul", 0, 0, pbytes, 0);
    for (const LeafCalls::Call& call : calls->leaf_calls(in)) {
      const LayerWork leaf =
          call.module ? count_layer(call.name, *call.module, call.in, call.out, eb)
                      : work(call.name, "elementwise", numel(call.out), 3 * numel(call.out) * eb);
      total.flops += leaf.flops;
      total.bytes += leaf.bytes;
      total.kernels += leaf.kernels;
      total.gemms += leaf.gemms;
      total.gemm_flops += leaf.gemm_flops;
      total.gemm_bytes += leaf.gemm_bytes;
    }
    return total;
  }

  // Composite: rows of the input's last dimension (a [B, S, D] transformer block).
  const double width = in.empty() ? 1 : static_cast<double>(in.back());
  const double rows = width > 0 ? n_in / width : 0;
  const double batch = in.size() >= 3 ? static_cast<double>(in[0]) : 1;
  const double seq = in.size() >= 3 ? static_cast<double>(in[in.size() - 2]) : rows;
  LayerWork total = work(name, "matmul", 0, 0, pbytes, 0);
  count_composite(m, rows, width, batch, seq, eb, static_cast<double>(sequence_parts), total);
  return total;
}

std::vector<LayerWork> count_forward(torch::nn::Sequential model, const torch::Tensor& input) {
  torch::NoGradGuard no_grad;
  std::vector<LayerWork> layers;
  torch::Tensor x = input;
  const auto children = model->named_children();
  size_t i = 0;
  for (auto& any : *model) {
    torch::Tensor y = any.forward<torch::Tensor>(x);
    layers.push_back(count_layer(children[i].key(), *children[i].value(), x.sizes(), y.sizes()));
    x = y;
    ++i;
  }
  return layers;
}

namespace {

// What a layer's backward runs again of its forward: in the forward's proportions of GEMMs its
// whole forward under full recompute, the attention core (one kernel) under selective, all
// but the kept Linears and a kept core under op-level recomputation; plus in every case a
// fused attention core's scores (GEMM work on top of the rest; alone, one kernel,
// FlashAttention-2's backward preprocessing).
struct Rerun {
  double flops = 0, bytes = 0, gemm_flops = 0, gemm_bytes = 0;
  double linear_flops = 0; // of gemm_flops, the linear GEMMs'
  int64_t kernels = 0, gemms = 0;
};

Rerun rerun_of(const LayerWork& w, double linear_flops) {
  Rerun r;
  if (w.keeps_matmuls) {
    const int64_t kept_kernels = w.kept_gemms + (w.kept_core_flops > 0 ? 1 : 0);
    const double kept_flops = w.kept_flops + w.kept_core_flops;
    const double kept_bytes = w.kept_bytes + w.kept_core_bytes;
    r.flops = w.rerun_flops + std::max(0.0, w.flops - kept_flops);
    r.bytes = w.rerun_bytes + std::max(0.0, w.bytes - kept_bytes);
    r.gemm_flops = std::max(0.0, w.gemm_flops - kept_flops) + w.rerun_flops;
    r.gemm_bytes = std::max(0.0, w.gemm_bytes - kept_bytes) + w.rerun_bytes;
    r.linear_flops = std::max(0.0, linear_flops - w.kept_flops);
    r.kernels = std::max<int64_t>(0, w.kernels - kept_kernels);
    r.gemms = std::max<int64_t>(0, w.gemms - kept_kernels);
    return r;
  }
  const bool whole = w.flops > 0 && w.rerun_flops / w.flops > 0.999;
  r.flops = w.rerun_flops;
  r.bytes = w.rerun_bytes;
  r.gemm_flops = whole ? w.gemm_flops + std::max(0.0, w.rerun_flops - w.flops) : w.rerun_flops;
  r.gemm_bytes = whole ? w.gemm_bytes + std::max(0.0, w.rerun_bytes - w.bytes) : w.rerun_bytes;
  r.linear_flops = whole ? linear_flops : 0;
  r.kernels = whole ? w.kernels : (w.rerun_flops > 0 ? 1 : 0);
  r.gemms = whole ? w.gemms : (w.rerun_flops > 0 ? 1 : 0);
  return r;
}

} // namespace

std::vector<LayerWork> backward_work(const std::vector<LayerWork>& forward) {
  std::vector<LayerWork> backward(forward.rbegin(), forward.rend());
  for (LayerWork& w : backward) {
    const bool gemm = w.op == "matmul" || w.op == "attention";
    const double linear_flops = std::max(0.0, w.gemm_flops - w.attention_flops);
    const Rerun again = rerun_of(w, linear_flops);
    const bool reruns = w.flops > 0 && again.flops > 0;
    w.recompute_flops = again.flops;
    w.recompute_bytes = again.bytes;
    w.rerun_flops = w.rerun_bytes = 0;
    w.flops = w.flops * (gemm ? 2 : 1) + w.recompute_flops;
    w.bytes = w.bytes * 2 + w.recompute_bytes;
    // Each GEMM's backward is two (the gradient of its input and of its weight); every other
    // kernel has one backward kernel.
    w.kernels = w.kernels + w.gemms + again.kernels;
    w.gemms = 2 * w.gemms + again.gemms;
    // The attention core's share of the backward's GEMMs: all but the linear GEMMs' backward
    // (two of each) and those of them run again (all under full recompute).
    w.gemm_flops = 2 * w.gemm_flops + again.gemm_flops;
    if (w.attention_flops > 0)
      w.attention_flops = std::max(0.0, w.gemm_flops - 2 * linear_flops - again.linear_flops);
    w.gemm_bytes = 2 * w.gemm_bytes + again.gemm_bytes;
    // Every recompute mode runs the attention core again (but op-level's of a kept core).
    w.score_bytes = w.score_bytes * (kScorePassesBackward / kScorePassesForward) +
                    (reruns ? w.score_bytes : 0);
  }
  return backward;
}

std::vector<LayerWork> backward_work(const std::vector<LayerWork>& forward,
                                     const LayerWork& loss) {
  std::vector<LayerWork> backward{loss};
  for (LayerWork& w : backward_work(forward)) backward.push_back(std::move(w));
  return backward;
}

LayerWork optimizer_work(int64_t params, const std::string& optimizer, bool momentum,
                         int64_t tensors) {
  const double n = static_cast<double>(params);
  if (optimizer == "adam")
    return work("adam", "optimizer", 12 * n, 28 * n, 0, tensors);
  return momentum ? work("sgd", "optimizer", 4 * n, 20 * n, 0, tensors)
                  : work("sgd", "optimizer", 2 * n, 12 * n, 0, tensors);
}

void attach_work(ComputeRecord& record, std::vector<LayerWork> layers) {
  std::map<std::string, double> by_op;
  record.flops = record.bytes = record.recompute_flops = 0;
  for (const LayerWork& w : layers) {
    record.flops += w.flops;
    record.recompute_flops += w.recompute_flops;
    record.bytes += w.bytes;
    by_op[w.op] += w.flops;
  }
  double best = -1;
  for (const auto& [op, flops] : by_op)
    if (flops > best)
      best = flops, record.op = op;
  record.layers = std::move(layers);
}

} // namespace meshsim
