// A model's plan through the family table, and the name matching the plans' entries use.
#include "models/parallel_plan.h"

#include <stdexcept>

#include "models/family.h"

namespace meshsim {

ParallelPlan parallel_plan(const std::string& model, const TransformerShape& shape) {
  const ModelFamily* family = find_model_family(model);
  if (!family || !family->parallel_plan)
    throw std::invalid_argument("tensor parallel: model '" + model +
                                "' has no plan (gpt and llama have)");
  return family->parallel_plan(shape);
}

bool pattern_matches(const std::string& pattern, const std::string& name) {
  // Iterative glob: remember the last '*' and retry from one character further on mismatch.
  size_t p = 0, n = 0, star = std::string::npos, resume = 0;
  while (n < name.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = n;
    } else if (p < pattern.size() && pattern[p] == name[n]) {
      ++p;
      ++n;
    } else if (star != std::string::npos) {
      p = star + 1;
      n = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*')
    ++p;
  return p == pattern.size();
}

} // namespace meshsim
