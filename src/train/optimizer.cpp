// PyTorch 1.13's Adam (no weight decay, no amsgrad) and SGD (momentum, no dampening),
// step for step.
#include "train/optimizer.h"

#include <cmath>
#include <stdexcept>

#include "memory/allocator.h"

namespace meshsim {

void allocate_gradients(const std::vector<torch::Tensor>& params) {
  CategoryScope scope(MemoryCategory::Gradients);
  for (torch::Tensor p : params)
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
}

Optimizer::Optimizer(std::vector<torch::Tensor> params, OptimizerOptions options)
    : params_(std::move(params)), options_(std::move(options)) {
  if (options_.name != "adam" && options_.name != "sgd")
    throw std::invalid_argument("unknown optimizer '" + options_.name + "' (choose adam or sgd)");
  CategoryScope scope(MemoryCategory::Optimizer);
  for (const auto& p : params_) {
    if (options_.name == "adam") {
      exp_avg_.push_back(torch::zeros_like(p));
      exp_avg_sq_.push_back(torch::zeros_like(p));
    } else if (options_.momentum != 0) {
      exp_avg_.push_back(torch::zeros_like(p));
    }
  }
}

void Optimizer::step() {
  torch::NoGradGuard no_grad;
  CategoryScope scope(MemoryCategory::Other);  // temporaries of the update
  ++step_count_;
  for (size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor p = params_[i];
    const torch::Tensor& grad = p.grad();
    if (!grad.defined()) continue;
    if (options_.name == "sgd") {
      if (options_.momentum != 0) {
        // PyTorch starts the buffer at the first gradient; momentum * 0 + grad is the same.
        exp_avg_[i].mul_(options_.momentum).add_(grad);
        p.add_(exp_avg_[i], -options_.lr);
      } else {
        p.add_(grad, -options_.lr);
      }
      continue;
    }
    const double bias1 = 1 - std::pow(options_.beta1, static_cast<double>(step_count_));
    const double bias2 = 1 - std::pow(options_.beta2, static_cast<double>(step_count_));
    exp_avg_[i].mul_(options_.beta1).add_(grad, 1 - options_.beta1);
    exp_avg_sq_[i].mul_(options_.beta2).addcmul_(grad, grad, 1 - options_.beta2);
    torch::Tensor denom = (exp_avg_sq_[i].sqrt() / std::sqrt(bias2)).add_(options_.eps);
    p.addcdiv_(exp_avg_[i], denom, -options_.lr / bias1);
  }
}

void Optimizer::zero_grad() {
  for (auto& p : params_)
    if (p.grad().defined()) p.mutable_grad().zero_();
}

int64_t Optimizer::state_bytes() const {
  int64_t n = 0;
  for (const auto& t : exp_avg_) n += t.numel() * t.element_size();
  for (const auto& t : exp_avg_sq_) n += t.numel() * t.element_size();
  return n;
}

void Optimizer::save(torch::serialize::OutputArchive& archive) const {
  archive.write("optimizer/step", torch::tensor(step_count_));
  for (size_t i = 0; i < exp_avg_.size(); ++i)
    archive.write("optimizer/exp_avg/" + std::to_string(i), exp_avg_[i]);
  for (size_t i = 0; i < exp_avg_sq_.size(); ++i)
    archive.write("optimizer/exp_avg_sq/" + std::to_string(i), exp_avg_sq_[i]);
}

namespace {

void check_shape(const char* what, size_t i, const torch::Tensor& saved, const torch::Tensor& mine) {
  if (!saved.sizes().equals(mine.sizes()))
    throw std::runtime_error("optimizer state " + std::string(what) + "/" + std::to_string(i) +
                             " has another shape");
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
}

} // namespace meshsim
