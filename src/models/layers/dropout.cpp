// Counter-based dropout masks and the dropout that keeps only its 1-byte mask.
#include "models/layers/dropout.h"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "memory/allocator.h"

namespace meshsim {
namespace {

thread_local std::shared_ptr<const DropoutDraw> t_dropout_draw;

constexpr uint64_t kDropoutGolden = 0x9e3779b97f4a7c15ULL; // 2^64 / golden ratio, odd
constexpr uint64_t kDropoutMix1 = 0xbf58476d1ce4e5b9ULL;   // splitmix64's multipliers
constexpr uint64_t kDropoutMix2 = 0x94d049bb133111ebULL;

// splitmix64's finalizer: a bijection of 64-bit words that mixes every bit into every other.
uint64_t dropout_mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * kDropoutMix1;
  z = (z ^ (z >> 27)) * kDropoutMix2;
  return z ^ (z >> 31);
}

// One coordinate folded into the hash: distinct v give distinct words for a given h (the
// golden multiplier is odd, the mix a bijection).
uint64_t dropout_absorb(uint64_t h, uint64_t v) {
  return dropout_mix64(h + (v + 1) * kDropoutGolden);
}

// The same words as int64, the dtype tensors compute in: two's complement addition and
// multiplication wrap exactly as uint64's do.
int64_t as_int64(uint64_t u) {
  int64_t s;
  std::memcpy(&s, &u, sizeof s);
  return s;
}

// z >> s as uint64 on int64 tensors (>> is arithmetic on them): the sign's copies cleared.
torch::Tensor logical_shift_right(const torch::Tensor& z, int s) {
  return z.__rshift__(s).bitwise_and((int64_t{1} << (64 - s)) - 1);
}

torch::Tensor dropout_mix_tensor(torch::Tensor z) {
  z = z.bitwise_xor(logical_shift_right(z, 30)).mul(as_int64(kDropoutMix1));
  z = z.bitwise_xor(logical_shift_right(z, 27)).mul(as_int64(kDropoutMix2));
  return z.bitwise_xor(logical_shift_right(z, 31));
}

// The hash of everything but the element's coordinates.
uint64_t dropout_base(const DropoutDraw& draw, int64_t layer, DropoutSite site) {
  uint64_t h = dropout_mix64(draw.seed + kDropoutGolden);
  h = dropout_absorb(h, static_cast<uint64_t>(draw.step));
  h = dropout_absorb(h, static_cast<uint64_t>(layer));
  return dropout_absorb(h, static_cast<uint64_t>(site));
}

// Keep iff the hash's top 53 bits are below this: a fraction 1 - p of 2^53, to 2^-53.
int64_t keep_threshold(double p) {
  return static_cast<int64_t>(std::llround((1.0 - p) * 9007199254740992.0));
}

void check_probability(double p) {
  if (!(p >= 0 && p < 1))
    throw std::invalid_argument("dropout: p must be in [0, 1), got " + std::to_string(p));
}

// Megatron's dropout backward: the gradient through the kept elements, scaled; only the bool
// mask is saved (the scale is a number).
struct MaskedScale : public torch::autograd::Function<MaskedScale> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& keep, double scale) {
    ctx->save_for_backward({keep});
    ctx->saved_data["scale"] = scale;
    return x.mul(keep).mul(scale);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::Tensor keep = ctx->get_saved_variables()[0];
    const double scale = ctx->saved_data["scale"].toDouble();
    return {grads[0].mul(keep).mul(scale), torch::Tensor(), torch::Tensor()};
  }
};

// The draw an attention module's dropout masks with: its own, or this thread's.
std::shared_ptr<const DropoutDraw> draw_of(const AttentionDropout& dropout) {
  return dropout.draw ? dropout.draw : current_dropout_draw();
}

} // namespace

DropoutScope::DropoutScope(std::shared_ptr<const DropoutDraw> draw)
    : previous_(std::move(t_dropout_draw)) {
  t_dropout_draw = std::move(draw);
}

DropoutScope::~DropoutScope() { t_dropout_draw = std::move(previous_); }

std::shared_ptr<const DropoutDraw> current_dropout_draw() { return t_dropout_draw; }

uint64_t dropout_hash(const DropoutDraw& draw, int64_t layer, DropoutSite site,
                      const std::vector<int64_t>& coordinates) {
  uint64_t h = dropout_base(draw, layer, site);
  for (int64_t c : coordinates)
    h = dropout_absorb(h, static_cast<uint64_t>(c));
  return h;
}

