// The Llama's parallel plan (models/parallel_plan.h), beside the model: attn.q, attn.k,
// attn.v, mlp.gate, mlp.up column-parallel; attn.o and mlp.down row-parallel; the head over
// the vocabulary; the blocks as pipeline units. Attention shards whole heads, so each member
// keeps heads/tp query heads and kv_heads/tp kv heads, exactly the ones its query heads read
// (both must divide by tp).
#include "models/llama.h"

namespace meshsim {

ParallelPlan llama_parallel_plan(const TransformerShape& o) {
  ParallelPlan plan;
  for (int64_t l = 0; l < o.layers; ++l) {
    const std::string block = "block" + std::to_string(l);
    plan.linears.push_back({block + ".attn.q", ParallelStyle::Column});
    plan.linears.push_back({block + ".attn.k", ParallelStyle::Column});
    plan.linears.push_back({block + ".attn.v", ParallelStyle::Column});
    plan.linears.push_back({block + ".attn.o", ParallelStyle::Row});
    plan.linears.push_back({block + ".mlp.gate", ParallelStyle::Column});
    plan.linears.push_back({block + ".mlp.up", ParallelStyle::Column});
    plan.linears.push_back({block + ".mlp.down", ParallelStyle::Row});
    plan.pipeline_units.push_back(block);
    plan.attention.push_back(block + ".attn");
  }
  plan.vocab_head = "head";
  plan.sequence_after = "embed";
  plan.sequence_before = "head";
  return plan;
}

} // namespace meshsim
