// The steps of validate (config.cpp), one file per concern: the model's rules
// (validate_model.cpp) and the layout's (validate_layout.cpp). Each throws
// std::invalid_argument with a one-line message; validate calls them in this order.
#pragma once

#include <string>
#include <vector>

#include "config/config.h"

namespace meshsim {

/// True when `name` is one of `names`.
bool listed(const std::vector<std::string>& names, const std::string& name);

/// --model names a family (or the message lists them and the nearest presets), and a --preset
/// given is one of that family's.
void check_model_name(const TrainConfig& config);

/// The model's default data when --data is not given; refuses files for a family whose samples
/// only --data synthetic makes.
void resolve_model_data(TrainConfig& config);

/// dp × tp × pp, ZeRO, schedule, micro-batches, virtual stages and the batch they divide;
/// resolves micro_batches and the batch per replica.
void validate_layout(TrainConfig& config);

/// The model against the layout: a transformer's shape, heads and layers against --tp, --pp and
/// --virtual-stages; an image net's layers with parameters against --pp.
void validate_model_layout(const TrainConfig& config);

/// A transformer's largest activations (attention scores, logits) within what a tensor can
/// address; nothing for the image nets.
void check_activation_sizes(const TrainConfig& config);

} // namespace meshsim
