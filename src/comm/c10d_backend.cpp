// The c10d backend's rendezvous, heartbeats and store barriers. See c10d_backend.h.
#include "comm/c10d_backend.h"

#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#if MESHSIM_C10D_GLOO
#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "comm/c10d_state.h"
#endif

namespace meshsim {

std::string c10d_device_refusal(const std::string& device) {
  if (device == "cpu" || (c10d_nccl_available() && (device == "cuda" || device == "cuda:0")))
    return "";
  if (c10d_nccl_available())
    return fmt::format("--backend c10d runs on cpu (Gloo) or cuda (NCCL), not --device {}",
                       device);
  return fmt::format(
      "--backend c10d runs on the CPU (Gloo): this LibTorch has no NCCL, so not --device {}",
      device);
}

#if !MESHSIM_C10D_GLOO

bool c10d_available() { return false; }
bool c10d_nccl_available() { return false; }

struct C10dWorld::State {};

C10dWorld::C10dWorld(const C10dOptions&, const RunClock&) {
  throw RendezvousError(
      "--backend c10d is compiled out of this build: its LibTorch has no Gloo headers (PyTorch's "
      "wheels ship none; docs/processes.md)");
}
C10dWorld::~C10dWorld() = default;
int C10dWorld::rank() const { return 0; }
int C10dWorld::world_size() const { return 1; }
std::unique_ptr<Communicator> C10dWorld::make_communicator() { return nullptr; }
void C10dWorld::store_barrier(const std::string&) {}
std::string C10dWorld::share(const std::string&, const std::string& value) { return value; }
std::string C10dWorld::agree(const std::string&, const std::string& value) { return value; }
std::string C10dWorld::agreed(const std::string&) { return ""; }
std::vector<std::string> C10dWorld::all_gather(const std::string&, const std::string& value) {
  return {value};
}

#else

bool c10d_available() { return true; }
bool c10d_nccl_available() { return MESHSIM_C10D_NCCL != 0; }
namespace {

std::string first_line(const std::string& text) {
  const auto end = text.find('\n');
  return end == std::string::npos ? text : text.substr(0, end);
}

// The address of this host that reaches `master` (no packet is sent): where Gloo listens.
std::string local_address_towards(const std::string& master, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(master.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || !found)
    throw RendezvousError(fmt::format("cannot resolve the rendezvous host '{}'", master));
  std::string local = "127.0.0.1";
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  if (fd >= 0) {
    sockaddr_in self{};
    socklen_t len = sizeof(self);
    if (::connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&self), &len) == 0) {
      char text[INET_ADDRSTRLEN] = {};
      if (inet_ntop(AF_INET, &self.sin_addr, text, sizeof(text)))
        local = text;
    }
    ::close(fd);
  }
  freeaddrinfo(found);
  return local;
}

// Standard error sent to /dev/null while it lives: c10d logs a failed bind over several lines
// of its own (glog in 1.13), where meshsim says it in one. Made before any rank thread runs.
class QuietStderr {
public:
  QuietStderr() : saved_(::dup(STDERR_FILENO)) {
    const int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (saved_ >= 0 && null >= 0)
      ::dup2(null, STDERR_FILENO);
    if (null >= 0)
      ::close(null);
  }
  ~QuietStderr() {
    if (saved_ >= 0) {
      ::dup2(saved_, STDERR_FILENO);
      ::close(saved_);
    }
  }
  QuietStderr(const QuietStderr&) = delete;
  QuietStderr& operator=(const QuietStderr&) = delete;

private:
  int saved_;
};

