// The fused attention core as a custom autograd Function (FlashAttention-2's algorithm over
// tiles of query rows, in LibTorch kernels).
//
// Forward, per tile of n query rows: S = q_tile kᵀ/√d [B, h, n, Tk] with hidden keys at -inf,
// lse = logsumexp(S), P = exp(S - lse), out_tile = P v. Only q, k, v, out and lse are saved.
// Backward, per tile: S and P again from q, k and lse; D = rowsum(dO∘O);
// dV += Pᵀ dO; dP = dO vᵀ; dS = P∘(dP - D + dlse) (the last term is lse's own gradient,
// d lse/dS = P); dQ_tile = dS k/√d; dK += dSᵀ q_tile/√d.
//
// With dropout on the probabilities (p > 0), each tile's keep mask M is regenerated from its
// coordinates (models/layers/dropout.h) in forward and again in backward, as FlashAttention
// regenerates its Philox bits, and only the draw's seed, step and sample indices are saved.
// P̃ = P∘M/(1-p) replaces P in out_tile = P̃ v and dV += P̃ᵀ dO, and dP = (dO vᵀ)∘M/(1-p);
// lse is the undropped softmax's, and D = rowsum(dO∘O) is still Σ_j P_ij dP_ij (O = P̃ v).
//
// 16-bit inputs: the GEMMs run in the input's dtype (as tensor cores take them), the scores'
// softmax and lse in float32, P cast back for P v and Pᵀ dO; dK and dV accumulate over the
// tiles in float32 (FlashAttention-2 accumulates them in registers) and are cast at the end.
// Each tile's 16-bit dK and dV are cast to float32 before they are added: an in-place add of
// mixed dtypes makes a float32 copy inside the CPU kernel in LibTorch 2.x (not in 1.13, not on
// meta), which the plan would not see; the explicit cast is the same allocation everywhere.
//
// The meta device (plans) has no values, and a loop over every tile would cost a plan of a
// 128K-token sequence a thousand tiles per layer per micro-batch of dispatch. The tiles run
// one after another and each frees its scores before the next allocates its own, so the memory
// a GPU holds at any time is the saved tensors plus one tile's transients, the same for every
// full tile (the last, partial one holds less). On meta the first tile therefore stands for
// all: the full-size out, lse, dq, dk and dv are allocated as on a CPU, and the first tile's
// transients are charged once, which is the peak a CPU run reaches (tests/plan/test_plan.cpp
// checks plans against CPU runs byte for byte). What one tile does not stand for is the count
// of operations: a region with a collective inside it is split, for the prediction, by the
// memory charges its rank made on either side (cost/predict.h), and a plan's core makes one
// tile's charges where a GPU makes every tile's, so a plan weights the core less in that split
// (the region's total, the roofline of its counted work, is the same).
#include "models/layers/fused_core.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "memory/allocator.h"
#include "models/layers/recompute.h"

