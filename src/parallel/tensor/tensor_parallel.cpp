// Megatron's mappings and parallel Linears, and the function that applies a plan to a model.
#include "parallel/tensor/tensor_parallel.h"

#include <map>
#include <set>
#include <stdexcept>
#include <unordered_map>

#include "models/layers/attention.h"
#include "models/layers/slots.h"
#include "models/models.h"
#include "parallel/autograd_group.h"
#include "parallel/tensor/sequence_parallel.h"

namespace meshsim {
namespace {

namespace nn = torch::nn;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

void all_reduce_saved(AutogradContext* ctx, torch::Tensor& t) {
  saved_comm(ctx).all_reduce(t, ReduceOp::Sum, saved_group(ctx));
}

struct CopyToRegion : public torch::autograd::Function<CopyToRegion> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, Communicator* comm,
                               const Group* group) {
    save_group(ctx, comm, *group);
    return x; // autograd turns a returned input into a view of it: no copy
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    torch::Tensor g = grads[0].clone();
    all_reduce_saved(ctx, g);
    return {g, torch::Tensor(), torch::Tensor()};
  }
};

struct ReduceFromRegion : public torch::autograd::Function<ReduceFromRegion> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, Communicator* comm,
                               const Group* group) {
    save_group(ctx, comm, *group);
    torch::Tensor y = x.clone();
    all_reduce_saved(ctx, y);
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {grads[0], torch::Tensor(), torch::Tensor()};
  }
};

// Megatron's gather_from_tensor_model_parallel_region: forward all-gathers the members'
// slices along the last dimension, backward keeps this member's slice of the gradient.
struct GatherFromRegion : public torch::autograd::Function<GatherFromRegion> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, Communicator* comm,
                               const Group* group, int64_t index) {
    ctx->saved_data["index"] = index;
    ctx->saved_data["parts"] = static_cast<int64_t>(group->size());
    const torch::Tensor all = comm->all_gather(x.contiguous(), *group); // [n, *x]
    return torch::cat(all.unbind(0), -1);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const int64_t index = ctx->saved_data["index"].toInt();
    const int64_t width = grads[0].size(-1) / ctx->saved_data["parts"].toInt();
    return {grads[0].narrow(-1, index * width, width).contiguous(), torch::Tensor(),
            torch::Tensor(), torch::Tensor()};
  }
};

} // namespace

torch::Tensor gather_from_region(const torch::Tensor& x, Communicator& comm, const Group& group,
                                 int index) {
  if (group.size() == 1)
    return x;
  return GatherFromRegion::apply(x, &comm, &group, static_cast<int64_t>(index));
}

torch::Tensor copy_to_region(const torch::Tensor& x, Communicator& comm, const Group& group) {
  if (group.size() == 1)
    return x;
  return CopyToRegion::apply(x, &comm, &group);
}

torch::Tensor reduce_from_region(const torch::Tensor& x, Communicator& comm, const Group& group) {
  if (group.size() == 1)
    return x;
  return ReduceFromRegion::apply(x, &comm, &group);
}

// Hands each of `consumers` column layers the same copy_to_region of their common input (under
// sequence parallelism, the same gather_to_tensor_region), then forgets it, so nothing stays
// referenced between steps (a checkpointed block must not keep activations alive). A
// different input (another tensor, or the same one modified) gets a fresh copy, so sharing
// can never return a stale value.
class RegionInput {
public:
  RegionInput(Communicator& comm, Group group, int consumers, bool sequence_parallel = false)
      : comm_(comm), group_(std::move(group)), consumers_(consumers),
        sequence_parallel_(sequence_parallel && group_.size() > 1),
        regather_(comm, group_, consumers) {}

  bool sequence_parallel() const { return sequence_parallel_; }
  int64_t group_size() const { return group_.size(); }
  SequenceRegather& regather() { return regather_; }

