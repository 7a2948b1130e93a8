// Byte-level language-model data for the GPT: windows of a text file (or of synthetic
// token sequences) as Dataset{images = input tokens, labels = next tokens}.
#pragma once

#include <cstdint>
#include <string>

#include "data/dataset.h"

namespace meshsim {

/// Byte-level language-model data from any file: windows of seq_len+1 bytes, stride seq_len;
/// images = inputs [N, seq_len] int64, labels = next bytes [N, seq_len] int64.
/// The last `test_fraction` of the file's windows is the test split (rounded, at least one
/// window each for train and for test when test_fraction > 0). Throws DataError (one line) if
/// the file is missing/unreadable or too short for 2 windows; std::invalid_argument for
/// seq_len < 1 or test_fraction outside [0, 1).
DataSplit make_text_dataset(const std::string& path, int64_t seq_len, double test_fraction = 0.1);

/// make_text_dataset on bytes already in memory (what the file reader calls once it has read
/// the file); `what` names them in errors. Same results and errors.
DataSplit text_dataset_from_bytes(const std::string& bytes, const std::string& what,
                                  int64_t seq_len, double test_fraction = 0.1);

/// Deterministic learnable token sequences (so loss falls) for tests: tokens < vocab.
/// Each sequence counts up from a random start with a random stride in 1..3, modulo vocab,
/// so the next token follows from the two before it. Same seed -> identical tensors.
DataSplit synthetic_text(int64_t train, int64_t test, int64_t seq_len, int64_t vocab,
                         uint64_t seed);

} // namespace meshsim
