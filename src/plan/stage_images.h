// Pipeline stages a plan does not run: middle stages that are images of stage 1.
//
// A plan executes one GPU per stage (plan.h), and each stage is a thread running its blocks on
// meta tensors, so a deep pipeline costs a plan as many times the work of a stage. With few
// micro-batches, as the search's reduced plans have (one or two, search.h), the middle stages
// of a pipeline of equal stages run the same program: the same blocks, the same schedule
// (every 1F1B stage from 1 to P − m − 1 warms up with all m micro-batches), the same messages
// to the stage before and after. Those from 2 on are then images of stage 1, as a replica is
// of the replica it copies: the plan runs stage 1 and routes its messages for stage 2 to the
// next stage that runs (and that stage's for the one before it back to stage 1), which, with
// the same schedule, receives them in the order stage 2 would have; the images' records are
// stage 1's with every rank moved to their own stage, so the cost model still replays every
// stage of the pipeline. PlanStageImages holds such a plan equal to one that runs every stage.
#pragma once

#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/recorder.h"
#include "config/config.h"
#include "mesh/parallel_dims.h"

namespace meshsim {

/// Stages [first, last] are images of stage 1; none when last < first.
struct StageImages {
  int first = 2, last = 1;
  bool any() const { return last >= first; }
  bool holds(int stage) const { return stage >= first && stage <= last; }
};

/// The middle stages of `config`'s pipeline whose program is stage 1's: equal stages, one
/// model chunk per stage, and the same schedule of actions as stage 1. The last stage, and
/// each stage whose schedule differs, runs.
StageImages stage_images(const TrainConfig& config, const ParallelDims& dims);

/// Where a rank's point-to-point message for `peer` goes (MeshOptions::p2p_route): to the peer,
/// except that stage 1's for the first image stage go to the same place in the stage after
/// the images, and that stage's for the last image stage to the same place in stage 1. Null
/// when there are no images.
P2pRoute stage_image_route(const ParallelDims& dims, const StageImages& images);

/// Stage 1's records moved to `stage`: a message's ranks move by stage − 1 stages, and so does
/// a collective's group when it lies within stage 1 (one spanning stages is the same group).
Recorder stage_image(const Recorder& stage_one, const ParallelDims& dims, int stage);

/// A phase of stage 1's memory samples ("1F0": stage 1's forward of micro-batch 0) as the
/// image at `stage` names it ("4F0"); a phase of no stage is the same.
std::string stage_image_phase(const std::string& phase, int stage);

} // namespace meshsim
