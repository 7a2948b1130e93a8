// Ring attention: the K/V blocks of a cp group go round it, each step's exchange overlapped
// with the attention of the block in hand, the partial outputs merged by log-sum-exp; an
// explicit ring backward that recomputes each block's attention and sends each block's
// dK/dV on with it, back to its owner.
//
// At step s rank r holds the block of rank j = r - s (mod C). With the load-balanced chunks
// (r and 2C-1-r), only its own block needs the causal mask; of another block it needs:
//   j < r: every query against the block's first chunk (j), which comes before both of r's;
//   j > r: the second chunk's queries (2C-1-r) against the whole block, which comes before it;
// the rest is masked, so each of the C - 1 other blocks costs half the own block's work.
#include "parallel/context/context_parallel.h"

#include <memory>

#include "parallel/autograd_group.h"

namespace meshsim {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The tags of the ring's messages: a symmetric exchange (communicator.h), so a plan records
// them without the peer.
constexpr int kTagRingKv = kSymmetricTagBase;
constexpr int kTagRingKvGrad = kSymmetricTagBase + 1;

// Which rows of the queries and which keys of block j rank r computes (see the top).
struct BlockRows {
  int64_t q_begin, q_rows, k_rows;
};

BlockRows block_rows(int r, int j, int64_t local) {
  const int64_t half = local / 2;
  if (j == r)
    return {0, local, local};
  if (j < r)
    return {0, local, half};
  return {half, half, local};
}

struct Ring {
  const ContextParallelCore& core;
  int cp, index, next, prev;
  explicit Ring(const ContextParallelCore& c)
      : core(c), cp(c.group().size()), index(c.index()),
        next(c.group().ranks[static_cast<size_t>((c.index() + 1) % cp)]),
        prev(c.group().ranks[static_cast<size_t>((c.index() + cp - 1) % cp)]) {}
  int source(int step) const { return (index - step + cp) % cp; }
};

// An exchange round the ring: `out` goes to the next rank while the previous one's arrives.
struct Exchange {
  torch::Tensor incoming;
  std::unique_ptr<Work> send, recv;
  Exchange(const Ring& ring, const torch::Tensor& out, int tag)
      : incoming(torch::empty_like(out)),
        send(ring.core.comm().isend(out, ring.next, tag)),
        recv(ring.core.comm().irecv(incoming, ring.prev, tag)) {}
  torch::Tensor wait() {
    send->wait();
    recv->wait();
    return incoming;
  }
};

// out and lse of rows [begin, begin + part rows) merged with a block's partial result.
void merge_rows(torch::Tensor& out, torch::Tensor& lse, int64_t begin, const BlockAttention& part) {
  const int64_t rows = part.lse.size(2);
  torch::Tensor o = out.narrow(2, begin, rows), l = lse.narrow(2, begin, rows);
  const torch::Tensor merged = torch::logaddexp(l, part.lse);
  o.mul_(torch::exp(l - merged).unsqueeze(-1));
  o.add_(part.out * torch::exp(part.lse - merged).unsqueeze(-1));
  l.copy_(merged);
}

struct RingAttention : public torch::autograd::Function<RingAttention> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor q, torch::Tensor k,
                               torch::Tensor v, torch::Tensor positions, int64_t core_address) {
    const auto& core = *reinterpret_cast<const ContextParallelCore*>(core_address);
    const Ring ring(core);
    const int64_t local = q.size(2);
    torch::Tensor kv = torch::stack({k, v}); // one message per step
    torch::Tensor out, lse;
    for (int s = 0; s < ring.cp; ++s) {
      std::unique_ptr<Exchange> exchange;
      if (s + 1 < ring.cp)
        exchange = std::make_unique<Exchange>(ring, kv, kTagRingKv);
      const int j = ring.source(s);
      const BlockRows b = block_rows(ring.index, j, local);
      const torch::Tensor keys = cp_positions(local * ring.cp, ring.cp, j, positions.options());
      BlockAttention part = core.block(
          q.narrow(2, b.q_begin, b.q_rows), kv[0].narrow(2, 0, b.k_rows),
          kv[1].narrow(2, 0, b.k_rows), positions.narrow(0, b.q_begin, b.q_rows),
          keys.narrow(0, 0, b.k_rows));
      if (s == 0) { // the own block: every row sees its own token, so lse is finite
        out = std::move(part.out);
        lse = std::move(part.lse);
      } else {
        merge_rows(out, lse, b.q_begin, part);
      }
      if (exchange)
        kv = exchange->wait();
    }
    ctx->save_for_backward({q, k, v, positions, out, lse});
    ctx->saved_data["core"] = core_address;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto& core =
        *reinterpret_cast<const ContextParallelCore*>(ctx->saved_data["core"].toInt());
    const Ring ring(core);
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &q = saved[0], &positions = saved[3], &out = saved[4], &lse = saved[5];
    const torch::Tensor d_out = grads[0];
    const int64_t local = q.size(2);
    // Each block's output and log-sum-exp enter the merged output: with w = exp(lse_j - lse),
    // dL/do_j = w·dO and dL/dlse_j = w·(dO·o_j - dO·out).
    const torch::Tensor d_dot_out = (d_out * out).sum(-1);
    torch::Tensor dq = torch::zeros_like(q);
    torch::Tensor kv = torch::stack({saved[1], saved[2]});
    std::unique_ptr<Exchange> grad_exchange; // the previous step's dK/dV on their way
    for (int s = 0; s < ring.cp; ++s) {
      std::unique_ptr<Exchange> exchange;
      if (s + 1 < ring.cp)
        exchange = std::make_unique<Exchange>(ring, kv, kTagRingKv);
      const int j = ring.source(s);
      const BlockRows b = block_rows(ring.index, j, local);
      const torch::Tensor keys = cp_positions(local * ring.cp, ring.cp, j, positions.options());
      variable_list block_grads;
      {
        torch::AutoGradMode enable(true);
        const torch::Tensor qq = q.narrow(2, b.q_begin, b.q_rows).detach().requires_grad_(true);
        const torch::Tensor kk = kv[0].narrow(2, 0, b.k_rows).detach().requires_grad_(true);
        const torch::Tensor vv = kv[1].narrow(2, 0, b.k_rows).detach().requires_grad_(true);
        const BlockAttention part = core.block(qq, kk, vv, positions.narrow(0, b.q_begin, b.q_rows),
                                                    keys.narrow(0, 0, b.k_rows));
        const torch::Tensor w = torch::exp(part.lse.detach() - lse.narrow(2, b.q_begin, b.q_rows));
        const torch::Tensor d_rows = d_out.narrow(2, b.q_begin, b.q_rows);
        const torch::Tensor d_o = d_rows * w.unsqueeze(-1);
        const torch::Tensor d_lse =
            w * ((d_rows * part.out.detach()).sum(-1) - d_dot_out.narrow(2, b.q_begin, b.q_rows));
        block_grads = torch::autograd::grad({part.out, part.lse}, {qq, kk, vv}, {d_o, d_lse});
      }
      dq.narrow(2, b.q_begin, b.q_rows).add_(block_grads[0]);
      // Block j's gradient so far: zero at its owner, else what the previous holder sent.
      torch::Tensor dkv = grad_exchange ? grad_exchange->wait() : torch::zeros_like(kv);
      dkv[0].narrow(2, 0, b.k_rows).add_(block_grads[1]);
      dkv[1].narrow(2, 0, b.k_rows).add_(block_grads[2]);
      block_grads.clear();
      // On to the block's next holder; after the last step, to its owner.
      grad_exchange = std::make_unique<Exchange>(ring, dkv, kTagRingKvGrad);
      if (exchange)
        kv = exchange->wait();
    }
    const torch::Tensor mine = grad_exchange->wait();
    return {dq, mine[0], mine[1], torch::Tensor(), torch::Tensor()};
  }
};

} // namespace

torch::Tensor RingAttentionCore::forward(const torch::Tensor& q, const torch::Tensor& k,
                                         const torch::Tensor& v,
                                         const torch::Tensor& positions) const {
  return RingAttention::apply(q, k, v, positions,
                              static_cast<int64_t>(reinterpret_cast<intptr_t>(this)));
}

} // namespace meshsim
