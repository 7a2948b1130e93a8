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

#include <array>
#include <atomic>
#include <memory>

#include "memory/virtual_gpu.h"
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

// RingRunsEveryStep's count: rings run every step while it is above 0.
std::atomic<int> g_every_step{0};

// The three kinds of step (block_rows): the own block, an earlier one, a later one.
int block_kind(int r, int j) {
  return j == r ? 0 : j < r ? 1 : 2;
}

// On meta (plans) a block's attention has no values, and every step of one kind computes on
// the same shapes from the same tensors in flight. The first step of each kind runs; the others
// exchange their blocks as every step does but only count the charges the first made
// (skip_charges), so the memory the GPU reaches and the program the cost model reads (it
// splits a region at its messages by the charges between them) are those of running them all,
// and a plan of cp C runs at most three blocks of attention per layer instead of C.
class MetaRepeats {
public:
  explicit MetaRepeats(bool meta) : meta_(meta && g_every_step.load() == 0) {}
  /// Whether a step of `kind` stands in for one that ran.
  bool skips(int kind) const { return meta_ && ran_[static_cast<size_t>(kind)]; }
  /// Part `part` of a step of `kind`: `fn` run and its charges counted, or, skipping, counted.
  template <class Fn>
  void part(int kind, int part, bool skip, Fn&& fn) {
    int64_t& charges = charges_[static_cast<size_t>(kind)][static_cast<size_t>(part)];
    if (skip) {
      skip_charges(charges);
      return;
    }
    const int64_t before = thread_charge_count();
    fn();
    charges = thread_charge_count() - before;
  }
  void ran(int kind) { ran_[static_cast<size_t>(kind)] = true; }

private:
  bool meta_;
  std::array<bool, 3> ran_{};
  std::array<std::array<int64_t, 2>, 3> charges_{};
};

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
                               torch::Tensor v, torch::Tensor positions, int64_t core_address,
                               const AttentionDropout& dropout) {
    const auto& core = *reinterpret_cast<const ContextParallelCore*>(core_address);
    const Ring ring(core);
    const int64_t local = q.size(2);
    torch::Tensor kv = torch::stack({k, v}); // one message per step
    torch::Tensor out, lse;
    MetaRepeats repeats(q.is_meta());
    for (int s = 0; s < ring.cp; ++s) {
      std::unique_ptr<Exchange> exchange;
      if (s + 1 < ring.cp)
        exchange = std::make_unique<Exchange>(ring, kv, kTagRingKv);
      const int j = ring.source(s);
      const int kind = block_kind(ring.index, j);
      repeats.part(kind, 0, repeats.skips(kind), [&] {
        const BlockRows b = block_rows(ring.index, j, local);
        const torch::Tensor keys = cp_positions(local * ring.cp, ring.cp, j, positions.options());
        BlockAttention part = core.block(
            q.narrow(2, b.q_begin, b.q_rows), kv[0].narrow(2, 0, b.k_rows),
            kv[1].narrow(2, 0, b.k_rows), positions.narrow(0, b.q_begin, b.q_rows),
            keys.narrow(0, 0, b.k_rows), dropout);
        if (s == 0) { // the own block: every row sees its own token, so lse is finite
          out = std::move(part.out);
          lse = std::move(part.lse);
        } else {
          merge_rows(out, lse, b.q_begin, part);
        }
      });
      repeats.ran(kind);
      if (exchange)
        kv = exchange->wait();
    }
    ctx->save_for_backward({q, k, v, positions, out, lse});
    ctx->saved_data["core"] = core_address;
    dropout.save(ctx);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto& core =
        *reinterpret_cast<const ContextParallelCore*>(ctx->saved_data["core"].toInt());
    const Ring ring(core);
    const AttentionDropout dropout = AttentionDropout::saved(ctx);
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
    MetaRepeats repeats(q.is_meta());
    for (int s = 0; s < ring.cp; ++s) {
      std::unique_ptr<Exchange> exchange;
      if (s + 1 < ring.cp)
        exchange = std::make_unique<Exchange>(ring, kv, kTagRingKv);
      const int j = ring.source(s);
      const int kind = block_kind(ring.index, j);
      const bool skip = repeats.skips(kind);
      const BlockRows b = block_rows(ring.index, j, local);
      variable_list block_grads;
      repeats.part(kind, 0, skip, [&] {
        const torch::Tensor keys = cp_positions(local * ring.cp, ring.cp, j, positions.options());
        torch::AutoGradMode enable(true);
        const torch::Tensor qq = q.narrow(2, b.q_begin, b.q_rows).detach().requires_grad_(true);
        const torch::Tensor kk = kv[0].narrow(2, 0, b.k_rows).detach().requires_grad_(true);
        const torch::Tensor vv = kv[1].narrow(2, 0, b.k_rows).detach().requires_grad_(true);
        const BlockAttention part = core.block(qq, kk, vv, positions.narrow(0, b.q_begin, b.q_rows),
                                               keys.narrow(0, 0, b.k_rows), dropout);
        const torch::Tensor w = torch::exp(part.lse.detach() - lse.narrow(2, b.q_begin, b.q_rows));
        const torch::Tensor d_rows = d_out.narrow(2, b.q_begin, b.q_rows);
        const torch::Tensor d_o = d_rows * w.unsqueeze(-1);
        const torch::Tensor d_lse =
            w * ((d_rows * part.out.detach()).sum(-1) - d_dot_out.narrow(2, b.q_begin, b.q_rows));
        block_grads = torch::autograd::grad({part.out, part.lse}, {qq, kk, vv}, {d_o, d_lse});
        dq.narrow(2, b.q_begin, b.q_rows).add_(block_grads[0]);
      });
      // Block j's gradient so far: zero at its owner, else what the previous holder sent.
      torch::Tensor dkv = grad_exchange ? grad_exchange->wait() : torch::zeros_like(kv);
      repeats.part(kind, 1, skip, [&] {
        dkv[0].narrow(2, 0, b.k_rows).add_(block_grads[1]);
        dkv[1].narrow(2, 0, b.k_rows).add_(block_grads[2]);
        block_grads.clear();
      });
      repeats.ran(kind);
      // On to the block's next holder; after the last step, to its owner.
      grad_exchange = std::make_unique<Exchange>(ring, dkv, kTagRingKvGrad);
      if (exchange)
        kv = exchange->wait();
    }
    const torch::Tensor mine = grad_exchange->wait();
    return {dq, mine[0], mine[1], torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

} // namespace

RingRunsEveryStep::RingRunsEveryStep() { ++g_every_step; }
RingRunsEveryStep::~RingRunsEveryStep() { --g_every_step; }

torch::Tensor RingAttentionCore::forward_with_dropout(const torch::Tensor& q,
                                                      const torch::Tensor& k,
                                                      const torch::Tensor& v,
                                                      const torch::Tensor& positions,
                                                      const AttentionDropout& dropout) const {
  return RingAttention::apply(q, k, v, positions,
                              static_cast<int64_t>(reinterpret_cast<intptr_t>(this)), dropout);
}

} // namespace meshsim
