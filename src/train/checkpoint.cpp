// Checkpoint folders: written by every rank (or rank 0), published by rank 0 with their
// manifest, checked in full before a resume.
#include "train/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "data/dataset.h"
#include "memory/allocator.h"
#include "mesh/parallel_dims.h"
#include "models/family.h"
#include "models/models.h"
#include "base/atomic_file.h"
#include "base/crc32c.h"
#include "base/input_file.h"
#include "base/printable.h"

namespace fs = std::filesystem;

namespace meshsim {
namespace {

constexpr const char* kManifest = "manifest.json";
constexpr const char* kWholeFile = "model.pt";

std::string part_name(int rank) {
  return fmt::format("rank-{}.pt", rank);
}

// The step of a folder named step-NNNNNNNN, or -1 for any other name.
int64_t step_of(const std::string& name) {
  if (name.size() <= 5 || name.compare(0, 5, "step-") != 0)
    return -1;
  int64_t step = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || step > (int64_t{1} << 53))
      return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

bool is_temporary(const std::string& name) {
  return !name.empty() && (name[0] == '.' || name.find(".tmp-") != std::string::npos);
}

std::string serialize(torch::serialize::OutputArchive& archive) {
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

CheckpointPart write_part(const fs::path& folder, const std::string& file, int rank,
                          const std::string& bytes) {
  write_file_atomic(folder / file, bytes);
  return CheckpointPart{file, rank, static_cast<int64_t>(bytes.size()),
                        crc32c(bytes.data(), bytes.size())};
}

// Rank 0, once every part is on disk: the manifest, then the folder under its real name,
// then `latest`, then the retention.
void publish(const fs::path& dir, const fs::path& tmp, const CheckpointManifest& manifest,
             int64_t keep) {
  write_file_atomic(tmp / kManifest, manifest_to_json(manifest));
  const std::string name = checkpoint_name(manifest.step);
  fs::remove_all(dir / name); // an abandoned checkpoint of the same step
  commit_atomic_file(tmp, dir / name);
  write_file_atomic(dir / "latest", name + "\n");
  if (keep <= 0)
    return;
  std::vector<int64_t> steps;
  for (const auto& entry : fs::directory_iterator(dir))
    if (const int64_t s = step_of(entry.path().filename().string()); s >= 0 && entry.is_directory())
      steps.push_back(s);
  std::sort(steps.rbegin(), steps.rend());
  for (size_t i = static_cast<size_t>(keep); i < steps.size(); ++i)
    if (steps[i] != manifest.step)
      fs::remove_all(dir / checkpoint_name(steps[i]));
}

// Where a checkpoint is written before it is published. A run made of processes writes one
// folder, rank 0's (shared through the rendezvous store, not a collective).
fs::path temporary_folder(const fs::path& dir, int64_t step, RankContext& ctx) {
  const fs::path tmp = dir / fmt::format(".{}.tmp-{}", checkpoint_name(step), ::getpid());
  if (C10dWorld* world = ctx.mesh.c10d_world())
    return world->share(fmt::format("checkpoint-{}", step), tmp.string());
  return tmp;
}

// Rank 0 writes model.pt: the model, the optimizer and every rank's dropout generator
// states, one row per rank (gathered from every rank: a collective for models with dropout).
void save_whole(const fs::path& dir, RankContext& ctx, Strategy& strategy,
                const CheckpointIdentity& identity, int64_t step, int64_t keep) {
  torch::Tensor dropout_rng = dropout_rng_state(*strategy.model());
  if (dropout_rng.numel() > 0) {
    CategoryScope scope(MemoryCategory::Communication);
    dropout_rng = ctx.comm.all_gather(dropout_rng, Group::world(ctx.world_size));
  }
  if (ctx.rank != 0)
    return;
  std::string bytes;
  {
    GpuGuard host(nullptr); // the archive's copies are not GPU memory
    torch::serialize::OutputArchive archive;
    for (const auto& item : strategy.model()->named_parameters())
      archive.write("model/" + item.key(), item.value());
    archive.write("meta/step", torch::tensor(step));
    archive.write("meta/rank", torch::tensor(int64_t{0}));
    if (const Optimizer* optimizer = strategy.optimizer())
      optimizer->save(archive);
    if (dropout_rng.numel() > 0)
      archive.write("rng/dropout", dropout_rng);
    bytes = serialize(archive);
  }
  const fs::path tmp = temporary_folder(dir, step, ctx);
  fs::create_directories(tmp);
  CheckpointManifest manifest{step, ctx.world_size, identity, {}};
  manifest.parts.push_back(write_part(tmp, kWholeFile, 0, bytes));
  publish(dir, tmp, manifest, keep);
}

// Every rank writes its part; the size and checksum of each travel to rank 0, which
// writes the manifest.
void save_parts(const fs::path& dir, RankContext& ctx, Strategy& strategy,
                const CheckpointIdentity& identity, int64_t step, int64_t keep) {
  const fs::path tmp = temporary_folder(dir, step, ctx);
  fs::create_directories(tmp); // every rank: creating an existing folder is no error
  CheckpointPart mine;
  {
    GpuGuard host(nullptr); // the archive's copies are not GPU memory
    torch::serialize::OutputArchive archive;
    archive.write("meta/step", torch::tensor(step));
    archive.write("meta/rank", torch::tensor(static_cast<int64_t>(ctx.rank)));
    strategy.save_state(archive);
    const torch::Tensor rng = dropout_rng_state(*strategy.model());
    if (rng.numel() > 0)
      archive.write("rng/dropout", rng);
    mine = write_part(tmp, part_name(ctx.rank), ctx.rank, serialize(archive));
  }
  torch::Tensor sums; // [world, 2]: bytes and CRC of every part; also "every part is on disk"
  {
    CategoryScope scope(MemoryCategory::Communication);
    sums = ctx.comm.all_gather(torch::tensor({mine.bytes, static_cast<int64_t>(mine.crc32c)}),
                               Group::world(ctx.world_size));
  }
  if (ctx.rank != 0)
    return;
  CheckpointManifest manifest{step, ctx.world_size, identity, {}};
  for (int r = 0; r < ctx.world_size; ++r)
    manifest.parts.push_back(CheckpointPart{part_name(r), r, sums[r][0].item<int64_t>(),
                                            static_cast<uint32_t>(sums[r][1].item<int64_t>())});
  publish(dir, tmp, manifest, keep);
}

// Opens a part's bytes and checks that they are its rank's state of the manifest's step.
torch::serialize::InputArchive open_part(const std::string& bytes, const CheckpointPart& part,
                                         const CheckpointManifest& manifest) {
  torch::serialize::InputArchive archive;
  int64_t rank = -1, step = -1;
  try {
    archive.load_from(bytes.data(), bytes.size());
    torch::Tensor step_t, rank_t;
    if (!archive.try_read("meta/step", step_t) || !archive.try_read("meta/rank", rank_t))
      throw DataError(part.file + " has no meta/step or meta/rank");
    step = step_t.item<int64_t>();
    rank = rank_t.item<int64_t>();
  } catch (const c10::Error& e) {
    throw DataError(part.file +
                    " is not a readable checkpoint part: " + e.what_without_backtrace());
  }
  if (rank != part.rank)
    throw DataError(fmt::format("{} holds rank {}'s part, not rank {}'s: the files were swapped",
                                part.file, rank, part.rank));
  if (step != manifest.step)
    throw DataError(fmt::format("{} holds the state of step {}, the manifest says step {}",
                                part.file, step, manifest.step));
  return archive;
}

void check_identity(const CheckpointManifest& m, const CheckpointIdentity& expected,
                    int world_size) {
  const CheckpointIdentity& got = m.identity;
  if (got.kind != expected.kind)
    throw std::invalid_argument(
        got.kind == kPerRankCheckpoint
            ? "it holds one part per rank, written by a --tp/--pp/--zero run; resume it with "
              "that run's layout"
            : "it holds the whole model of a run without --tp/--pp/--zero; resume it without them");
  if (got.model != expected.model)
    throw std::invalid_argument(
        fmt::format("it holds the model {}; this run trains {}", got.model, expected.model));
  if (got.optimizer != expected.optimizer) {
    // "adam" or "adam with bf16 mixed precision" (checkpoint_identity): name, then precision.
    auto name = [](const std::string& id) { return id.substr(0, id.find(' ')); };
    auto precision = [](const std::string& id) {
      const auto with = id.find(" with ");
      return with == std::string::npos ? std::string("fp32") : id.substr(with + 6, 4);
    };
    if (name(got.optimizer) != name(expected.optimizer))
      throw std::invalid_argument(
          fmt::format("its optimizer state is {}'s; this run uses --optimizer {}",
                      name(got.optimizer), name(expected.optimizer)));
    throw std::invalid_argument(
        fmt::format("it was trained with --precision {}; this run uses --precision {}",
                    precision(got.optimizer), precision(expected.optimizer)));
  }
  if (got.layout != expected.layout)
    throw std::invalid_argument(
        fmt::format("it was written by {}; this run is {}", got.layout, expected.layout));
  if (got.kind == kPerRankCheckpoint && m.world_size != world_size)
    throw std::invalid_argument(
        fmt::format("it was written by {} GPUs; this run has {}", m.world_size, world_size));
}

} // namespace

CheckpointIdentity checkpoint_identity(const TrainConfig& config) {
  CheckpointIdentity id;
  id.kind = uses_mesh_layout(config) ? kPerRankCheckpoint : kWholeCheckpoint;
  id.model = model_family(config.model).checkpoint_identity(config.shape);
  id.optimizer = config.optimizer.name;
  // Mixed precision adds fp32 master weights (and fp16 a loss scale) to the state.
  if (config.precision != "fp32")
    id.optimizer += " with " + config.precision + " mixed precision";
  // What decides the shapes of a rank's part; micro-batches, schedule and recompute do not.
  // Virtual stages do (a rank holds other layers), and are named only when there are some,
  // so that the layouts of older checkpoints read as before.
  if (id.kind == kPerRankCheckpoint)
    id.layout = fmt::format("{} GPUs as {}{}, zero {}, buckets of {} MiB", config.gpus,
                            ParallelDims::make(config.gpus, config.tp, config.pp, config.cp).describe(),
                            config.virtual_stages > 1
                                ? fmt::format(" with {} virtual stages", config.virtual_stages)
                                : "",
                            config.zero, config.bucket_mb);
  return id;
}

fs::path resolve_checkpoint(const fs::path& path) {
  if (fs::is_regular_file(path / kManifest))
    return path;
  if (fs::is_regular_file(path))
    throw std::invalid_argument(fmt::format(
        "{} is a file; name a run folder or one of its checkpoint/step-N folders", path.string()));
  fs::path dir = path;
  if (fs::is_directory(path / "checkpoint"))
    dir = path / "checkpoint";
  std::ifstream latest(dir / "latest");
  std::string name;
  if (!latest || !(latest >> name))
    throw std::invalid_argument("no checkpoint to resume in " + path.string() +
                                " (expected checkpoint/latest)");
  if (name.size() > 3 && name.compare(name.size() - 3, 3, ".pt") == 0)
    throw std::invalid_argument(fmt::format(
        "{} names {}, a checkpoint of an older meshsim; this one reads step folders with a "
        "manifest.json",
        (dir / "latest").string(), name));
  if (step_of(name) < 0)
    throw DataError(
        fmt::format("{} is damaged: it names '{}'", (dir / "latest").string(), printable(name)));
  if (!fs::is_directory(dir / name))
    throw std::invalid_argument(
        fmt::format("{} names {}, which is not there", (dir / "latest").string(), name));
  return dir / name;
}

VerifiedCheckpoint verify_checkpoint(const fs::path& path, const CheckpointIdentity& expected,
                                     int world_size, const std::string& action) {
  const fs::path folder = resolve_checkpoint(path);
  auto refuse = [&](const std::string& why) {
    return "cannot " + action + " " + folder.string() + ": " + why;
  };
  try {
    const std::string manifest = (folder / kManifest).string();
    if (path_kind(manifest) == PathKind::kNothing)
      throw std::invalid_argument(
          "it has no manifest.json (written by an older meshsim, or not a checkpoint)");
    VerifiedCheckpoint checkpoint{
        folder, parse_manifest(read_input_file(manifest, "manifest", kMaxConfigBytes)), {}, action};
    check_identity(checkpoint.manifest, expected, world_size);
    GpuGuard host(nullptr); // checked on the caller's thread; nothing is any GPU's
    for (const auto& part : checkpoint.manifest.parts) {
      checkpoint.part_bytes.push_back(read_part(folder, part));
      open_part(checkpoint.part_bytes.back(), part, checkpoint.manifest);
    }
    return checkpoint;
  } catch (const DataError& e) {
    throw DataError(refuse(printable(e.what())));
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(refuse(printable(e.what())));
  }
}

void save_checkpoint(const fs::path& run_dir, RankContext& ctx, Strategy& strategy,
                     const CheckpointIdentity& identity, int64_t step, int64_t keep) {
  const fs::path dir = run_dir / "checkpoint";
  if (strategy.checkpoints_per_rank())
    save_parts(dir, ctx, strategy, identity, step, keep);
  else
    save_whole(dir, ctx, strategy, identity, step, keep);
}

TrainPosition load_checkpoint(const VerifiedCheckpoint& checkpoint, RankContext& ctx,
                              Strategy& strategy) {
  const CheckpointManifest& m = checkpoint.manifest;
  const bool whole = m.identity.kind == kWholeCheckpoint;
  const size_t index = whole ? 0 : static_cast<size_t>(ctx.rank);
  const CheckpointPart& part = m.parts.at(index);
  try {
    torch::serialize::InputArchive archive;
    {
      GpuGuard host(nullptr); // the archive's tensors are not GPU memory
      archive = open_part(checkpoint.part_bytes.at(index), part, m);
    }
    if (!whole) {
      strategy.load_state(archive);
      torch::Tensor rng;
      if (archive.try_read("rng/dropout", rng))
        set_dropout_rng_state(*strategy.model(), rng);
      return TrainPosition{m.step};
    }
    torch::NoGradGuard no_grad;
    for (auto& item : strategy.model()->named_parameters()) {
      torch::Tensor t; // fresh each time: read() into a defined tensor re-points it (set_)
      archive.read("model/" + item.key(), t);
      if (!t.sizes().equals(item.value().sizes()))
        throw std::runtime_error("parameter " + item.key() + " has another shape");
      item.value().copy_(t);
    }
    if (Optimizer* optimizer = strategy.optimizer())
      optimizer->load(archive);
    torch::Tensor rows; // absent for a model without dropout
    if (archive.try_read("rng/dropout", rows)) {
      if (rows.size(0) == ctx.world_size)
        set_dropout_rng_state(*strategy.model(), rows[ctx.rank]);
      else if (ctx.rank == 0)
        fmt::print(stderr,
                   "meshsim: warning: the checkpoint's dropout generators are for {} GPUs, "
                   "this run has {}: its dropout masks start afresh\n",
                   rows.size(0), ctx.world_size);
    }
    return TrainPosition{m.step};
  } catch (const c10::Error& e) {
    // Its manifest matched, its bytes are whole, and still it does not load: a part that is
    // not what its manifest says (another run's, under this run's identity).
    throw DataError(fmt::format("cannot {} {}: a part does not fit the model its manifest names: {}",
                                checkpoint.action, printable(checkpoint.folder.string()),
                                printable(e.what_without_backtrace())));
  } catch (const std::runtime_error& e) {
    throw DataError(fmt::format("cannot {} {}: a part does not fit the model its manifest names: {}",
                                checkpoint.action, printable(checkpoint.folder.string()),
                                printable(e.what())));
  }
}

void tidy_checkpoints(const fs::path& run_dir, int64_t resume_step) {
  const fs::path dir = run_dir / "checkpoint";
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return;
  std::vector<fs::path> doomed;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (is_temporary(name) || (resume_step >= 0 && step_of(name) > resume_step))
      doomed.push_back(entry.path());
  }
  for (const auto& p : doomed)
    fs::remove_all(p, ec);
  if (resume_step >= 0 && fs::is_directory(dir / checkpoint_name(resume_step), ec))
    write_file_atomic(dir / "latest", checkpoint_name(resume_step) + "\n");
}

} // namespace meshsim