#if MESHSIM_C10D_NCCL
// ProcessGroupNCCL's options embed NCCL's own config struct, sized by the nccl.h meshsim was
// compiled with: the NCCL that LibTorch loaded must be that release. Found without a link
// dependency, as LibTorch has loaded it already.
void check_nccl_version() {
  using GetVersion = int (*)(int*);
  const auto get = reinterpret_cast<GetVersion>(::dlsym(RTLD_DEFAULT, "ncclGetVersion"));
  int loaded = 0;
  if (!get || get(&loaded) != 0)
    return;  // not loaded yet: ProcessGroupNCCL says so itself at its first collective
  const int major = loaded >= 10000 ? loaded / 10000 : loaded / 1000;
  const int minor = loaded >= 10000 ? loaded / 100 % 100 : loaded / 100 % 10;
  if (major != NCCL_MAJOR || minor != NCCL_MINOR)
    throw RendezvousError(fmt::format(
        "--backend c10d --device cuda: LibTorch loaded NCCL {}.{}, but meshsim was built "
        "against nccl.h {}.{}: rebuild with the nccl.h of the NCCL LibTorch ships with",
        major, minor, NCCL_MAJOR, NCCL_MINOR));
}
#endif

} // namespace

std::string c10d_message(const std::exception& e) {
  if (const auto* c10 = dynamic_cast<const c10::Error*>(&e))
    return first_line(c10->what_without_backtrace());
  return first_line(e.what());
}

C10dWorld::State::~State() {
  {
    std::lock_guard<std::mutex> lock(heartbeat_mutex);
    stopping = true;
  }
  heartbeat_cv.notify_all();
  if (heartbeat.joinable())
    heartbeat.join();
}

void C10dWorld::State::beat() {
  std::unique_lock<std::mutex> lock(heartbeat_mutex);
  while (!heartbeat_cv.wait_for(lock, kHeartbeat, [&] { return stopping; })) {
    lock.unlock();
    try {
      heartbeat_store->add(key(fmt::format("alive/{}", options.rank)), 1);
    } catch (const std::exception&) {
      return;  // the store is gone (rank 0 ended): nobody to tell
    }
    lock.lock();
  }
}

void C10dWorld::State::note_failure() {
  try {
    heartbeat_store->add(key(fmt::format("failed/{}", options.rank)), 1);
  } catch (const std::exception&) {
  }
}

std::string C10dWorld::State::missing(const std::vector<int>& ranks) {
  auto read = [&] {
    std::map<int, int64_t> counts;
    for (int r : ranks)
      if (r != options.rank)
        counts[r] = heartbeat_store->add(key(fmt::format("alive/{}", r)), 0);
    return counts;
  };
  std::map<int, int64_t> before;
  try {
    before = read();
  } catch (const std::exception&) {
    return options.rank == 0 ? ""
                             : " (rank 0 is gone: the rendezvous store it held does not answer)";
  }
  {
    std::unique_lock<std::mutex> lock(heartbeat_mutex);
    heartbeat_cv.wait_for(lock, 4 * kHeartbeat, [&] { return stopping; });
  }
  std::map<int, int64_t> after;
  try {
    after = read();
  } catch (const std::exception&) {
    return " (rank 0 is gone: the rendezvous store it held does not answer)";
  }
  std::vector<int> gone;
  try {
    for (const auto& [r, count] : before)
      if (after[r] == count && !heartbeat_store->check({key(fmt::format("failed/{}", r))}))
        gone.push_back(r);
  } catch (const std::exception&) {
    return " (rank 0 is gone: the rendezvous store it held does not answer)";
  }
  if (gone.empty())
    return " (every other rank of the group is alive: one of them is late, or failed first)";
  // Silent: dead (kill -9) or hung (SIGSTOP, a deadlock); the heartbeat cannot tell which.
  return fmt::format(" (rank{} {} went silent: no heartbeat for {} ms, dead or hung)",
                     gone.size() > 1 ? "s" : "", fmt::join(gone, ", "),
                     (4 * kHeartbeat).count());
}

c10::intrusive_ptr<C10dGroup> C10dWorld::State::group(const Group& g, bool on_card) {
  std::lock_guard<std::mutex> lock(groups_mutex);
  const std::string name = (on_card ? "nccl/" : "") + g.key();
  auto& pg = groups[name];
  if (pg)
    return pg;
  const int index = g.index_of(options.rank);
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(key("group/" + name + "/"), store);
  if (!on_card) {
    pg = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, index, g.size(), pg_options);
    return pg;
  }
