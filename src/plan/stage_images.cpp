// Middle pipeline stages as images of stage 1. See stage_images.h.
#include "plan/stage_images.h"

#include <algorithm>

#include "config/stage_layers.h"
#include "parallel/pipeline/schedule.h"

namespace meshsim {
namespace {

// A stage's actions without the stage they belong to: what it does, in order.
bool same_program(const std::vector<Action>& a, const std::vector<Action>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](const Action& x, const Action& y) {
    return x.kind == y.kind && x.micro_batch == y.micro_batch;
  });
}

// `rank` moved by `stages` pipeline stages.
int shifted(const ParallelDims& dims, int rank, int stages) {
  ParallelCoord c = dims.coord(rank);
  c.pp += stages;
  return dims.rank(c);
}

} // namespace

StageImages stage_images(const TrainConfig& config, const ParallelDims& dims) {
  StageImages none;
  if (dims.pp < 4 || config.virtual_stages != 1 || config.micro_batches < 1)
    return none;
  const std::vector<int64_t> layers = stage_layer_counts(config); // empty: equal stages
  const Schedule schedule = make_schedule(config.schedule, dims.pp, config.micro_batches, 1);
  StageImages images;
  for (int s = 2; s < dims.pp - 1; ++s) {
    const bool alike = same_program(schedule[static_cast<size_t>(s)], schedule[1]) &&
                       (layers.empty() || layers[static_cast<size_t>(s)] == layers[1]);
    if (!alike)
      break;
    images.last = s;
  }
  return images;
}

P2pRoute stage_image_route(const ParallelDims& dims, const StageImages& images) {
  if (!images.any())
    return nullptr;
  return [dims, images](int self, int peer) {
    const int from = dims.coord(self).pp, to = dims.coord(peer).pp;
    if (from == 1 && to == images.first) // stage 1 sends on past the images
      return shifted(dims, peer, images.last + 1 - to);
    if (from == images.last + 1 && to == images.last) // and hears back from the stage after
      return shifted(dims, peer, 1 - to);
    return peer;
  };
}

Recorder stage_image(const Recorder& stage_one, const ParallelDims& dims, int stage) {
  Recorder out = stage_one;
  const int by = stage - 1;
  for (CollectiveRecord& c : out.collectives) {
    const bool message = c.peer >= 0;
    const bool within = std::all_of(c.group.begin(), c.group.end(),
                                    [&](int g) { return dims.coord(g).pp == 1; });
    if (!message && !within)
      continue;
    for (int& g : c.group)
      g = shifted(dims, g, by);
    if (message)
      c.peer = shifted(dims, c.peer, by);
  }
  return out;
}

std::string stage_image_phase(const std::string& phase, int stage) {
  if (phase.size() < 2 || phase[0] != '1' || (phase[1] != 'F' && phase[1] != 'B'))
    return phase;
  return std::to_string(stage) + phase.substr(1);
}

} // namespace meshsim
