// `meshsim launch`: starts this node's processes of a run made of processes (--backend c10d),
// each running meshsim with the arguments after `--` and torchrun's environment, and ends
// with the first failing rank's exit code (launch/launcher.h).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <iostream>
#include <streambuf>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/integer_flag.h"
#include "launch/launcher.h"

namespace meshsim {
namespace {

// Whether something on this host already listens at `addr`:`port` (the rendezvous store
// rank 0 is about to serve there). An address that is not this host's says nothing.
bool port_taken(const std::string& addr, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, addr.c_str(), &a.sin_addr) != 1)
    a.sin_addr.s_addr = htonl(INADDR_ANY);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0)
    return false;
  const bool taken = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 &&
                     errno == EADDRINUSE;
  ::close(fd);
  return taken;
}

// stderr, each line starting "meshsim launch: ", so the launcher's lines stand apart from
// its ranks' own.
class PrefixedLines final : public std::streambuf {
public:
  explicit PrefixedLines(std::ostream& out) : out_(out) {}

protected:
  int overflow(int ch) override {
    if (ch == traits_type::eof())
      return traits_type::not_eof(ch);
    if (line_start_)
      out_ << "meshsim launch: ";
    out_.put(static_cast<char>(ch));
    line_start_ = ch == '\n';
    if (line_start_)
      out_.flush();
    return ch;
  }

private:
  std::ostream& out_;
  bool line_start_ = true;
};

std::string self_path() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0)
    throw std::runtime_error("cannot find meshsim's own executable (/proc/self/exe)");
  return std::string(buf, static_cast<size_t>(n));
}

} // namespace

void add_launch_flags(CLI::App& app, LaunchArgs& args) {
  add_integer_flag(app, "--nproc-per-node", args.nproc_per_node, "processes (ranks) on this node",
                   /*min=*/1)
      ->capture_default_str();
  add_integer_flag(app, "--nnodes", args.nnodes, "nodes of the run", /*min=*/1)->capture_default_str();
  add_integer_flag(app, "--node-rank", args.node_rank, "this node's index, 0 .. nnodes-1", /*min=*/0)
      ->capture_default_str();
  app.add_option("--master-addr", args.master_addr,
                 "node 0's address, where rank 0 serves the rendezvous")
      ->capture_default_str();
  add_integer_flag(app, "--master-port", args.master_port, "the rendezvous port", /*min=*/1)
      ->capture_default_str();
  app.add_option("--grace", args.grace_s,
                 "seconds the other ranks get to exit after one fails, before they are killed")
      ->capture_default_str();
  app.add_option("command", args.command, "after --: meshsim's arguments, e.g. train --backend c10d ...")
      ->required();
}

int run_launch(const LaunchArgs& args) {
  LaunchOptions o;
  o.nproc_per_node = args.nproc_per_node;
  o.nnodes = args.nnodes;
  o.node_rank = args.node_rank;
  o.master_addr = args.master_addr;
  o.master_port = args.master_port;
  if (!(std::isfinite(args.grace_s) && args.grace_s >= 0 && args.grace_s <= 3600)) {
    fmt::print(stderr, "meshsim: --grace must be between 0 and 3600 seconds, got {}\n",
               args.grace_s);
    return kExitUsage;
  }
  o.grace = std::chrono::milliseconds(static_cast<int64_t>(args.grace_s * 1000));
  if (args.node_rank == 0 && args.master_port >= 1 && args.master_port <= 65535 &&
      port_taken(args.master_addr, args.master_port)) {
    fmt::print(stderr,
               "meshsim: the rendezvous port {} is already in use on {} (another run?): choose "
               "a free one with --master-port\n",
               args.master_port, args.master_addr);
    return kExitUsage;
  }
  try {
    o.command.push_back(self_path());
    o.command.insert(o.command.end(), args.command.begin(), args.command.end());
    PrefixedLines lines(std::cerr);
    std::ostream log(&lines);
    const LaunchResult result = launch(o, log);
    if (result.stop_signal != 0) {
      // The ranks ending by the signal they were forwarded is the stop asked for, not a failure.
      const int code =
          result.exit_code != 0 ? result.exit_code : kExitSignalBase + result.stop_signal;
      log << fmt::format("stopped by {} (sent to launch and forwarded to every rank): exiting with "
                         "{}\n",
                         launch_signal_name(result.stop_signal), code);
      return code;
    }
    if (result.exit_code != 0)
      log << fmt::format("rank {} failed first: exiting with its code, {}\n",
                         result.first_failed_rank, result.exit_code);
    return result.exit_code;
  } catch (const std::exception& e) {
    return report_failure(e);
  }
}

} // namespace meshsim
