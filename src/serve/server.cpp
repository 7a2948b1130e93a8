// The server: httplib for HTTP, a slot count for the plans, one child process per plan.
#include "serve/server.h"

#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <stdexcept>

#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "base/printable.h"
#include "cost/hardware.h"
#include "models/presets.h"
#include "report/plan_page.h"
#include "serve/child_process.h"
#include "serve/plan_request.h"

namespace meshsim {
namespace {

using json = nlohmann::json;
constexpr int kListenBacklog = 1024;
namespace fs = std::filesystem;

void answer(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void refuse(httplib::Response& res, int status, const std::string& what) {
  answer(res, status, {{"error", what}});
}

} // namespace

// The plans running and waiting: at most `running` at once, `waiting` more in line.
class PlanSlots {
public:
  PlanSlots(int running, int waiting) : max_running_(running), max_waiting_(waiting) {}
  enum class Got { Slot, Busy, TimedOut };
  Got acquire(std::chrono::steady_clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (running_ < max_running_) {
      ++running_;
      return Got::Slot;
    }
    if (waiting_ >= max_waiting_)
      return Got::Busy;
    ++waiting_;
    const bool got = freed_.wait_until(lock, deadline, [&] { return running_ < max_running_; });
    --waiting_;
    if (!got)
      return Got::TimedOut;
    ++running_;
    return Got::Slot;
  }
  void release() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      --running_;
    }
    freed_.notify_one();
  }
  json load() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return {{"running", running_},
            {"waiting", waiting_},
            {"max_plans", max_running_},
            {"max_waiting", max_waiting_}};
  }

private:
  mutable std::mutex mutex_;
  std::condition_variable freed_;
  int running_ = 0, waiting_ = 0;
  const int max_running_, max_waiting_;
};

namespace {

// A folder of its own for one request (its config.json, a search's plan), removed after.
class RequestFolder {
public:
  RequestFolder() {
    std::string pattern = (fs::temp_directory_path() / "meshsim-serve-XXXXXX").string();
    if (!mkdtemp(pattern.data()))
      throw std::runtime_error("cannot make a folder for the plan under " +
                               fs::temp_directory_path().string());
    path_ = pattern;
  }
  ~RequestFolder() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const fs::path& path() const { return path_; }

private:
  fs::path path_;
};

// The line a failed plan ended with ("meshsim: ..." on its stderr), without the prefix.
std::string plan_error(const std::string& err) {
  std::string line = last_line(err);
  if (line.rfind("meshsim: ", 0) == 0)
    line = line.substr(9);
  return line.size() > 1000 ? line.substr(0, 1000) + "..." : line;
}

json options_json(const ServeOptions& o) {
  json presets = json::array();
  for (const ModelPreset& p : model_presets())
    presets.push_back({{"name", p.name},
                       {"family", p.family},
                       {"parameters", preset_parameter_count(p.family, p.shape)},
                       {"experts", p.shape.moe.experts},
                       {"seq_len", p.shape.seq_len}});
  json gpus = json::array();
  for (const GpuSpec& g : gpu_presets())
    gpus.push_back(g.name);
  return {{"presets", presets},
          {"clusters",
           {"8xh100", "2x8xh100", "4x8xh100", "8x8xh100", "32x8xh100", "8xh200", "8xh800", "8xb200",
            "72xgb200", "8xa100-80", "4x8xa100-80"}},
          {"gpus", gpus},
          {"precisions", {"bf16", "fp8", "fp16", "fp32"}},
          {"recompute", {"none", "selective", "op", "full"}},
          {"attention", {"fused", "eager"}},
          {"limits",
           {{"max_body_bytes", o.max_body_bytes},
            {"max_seconds", o.max_seconds},
            {"max_plans", o.max_plans},
            {"max_waiting", o.max_waiting}}}};
}

} // namespace

struct PlanServer::State {
  ServeOptions options;
  httplib::Server http;
  PlanSlots slots;
  std::atomic<bool> stopping{false};
  int socket = -1; // the listening socket, once bound
  explicit State(ServeOptions o)
      : options(std::move(o)), slots(options.max_plans, options.max_waiting) {}

