// A model's parallel plan: what tensor parallelism splits and how, where the vocabulary-parallel
// head is, where sequence parallelism splits the sequence, where a pipeline may cut, and which
// modules are attention (whose cores a fused or context-parallel core replaces). Each model
// declares its own beside itself (gpt_plan.cpp, llama_plan.cpp), as torchtitan keeps
// parallelize.py in each model's folder; the strategies read it instead of guessing from
// child names.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "models/models.h"

namespace meshsim {

enum class ParallelStyle { Column, Row };

struct ParallelPlan {
  /// Linears by full module name ('*' matches any run of characters, dots too) and how
  /// tensor parallelism splits them: Column (output features) or Row (input features). The
  /// Linear's parent must implement LinearSlots (models/layers/slots.h).
  std::vector<std::pair<std::string, ParallelStyle>> linears;
  /// The child of the model that is the LM head, split over the vocabulary by tensor
  /// parallelism when it is a Linear of its own (not tied to the embedding); empty: none.
  std::string vocab_head = "head";
  /// The child of the model that is the token embedding, split over the vocabulary by tensor
  /// parallelism when it implements VocabSlots (models/layers/slots.h); empty: kept whole (a
  /// tied model, whose head reads the whole table).
  std::string vocab_embedding{};
  /// Sequence parallelism: the children of the model after which the sequence is split over
  /// the group and before which it is gathered whole again.
  std::string sequence_after = "embed", sequence_before = "head";
  /// The children where a pipeline unit starts, in order: a pipeline cuts only there (the
  /// first unit also takes the children before it, the last those after it). Empty: every
  /// child with parameters starts one.
  std::vector<std::string> pipeline_units{};
  /// The attention modules (full names), each implementing AttentionHeads: where a core is.
  std::vector<std::string> attention{};
};

/// The plan of `model` ("gpt" or "llama") of shape `shape`. Throws std::invalid_argument for
/// a model without one.
ParallelPlan parallel_plan(const std::string& model, const TransformerShape& shape);

/// True when `name` matches `pattern`, where '*' matches any run of characters (dots too).
bool pattern_matches(const std::string& pattern, const std::string& name);

} // namespace meshsim