  torch::Tensor get(const torch::Tensor& x) {
    if (uses_left_ > 0 && x.unsafeGetTensorImpl() == input_.unsafeGetTensorImpl() &&
        x._version() == version_) {
      torch::Tensor out = output_;
      if (--uses_left_ == 0)
        input_ = output_ = torch::Tensor();
      return out;
    }
    torch::Tensor out = sequence_parallel_ ? gather_to_tensor_region(x, comm_, group_)
                                           : copy_to_region(x, comm_, group_);
    uses_left_ = consumers_ - 1;
    if (uses_left_ > 0) {
      input_ = x;
      output_ = out;
      version_ = x._version();
    } else {
      input_ = output_ = torch::Tensor();
    }
    return out;
  }

private:
  Communicator& comm_;
  Group group_;
  int consumers_;
  bool sequence_parallel_;
  SequenceRegather regather_;
  int uses_left_ = 0;
  torch::Tensor input_, output_;
  uint32_t version_ = 0;
};

ColumnParallelLinearImpl::ColumnParallelLinearImpl(torch::Tensor w, torch::Tensor b,
                                                   Communicator& comm, Group group,
                                                   std::shared_ptr<RegionInput> input)
    : input_(input ? std::move(input) : std::make_shared<RegionInput>(comm, std::move(group), 1)) {
  weight = register_parameter("weight", std::move(w));
  if (b.defined())
    bias = register_parameter("bias", std::move(b));
}

torch::Tensor ColumnParallelLinearImpl::forward(const torch::Tensor& x) {
  if (input_->sequence_parallel()) // keeps x, this member's part, for backward, not the whole
    return gathered_linear(input_->get(x), x, weight, bias, input_->regather());
  return nn::functional::linear(input_->get(x), weight, bias);
}

int64_t ColumnParallelLinearImpl::sequence_parts() const {
  return input_->sequence_parallel() ? input_->group_size() : 1;
}

RowParallelLinearImpl::RowParallelLinearImpl(torch::Tensor w, torch::Tensor b, Communicator& comm,
                                             Group group, bool sequence_parallel)
    : comm_(comm), group_(std::move(group)), sequence_parallel_(sequence_parallel) {
  weight = register_parameter("weight", std::move(w));
  if (b.defined())
    bias = register_parameter("bias", std::move(b));
}

torch::Tensor RowParallelLinearImpl::forward(const torch::Tensor& x) {
  const torch::Tensor partial = nn::functional::linear(x, weight);
  torch::Tensor y = sequence_parallel_ ? reduce_scatter_to_sequence_region(partial, comm_, group_)
                                       : reduce_from_region(partial, comm_, group_);
  return bias.defined() ? y + bias : y; // once, after the sum: the bias is replicated
}

VocabParallelHeadImpl::VocabParallelHeadImpl(torch::Tensor w, Communicator& comm, Group group,
                                             int index)
    : comm_(comm), group_(std::move(group)), index_(index) {
  weight = register_parameter("weight", std::move(w));
}

torch::Tensor VocabParallelHeadImpl::forward(const torch::Tensor& x) {
  const torch::Tensor mine = nn::functional::linear(copy_to_region(x, comm_, group_), weight);
  return parallel_output ? mine : gather_from_region(mine, comm_, group_, index_);
}