  void plan(const httplib::Request& req, httplib::Response& res);
};

void PlanServer::State::plan(const httplib::Request& req, httplib::Response& res) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const auto deadline = start + std::chrono::duration_cast<clock::duration>(
                                    std::chrono::duration<double>(options.max_seconds));
  PlanRequest request;
  try {
    request = parse_plan_request(req.body);
  } catch (const RequestError& e) {
    return refuse(res, e.status(), e.what());
  }
  switch (slots.acquire(deadline)) {
  case PlanSlots::Got::Busy:
    res.set_header("Retry-After", "5");
    return refuse(res, 503,
                  fmt::format("busy: {} plans running and {} waiting (meshsim serve "
                              "--max-plans, --max-waiting); try again shortly",
                              options.max_plans, options.max_waiting));
  case PlanSlots::Got::TimedOut:
    res.set_header("Retry-After", "5");
    return refuse(res, 503,
                  fmt::format("busy: no plan slot came free within --max-seconds "
                              "{:g} s; try again shortly",
                              options.max_seconds));
  case PlanSlots::Got::Slot:
    break;
  }
  struct Release {
    PlanSlots& slots;
    ~Release() { slots.release(); }
  } release{slots};

  const RequestFolder folder;
  std::vector<std::string> argv{options.binary, "plan", "--json"};
  if (request.hf_config.is_object()) {
    const fs::path config = folder.path() / "config.json";
    std::ofstream(config) << request.hf_config.dump(2, ' ', false, json::error_handler_t::replace);
    argv.insert(argv.end(), {"--hf-config", config.string()});
  }
  argv.insert(argv.end(), request.flags.begin(), request.flags.end());
  const fs::path out = folder.path() / "out";
  if (request.search)
    argv.insert(argv.end(), {"--out", out.string()});
  ChildLimits limits;
  limits.max_seconds = std::chrono::duration<double>(deadline - clock::now()).count();
  limits.cancel = &stopping;
  const ChildResult child = run_child(argv, limits);
  if (child.timed_out)
    return refuse(res, 503,
                  fmt::format("the plan ran past --max-seconds {:g} s and was stopped "
                              "(a smaller model or cluster plans faster; meshsim serve "
                              "--max-seconds allows more)",
                              options.max_seconds));
  if (child.signal != 0)
    return refuse(res, 500,
                  fmt::format("the plan stopped on signal {}{}", child.signal,
                              stopping ? " (the server is stopping)" : ""));
  if (child.exit_code != 0) {
    // The request's config.json is named as the person sent it, not by the server's folder.
    std::string why = plan_error(child.err);
    for (size_t at; (at = why.find(folder.path().string() + "/")) != std::string::npos;)
      why.erase(at, folder.path().string().size() + 1);
    // 2, 3: the request's values (a layout that does not divide, a config.json refused);
    // 4: a plan no GPU could hold. Anything else is the server's own failure.
    const int status = child.exit_code == 2 || child.exit_code == 3 ? 400
                       : child.exit_code == 4                       ? 422
                                                                    : 500;
    return refuse(res, status,
                  why.empty() ? fmt::format("the plan failed (exit {})", child.exit_code) : why);
  }
  json doc = json::parse(child.out, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object())
    return refuse(res, 500, "the plan printed no JSON object");
  json body{{"command", request.command_line()},
            {"seconds", std::chrono::duration<double>(clock::now() - start).count()}};
  if (request.search) {
    body["search"] = std::move(doc);
    json best = nullptr;
    if (std::ifstream in{out / "plan.json"})
      best = json::parse(in, nullptr, /*allow_exceptions=*/false);
    body["plan"] = best.is_object() ? best : json(nullptr);
  } else {
    body["plan"] = std::move(doc);
    body["search"] = nullptr;
  }
  answer(res, 200, body);
}