#if MESHSIM_C10D_NCCL
  // NCCL makes its communicator on the tensors' card at the group's first collective, and
  // orders its stream after the caller's (the rank's stream, physical_device.h).
  auto o = c10d::ProcessGroupNCCL::Options::create();
  o->timeout = options.timeout;
  pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, index, g.size(), o);
  return pg;
#else
  throw std::invalid_argument(
      "a tensor on a CUDA card reached the c10d backend, and this LibTorch has no NCCL");
#endif
}

C10dWorld::C10dWorld(const C10dOptions& options, const RunClock& clock)
    : state_(std::make_shared<State>()) {
  State& s = *state_;
  s.options = options;
  s.clock = &clock;
  const std::string at = fmt::format("{}:{}", options.master_addr, options.master_port);
  const double seconds = options.timeout.count() / 1000.0;
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size)
    throw RendezvousError(
        fmt::format("rank {} is outside [0, {}) of the world", options.rank, options.world_size));
  if (options.master_port < 1 || options.master_port > 65535)
    throw RendezvousError(fmt::format("rendezvous port {} is outside 1..65535", options.master_port));
  if (const std::string why = c10d_device_refusal(options.device); !why.empty())
    throw RendezvousError(why);
#if MESHSIM_C10D_NCCL
  if (options.device == "cuda")
    check_nccl_version();
#endif
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(options.master_port);
  so.isServer = options.rank == 0;
  so.numWorkers = options.world_size;
  so.waitWorkers = false;
  so.timeout = options.timeout;
  try {
    QuietStderr quiet;
    s.store = c10::make_intrusive<c10d::TCPStore>(options.master_addr, so);
  } catch (const std::exception& e) {
    const std::string why = c10d_message(e);
    if (options.rank == 0 && why.find("already in use") != std::string::npos)
      throw RendezvousError(fmt::format(
          "the rendezvous port {} is already in use on {} (another run?): choose a free one "
          "with --master-port",
          options.master_port, options.master_addr));
    throw RendezvousError(fmt::format("rank {} cannot reach the rendezvous at {} within {:.1f} s: {}",
                                      options.rank, at, seconds, why));
  }
  try {
    // A rank claimed twice: a stale run still serves this port, or two processes got the
    // same RANK.
    if (s.store->add(s.key(fmt::format("claim/{}", options.rank)), 1) != 1)
      throw RendezvousError(fmt::format(
          "rank {} is already taken at the rendezvous {}: a stale run still holds the port, or "
          "two processes were given RANK={}",
          options.rank, at, options.rank));
    const std::string world = std::to_string(options.world_size);
    if (options.rank == 0)
      s.store->set(s.key("world_size"), std::vector<uint8_t>(world.begin(), world.end()));
    const auto got = s.store->get(s.key("world_size"));  // waits for rank 0, up to the timeout
    const std::string theirs(got.begin(), got.end());
    if (theirs != world)
      throw RendezvousError(fmt::format("WORLD_SIZE is {} on rank {} but {} on rank 0", world,
                                        options.rank, theirs));
    // Joined only once it agrees on the world: rank 0 does not count a rank that gave up.
    s.store->set(s.key(fmt::format("world/{}", options.rank)),
                 std::vector<uint8_t>(1, static_cast<uint8_t>(0)));
    std::vector<std::string> everyone;
    for (int r = 0; r < options.world_size; ++r)
      everyone.push_back(s.key(fmt::format("world/{}", r)));
    try {
      s.store->wait(everyone, options.timeout);
    } catch (const std::exception&) {
      std::vector<int> absent;
      for (int r = 0; r < options.world_size; ++r)
        if (!s.store->check({s.key(fmt::format("world/{}", r))}))
          absent.push_back(r);
      throw RendezvousError(fmt::format(
          "rank{} {} did not join the rendezvous at {} within {:.1f} s (WORLD_SIZE {}: are "
          "that many processes started?)",
          absent.size() > 1 ? "s" : "", fmt::join(absent, ", "), at, seconds, options.world_size));
    }
  } catch (const RendezvousError&) {
    throw;
  } catch (const std::exception& e) {
    throw RendezvousError(fmt::format("rendezvous at {} failed on rank {}: {}", at, options.rank,
                                      c10d_message(e)));
  }
  s.pg_options = c10d::ProcessGroupGloo::Options::create(options.timeout);
  s.pg_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(
      local_address_towards(options.master_addr, options.master_port)));
  c10d::TCPStoreOptions client = so;
  client.isServer = false;
  client.numWorkers.reset();  // c10::optional in 1.13, std::optional in 2.x
  s.heartbeat_store = c10::make_intrusive<c10d::TCPStore>(options.master_addr, client);
  s.heartbeat = std::thread([&s] { s.beat(); });
  try {
    s.group(Group::world(options.world_size));
  } catch (const std::exception& e) {
    throw RendezvousError(fmt::format("rank {} could not connect to the others through {}: {}",
                                      options.rank, at, c10d_message(e)));
  }
}

