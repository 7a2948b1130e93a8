// The layers of src/ as README.md's "Layout" lists them, top down: every #include of a
// project header points to the file's own folder or to one below it.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

const fs::path kSource = MESHSIM_SOURCE_DIR;

// The folders of README.md's Layout block, top layer first.
std::vector<std::string> layers_top_down() {
  std::ifstream readme(kSource / "README.md");
  std::string line;
  while (std::getline(readme, line) && line != "## Layout") {
  }
  std::vector<std::string> layers;
  bool in_block = false;
  const std::regex folder(R"(^src/([a-z_]+)\s)");
  while (std::getline(readme, line)) {
    if (line.rfind("```", 0) == 0) {
      if (in_block)
        break;
      in_block = true;
      continue;
    }
    std::smatch m;
    if (in_block && std::regex_search(line, m, folder))
      layers.push_back(m[1]);
  }
  return layers;
}

} // namespace

TEST(Layers, EveryFolderOfSrcIsInTheMap) {
  const auto layers = layers_top_down();
  ASSERT_GE(layers.size(), 10u) << "README.md's Layout block lists too few src/ folders";
  for (const auto& entry : fs::directory_iterator(kSource / "src"))
    if (entry.is_directory()) {
      EXPECT_NE(std::find(layers.begin(), layers.end(), entry.path().filename().string()),
                layers.end())
          << "src/" << entry.path().filename().string() << " is not in README.md's Layout";
    }
}

TEST(Layers, EveryIncludePointsDown) {
  const auto layers = layers_top_down();
  auto depth = [&](const std::string& layer) {
    return static_cast<int>(std::find(layers.begin(), layers.end(), layer) - layers.begin());
  };
  const std::regex include(R"re(^\s*#\s*include\s+"([a-z_]+)/)re");
  int checked = 0;
  for (const auto& entry : fs::recursive_directory_iterator(kSource / "src")) {
    const auto ext = entry.path().extension();
    if (!entry.is_regular_file() || (ext != ".h" && ext != ".cpp" && ext != ".cu"))
      continue;
    const std::string from = fs::relative(entry.path(), kSource / "src").begin()->string();
    std::ifstream file(entry.path());
    std::string line;
    int line_no = 0;
    while (std::getline(file, line)) {
      ++line_no;
      std::smatch m;
      if (!std::regex_search(line, m, include) || depth(m[1]) == static_cast<int>(layers.size()))
        continue;  // not a project folder
      ++checked;
      EXPECT_GE(depth(m[1]), depth(from))
          << fs::relative(entry.path(), kSource).string() << ":" << line_no << " includes "
          << m[1] << "/, a layer above " << from << "/";
    }
  }
  EXPECT_GT(checked, 300);  // the walk found the sources
}