PlanServer::PlanServer(ServeOptions options) : state_(std::make_unique<State>(std::move(options))) {
  State& s = *state_;
  httplib::Server& http = s.http;
  const int workers = s.options.max_plans + s.options.max_waiting + 4;
  http.new_task_queue = [workers] { return new httplib::ThreadPool(static_cast<size_t>(workers)); };
  http.set_payload_max_length(s.options.max_body_bytes);
  // SO_REUSEADDR (a restart does not wait for the last connections' TIME_WAIT), not httplib's
  // default SO_REUSEPORT, which would let a second server share the port unseen; and the
  // socket kept, for a longer queue of connections than httplib's (run()).
  http.set_socket_options([&s](int sock) {
    const int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    s.socket = sock;
  });
  http.set_read_timeout(10);
  http.set_write_timeout(10);
  http.set_keep_alive_max_count(20);
  const std::string page = serve_page();
  http.Get("/", [page](const httplib::Request&, httplib::Response& res) {
    res.set_content(page, "text/html; charset=utf-8");
  });
  http.Get("/api/options", [&s](const httplib::Request&, httplib::Response& res) {
    answer(res, 200, options_json(s.options));
  });
  http.Get("/api/health", [&s](const httplib::Request&, httplib::Response& res) {
    answer(res, 200, s.slots.load());
  });
  http.Post("/api/plan",
            [&s](const httplib::Request& req, httplib::Response& res) { s.plan(req, res); });
  // Every refusal httplib makes itself (404, 405, 413, 400) as one line of JSON too.
  http.set_error_handler([&s](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty())
      return;
    // A known path asked with another method: 405, naming the one it takes.
    static const std::pair<const char*, const char*> methods[] = {
        {"/", "GET"}, {"/api/options", "GET"}, {"/api/health", "GET"}, {"/api/plan", "POST"}};
    for (const auto& [path, method] : methods)
      if (res.status == 404 && req.path == path) {
        res.set_header("Allow", method);
        return refuse(res, 405,
                      fmt::format("{} takes {}, not {}", path, method, req.method.substr(0, 20)));
      }
    const std::string what =
        res.status == 413   ? fmt::format("the body is over {} bytes (meshsim serve --max-body)",
                                          s.options.max_body_bytes)
        : res.status == 404 ? fmt::format("no {} here: the page is GET /, the API GET "
                                          "/api/options and POST /api/plan",
                                          req.path.substr(0, 200))
        : res.status == 405 ? fmt::format("{} is not a method of {}", req.method.substr(0, 20),
                                          req.path.substr(0, 200))
                            : fmt::format("the request was refused (HTTP {})", res.status);
    refuse(res, res.status, what);
  });
  http.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr error) {
        std::string what = "an unknown error";
        try {
          std::rethrow_exception(error);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        refuse(res, 500, what.substr(0, what.find('\n')));
      });
  http.set_logger([](const httplib::Request& req, const httplib::Response& res) {
    fmt::print(stderr, "meshsim serve: {} {} {}\n", req.method, req.path.substr(0, 200),
               res.status);
  });
}

PlanServer::~PlanServer() = default;

void PlanServer::run(const std::function<void(int port)>& listening) {
  State& s = *state_;
  int port = s.options.port;
  if (port == 0) {
    port = s.http.bind_to_any_port(s.options.host);
    if (port < 0)
      throw std::runtime_error(fmt::format("cannot listen on {} (any port)", s.options.host));
  } else if (!s.http.bind_to_port(s.options.host, port)) {
    throw std::runtime_error(fmt::format("cannot listen on {} port {} (in use, or not this "
                                         "machine's address)",
                                         s.options.host, port));
  }
  // httplib listens with a queue of 5 connections: a burst of clients would find it full
  // (their connections dropped, then retried or reset). listen() again sets a longer one.
  if (s.socket >= 0)
    ::listen(s.socket, kListenBacklog);
  listening(port);
  s.http.listen_after_bind();
}

void PlanServer::stop() {
  state_->stopping = true;
  state_->http.stop();
}

} // namespace meshsim
