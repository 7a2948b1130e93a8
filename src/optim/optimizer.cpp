// PyTorch 1.13's Adam (no weight decay, no amsgrad) and SGD (momentum, no dampening),
// step for step, with fp32 master weights for 16-bit parameters and fp16's loss scaler.
#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "memory/allocator.h"

namespace meshsim {

bool is_low_precision(torch::Dtype dtype) {
  return dtype == torch::kBFloat16 || dtype == torch::kHalf;
}

void allocate_gradients(const std::vector<torch::Tensor>& params) {
  CategoryScope scope(MemoryCategory::Gradients);
  for (torch::Tensor p : params)
    if (!p.grad().defined())
      p.mutable_grad() = torch::zeros_like(p);
}

void LossScaler::update(bool finite) {
  if (!finite) {
    scale = std::max(kMinScale, scale / 2);
    good_steps = 0;
    return;
  }
  if (++good_steps == kGrowthInterval) {
    scale *= 2;
    good_steps = 0;
  }
}

Optimizer::Optimizer(std::vector<torch::Tensor> params, OptimizerOptions options)
    : params_(std::move(params)), options_(std::move(options)) {
  if (options_.name != "adam" && options_.name != "sgd")
    throw std::invalid_argument("unknown optimizer '" + options_.name + "' (choose adam or sgd)");
  torch::NoGradGuard no_grad;
  CategoryScope scope(MemoryCategory::Optimizer);
  bool any_master = false;
  for (const auto& p : params_) {
    // The state lives where the parameter does (its options: device, meta included).
    torch::Tensor master;
    if (is_low_precision(p.scalar_type())) {
      master = p.detach().to(torch::kFloat32, /*non_blocking=*/false, /*copy=*/true);
      any_master = true;
      loss_scaling_ = loss_scaling_ || p.scalar_type() == torch::kHalf;
    }
    masters_.push_back(master);
    const torch::Tensor& like = master.defined() ? master : p;
    if (options_.name == "adam") {
      exp_avg_.push_back(torch::zeros_like(like));
      exp_avg_sq_.push_back(torch::zeros_like(like));
    } else if (options_.momentum != 0) {
      exp_avg_.push_back(torch::zeros_like(like));
    }
  }
  if (!any_master)
    masters_.clear();
}

bool Optimizer::grads_finite() const {
  torch::NoGradGuard no_grad;
  CategoryScope scope(MemoryCategory::Other);
  for (const auto& p : params_) {
    const torch::Tensor& grad = p.grad();
    if (!grad.defined() || grad.is_meta())
      continue;
    if (!torch::isfinite(grad).all().item<bool>())
      return false;
  }
  return true;
}

bool Optimizer::step(bool grads_finite) {
  torch::NoGradGuard no_grad;
  CategoryScope scope(MemoryCategory::Other); // temporaries of the update
  // The loss was multiplied by this scale; the gradients carry it until they are unscaled.
  const double unscale = 1.0 / loss_scale();
  if (loss_scaling_)
    scaler_.update(grads_finite);
  if (!grads_finite)
    return false;
  ++step_count_;
  for (size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor p = params_[i];
    const torch::Tensor& grad = p.grad();
    if (!grad.defined())
      continue;
    if (masters_.empty() || !masters_[i].defined()) {
      update(i, p, grad);
      continue;
    }
    // 16-bit gradient -> fp32 (unscaled), update the fp32 master, round it into the
    // parameter (round to nearest even). An fp32 gradient (ZeRO's fp32 reduction) is read
    // as it is, copied only to be unscaled.
    torch::Tensor grad32 = grad.to(torch::kFloat32, /*non_blocking=*/false,
                                   /*copy=*/unscale != 1.0);
    if (unscale != 1.0)
      grad32.mul_(unscale);
    update(i, masters_[i], grad32);
    p.copy_(masters_[i]);
  }
  return true;
}

void Optimizer::update(size_t i, torch::Tensor target, const torch::Tensor& grad) {
  if (options_.name == "sgd") {
    if (options_.momentum != 0) {
      // PyTorch starts the buffer at the first gradient; momentum * 0 + grad is the same.
      exp_avg_[i].mul_(options_.momentum).add_(grad);
      target.add_(exp_avg_[i], -options_.lr);
    } else {
      target.add_(grad, -options_.lr);
    }
    return;
  }
  const double bias1 = 1 - std::pow(options_.beta1, static_cast<double>(step_count_));
  const double bias2 = 1 - std::pow(options_.beta2, static_cast<double>(step_count_));
  exp_avg_[i].mul_(options_.beta1).add_(grad, 1 - options_.beta1);
  exp_avg_sq_[i].mul_(options_.beta2).addcmul_(grad, grad, 1 - options_.beta2);
  torch::Tensor denom = (exp_avg_sq_[i].sqrt() / std::sqrt(bias2)).add_(options_.eps);
  target.addcdiv_(exp_avg_[i], denom, -options_.lr / bias1);
}

void Optimizer::zero_grad() {
  for (auto& p : params_)
    if (p.grad().defined()) p.mutable_grad().zero_();
}

int64_t Optimizer::state_bytes() const {
  int64_t n = 0;
  for (const auto* list : {&masters_, &exp_avg_, &exp_avg_sq_})
    for (const auto& t : *list)
      if (t.defined())
        n += t.numel() * static_cast<int64_t>(t.element_size());
  return n;
}

void Optimizer::save(torch::serialize::OutputArchive& archive) const {
  archive.write("optimizer/step", torch::tensor(step_count_));
  for (size_t i = 0; i < exp_avg_.size(); ++i)
    archive.write("optimizer/exp_avg/" + std::to_string(i), exp_avg_[i]);
  for (size_t i = 0; i < exp_avg_sq_.size(); ++i)
    archive.write("optimizer/exp_avg_sq/" + std::to_string(i), exp_avg_sq_[i]);
  for (size_t i = 0; i < masters_.size(); ++i)
    if (masters_[i].defined())
      archive.write("optimizer/master/" + std::to_string(i), masters_[i]);
  if (loss_scaling_) {
    archive.write("optimizer/loss_scale", torch::tensor(scaler_.scale, torch::kFloat64));
    archive.write("optimizer/loss_scale_good_steps", torch::tensor(scaler_.good_steps));
  }
}

namespace {

void check_shape(const char* what, size_t i, const torch::Tensor& saved, const torch::Tensor& mine) {
  if (!saved.sizes().equals(mine.sizes()))
    throw std::runtime_error("optimizer state " + std::string(what) + "/" + std::to_string(i) +
                             " has another shape");
}

// A key this precision needs (or must not find): a checkpoint of another --precision.
torch::Tensor read_precision_key(torch::serialize::InputArchive& archive, const std::string& key,
                                 bool expected) {
  torch::Tensor t;
  const bool found = archive.try_read(key, t);
  if (found != expected)
    throw std::runtime_error("the checkpoint's optimizer state " +
                             std::string(found ? "has" : "lacks") + " '" + key +
                             "': it was saved at another --precision");
  return t;
}

} // namespace

void Optimizer::load(torch::serialize::InputArchive& archive) {
  torch::NoGradGuard no_grad;
  torch::Tensor step;
  archive.read("optimizer/step", step);
  step_count_ = step.item<int64_t>();
  for (size_t i = 0; i < exp_avg_.size(); ++i) {
    torch::Tensor t;  // fresh each time: read() into a defined tensor re-points it (set_)
    archive.read("optimizer/exp_avg/" + std::to_string(i), t);
    check_shape("exp_avg", i, t, exp_avg_[i]);
    exp_avg_[i].copy_(t);
  }
  for (size_t i = 0; i < exp_avg_sq_.size(); ++i) {
    torch::Tensor t;
    archive.read("optimizer/exp_avg_sq/" + std::to_string(i), t);
    check_shape("exp_avg_sq", i, t, exp_avg_sq_[i]);
    exp_avg_sq_[i].copy_(t);
  }
  if (masters_.empty()) {
    read_precision_key(archive, "optimizer/master/0", false);
  } else {
    for (size_t i = 0; i < masters_.size(); ++i) {
      if (!masters_[i].defined())
        continue;
      torch::Tensor t = read_precision_key(archive, "optimizer/master/" + std::to_string(i), true);
      check_shape("master", i, t, masters_[i]);
      masters_[i].copy_(t);
    }
  }
  torch::Tensor scale = read_precision_key(archive, "optimizer/loss_scale", loss_scaling_);
  if (loss_scaling_) {
    scaler_.scale = scale.item<double>();
    scaler_.good_steps =
        read_precision_key(archive, "optimizer/loss_scale_good_steps", true).item<int64_t>();
  }
}

} // namespace meshsim