namespace {

struct Match {
  std::string name, parent, slot;
  ParallelStyle style;
  std::shared_ptr<nn::LinearImpl> linear;
  LinearSlots* holder;
};

std::vector<Match> find_matches(nn::Sequential& model, const ParallelPlan& plan, int parts) {
  const auto modules = model->named_modules();
  std::vector<Match> matches;
  std::set<std::string> taken; // a Linear matched by two rules follows the first
  for (const auto& [pattern, style] : plan.linears) {
    bool found = false;
    // A plan names each Linear in full: looked up at once, not matched against every module
    // (a 126-layer model has 882 names and over a thousand modules).
    std::vector<std::pair<std::string, std::shared_ptr<nn::Module>>> candidates;
    if (pattern.find('*') == std::string::npos) {
      if (const auto* module = modules.find(pattern)) candidates.emplace_back(pattern, *module);
    } else {
      for (const auto& item : modules) candidates.emplace_back(item.key(), item.value());
    }
    for (const auto& [key, module] : candidates) {
      auto linear = std::dynamic_pointer_cast<nn::LinearImpl>(module);
      if (!linear || !pattern_matches(pattern, key))
        continue;
      found = true;
      if (!taken.insert(key).second)
        continue;
      const auto dot = key.rfind('.');
      Match m{key,
              dot == std::string::npos ? "" : key.substr(0, dot),
              key.substr(dot == std::string::npos ? 0 : dot + 1),
              style,
              linear,
              nullptr};
      const auto* parent = modules.find(m.parent);
      m.holder = parent ? dynamic_cast<LinearSlots*>(parent->get()) : nullptr;
      if (!m.holder)
        throw std::invalid_argument("tensor parallel: cannot replace " + m.name +
                                    ": its parent does not implement LinearSlots");
      const int64_t unit = m.holder->shard_granularity(m.slot);
      const bool column = style == ParallelStyle::Column;
      const int64_t features =
          column ? linear->options.out_features() : linear->options.in_features();
      if (features % (parts * unit) != 0)
        throw std::invalid_argument("tensor parallel: cannot split " + m.name + "'s " +
                                    std::to_string(features) + (column ? " output" : " input") +
                                    " features over " + std::to_string(parts) +
                                    " members in whole units of " + std::to_string(unit));
      matches.push_back(std::move(m));
    }
    if (!found)
      throw std::invalid_argument("tensor parallel: rule '" + pattern + "' matches no Linear");
  }
  return matches;
}

std::vector<torch::Tensor> gather_full(nn::Sequential& model, Communicator& comm,
                                       const Group& group, bool grads) {
  torch::NoGradGuard no_grad;
  std::unordered_map<const void*, int64_t> split_dim; // shard parameter -> dimension it splits
  for (const auto& m : model->modules()) {
    if (auto* col = m->as<ColumnParallelLinearImpl>()) {
      split_dim[col->weight.unsafeGetTensorImpl()] = 0;
      if (col->bias.defined())
        split_dim[col->bias.unsafeGetTensorImpl()] = 0;
    } else if (auto* row = m->as<RowParallelLinearImpl>()) {
      split_dim[row->weight.unsafeGetTensorImpl()] = 1;
    } else if (auto* head = m->as<VocabParallelHeadImpl>()) {
      split_dim[head->weight.unsafeGetTensorImpl()] = 0;
    } else if (const auto* embedding = dynamic_cast<const VocabSlots*>(m.get());
               embedding && embedding->vocabulary_split()) {
      split_dim[embedding->word_table().unsafeGetTensorImpl()] = 0;
    }
  }
  std::vector<torch::Tensor> out;
  for (const auto& p : unique_parameters(*model)) {
    const torch::Tensor t = grads ? p.grad() : p;
    if (!t.defined())
      throw std::invalid_argument("full_gradients: a parameter has no gradient");
    const auto it = split_dim.find(p.unsafeGetTensorImpl());
    if (it == split_dim.end() || group.size() == 1) {
      out.push_back(t);
      continue;
    }
    const torch::Tensor all = comm.all_gather(t, group); // [n, *shard]
    out.push_back(torch::cat(all.unbind(0), it->second));
  }
  return out;
}

// Sequence parallelism needs the children the sequence is split after and gathered before,
// in that order.
void check_sequence_region(const nn::Sequential& model, const ParallelPlan& plan) {
  const auto children = model->named_children();
  int after = -1, before = -1;
  for (size_t i = 0; i < children.size(); ++i) {
    if (children[i].key() == plan.sequence_after)
      after = static_cast<int>(i);
    if (children[i].key() == plan.sequence_before)
      before = static_cast<int>(i);
  }
  if (after < 0 || before <= after)
    throw std::invalid_argument("sequence parallel: the model has no child '" +
                                plan.sequence_after + "' followed by a child '" +
                                plan.sequence_before + "' to split the sequence between");
}

// `model` with a SequenceScatter after plan.sequence_after and a SequenceGather before
// plan.sequence_before (the same child modules otherwise, under the same names).
nn::Sequential with_sequence_region(const nn::Sequential& model, const ParallelPlan& plan,
                                    Communicator& comm, const Group& group) {
  const auto children = model->named_children();
  nn::Sequential out;
  size_t i = 0;
  for (const auto& any : *model) {
    const std::string& name = children[i++].key();
    if (name == plan.sequence_before)
      out->push_back("sequence_gather", SequenceGather(comm, group));
    out->push_back(name, any);
    if (name == plan.sequence_after)
      out->push_back("sequence_scatter", SequenceScatter(comm, group));
  }
  return out;
}

// `model` with its child `head`, when that is a Linear without bias whose vocabulary divides
// by the group, replaced by this member's rows of it (a tied head, which shares the
// embedding's weight, stays whole).
nn::Sequential with_vocab_parallel_head(const nn::Sequential& model, const std::string& head,
                                        Communicator& comm, const Group& group, int index) {
  const int n = group.size();
  const auto children = model->named_children();
  nn::Sequential out;
  size_t i = 0;
  for (const auto& any : *model) {
    const std::string& name = children[i++].key();
    const auto* linear = !head.empty() && name == head ? any.ptr()->as<nn::LinearImpl>() : nullptr;
    if (!linear || linear->bias.defined() || linear->weight.size(0) % n != 0) {
      out->push_back(name, any);
      continue;
    }
    const int64_t rows = linear->weight.size(0) / n;
    torch::Tensor mine =
        linear->weight.narrow(0, index * rows, rows).clone(at::MemoryFormat::Contiguous);
    out->push_back(name, nn::AnyModule(VocabParallelHead(std::move(mine), comm, group, index)));
  }
  return out;
}

// The child `name`, when it implements VocabSlots and its vocabulary divides by the group,
// keeps this member's rows of the word table; the members' lookups are summed over the group
// (Megatron's VocabParallelEmbedding: all-reduce forward, identity backward).
void split_vocab_embedding(nn::Sequential& model, const std::string& name, Communicator& comm,
                           const Group& group, int index) {
  if (name.empty())
    return;
  const auto children = model->named_children();
  const auto* child = children.find(name);
  auto* embedding = child ? dynamic_cast<VocabSlots*>(child->get()) : nullptr;
  const int n = group.size();
  if (!embedding || embedding->word_table().size(0) % n != 0)
    return;
  const int64_t rows = embedding->word_table().size(0) / n;
  embedding->split_vocabulary(index * rows, rows, [&comm, group](const torch::Tensor& partial) {
    return reduce_from_region(partial, comm, group);
  });
}

} // namespace

