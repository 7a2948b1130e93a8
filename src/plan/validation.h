// `meshsim validate`: every published measurement meshsim's cost model is held against, each
// predicted with the configuration the publication names, and the error.
//
// A row is a calibration row when one of the model's constants was fitted on it (its error
// says how well the fit reproduces it, nothing more), and held out otherwise: the held-out
// errors are the model's accuracy. Where a publication gives a range, a prediction inside it
// has no error, and one outside it is measured from the nearer end. The rows, their sources
// and which constant each calibrates are listed in docs/cost-model.md.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "cost/roofline.h"

namespace meshsim {

/// The families the targets apply to, each on its own: a family's held-out rows are its
/// accuracy (docs/cost-model.md, Validation).
constexpr const char* kFamilyOlder = "A100/V100 (2019-2021)";
constexpr const char* kFamilyCollectives = "collectives";
constexpr const char* kFamilyDense = "dense bf16 (H100)";
constexpr const char* kFamilyFp8 = "FP8 (H100)";
constexpr const char* kFamilyMoe = "MoE (H100)";
constexpr const char* kFamilyLongContext = "long context (H100)";
/// Every family in the order `meshsim validate` prints them.
const std::vector<std::string>& validation_families();

struct PublishedRow {
  std::string group;   // "nccl-tests", "Narayanan et al. SC'21 Table 1"
  std::string family;  // one of validation_families()
  std::string name;    // what was measured, with its configuration
  std::string source;  // where the number is published, and the software version that ran it
  std::string unit;    // "GB/s busbw", "TFLOP/s per GPU"
  double low = 0;      // the published value, or the low end of a published range
  double high = 0;     // == low for a single value
  std::string fitted;  // the constant fitted on this row; empty: held out
  std::function<double()> predict;  // the prediction, in `unit`

  bool calibration() const { return !fitted.empty(); }
};

struct RowResult {
  const PublishedRow* row = nullptr;
  double predicted = 0;
  double error = 0;  // signed: (predicted - nearer end of the published range) / that end
  std::string failure;  // set when the prediction could not be made (then no error counts)
};

/// The errors of one family's rows (or of all of them).
struct ErrorSummary {
  std::string family;
  int held_out = 0;
  double held_out_mean_abs = 0; // mean |error| over held-out rows
  double held_out_worst = 0;    // largest |error| over held-out rows
  int calibration = 0;
  double calibration_mean_abs = 0;
};

struct ValidationSummary {
  std::vector<RowResult> rows;
  std::vector<ErrorSummary> families; // the families present, in validation_families() order
  int held_out = 0;
  double held_out_mean_abs = 0;  // mean |error| over held-out rows
  double held_out_worst = 0;     // largest |error| over held-out rows
  double calibration_mean_abs = 0;
  int failed = 0;  // rows whose prediction threw
};

/// Every row meshsim knows. `groups` empty: all of them; else only those whose group starts
/// with one of the given words ("nccl", "narayanan", "megatron-bridge"). `families` likewise,
/// by the start of the family's name ("dense", "fp8", "moe", "long", "a100", "collectives").
/// Compute is predicted with `efficiency` (the defaults, or a calibration being tried).
std::vector<PublishedRow> published_rows(const std::vector<std::string>& groups = {},
                                         const Efficiency& efficiency = {},
                                         const std::vector<std::string>& families = {});

/// The error of `predicted` against a published [low, high].
double published_error(double predicted, double low, double high);

/// Predicts every row (calling `progress(i, n, row)` before each) and summarises. A row whose
/// prediction throws is kept with its failure and left out of the errors.
ValidationSummary validate_rows(const std::vector<PublishedRow>& rows,
                                const std::function<void(size_t, size_t, const PublishedRow&)>&
                                    progress = {});

/// Megatron-LM's FLOPs per iteration (num_floating_point_operations in
/// megatron/training/training.py, Megatron-Core r0.8.0), what its README's and NeMo's TFLOP/s
/// count: 12·B·s·L·h²·((1 + g/n + s/h) + (f/h)·(3/2 if gated) + V/(2·L·h)), with n heads, g
/// key/value groups, f the MLP's width; no recomputation counted, no causal halving.
double megatron_flops(double batch, double seq, double layers, double hidden, double heads,
                      double kv_heads, double ffn, bool gated, double vocab);

/// Narayanan et al.'s FLOPs per iteration (their eq. 3): 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)),
/// the forward counted twice for full recomputation.
double narayanan_flops(double batch, double seq, double layers, double hidden, double vocab);

} // namespace meshsim
