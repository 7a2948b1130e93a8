// meshsim's command line: `meshsim train` runs a simulation and writes its run folder;
// `meshsim plan` answers the same question for a target cluster without running it;
// `meshsim info` says what this build can do; `meshsim models` lists the model presets;
// `meshsim export` writes a run's trained model as a PyTorch state_dict; `meshsim launch`
// starts the processes of a run with --backend c10d; `meshsim serve` is the planner as a local
// web page.
//
// Exit codes: 0 ok, 2 usage or configuration, 3 data, 4 a virtual GPU (or the host) ran out
// of memory, 5 a collective timed out or a rank failed, 6 the loss diverged, 128 + N stopped
// by signal N, 1 anything else.
#include "cli/command_line.h"
#include "base/atomic_file.h"

int main(int argc, char** argv) {
  // Ctrl-C or SIGTERM outside a training run (which stops after its step instead): the file
  // being written is left as it was, with no temporary beside it.
  meshsim::remove_temp_files_on_signals();
  return meshsim::run_main(argc, argv);
}
