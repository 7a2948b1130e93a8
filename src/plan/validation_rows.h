// The rows of `meshsim validate` published from 2024 on, beside the 2019-2021 ones that
// validation.cpp holds: each source's rows with the configuration it names (validation.h).
#pragma once

#include <vector>

#include "config/config.h"
#include "plan/validation.h"

namespace meshsim {

/// A configuration with preset `name`'s shape, as `--preset name` gives it: what each row
/// starts from.
TrainConfig preset_config(const std::string& name);

/// Training runs on H100s (validation_h100.cpp): the Megatron-LM README's table, Megatron-Bridge's
/// and NeMo's performance summaries, torchtitan's benchmarks; each in its family (dense bf16,
/// FP8, MoE, long context) and predicted as `meshsim plan` would plan its layout.
std::vector<PublishedRow> h100_training_rows(const Efficiency& efficiency);

/// All-to-all on Hopper (validation_alltoall.cpp): nccl-tests' alltoall_perf and DeepEP's
/// dispatch and combine bandwidths, family collectives.
std::vector<PublishedRow> all_to_all_rows();

} // namespace meshsim