void parallelize_tensor(nn::Sequential& model, const ParallelPlan& plan, Communicator& comm,
                        const Group& group, int index, bool sequence_parallel) {
  const int n = group.size();
  if (n < 1 || index < 0 || index >= n)
    throw std::invalid_argument("tensor parallel: member " + std::to_string(index) +
                                " is not in a group of " + std::to_string(n));
  const std::vector<Match> matches = find_matches(model, plan, n); // every check before any change
  if (sequence_parallel)
    check_sequence_region(model, plan);

  // Per parent and the tensor its column slots read: q, k, v share theirs (latent attention's
  // q_b and kv_b read two different latents).
  const auto input_key = [](const Match& m) { return m.parent + "|" + m.holder->slot_input(m.slot); };
  std::map<std::string, std::shared_ptr<RegionInput>> inputs;
  std::map<std::string, int> columns;
  for (const auto& m : matches)
    if (m.style == ParallelStyle::Column)
      ++columns[input_key(m)];
  for (const auto& [key, count] : columns)
    inputs[key] = std::make_shared<RegionInput>(comm, group, count, sequence_parallel);

  torch::NoGradGuard no_grad;
  for (const auto& m : matches) {
    const torch::Tensor& w = m.linear->weight;
    const torch::Tensor& b = m.linear->bias;
    // Clones, so the shards are charged to the caller's GPU and category and the full
    // weight's memory goes when the Linear does.
    const auto take = [](const torch::Tensor& t) { return t.clone(at::MemoryFormat::Contiguous); };
    if (m.style == ParallelStyle::Column) {
      const int64_t rows = w.size(0) / n; // whole heads for q, k, v: head-major rows
      m.holder->replace_linear(
          m.slot, nn::AnyModule(ColumnParallelLinear(
                      take(w.narrow(0, index * rows, rows)),
                      b.defined() ? take(b.narrow(0, index * rows, rows)) : torch::Tensor(), comm,
                      group, inputs.at(input_key(m)))));
    } else {
      const int64_t cols = w.size(1) / n;
      m.holder->replace_linear(
          m.slot, nn::AnyModule(RowParallelLinear(take(w.narrow(1, index * cols, cols)),
                                                  b.defined() ? take(b) : torch::Tensor(), comm,
                                                  group, sequence_parallel)));
    }
  }
  // Member `index` runs heads index·H/n ..: its attention dropout draws those heads' masks.
  const auto modules = model->named_modules();
  for (const std::string& name : plan.attention)
    if (const auto* found = modules.find(name))
      if (auto* attention = dynamic_cast<AttentionImpl*>(found->get())) {
        attention->set_first_head(index * (attention->query_features() / attention->head_dim()));
        // Latent attention's rotated key part serves every head: its gradient is the sum of
        // every member's heads'.
        if (attention->latent() && n > 1)
          attention->set_shared_key_region([&comm, group](const torch::Tensor& x) {
            return copy_to_region(x, comm, group);
          });
      }
  if (n > 1) {
    model = with_vocab_parallel_head(model, plan.vocab_head, comm, group, index);
    split_vocab_embedding(model, plan.vocab_embedding, comm, group, index);
  }
  if (sequence_parallel)
    model = with_sequence_region(model, plan, comm, group);
}

