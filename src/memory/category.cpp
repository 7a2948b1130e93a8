// Category names and byte-size formatting shared by memory accounting and the CLI.
#include "memory/category.h"

#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

namespace meshsim {

const char* category_name(MemoryCategory c) {
  switch (c) {
  case MemoryCategory::Parameters: return "parameters";
  case MemoryCategory::Gradients: return "gradients";
  case MemoryCategory::Optimizer: return "optimizer";
  case MemoryCategory::Activations: return "activations";
  case MemoryCategory::Communication: return "communication";
  case MemoryCategory::Other: return "other";
  }
  return "other";
}

} // namespace meshsim
