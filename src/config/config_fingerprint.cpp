// What the processes of a run compare at the rendezvous: every field of config.json and the
// run folder. Two processes started with different flags would train different programs that
// happen to share collectives (or crash inside Gloo when the sizes differ); they stop first.
#include <fmt/format.h>

#include "base/printable.h"
#include "config/config.h"

namespace meshsim {
namespace {

void first_difference_in(const nlohmann::json& a, const nlohmann::json& b, const std::string& prefix,
                         std::optional<FieldDifference>* found) {
  if (*found) return;
  if (a.is_object() && b.is_object()) {
    // Keys in sorted order: the same "first" field on every process.
    for (const auto& [key, value] : a.items()) {
      const auto other = b.find(key);
      if (other == b.end()) {
        *found = FieldDifference{prefix + key, value.dump(), "(absent)"};
        return;
      }
      first_difference_in(value, *other, prefix + key + ".", found);
      if (*found) return;
    }
    for (const auto& [key, value] : b.items())
      if (!a.contains(key)) {
        *found = FieldDifference{prefix + key, "(absent)", value.dump()};
        return;
      }
    return;
  }
  if (a != b) {
    const std::string name = prefix.empty() ? "(the whole configuration)" : prefix.substr(0, prefix.size() - 1);
    *found = FieldDifference{name, a.dump(), b.dump()};
  }
}

} // namespace

nlohmann::json configuration_fingerprint(const TrainConfig& c) {
  nlohmann::json doc = to_json(c);
  doc["out"] = c.out;
  return doc;
}

std::optional<FieldDifference> first_difference(const nlohmann::json& a, const nlohmann::json& b) {
  std::optional<FieldDifference> found;
  first_difference_in(a, b, "", &found);
  if (found) {
    found->field = printable(found->field);
    found->a = printable(found->a);
    found->b = printable(found->b);
  }
  return found;
}

} // namespace meshsim