std::vector<torch::Tensor> sequence_parallel_parameters(const nn::Sequential& model,
                                                        const ParallelPlan& plan) {
  std::vector<torch::Tensor> out;
  for (const auto& child : model->named_children()) {
    if (child.key() == plan.sequence_after || child.key() == plan.sequence_before)
      continue;
    std::set<const void*> shards;
    for (const auto& m : child.value()->modules()) {
      if (auto* col = m->as<ColumnParallelLinearImpl>()) {
        shards.insert(col->weight.unsafeGetTensorImpl());
        if (col->bias.defined())
          shards.insert(col->bias.unsafeGetTensorImpl());
      } else if (auto* row = m->as<RowParallelLinearImpl>()) {
        shards.insert(row->weight.unsafeGetTensorImpl());
      }
    }
    for (const auto& p : child.value()->parameters())
      if (!shards.count(p.unsafeGetTensorImpl()))
        out.push_back(p);
  }
  return out;
}

int64_t sequence_parts(const nn::Module& module) {
  if (const auto* col = module.as<ColumnParallelLinearImpl>())
    return col->sequence_parts();
  for (const auto& m : module.modules(/*include_self=*/false))
    if (const auto* col = m->as<ColumnParallelLinearImpl>())
      return col->sequence_parts();
  return 1;
}

std::vector<torch::Tensor> full_parameters(nn::Sequential& model, Communicator& comm,
                                           const Group& group) {
  return gather_full(model, comm, group, /*grads=*/false);
}

std::vector<torch::Tensor> full_gradients(nn::Sequential& model, Communicator& comm,
                                          const Group& group) {
  return gather_full(model, comm, group, /*grads=*/true);
}

} // namespace meshsim
