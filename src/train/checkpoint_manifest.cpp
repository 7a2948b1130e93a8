// manifest.json: written by rank 0 once every part is on disk, checked before a resume.
#include "train/checkpoint_manifest.h"

#include <fstream>
#include <iterator>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/json_input.h"
#include "data/dataset.h"
#include "base/crc32c.h"
#include "base/json_integer.h"
#include "base/printable.h"

namespace meshsim {
namespace {

using json = nlohmann::json;

// Caps that keep a damaged manifest from asking for absurd work; far above any real run.
constexpr int kMaxManifestRanks = 1 << 20;
constexpr int64_t kMaxPartBytes = int64_t{1} << 40;

// `why` may quote the manifest's own strings: printable() keeps the message one line.
[[noreturn]] void damaged(const std::string& why) {
  throw DataError("manifest.json is damaged: " + printable(why));
}

const json& field(const json& object, const char* name, json::value_t type) {
  const auto it = object.find(name);
  if (it == object.end())
    damaged(fmt::format("no \"{}\"", name));
  const bool ok =
      type == json::value_t::number_integer ? it->is_number_integer() : it->type() == type;
  if (!ok)
    damaged(fmt::format("\"{}\" is not a{}", name,
                        type == json::value_t::string   ? " string"
                        : type == json::value_t::array  ? "n array"
                        : type == json::value_t::object ? "n object"
                                                        : "n integer"));
  return *it;
}

int64_t integer(const json& object, const char* name, int64_t min, int64_t max) {
  const std::optional<int64_t> n =
      json_integer<int64_t>(field(object, name, json::value_t::number_integer));
  if (!n || *n < min || *n > max) damaged(fmt::format("\"{}\" is out of range", name));
  return *n;
}

std::string text(const json& object, const char* name) {
  return field(object, name, json::value_t::string).get<std::string>();
}

} // namespace

std::string checkpoint_name(int64_t step) {
  return fmt::format("step-{:08d}", step);
}

std::string manifest_to_json(const CheckpointManifest& m) {
  json parts = json::array();
  for (const auto& p : m.parts)
    parts.push_back({{"file", p.file}, {"rank", p.rank}, {"bytes", p.bytes}, {"crc32c", p.crc32c}});
  const json doc = {{"format", kCheckpointFormat}, {"step", m.step},
                    {"world_size", m.world_size},  {"kind", m.identity.kind},
                    {"model", m.identity.model},   {"optimizer", m.identity.optimizer},
                    {"layout", m.identity.layout}, {"parts", parts}};
  return doc.dump(2) + "\n";
}

CheckpointManifest parse_manifest(const std::string& contents) {
  json doc;
  try {
    doc = parse_json(contents, "its text");
  } catch (const JsonError& e) {
    damaged(e.what()); // not JSON, or a key twice
  }
  if (!doc.is_object())
    damaged("not a JSON object");
  const std::string format = text(doc, "format");
  if (format != kCheckpointFormat)
    damaged(fmt::format("format '{}' is not '{}'", format, kCheckpointFormat));
  CheckpointManifest m;
  m.step = integer(doc, "step", 0, int64_t{1} << 53);
  m.world_size = static_cast<int>(integer(doc, "world_size", 1, kMaxManifestRanks));
  m.identity.kind = text(doc, "kind");
  m.identity.model = text(doc, "model");
  m.identity.optimizer = text(doc, "optimizer");
  m.identity.layout = text(doc, "layout");
  const bool whole = m.identity.kind == kWholeCheckpoint;
  if (!whole && m.identity.kind != kPerRankCheckpoint)
    damaged(fmt::format("kind '{}' is neither '{}' nor '{}'", m.identity.kind, kWholeCheckpoint,
                        kPerRankCheckpoint));
  const json& parts = field(doc, "parts", json::value_t::array);
  const size_t expected = whole ? 1 : static_cast<size_t>(m.world_size);
  if (parts.size() != expected)
    damaged(fmt::format("{} parts listed, {} expected", parts.size(), expected));
  for (size_t i = 0; i < parts.size(); ++i) {
    if (!parts[i].is_object())
      damaged("a part is not a JSON object");
    CheckpointPart p;
    p.rank = static_cast<int>(integer(parts[i], "rank", 0, m.world_size - 1));
    p.file = text(parts[i], "file");
    p.bytes = integer(parts[i], "bytes", 0, kMaxPartBytes);
    p.crc32c = static_cast<uint32_t>(integer(parts[i], "crc32c", 0, 0xFFFFFFFFll));
    // Parts are listed in rank order, each under the one name its rank has: a manifest
    // cannot point outside its folder, nor give two ranks one file.
    const std::string name = whole ? "model.pt" : fmt::format("rank-{}.pt", i);
    if (p.rank != static_cast<int>(i) || p.file != name)
      damaged(fmt::format("part {} is '{}' of rank {}, expected '{}' of rank {}", i, p.file, p.rank,
                          name, i));
    m.parts.push_back(p);
  }
  return m;
}

void check_part_bytes(const std::string& bytes, const CheckpointPart& part) {
  if (static_cast<int64_t>(bytes.size()) != part.bytes)
    throw DataError(fmt::format("{} has {} bytes, its manifest says {}: the file is damaged",
                                part.file, bytes.size(), part.bytes));
  const uint32_t crc = crc32c(bytes.data(), bytes.size());
  if (crc != part.crc32c)
    throw DataError(fmt::format("{} fails its checksum (CRC-32C {:08x}, the manifest says {:08x}): "
                                "the file is damaged",
                                part.file, crc, part.crc32c));
}

std::string read_part(const std::filesystem::path& folder, const CheckpointPart& part) {
  const auto path = folder / part.file;
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec)
    throw DataError(fmt::format("{} is missing: {}", path.string(), ec.message()));
  if (static_cast<int64_t>(size) != part.bytes)
    throw DataError(fmt::format("{} has {} bytes, its manifest says {}: the file is damaged",
                                part.file, size, part.bytes));
  std::ifstream in(path, std::ios::binary);
  std::string bytes(static_cast<size_t>(size), '\0');
  if (!in.read(bytes.data(), static_cast<std::streamsize>(size)))
    throw DataError("cannot read " + path.string());
  check_part_bytes(bytes, part);
  return bytes;
}

} // namespace meshsim
