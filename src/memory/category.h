// Memory categories: what each byte on a virtual GPU is for.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "base/bytes.h"

namespace meshsim {

enum class MemoryCategory : uint8_t {
  Parameters = 0,
  Gradients,
  Optimizer,
  Activations,
  Communication,
  Other,
};

constexpr int kNumCategories = 6;

/// The lower-case name used in logs, summary.json and memory.csv.
const char* category_name(MemoryCategory c);

/// All categories in declaration order.
constexpr std::array<MemoryCategory, kNumCategories> kAllCategories = {
    MemoryCategory::Parameters,  MemoryCategory::Gradients,     MemoryCategory::Optimizer,
    MemoryCategory::Activations, MemoryCategory::Communication, MemoryCategory::Other};

/// Bytes of each category, in declaration order.
using CategoryBytes = std::array<int64_t, kNumCategories>;

/// The bytes of every category together.
inline int64_t category_total(const CategoryBytes& b) {
  int64_t t = 0;
  for (int64_t v : b) t += v;
  return t;
}

constexpr double kMiB = 1024.0 * 1024.0;

} // namespace meshsim
