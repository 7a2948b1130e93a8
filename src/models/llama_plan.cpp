// The Llama's parallel plan (models/parallel_plan.h), beside the model: attn.q, attn.k,
// attn.v, mlp.gate, mlp.up column-parallel; attn.o and mlp.down row-parallel; the head over
// the vocabulary; the blocks as pipeline units. Attention shards whole heads, so each member
// keeps heads/tp query heads and kv_heads/tp kv heads, exactly the ones its query heads read
// (both must divide by tp). A mixture-of-experts layer's feed-forward stays whole on every
// tensor-parallel member (its experts split over ep instead: parallel/expert/), each member
// running it on the same tokens. Multi-head latent attention splits q_b (or q) and kv_b by heads
// and o, keeping its two down-projections q_a and kv_a whole (as Megatron's MLA does); the
// rotated key part every head reads has its gradient summed by tensor parallelism
// (AttentionImpl::set_shared_key_region).
#include "models/llama.h"

namespace meshsim {

ParallelPlan llama_parallel_plan(const TransformerShape& o) {
  ParallelPlan plan;
  for (int64_t l = 0; l < o.layers; ++l) {
    const std::string block = "block" + std::to_string(l);
    if (o.latent.kv_rank == 0) {
      plan.linears.push_back({block + ".attn.q", ParallelStyle::Column});
      plan.linears.push_back({block + ".attn.k", ParallelStyle::Column});
      plan.linears.push_back({block + ".attn.v", ParallelStyle::Column});
    } else { // latent attention: q_a and kv_a stay whole
      plan.linears.push_back({block + (o.latent.q_rank > 0 ? ".attn.q_b" : ".attn.q"),
                              ParallelStyle::Column});
      plan.linears.push_back({block + ".attn.kv_b", ParallelStyle::Column});
    }
    plan.linears.push_back({block + ".attn.o", ParallelStyle::Row});
    if (!llama_moe_layer(o, l)) {
      plan.linears.push_back({block + ".mlp.gate", ParallelStyle::Column});
      plan.linears.push_back({block + ".mlp.up", ParallelStyle::Column});
      plan.linears.push_back({block + ".mlp.down", ParallelStyle::Row});
    }
    plan.pipeline_units.push_back(block);
    plan.attention.push_back(block + ".attn");
  }
  plan.vocab_head = "head";
  if (!o.tie_head) // torchtitan's row-wise embedding; a tied head reads the whole table
    plan.vocab_embedding = "embed";
  plan.sequence_after = "embed";
  plan.sequence_before = "head";
  return plan;
}

} // namespace meshsim