torch::Tensor dropout_keep_mask(const DropoutDraw& draw, double p, int64_t layer,
                                DropoutSite site, const std::vector<torch::Tensor>& coordinates) {
  check_probability(p);
  if (coordinates.empty())
    throw std::invalid_argument("dropout: a mask needs at least one coordinate");
  std::vector<int64_t> shape;
  for (const torch::Tensor& c : coordinates) {
    if (c.dim() != 1 || c.scalar_type() != torch::kLong)
      throw std::invalid_argument("dropout: coordinates must be 1-D int64 tensors");
    shape.push_back(c.size(0));
  }
  const torch::Device device = coordinates.front().device();
  if (device.is_meta())
    return torch::empty(shape, torch::TensorOptions().dtype(torch::kBool).device(device));
  torch::Tensor bits;
  {
    // A GPU kernel draws these in registers: the hash's int64 scratch is no GPU memory.
    GpuGuard host(nullptr);
    const int64_t n = static_cast<int64_t>(coordinates.size());
    torch::Tensor h;
    for (int64_t d = 0; d < n; ++d) {
      std::vector<int64_t> view(static_cast<size_t>(n), 1);
      view[static_cast<size_t>(d)] = shape[static_cast<size_t>(d)];
      // h + (c + 1)·golden, as dropout_absorb: c·golden + (h + golden).
      torch::Tensor term = coordinates[static_cast<size_t>(d)].to(device).reshape(view).mul(
          as_int64(kDropoutGolden));
      term = h.defined()
                 ? term.add(h).add(as_int64(kDropoutGolden))
                 : term.add(as_int64(dropout_base(draw, layer, site) + kDropoutGolden));
      h = dropout_mix_tensor(term);
    }
    bits = logical_shift_right(h, 11); // the top 53 bits, as a non-negative int64
  }
  return bits.lt(keep_threshold(p)); // the mask is the GPU's
}

torch::Tensor attention_dropout_keep(const DropoutDraw& draw, double p, int64_t layer,
                                     const torch::Tensor& samples, int64_t first_head,
                                     int64_t heads, const torch::Tensor& q_positions,
                                     const torch::Tensor& k_positions) {
  torch::Tensor head_ids;
  {
    GpuGuard host(nullptr);
    head_ids = torch::arange(first_head, first_head + heads,
                             torch::TensorOptions().dtype(torch::kLong).device(q_positions.device()));
  }
  return dropout_keep_mask(draw, p, layer, DropoutSite::AttentionProbabilities,
                           {samples.to(q_positions.device()), head_ids, q_positions,
                            k_positions.to(q_positions.device())});
}

torch::Tensor AttentionDropout::keep(int64_t batch, int64_t heads, const torch::Tensor& q_positions,
                                     const torch::Tensor& k_positions) const {
  const std::shared_ptr<const DropoutDraw> d = draw_of(*this);
  if (!d || !d->samples.defined() || d->samples.size(0) != batch)
    throw std::logic_error("attention dropout: no draw with the batch's " + std::to_string(batch) +
                           " sample indices is installed");
  return attention_dropout_keep(*d, p, layer, d->samples, first_head, heads, q_positions,
                                k_positions);
}

void AttentionDropout::save(torch::autograd::AutogradContext* ctx) const {
  ctx->saved_data["dropout.p"] = p;
  if (!(p > 0))
    return;
  const std::shared_ptr<const DropoutDraw> d = draw_of(*this);
  if (!d)
    throw std::logic_error("attention dropout: no draw is installed");
  ctx->saved_data["dropout.layer"] = layer;
  ctx->saved_data["dropout.first_head"] = first_head;
  ctx->saved_data["dropout.seed"] = as_int64(d->seed);
  ctx->saved_data["dropout.step"] = d->step;
  ctx->saved_data["dropout.samples"] = d->samples;
}

AttentionDropout AttentionDropout::saved(torch::autograd::AutogradContext* ctx) {
  AttentionDropout out;
  out.p = ctx->saved_data["dropout.p"].toDouble();
  if (!(out.p > 0))
    return out;
  out.layer = ctx->saved_data["dropout.layer"].toInt();
  out.first_head = ctx->saved_data["dropout.first_head"].toInt();
  auto d = std::make_shared<DropoutDraw>();
  const int64_t seed = ctx->saved_data["dropout.seed"].toInt();
  std::memcpy(&d->seed, &seed, sizeof seed);
  d->step = ctx->saved_data["dropout.step"].toInt();
  d->samples = ctx->saved_data["dropout.samples"].toTensor();
  out.draw = std::move(d);
  return out;
}

torch::Tensor apply_dropout_mask(const torch::Tensor& x, const torch::Tensor& keep, double p) {
  check_probability(p);
  return MaskedScale::apply(x, keep, 1.0 / (1.0 - p));
}

torch::Tensor hidden_dropout(const torch::Tensor& x, double p, int64_t layer, DropoutSite site) {
  const std::shared_ptr<const DropoutDraw> draw = current_dropout_draw();
  if (!draw)
    throw std::logic_error("dropout: no draw installed for this forward (the strategy does not "
                           "give its micro-batches' sample indices)");
  if (x.dim() != 3 || !draw->samples.defined() || draw->samples.size(0) != x.size(0) ||
      (draw->positions.defined() && draw->positions.size(0) != x.size(1)))
    throw std::logic_error("dropout: the draw's samples and positions do not match the "
                           "activation " + c10::str(x.sizes()));
  torch::Tensor samples, positions, features;
  {
    GpuGuard host(nullptr);
    const auto index = torch::TensorOptions().dtype(torch::kLong).device(x.device());
    samples = draw->samples.to(x.device());
    positions = draw->positions.defined() ? draw->positions.to(x.device())
                                          : torch::arange(x.size(1), index);
    features = torch::arange(x.size(2), index);
  }
  return apply_dropout_mask(x, dropout_keep_mask(*draw, p, layer, site, {samples, positions, features}),
                            p);
}

} // namespace meshsim
