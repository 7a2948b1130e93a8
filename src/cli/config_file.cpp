// `meshsim train --config FILE`: a run folder's config.json as the starting point of a run.
// The file is loaded before the flags are parsed, so any flag given on the command line
// overrides it (CLI11 writes only the options it sees).
#include <cstring>

#include <fmt/format.h>

#include "base/input_file.h"
#include "base/json_input.h"
#include "base/printable.h"
#include "cli/commands.h"

namespace meshsim {

std::string find_config_arg(int argc, char** argv) {
  std::string path;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0)
      break;
    if (std::strcmp(argv[i], "--config") == 0 && i + 1 < argc)
      path = argv[++i];
    else if (std::strncmp(argv[i], "--config=", 9) == 0)
      path = argv[i] + 9;
  }
  return path;
}

void load_config_file(const std::string& path, TrainConfig& config) {
  // A name that names nothing is a mistyped flag (exit 2); anything else that is not a
  // regular file of a config's size is refused as data (exit 3).
  if (path_kind(path) == PathKind::kNothing)
    throw std::invalid_argument(
        fmt::format("--config {}: cannot open the file: it does not exist", printable(path)));
  const std::string text = read_input_file(path, "--config", kMaxConfigBytes);
  try {
    config = config_from_json(parse_json(text, "--config " + printable(path)));
  } catch (const JsonError& e) {
    throw std::invalid_argument(e.what());
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("--config {}: {}", printable(path), e.what()));
  }
}

} // namespace meshsim