C10dWorld::~C10dWorld() = default;

int C10dWorld::rank() const { return state_->options.rank; }
int C10dWorld::world_size() const { return state_->options.world_size; }

void C10dWorld::store_barrier(const std::string& name) {
  State& s = *state_;
  const std::string arrived = s.key("barrier/" + name);
  const int64_t count = s.store->add(arrived, 1);
  const std::string open = s.key("barrier/" + name + "/open");
  if (count == s.options.world_size)
    s.store->set(open, std::vector<uint8_t>(1, static_cast<uint8_t>(1)));
  try {
    s.store->wait({open}, s.options.timeout);
  } catch (const std::exception& e) {
    throw CollectiveTimeout(fmt::format("the processes did not all reach '{}' within {:.1f} s{}",
                                        name, s.options.timeout.count() / 1000.0,
                                        s.missing(Group::world(s.options.world_size).ranks)));
  }
}

std::string C10dWorld::share(const std::string& name, const std::string& value) {
  State& s = *state_;
  const std::string key = s.key("share/" + name);
  if (s.options.rank == 0) {
    s.store->set(key, std::vector<uint8_t>(value.begin(), value.end()));
    return value;
  }
  try {
    s.store->wait({key}, s.options.timeout);
    const auto got = s.store->get(key);
    return std::string(got.begin(), got.end());
  } catch (const std::exception& e) {
    throw CollectiveTimeout(fmt::format("rank 0 did not publish '{}' within {:.1f} s{}", name,
                                        s.options.timeout.count() / 1000.0, s.missing({0})));
  }
}

std::vector<std::string> C10dWorld::all_gather(const std::string& name, const std::string& value) {
  State& s = *state_;
  const int world = s.options.world_size;
  auto key_of = [&](int r) { return s.key(fmt::format("gather/{}/{}", name, r)); };
  s.store->set(key_of(s.options.rank), std::vector<uint8_t>(value.begin(), value.end()));
  std::vector<std::string> keys;
  for (int r = 0; r < world; ++r)
    keys.push_back(key_of(r));
  try {
    s.store->wait(keys, s.options.timeout);
  } catch (const std::exception& e) {
    throw CollectiveTimeout(fmt::format("the processes did not all offer '{}' within {:.1f} s{}",
                                        name, s.options.timeout.count() / 1000.0,
                                        s.missing(Group::world(world).ranks)));
  }
  std::vector<std::string> out;
  for (const std::string& key : keys) {
    const auto got = s.store->get(key);
    out.emplace_back(got.begin(), got.end());
  }
  return out;
}

std::string C10dWorld::agree(const std::string& name, const std::string& value) {
  State& s = *state_;
  const auto got = s.store->compareSet(s.key("agree/" + name), {},
                                       std::vector<uint8_t>(value.begin(), value.end()));
  return std::string(got.begin(), got.end());
}

std::string C10dWorld::agreed(const std::string& name) {
  State& s = *state_;
  const std::string key = s.key("agree/" + name);
  if (!s.store->check({key}))
    return "";
  const auto got = s.store->get(key);
  return std::string(got.begin(), got.end());
}

#endif

} // namespace meshsim