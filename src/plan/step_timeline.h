// The predicted step per pipeline stage, as a person reads it: when the stage's GPU computes,
// when it waits on communication it could not hide, and when it idles (the pipeline's bubble).
// plan.html and `meshsim serve` draw it; the totals are exact, the segments a picture of them.
#pragma once

#include <string>
#include <vector>

#include "plan/plan.h"

namespace meshsim {

enum class StepActivity { Compute, ExposedComm, Bubble };
const char* activity_name(StepActivity a); // "compute", "comm", "bubble"

struct StepSegment {
  double start_s = 0;
  double end_s = 0;
  StepActivity activity = StepActivity::Compute;
};

struct StageTimeline {
  int stage = 0;
  int rank = 0;              // the GPU that stands for the stage
  double compute_s = 0;      // its compute stream busy
  double exposed_comm_s = 0; // communication running while nothing computes
  double bubble_s = 0;       // neither: the rest of the step
  /// Non-overlapping, in order, covering [0, step]. With more than `max_segments` changes,
  /// the step is cut into that many equal slices, each labelled by what filled most of it.
  std::vector<StepSegment> segments;
};

/// Each stage's timeline in `prediction`'s replay of `plan` (an image stage's from the rank it
/// is an image of). `step_s` is the replay's makespan.
std::vector<StageTimeline> stage_timelines(const Plan& plan, const Prediction& prediction,
                                           int max_segments = 600);

/// The exact split of [0, step_s] for a rank with these compute and communication intervals
/// (each [start, end), any order, may overlap): compute first, then exposed communication,
/// the rest bubble.
StageTimeline split_step(std::vector<std::pair<double, double>> compute,
                         std::vector<std::pair<double, double>> comm, double step_s,
                         int max_segments = 600);

} // namespace meshsim
