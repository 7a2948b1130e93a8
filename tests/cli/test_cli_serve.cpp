// `meshsim serve` as a user runs it: a server process on loopback, answering the page, the
// options and plans; refusing bad requests with a status and one line; under load, answering
// every request (200, 4xx or 503) with its memory bounded; stopping on SIGTERM.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <map>
#include <thread>

#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "chromium.h"
#include "cli_harness.h"

using namespace meshsim::testing;
namespace fs = std::filesystem;
using json = nlohmann::json;

extern char** environ;

namespace {

// `meshsim serve --port 0 FLAGS`, its port read from the line it prints; SIGTERM at the end.
class Server {
public:
  explicit Server(const std::string& flags, const fs::path& log) : log_(log) {
    fs::create_directories(log.parent_path());
    int fds[2];
    EXPECT_EQ(pipe(fds), 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
    posix_spawn_file_actions_addopen(&actions, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addclose(&actions, fds[0]);
    std::vector<std::string> args{MESHSIM_BINARY, "serve", "--port", "0"};
    std::istringstream words(flags);
    for (std::string w; words >> w;)
      args.push_back(w);
    std::vector<char*> argv;
    for (auto& a : args)
      argv.push_back(a.data());
    argv.push_back(nullptr);
    EXPECT_EQ(posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&actions);
    close(fds[1]);
    // "meshsim serve: listening on http://127.0.0.1:PORT"
    std::string line;
    char c;
    while (read(fds[0], &c, 1) == 1 && c != '\n')
      line += c;
    close(fds[0]);
    const auto colon = line.rfind(':');
    if (line.find("listening on http://") != std::string::npos && colon != std::string::npos)
      port_ = std::stoi(line.substr(colon + 1));
    EXPECT_GT(port_, 0) << line << "\n" << read_text(log_);
  }
  ~Server() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  // SIGTERM: the server stops and exits 0.
  int stop() {
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  std::string log() const { return read_text(log_); }
  // The server process's resident memory now and at its highest, in KiB (/proc/PID/status).
  std::pair<int64_t, int64_t> memory_kib() const {
    std::ifstream status(fmt::format("/proc/{}/status", pid_));
    int64_t rss = 0, hwm = 0;
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("VmRSS:", 0) == 0)
        rss = std::stoll(line.substr(6));
      if (line.rfind("VmHWM:", 0) == 0)
        hwm = std::stoll(line.substr(6));
    }
    return {rss, hwm};
  }

private:
  pid_t pid_ = -1;
  int port_ = 0;
  fs::path log_;
};

struct Answer {
  int status = 0; // 0: no answer (the connection failed: `error` says how)
  json body;
  std::string error;
};

Answer post(int port, const std::string& body, int timeout_s = 120) {
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(timeout_s);
  client.set_connection_timeout(timeout_s);
  Answer a;
  if (auto res = client.Post("/api/plan", body, "application/json")) {
    a.status = res->status;
    a.body = json::parse(res->body, nullptr, false);
  } else {
    a.error = httplib::to_string(res.error());
  }
  return a;
}

// A refusal: the status, and a JSON object whose "error" is one line.
void expect_refused(const Answer& a, int status, const std::string& says) {
  EXPECT_EQ(a.status, status) << a.body.dump();
  ASSERT_TRUE(a.body.is_object() && a.body.contains("error")) << a.body.dump();
  const std::string error = a.body["error"].get<std::string>();
  EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  EXPECT_NE(error.find(says), std::string::npos) << error;
  std::cout << status << ": " << error << "\n";
}

} // namespace

TEST(CliServe, AnswersThePageAndAPlanAsMeshsimPlanDoes) {
  const fs::path dir = fresh_dir("serve-plan");
  Server server("", dir / "serve.log");
  ASSERT_GT(server.port(), 0);
  httplib::Client client("127.0.0.1", server.port());
  auto page = client.Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_NE(page->body.find("<main id=\"serve\">"), std::string::npos);
  expect_self_contained(page->body);
  auto options = client.Get("/api/options");
  ASSERT_TRUE(options);
  const json o = json::parse(options->body);
  EXPECT_TRUE(std::any_of(o["presets"].begin(), o["presets"].end(),
                          [](const json& p) { return p["name"] == "llama3-8b"; }));

  const Answer a = post(server.port(), R"({"preset": "llama3-8b", "cluster": "8xh100",
      "precision": "bf16", "layout": {"zero": 3}})");
  ASSERT_EQ(a.status, 200) << a.body.dump() << server.log();
  const CliResult cli =
      run_meshsim_exactly("plan --preset llama3-8b --cluster 8xh100 --precision bf16 --zero 3 "
                          "--json");
  ASSERT_EQ(cli.code, 0) << cli.output;
  // The document, between the progress lines on stderr.
  const size_t open = cli.output.find("\n{"), close = cli.output.rfind("\n}");
  ASSERT_NE(open, std::string::npos);
  const json expected = json::parse(cli.output.substr(open + 1, close + 1 - open));
  EXPECT_EQ(a.body["plan"], expected); // the same document, byte for byte once parsed
  EXPECT_EQ(a.body["command"], "meshsim plan --preset llama3-8b --cluster 8xh100 --precision "
                               "bf16 --zero 3");
  EXPECT_TRUE(a.body["search"].is_null());
  EXPECT_EQ(server.stop(), 0);
}

