// The one place an exception becomes an exit code and a line on stderr, for every command:
// the same failure reads the same, and exits the same, whichever command met it.
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <new>
#include <thread>
#include <typeinfo>

#include <fmt/format.h>

#include "base/errors.h"
#include "base/json_input.h"
#include "base/printable.h"
#include "cli/commands.h"
#include "comm/c10d_backend.h"
#include "comm/communicator.h"
#include "memory/virtual_gpu.h"

namespace meshsim {
namespace {

// LibTorch's CPU allocator reports a host out of memory as a c10::Error, not std::bad_alloc.
bool host_out_of_memory(const std::string& text) {
  return text.find("DefaultCPUAllocator: can't allocate memory") != std::string::npos ||
         text.find("DefaultCPUAllocator: not enough memory") != std::string::npos;
}

} // namespace

std::string one_line(const std::exception& e) {
  std::string text;
  if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) text = c10->what_without_backtrace();
  else text = e.what();
  // The first line that says something: some LibTorch errors start with a line break, and
  // carry more lines after it.
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos)
    return "an error without a message (" + std::string(typeid(e).name()) + ")";
  const auto nl = text.find('\n', first);
  return printable(text.substr(first, nl == std::string::npos ? std::string::npos : nl - first));
}

Failure failure_of(const std::exception& e) {
  const std::string line = one_line(e);
  if (dynamic_cast<const std::bad_alloc*>(&e))
    return {kExitOutOfMemory,
            "this machine ran out of memory (std::bad_alloc): ask for a smaller model, batch or "
            "run"};
  if (host_out_of_memory(line))
    return {kExitOutOfMemory, "this machine ran out of memory: " + line};
  if (dynamic_cast<const OutOfMemory*>(&e)) return {kExitOutOfMemory, line};
  if (dynamic_cast<const CollectiveTimeout*>(&e) || dynamic_cast<const CollectiveMismatch*>(&e) ||
      dynamic_cast<const RankAborted*>(&e))
    return {kExitRankFailure, line};
  if (dynamic_cast<const DataError*>(&e) || dynamic_cast<const JsonError*>(&e))
    return {kExitData, line};
  if (dynamic_cast<const std::invalid_argument*>(&e) || dynamic_cast<const RendezvousError*>(&e))
    return {kExitUsage, line};
  if (const auto* fs = dynamic_cast<const std::filesystem::filesystem_error*>(&e)) {
    // "filesystem error: cannot create directories: Permission denied [x]" says it twice.
    std::string paths = printable(fs->path1().string());
    if (!fs->path2().empty()) paths += ", " + printable(fs->path2().string());
    return {kExitFailure, fmt::format("{}: {}", paths, fs->code().message())};
  }
  return {kExitFailure, line};
}

int report_failure(const std::exception& e, const std::string& prefix) {
  const Failure f = failure_of(e);
  fmt::print(stderr, "meshsim: {}{}\n", prefix, f.message);
  return f.code;
}

void exit_within(std::chrono::milliseconds limit, int code) {
  // Never destroyed: the thread may still wait on them while the process exits normally.
  static auto* mutex = new std::mutex;
  static auto* never = new std::condition_variable;
  std::thread([limit, code] {
    std::unique_lock<std::mutex> lock(*mutex);
    never->wait_for(lock, limit, [] { return false; });
    std::fflush(stderr);
    std::_Exit(code);
  }).detach();
}

} // namespace meshsim