namespace meshsim {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// The dtype of the softmax statistics (lse) and of the scores' softmax.
torch::ScalarType fused_stats_type(const torch::Tensor& q) {
  const auto t = q.scalar_type();
  return t == torch::kHalf || t == torch::kBFloat16 ? torch::kFloat : t;
}

// The tiles that run: every one, or on meta the first (it stands for all, see above).
int64_t fused_tiles_run(const torch::Tensor& q, int64_t tile, int64_t rows) {
  const int64_t tiles = (rows + tile - 1) / tile;
  return q.is_meta() ? std::min<int64_t>(tiles, 1) : tiles;
}

// The scaled scores of query rows [r0, r0 + n) against every key, in the statistics' dtype,
// with the keys a row may not see at -inf: [B, h, n, Tk].
torch::Tensor fused_tile_scores(const torch::Tensor& q, const torch::Tensor& k,
                                const torch::Tensor& q_positions, const torch::Tensor& k_positions,
                                int64_t r0, int64_t n, double scale, torch::ScalarType stats) {
  torch::Tensor s = torch::matmul(q.narrow(2, r0, n), k.transpose(-2, -1)).to(stats).mul_(scale);
  const torch::Tensor hidden =
      k_positions.unsqueeze(0) > q_positions.narrow(0, r0, n).unsqueeze(1); // [n, Tk]
  return s.masked_fill_(hidden, kNegInf);
}

// A row's statistic with -inf (a row that sees no key) replaced by 0. lse is never +inf.
// (An equality, not isinf: LibTorch 1.13 has no meta kernel for abs, which isinf and
// logsumexp call.)
torch::Tensor fused_finite(const torch::Tensor& x) {
  return x.masked_fill(x == kNegInf, 0);
}

// logsumexp over the keys, -inf for a row that sees none: max + log Σ exp(S - max).
torch::Tensor fused_logsumexp(const torch::Tensor& scores) {
  const torch::Tensor top = fused_finite(scores.amax(-1, /*keepdim=*/true));
  return (scores - top).exp_().sum(-1).log_().add_(top.squeeze(-1));
}

// P = exp(S - lse); a row that sees no key (lse -inf) gets P = 0, not exp(-inf + inf).
torch::Tensor fused_probabilities(torch::Tensor scores, const torch::Tensor& lse) {
  return scores.sub_(fused_finite(lse).unsqueeze(-1)).exp_();
}

// x∘keep/(1-p) in place. Neither x.mul_(keep) nor x.mul_(1/(1-p)): the CPU kernels cast a
// bool operand, and a Python number, to x's dtype in copies of their own (a tile of float32
// for the mask) that meta kernels never make, so a plan would not see them. Zeroing the
// dropped elements through a bool mask makes only the mask's negation, on both; the scale is
// a 0-dim tensor of x's dtype, on the host, which no kernel converts.
torch::Tensor fused_drop(torch::Tensor x, const torch::Tensor& keep, double p) {
  torch::Tensor scale;
  {
    GpuGuard host(nullptr); // a kernel's argument, not GPU memory
    scale = torch::full({}, 1.0 / (1.0 - p), torch::TensorOptions().dtype(x.scalar_type()));
  }
  return x.masked_fill_(keep.eq(false), 0).mul_(scale);
}

// The probabilities of query rows at `q_positions` with dropout: P∘M/(1-p), M the rows' tile
// of the keep mask; P itself without dropout.
torch::Tensor fused_dropped(torch::Tensor p, const AttentionDropout& dropout,
                            const torch::Tensor& q_positions, const torch::Tensor& k_positions) {
  if (!(dropout.p > 0))
    return p;
  return fused_drop(std::move(p), dropout.keep(p.size(0), p.size(1), q_positions, k_positions),
                    dropout.p);
}

// What op-level recomputation kept of a fused core's forward (recompute.h): its output and
// log-sum-exp, handed to the recompute's node, which then runs only the backward. Not inputs
// of the function (an undefined tensor cannot be one): a plain argument.
struct KeptAttention {
  torch::Tensor out, lse;
};

struct FusedAttentionFunction : public torch::autograd::Function<FusedAttentionFunction> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const torch::Tensor& q_positions,
                               const torch::Tensor& k_positions, int64_t tile,
                               const AttentionDropout& dropout, const KeptAttention& kept_pass) {
    const int64_t b = q.size(0), h = q.size(1), tq = q.size(2), d = q.size(3);
    const torch::ScalarType stats = fused_stats_type(q);
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    // [B, Tq, h, dv]: the layout the output projection reads (see fused_core.h); dv is d but in
    // multi-head latent attention, whose values are narrower than its queries and keys. What
    // op-level recomputation kept of this forward, when given: then nothing runs again.
    const bool kept = kept_pass.out.defined();
    torch::Tensor out = kept ? kept_pass.out : torch::empty({b, tq, h, v.size(3)}, q.options());
    torch::Tensor lse = kept ? kept_pass.lse : torch::empty({b, h, tq}, q.options().dtype(stats));
    // One contiguous k and v for every tile (a GEMM reads a strided view by copying it).
    const torch::Tensor kc = kept ? k : k.contiguous(), vc = kept ? v : v.contiguous();
    for (int64_t t = 0; !kept && t < fused_tiles_run(q, tile, tq); ++t) {
      const int64_t r0 = t * tile, n = std::min(tile, tq - r0);
      torch::Tensor s = fused_tile_scores(q, kc, q_positions, k_positions, r0, n, scale, stats);
      const torch::Tensor m = fused_logsumexp(s); // -inf for a row that sees nothing
      const torch::Tensor p = fused_dropped(
          fused_probabilities(std::move(s), m), dropout, q_positions.narrow(0, r0, n), k_positions);
      out.narrow(1, r0, n).copy_(torch::matmul(p.to(v.scalar_type()), vc).transpose(1, 2));
      lse.narrow(2, r0, n).copy_(m);
    }
    // An output backward gets no gradient for stays undefined (no zeros made for it).
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({q, k, v, out, lse, q_positions, k_positions});
    ctx->saved_data["tile"] = tile;
    dropout.save(ctx);
    return {out, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3],
                        &lse = saved[4], &q_positions = saved[5], &k_positions = saved[6];
    const int64_t tile = ctx->saved_data["tile"].toInt();
    const AttentionDropout dropout = AttentionDropout::saved(ctx);
    const torch::Tensor& d_out = grads[0]; // [B, Tq, h, d]; undefined when out is unused
    const torch::Tensor& d_lse = grads[1]; // [B, h, Tq]; undefined when lse is unused
    const int64_t tq = q.size(2), d = q.size(3);
    const torch::ScalarType stats = fused_stats_type(q);
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    const torch::Tensor kc = k.contiguous(), vc = v.contiguous();
    torch::Tensor dq = torch::empty(q.sizes(), q.options()); // every row is written
    torch::Tensor dk = torch::zeros(k.sizes(), k.options().dtype(stats));
    torch::Tensor dv = torch::zeros(v.sizes(), v.options().dtype(stats));
    for (int64_t t = 0; t < fused_tiles_run(q, tile, tq); ++t) {
      const int64_t r0 = t * tile, n = std::min(tile, tq - r0);
      const torch::Tensor q_tile = q.narrow(2, r0, n);
      torch::Tensor ds; // dL/dS, [B, h, n, Tk]
      const torch::Tensor p = fused_probabilities(
          fused_tile_scores(q, kc, q_positions, k_positions, r0, n, scale, stats),
          lse.narrow(2, r0, n));
      if (d_out.defined()) {
        const torch::Tensor do_tile = d_out.narrow(1, r0, n).transpose(1, 2); // [B, h, n, d]
        const torch::Tensor o_tile = out.narrow(1, r0, n).transpose(1, 2);
        const torch::Tensor delta = (do_tile.to(stats) * o_tile.to(stats)).sum(-1, true);
        torch::Tensor dp = torch::matmul(do_tile, vc.transpose(-2, -1)).to(stats);
        torch::Tensor keep; // the tile's mask, with dropout
        if (dropout.p > 0)
          keep = dropout.keep(q.size(0), q.size(1), q_positions.narrow(0, r0, n), k_positions);
        const torch::Tensor dropped = keep.defined() ? fused_drop(p.clone(), keep, dropout.p) : p;
        dv.add_(torch::matmul(dropped.to(v.scalar_type()).transpose(-2, -1), do_tile).to(stats));
        if (keep.defined())
          fused_drop(dp, keep, dropout.p);
        ds = dp.sub_(delta).mul_(p);
      }
      if (d_lse.defined()) {
        const torch::Tensor through_lse = p * d_lse.narrow(2, r0, n).to(stats).unsqueeze(-1);
        ds = ds.defined() ? ds.add_(through_lse) : through_lse;
      }
      if (!ds.defined()) {
        dq.narrow(2, r0, n).zero_();
        continue;
      }
      const torch::Tensor ds_in = ds.mul_(scale).to(q.scalar_type());
      dq.narrow(2, r0, n).copy_(torch::matmul(ds_in, kc));
      dk.add_(torch::matmul(ds_in.transpose(-2, -1), q_tile).to(stats));
    }
    return {dq, dk.to(k.scalar_type()), dv.to(v.scalar_type()), {}, {}, {}, {}, {}};
  }
};

} // namespace

