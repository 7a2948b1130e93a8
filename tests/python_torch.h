// The Python the PyTorch comparisons run: MESHSIM_PYTHON, Debian's /usr/bin/python3 with
// python3-torch (1.13) in the default build, the project's .torch2 environment (PyTorch 2.11,
// transformers, safetensors) in `make test-torch2`. Tests that need what it lacks skip with
// the reason.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace meshsim::testing {

/// Whether MESHSIM_PYTHON runs `code` without error (output discarded).
inline bool python_runs(const std::string& code) {
  return std::system((MESHSIM_PYTHON " -c '" + code + "' >/dev/null 2>&1").c_str()) == 0;
}

/// The numbers a command prints, whitespace-separated, in order (empty when it cannot run):
/// how the PyTorch references hand their results to the tests.
inline std::vector<double> numbers_printed_by(const std::string& command) {
  std::vector<double> values;
  FILE* pipe = popen(command.c_str(), "r");
  double v;
  while (pipe && std::fscanf(pipe, "%lf", &v) == 1)
    values.push_back(v);
  if (pipe)
    pclose(pipe);
  return values;
}

inline bool python_torch_available() {
  static const bool available = python_runs("import torch");
  return available;
}

/// PyTorch 2.x with the APIs the comparisons against its distributed stack use.
inline bool python_torch2_available() {
  static const bool available =
      python_runs("import torch, sys; sys.exit(int(torch.__version__.split(\".\")[0]) < 2)");
  return available;
}

inline std::string no_python_torch() {
  return MESHSIM_PYTHON " cannot import torch (python3-torch, or make test-torch2)";
}

inline std::string no_python_torch2() {
  return MESHSIM_PYTHON " has no PyTorch 2.x: `make test-torch2` runs this comparison";
}

/// The Python that has transformers: MESHSIM_TRANSFORMERS_PYTHON (e.g. the environment
/// scripts/setup_torch2.sh makes), else MESHSIM_PYTHON.
inline std::string transformers_python() {
  const char* given = std::getenv("MESHSIM_TRANSFORMERS_PYTHON");
  return given && *given ? given : MESHSIM_PYTHON;
}

/// Whether transformers_python() imports transformers (and safetensors, which it needs).
inline bool transformers_importable() {
  return std::system((transformers_python() +
                      " -c 'import transformers, safetensors' >/dev/null 2>&1")
                         .c_str()) == 0;
}

inline std::string no_transformers() {
  return transformers_python() + " cannot import transformers (set MESHSIM_TRANSFORMERS_PYTHON "
                                 "to the python bash scripts/setup_torch2.sh prints)";
}

} // namespace meshsim::testing
