// `meshsim train --config FILE`: a run folder's config.json as the starting point of a run.
// The file is loaded before the flags are parsed, so any flag given on the command line
// overrides it (CLI11 writes only the options it sees).
#include <cstring>
#include <fstream>
#include <iterator>

#include <fmt/format.h>

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

bool load_config_file(const std::string& path, TrainConfig& config, std::string* error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *error = fmt::format("--config {}: cannot open the file", path);
    return false;
  }
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    *error = fmt::format("--config {}: not valid JSON", path);
    return false;
  }
  try {
    config = config_from_json(doc);
  } catch (const std::invalid_argument& e) {
    *error = fmt::format("--config {}: {}", path, e.what());
    return false;
  }
  return true;
}

} // namespace meshsim