TEST(CliServe, RefusesBadRequestsWithAStatusAndOneLine) {
  const fs::path dir = fresh_dir("serve-bad");
  Server server("--max-body 65536", dir / "serve.log");
  ASSERT_GT(server.port(), 0);
  const int port = server.port();
  expect_refused(post(port, R"({"preset": "gpt2", "cluster": "8xh100", "pad": ")" +
                                std::string(100000, 'x') + "\"}"),
                 413, "over 65536 bytes");
  expect_refused(post(port, "{\"preset\": \"llama3-8b\", "), 400, "not JSON");
  expect_refused(post(port, R"({"preset": "llama9-8b", "cluster": "8xh100"})"), 400,
                 "unknown preset 'llama9-8b'");
  expect_refused(post(port, R"({"preset": "llama3-8b", "cluster": "8xh100",
                                "layout": {"tp": 3}})"),
                 400, "tp");
  expect_refused(post(port, R"({"cluster": "8xh100", "hf_config": {"model_type": "bert",
                                "hidden_size": 768, "num_hidden_layers": 12}})"),
                 400, "bert");
  expect_refused(post(port, R"({"preset": "llama3-8b", "cluster": "8xq100"})"), 400, "q100");
  httplib::Client client("127.0.0.1", port);
  auto missing = client.Get("/nothing");
  ASSERT_TRUE(missing);
  expect_refused({missing->status, json::parse(missing->body, nullptr, false), ""}, 404,
                 "no /nothing");
  auto wrong_method = client.Delete("/api/plan");
  ASSERT_TRUE(wrong_method);
  expect_refused({wrong_method->status, json::parse(wrong_method->body, nullptr, false), ""}, 405,
                 "/api/plan takes POST, not DELETE");
  EXPECT_EQ(server.stop(), 0);
}

