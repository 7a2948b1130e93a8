// Pipeline stages of unequal size: the transformer blocks each model chunk holds, from
// --stage-layers (an explicit list) or --first-stage-layers / --last-stage-layers (Megatron's
// uneven first and last stage, the rest shared evenly by the other stages). The list's text
// is outside input: parse_stage_layers refuses a bad one in one line (fuzz/fuzz_cli.cpp
// reaches it through the command line).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"

namespace meshsim {

/// "3,4,4,3" -> {3, 4, 4, 3}: positive whole numbers separated by commas (spaces around them
/// allowed). Throws std::invalid_argument with a one-line message for anything else.
std::vector<int64_t> parse_stage_layers(const std::string& text);

/// The blocks of each of the pp × virtual_stages model chunks, in virtual-stage order, as
/// the flags ask; empty when none of them is given (the blocks split evenly). Throws
/// std::invalid_argument with a one-line message when the counts cannot be: a list of the
/// wrong length, a stage with no block, a sum other than --layers, --pp 1, a model without
/// transformer blocks, first/last with --virtual-stages or with --stage-layers.
std::vector<int64_t> stage_layer_counts(const TrainConfig& config);

} // namespace meshsim
