// Pipeline stages of unequal size: the flags' counts, checked and resolved (stage_layers.h).
#include "config/stage_layers.h"

#include <cctype>
#include <numeric>
#include <stdexcept>

#include <fmt/format.h>

#include "base/printable.h"
#include "models/family.h"

namespace meshsim {
namespace {

// More blocks than any model a plan can build (kMaxPlannedBlocksPerStage per stage, and a
// count past int's range is a typo, not a model).
constexpr int64_t kMaxStageLayerCount = 1 << 20;

std::string trimmed(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

// Splits `total` blocks over `stages` stages as the even cut does: the first ones take one
// more while there is a remainder.
void share_evenly(std::vector<int64_t>& counts, size_t from, size_t to, int64_t total) {
  const int64_t n = static_cast<int64_t>(to - from);
  for (size_t i = from; i < to; ++i)
    counts[i] = total / n + (static_cast<int64_t>(i - from) < total % n ? 1 : 0);
}

} // namespace

std::vector<int64_t> parse_stage_layers(const std::string& text) {
  if (trimmed(text).empty())
    throw std::invalid_argument("--stage-layers is empty: give the blocks of each stage, e.g. 3,4,4,3");
  std::vector<int64_t> out;
  size_t begin = 0;
  while (true) {
    const size_t comma = text.find(',', begin);
    const std::string item =
        trimmed(text.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin));
    bool digits = !item.empty() && item.size() <= 7;
    for (char ch : item) digits = digits && std::isdigit(static_cast<unsigned char>(ch));
    if (!digits)
      throw std::invalid_argument(fmt::format(
          "--stage-layers '{}': '{}' is not a whole number of blocks (give e.g. 3,4,4,3)",
          printable(text), printable(item)));
    const int64_t n = std::stoll(item);
    if (n > kMaxStageLayerCount)
      throw std::invalid_argument(fmt::format("--stage-layers: {} blocks on one stage is more than {}",
                                              n, kMaxStageLayerCount));
    out.push_back(n);
    if (comma == std::string::npos) break;
    begin = comma + 1;
    if (out.size() > static_cast<size_t>(kMaxGpus) * 64)
      throw std::invalid_argument("--stage-layers lists more stages than any pipeline has");
  }
  return out;
}

std::vector<int64_t> stage_layer_counts(const TrainConfig& c) {
  const bool list = !c.stage_layers.empty();
  const bool ends = c.first_stage_layers != 0 || c.last_stage_layers != 0;
  if (!list && !ends) return {};
  require(!list || !ends,
          "--stage-layers lists every stage: give it or --first-stage-layers / "
          "--last-stage-layers, not both");
  require(model_family(c.model).transformer,
          fmt::format("--stage-layers and --first/--last-stage-layers count transformer blocks "
                      "(gpt, llama); {} is cut at its layers with parameters",
                      c.model));
  require(c.pp > 1, fmt::format("--stage-layers and --first/--last-stage-layers need --pp 2 or "
                                "more, got --pp {}",
                                c.pp));
  const int64_t layers = c.shape.layers;
  const int64_t chunks = int64_t{c.pp} * c.virtual_stages;
  std::vector<int64_t> counts;
  if (list) {
    counts = parse_stage_layers(c.stage_layers);
    require(static_cast<int64_t>(counts.size()) == chunks,
            c.virtual_stages == 1
                ? fmt::format("--stage-layers lists {} stages, --pp has {}", counts.size(), c.pp)
                : fmt::format("--stage-layers lists {} counts, --pp {} × --virtual-stages {} has "
                              "{} model chunks (in virtual-stage order)",
                              counts.size(), c.pp, c.virtual_stages, chunks));
  } else {
    require(c.first_stage_layers >= 0 && c.last_stage_layers >= 0,
            fmt::format("--first-stage-layers {} / --last-stage-layers {}: a stage holds at least "
                        "one block",
                        c.first_stage_layers, c.last_stage_layers));
    require(c.virtual_stages == 1,
            fmt::format("--first/--last-stage-layers run without --virtual-stages (got {}); give "
                        "--stage-layers with --pp × --virtual-stages counts instead",
                        c.virtual_stages));
    counts.assign(static_cast<size_t>(c.pp), 0);
    const size_t from = c.first_stage_layers > 0 ? 1 : 0;
    const size_t to = c.last_stage_layers > 0 ? counts.size() - 1 : counts.size();
    if (from) counts.front() = c.first_stage_layers;
    if (to < counts.size()) counts.back() = c.last_stage_layers;
    const int64_t rest = layers - c.first_stage_layers - c.last_stage_layers;
    const int64_t others = static_cast<int64_t>(to - from);
    require(others > 0 ? rest >= others : rest == 0,
            others > 0
                ? fmt::format("--first-stage-layers {} and --last-stage-layers {} leave {} of "
                              "--layers {} for the other {} stages: every stage needs a block",
                              c.first_stage_layers, c.last_stage_layers, rest, layers, others)
                : fmt::format("--first-stage-layers {} + --last-stage-layers {} = {} is not "
                              "--layers {} (--pp 2 has no other stage)",
                              c.first_stage_layers, c.last_stage_layers,
                              c.first_stage_layers + c.last_stage_layers, layers));
    if (others > 0) share_evenly(counts, from, to, rest);
  }
  for (size_t i = 0; i < counts.size(); ++i)
    require(counts[i] >= 1, fmt::format("--stage-layers '{}': {} {} has no block: every stage "
                                        "needs one",
                                        printable(c.stage_layers),
                                        c.virtual_stages == 1 ? "stage" : "model chunk", i));
  const int64_t sum = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  require(sum == layers, fmt::format("--stage-layers '{}' sums to {} blocks, --layers is {}",
                                     printable(c.stage_layers), sum, layers));
  return counts;
}

} // namespace meshsim
