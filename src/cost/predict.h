// Prediction: one recorded training step replayed on a target cluster.
//
// build_step_program() turns what the ranks recorded (comm/recorder.h) into a replay Program:
//  - each rank's compute regions and collectives of the step, in the order they started
//    (stream order); a step runs from the rank's first compute region of the step to its
//    first one of the next step;
//  - a collective belongs to the step in which its lowest member (a send/recv: the sender)
//    issued it, and every member's instance joins that step, matched by the recorded
//    sequence number (send/recv by their order per (sender, receiver) pair);
//  - every task waits for the task recorded before it on its rank (the in-process collectives
//    block), except: a send does not hold up what follows it (it is buffered), and DDP
//    buckets overlap backward: the reductions recorded right after a backward region whose
//    sizes add up to its layers' parameters (or twice them: 16-bit gradients reduced in fp32)
//    (last layer first, as buckets are built) each
//    wait only for the fraction of backward, by modelled time, that produces the bucket's last
//    gradient;
//  - a collective recorded inside a compute region's span (a tensor-parallel all-reduce)
//    splits the region, in proportion to the measured time on either side; an all-gather
//    started with *_async ahead of its wait there (the distributed optimizer's) runs on the
//    data-parallel stream from its start: it waits only for the compute that ended last
//    before it was started, and what follows its wait waits for it;
//  - compute on the target: the roofline of each counted layer (models/layers/flops.h), with
//    the attention scores' traffic its core recorded (the eager core's; a fused core records
//    none and its recomputed scores instead); a region with
//    no counted work, or every region under `measured_compute`, keeps its measured time.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/recorder.h"
#include "cost/replay.h"

namespace meshsim {

struct PredictOptions {
  Dtype dtype = Dtype::FP32;             // the math of the target run (meshsim trains fp32)
  /// FP8 training (--precision fp8, as Transformer Engine and torchao's float8 train): the
  /// transformer blocks' linear GEMMs run at the FP8 peak (Efficiency::fp8_matmul), with their
  /// operands quantized first; the attention core, the embedding, the head and every other
  /// kernel stay at `dtype` (bf16). docs/cost-model.md, FP8.
  bool fp8 = false;
  /// Tensor parallelism's collectives run beside the GEMMs around them (Megatron's
  /// --tp-comm-overlap, torchtitan's async TP): each waits for the compute before it, the
  /// compute after it runs meanwhile, and the compute after that waits for it. Collectives of
  /// `tp` ranks inside a forward or backward are taken as tensor parallelism's.
  bool overlap_tensor_parallel = false;
  int tp = 1;
  Efficiency efficiency;                 // per op class, see roofline.h
  Algorithm algorithm = Algorithm::Auto; // all_reduce algorithm
  bool measured_compute = false;         // compute = measured time (target = this device)
  bool overlap_buckets = true;           // DDP buckets start as their gradients are ready
  int64_t step = -1;                     // -1: representative_step()
  /// Ranks with no records are images of the recorded ones, each recorded rank standing for
  /// the same number of GPUs (a plan's symmetry classes): only the recorded ranks are
  /// replayed (ReplayOptions::absent_ranks_are_images) and the FLOPs are scaled to every GPU.
  bool images = false;
};

/// Whether `w`'s linear GEMMs run in FP8 under PredictOptions::fp8: a transformer block's
/// ("block<N>"), as Transformer Engine's layers are the blocks'; the embedding and the head
/// stay in bf16.
bool runs_in_fp8(const LayerWork& w);

/// One layer's pass on `gpu`: its GEMMs by size and the rest memory bound, at least its
/// launches (roofline.h); under `o.fp8` a block's linear GEMMs at the FP8 peak, their operands
/// quantized first (docs/cost-model.md, FP8). A layer from older records, with no kernel
/// counts, is one roofline.
double layer_time(const LayerWork& w, const GpuSpec& gpu, const PredictOptions& o);

/// The step predicted by default: the second-to-last recorded step (the last one also holds
/// the final evaluation and checkpoint), or the only one. 0 when nothing was recorded.
int64_t representative_step(const std::vector<Recorder>& ranks);

/// One step of `ranks` as a replay Program (see the top of this file). `flops` receives the
/// counted FLOPs of the step summed over every rank, and `recompute_flops` the part of them
/// that activation recomputation ran again. Throws std::invalid_argument when the step was
/// not recorded.
Program build_step_program(const std::vector<Recorder>& ranks, int64_t step, const GpuSpec& gpu,
                           const PredictOptions& options, double* flops = nullptr,
                           double* recompute_flops = nullptr);

struct Prediction {
  std::string cluster; // ClusterSpec::to_string()
  int64_t step = 0;    // the recorded step that was replayed
  int world_size = 0;
  int64_t samples_per_step = 0;
  double step_time_s = 0; // makespan of the replayed step + overlap_penalty_s
  double samples_per_s = 0;
  double flops = 0;        // counted FLOPs of the step, every GPU, recomputation included
  double model_flops = 0;  // of them, the model's: recomputation excluded
  // Counted FLOPs, recomputation included (as Narayanan et al. count), / GPUs / step time.
  double tflops_per_gpu = 0;
  // The model's FLOPs (recomputation excluded, as Chowdhery et al. define MFU) / GPUs / step
  // time / the dtype's dense peak.
  double mfu = 0;
  double exposed_comm_s = 0;  // worst rank: communication not hidden behind compute
  // Efficiency::overlap_slowdown x the most communication any rank hides behind compute: added
  // to the replay's makespan in step_time_s.
  double overlap_penalty_s = 0;
  double bubble_fraction = 0; // compute streams idle (pipeline bubbles, exposed comm)
  double compute_s = 0;       // busiest rank's compute time
  double comm_s = 0;          // busiest rank's communication time
  std::string dtype;
  std::string compute_source; // "roofline" or "measured"
  Program program;
  ReplayResult replay;
  std::vector<Recorder> timeline; // the predicted step as records, for the trace
};

/// Replays step `options.step` of `ranks` on `cluster`.
Prediction predict(const std::vector<Recorder>& ranks, int64_t samples_per_step,
                   const ClusterSpec& cluster, const PredictOptions& options = {});

/// A data-parallel run's rank 0 records replicated on `world` GPUs, every collective over
/// all of them: the same per-GPU work (weak scaling). std::invalid_argument when some
/// collective does not span the whole recorded world (tensor or pipeline parallel).
std::vector<Recorder> resize_data_parallel(const std::vector<Recorder>& ranks, int world);

/// The headline numbers (not the program): what summary.json holds under "prediction".
nlohmann::json to_json(const Prediction& prediction);

/// Throws DataError when a prediction from outside records has a figure no run can have: not
/// finite, negative, or an MFU above 100% (records claiming more work than their time holds).
void check_prediction(const Prediction& prediction);

/// What `meshsim predict` needs from a run: every rank's records, losslessly.
nlohmann::json records_to_json(const std::vector<Recorder>& ranks, int64_t samples_per_step);
/// The inverse; throws DataError (one line) on a malformed document or an impossible value:
/// negative work, a span that ends before it starts, a rank outside the run, past-any-run sizes.
/// `world`: the ranks a collective may name (0: as many as the document holds; a process's
/// part holds one rank of a larger world).
std::vector<Recorder> records_from_json(const nlohmann::json& doc, int64_t* samples_per_step,
                                        int world = 0);

} // namespace meshsim