// 200 plans of a small model at once, then 20 of a large one that run past --max-seconds:
// every request is answered (200, 4xx or 503), the server's memory stays bounded, and it
// answers afterwards.
TEST(CliServe, UnderLoadAnswersEveryRequestWithBoundedMemory) {
  const fs::path dir = fresh_dir("serve-load");
  // The limit: ten times one small plan alone here, at least 5 s (a plan is several times
  // slower with the suite beside it, or under a sanitizer); the large plan takes far longer.
  const auto t0 = std::chrono::steady_clock::now();
  run_meshsim_exactly("plan --preset gpt2 --cluster 8xh100 --precision bf16 --json >/dev/null");
  const double alone =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double limit = std::max(5.0, 10 * alone);
  std::cout << "one small plan alone: " << alone << " s; --max-seconds " << limit << "\n";
  Server server(fmt::format("--max-seconds {:.1f} --max-plans 2 --max-waiting 8", limit),
                dir / "serve.log");
  ASSERT_GT(server.port(), 0);
  const int port = server.port();
  const auto before = server.memory_kib();

  auto storm = [&](int n, const std::string& body) {
    std::vector<int> statuses(static_cast<size_t>(n));
    std::vector<std::string> errors(static_cast<size_t>(n));
    std::vector<std::thread> clients;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i)
      clients.emplace_back([&, i] {
        const Answer a = post(port, body);
        statuses[static_cast<size_t>(i)] = a.status;
        errors[static_cast<size_t>(i)] = a.error;
      });
    for (auto& t : clients)
      t.join();
    std::map<int, int> by_status;
    for (int s : statuses)
      ++by_status[s];
    std::string summary;
    for (auto [status, count] : by_status)
      summary += fmt::format(" {}: {}", status, count);
    std::cout << n << " requests in "
              << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()
              << " s:" << summary << "\n";
    for (size_t i = 0; i < statuses.size(); ++i) {
      const int s = statuses[i];
      EXPECT_TRUE(s == 200 || (s >= 400 && s < 500) || s == 503) << s << " " << errors[i];
    }
    return by_status;
  };
  const auto small = storm(200, R"({"preset": "gpt2", "cluster": "8xh100", "precision": "bf16"})");
  EXPECT_GT(small.count(200) ? small.at(200) : 0, 0);
  // DeepSeek-V3 on 512 GPUs with 64 micro-batches a step takes over 40 s to plan here (8
  // micro-batches, about 10 s): stopped at the limit, 503.
  const auto large = storm(20, R"({"preset": "deepseek-v3", "cluster": "64x8xh100",
      "precision": "bf16", "layout": {"pp": 8, "ep": 64, "zero": 1, "micro_batch_size": 1,
      "recompute": "full"}, "global_batch_size": 4096})");
  EXPECT_EQ(large.count(200), 0u);
  const auto after = server.memory_kib();
  std::cout << "server memory: " << before.first << " KiB before, " << after.first
            << " KiB after, peak " << after.second << " KiB\n";
  // The plans run in their own processes: the server holds requests and answers only.
  EXPECT_LT(after.second, before.first + 256 * 1024);
  httplib::Client client("127.0.0.1", port);
  auto health = client.Get("/api/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(json::parse(health->body)["running"], 0);
  const Answer again = post(port, R"({"preset": "gpt2", "cluster": "8xh100"})");
  EXPECT_EQ(again.status, 200) << again.body.dump();
  EXPECT_EQ(server.stop(), 0);
}

// plan --out writes plan.html: self-contained, under 2 MB for the largest models, and drawn in
// headless Chromium with no console message and no network.
TEST(CliServe, PlanOutWritesAPlanPageThatOpensOffline) {
  const fs::path out = fresh_dir("plan-page");
  auto r = run_meshsim_exactly("plan --preset llama3-405b --cluster 128x8xh100 --precision bf16 "
                               "--tp 8 --pp 16 --virtual-stages 2 --micro-batch-size 1 "
                               "--global-batch-size 512 --recompute full --out " +
                               out.string());
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string page = read_text(out / "plan.html");
  std::cout << "plan.html of Llama 3 405B on 1024 H100: " << page.size() << " bytes\n";
  EXPECT_LT(page.size(), 2u * 1000 * 1000);
  expect_self_contained(page);
  const json plan = read_json(out / "plan.json");
  ASSERT_EQ(plan["timeline"]["stages"].size(), 16u);
  for (const auto& stage : plan["timeline"]["stages"])
    EXPECT_NEAR(stage["compute_s"].get<double>() + stage["exposed_comm_s"].get<double>() +
                    stage["bubble_s"].get<double>(),
                plan["timeline"]["step_seconds"].get<double>(),
                1e-9 * plan["timeline"]["step_seconds"].get<double>());
  EXPECT_EQ(plan["assumptions"]["attention"], "fused (no [s, s] scores kept)");
  const std::string chromium = find_chromium();
  if (chromium.empty())
    GTEST_SKIP() << "no Chromium (apt-get install chromium): the page was written but not loaded";
  const Loaded l =
      load_in_chromium(chromium, out / "plan.html", out / "chromium",
                       "--host-resolver-rules='MAP * ~NOTFOUND' --proxy-server=127.0.0.1:9");
  EXPECT_EQ(l.code, 0);
  for (const auto& line : l.console)
    ADD_FAILURE() << "console: " << line;
  EXPECT_FALSE(std::regex_search(l.dom, std::regex("<body[^>]*data-report-errors=\"[1-9]")))
      << l.dom.substr(0, 2000);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(l.dom, m, std::regex("data-charts-rendered=\"(\\d+)\"")));
  EXPECT_GE(std::stoi(m[1]), 2); // memory by stage, the step's timeline
  EXPECT_EQ(count(l.dom, "<canvas id=\"chart-[^\"]*\"[^>]*\\swidth=\"[1-9]"), std::stoi(m[1]));
}