int64_t fused_tile_rows(int64_t tile_rows, int64_t batch, int64_t heads, int64_t keys) {
  if (tile_rows > 0)
    return tile_rows;
  const int64_t per_row = std::max<int64_t>(1, batch * heads * keys);
  return std::max<int64_t>(1, std::min(kFusedTileRows, kFusedTileScores / per_row));
}

PartialAttention fused_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                 const torch::Tensor& q_positions, const torch::Tensor& k_positions,
                                 int64_t tile_rows, const AttentionDropout& dropout) {
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4 || k.sizes().slice(0, 3) != v.sizes().slice(0, 3) ||
      q.size(0) != k.size(0) || q.size(1) != k.size(1) || q.size(3) != k.size(3) ||
      q_positions.dim() != 1 || k_positions.dim() != 1 || q_positions.size(0) != q.size(2) ||
      k_positions.size(0) != k.size(2) || tile_rows < 0)
    throw std::invalid_argument("fused_attention: expected q [B,h,Tq,d], k [B,h,Tk,d] and v [B,h,Tk,dv], "
                                "positions [Tq] and [Tk], got q " + c10::str(q.sizes()) + ", k " +
                                c10::str(k.sizes()) + ", v " + c10::str(v.sizes()) + ", positions " +
                                c10::str(q_positions.sizes()) + " and " +
                                c10::str(k_positions.sizes()));
  const int64_t tile = fused_tile_rows(tile_rows, q.size(0), q.size(1), k.size(2));
  // Op-level recomputation (recompute.h) keeps the kernel's output and log-sum-exp in a
  // block's forward and hands them to its recompute, which runs only the backward's part.
  KeptOutputs* kept = current_kept_outputs();
  KeptAttention replayed;
  if (kept && kept->replaying()) {
    const std::vector<torch::Tensor> saved = kept->take();
    replayed = {saved.at(0), saved.at(1)};
  }
  const variable_list outs =
      FusedAttentionFunction::apply(q, k, v, q_positions, k_positions, tile, dropout, replayed);
  if (kept && !kept->replaying())
    kept->keep({outs[0], outs[1]});
  return {outs[0].transpose(1, 2), outs[1]};
}

} // namespace meshsim
