// The GPT's parallel plan (models/parallel_plan.h), beside the model: Megatron's split of
// each block (q, k, v and mlp.fc column-parallel; attn.out and mlp.proj row-parallel), the
// untied head over the vocabulary, the blocks as pipeline units.
#include "models/gpt.h"

namespace meshsim {

ParallelPlan gpt_parallel_plan(const TransformerShape& o) {
  ParallelPlan plan;
  for (int64_t l = 0; l < o.layers; ++l) {
    const std::string block = "block" + std::to_string(l);
    plan.linears.push_back({block + ".attn.q", ParallelStyle::Column});
    plan.linears.push_back({block + ".attn.k", ParallelStyle::Column});
    plan.linears.push_back({block + ".attn.v", ParallelStyle::Column});
    plan.linears.push_back({block + ".attn.out", ParallelStyle::Row});
    plan.linears.push_back({block + ".mlp.fc", ParallelStyle::Column});
    plan.linears.push_back({block + ".mlp.proj", ParallelStyle::Row});
    plan.pipeline_units.push_back(block);
    plan.attention.push_back(block + ".attn");
  }
  plan.vocab_head = "head"; // whole when tied: it shares the embedding's wte
  if (!o.tie_head) // Megatron's VocabParallelEmbedding; a tied head reads the whole table
    plan.vocab_embedding = "embed";
  plan.sequence_after = "embed";
  plan.sequence_before = "head";
  return plan;
}

} // namespace meshsim
