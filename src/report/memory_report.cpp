// memory.csv writer, the gnuplot script for memory.png, and a gnuplot runner that cannot hang.
#include "report/memory_report.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <stdexcept>

#include "base/atomic_file.h"
#include "base/printable.h"

extern char** environ;

namespace meshsim {
namespace {

constexpr double kOffScaleFactor = 20.0;  // capacity this far above the peak flattens the curves
constexpr int kPlotTimeoutMs = 60000;

std::string format(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += (c == '"') ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

} // namespace

/// A gnuplot single-quoted string: no escapes are processed inside, only '' stands for '.
std::string gnuplot_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "''";
    else if (static_cast<unsigned char>(c) < 0x20) out += ' ';  // a newline would end the command
    else out += c;
  }
  return out + "'";
}

std::string capacity_text(int64_t bytes) {
  const double gib = bytes / (kMiB * 1024.0);
  if (gib >= 1.0) return format("%.1f GiB", gib);
  const double mib = bytes / kMiB;
  return format(mib >= 10 ? "%.0f MiB" : "%.1f MiB", mib);
}

std::string memory_csv(const std::vector<MemorySample>& samples, int num_gpus) {
  std::string out = "time_s,step,phase";
  for (int g = 0; g < num_gpus; ++g) out += ",gpu" + std::to_string(g) + "_mib";
  out += ",phys_used_mib,phys_util_pct\n";
  for (const auto& s : samples) {
    if (static_cast<int>(s.bytes.size()) != num_gpus) {
      throw std::invalid_argument("memory sample at t=" + format("%.6f", s.time_s) + " has " +
                                  std::to_string(s.bytes.size()) + " GPUs, expected " +
                                  std::to_string(num_gpus));
    }
    out += format("%.6f", s.time_s) + "," + std::to_string(s.step) + "," + csv_field(s.phase);
    for (int64_t b : s.bytes) out += "," + format("%.3f", b / kMiB);
    out += "," + (s.phys_used_bytes ? format("%.3f", *s.phys_used_bytes / kMiB) : std::string());
    out += "," + (s.phys_util_pct ? std::to_string(*s.phys_util_pct) : std::string());
    out += '\n';
  }
  return out;
}

void write_memory_csv(const std::filesystem::path& path, const std::vector<MemorySample>& samples,
                      int num_gpus) {
  write_file_atomic(path, memory_csv(samples, num_gpus));
}

std::string memory_plot_script(const std::vector<MemorySample>& samples,
                               const std::vector<int64_t>& capacities, const std::string& title,
                               const std::filesystem::path& output_png,
                               const std::vector<std::string>& labels) {
  // Rank threads append samples concurrently, so times can be slightly out of order.
  std::vector<const MemorySample*> sorted;
  for (const auto& s : samples) sorted.push_back(&s);
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const MemorySample* a, const MemorySample* b) { return a->time_s < b->time_s; });
  size_t num_gpus = 0;
  int64_t peak = 0;
  bool card = false;  // some sample has the card's NVML reading: draw it beside the GPUs
  for (const auto* s : sorted) {
    num_gpus = std::max(num_gpus, s->bytes.size());
    for (int64_t b : s->bytes) peak = std::max(peak, b);
    if (s->phys_used_bytes) {
      card = true;
      peak = std::max(peak, *s->phys_used_bytes);
    }
  }
  const double peak_mib = std::max(peak / kMiB, 1e-3);

  std::vector<int64_t> caps(num_gpus, 0);
  for (size_t g = 0; g < num_gpus && g < capacities.size(); ++g) caps[g] = capacities[g];
  const bool all_equal = num_gpus > 0 && caps[0] > 0 &&
                         std::all_of(caps.begin(), caps.end(), [&](int64_t c) { return c == caps[0]; });
  auto on_scale = [&](int64_t cap) { return cap / kMiB <= kOffScaleFactor * peak_mib; };
  double top_mib = peak_mib;
  std::vector<std::string> off_scale;  // "capacity 5.8 GiB", "gpu3 capacity 5.8 GiB"
  for (size_t g = 0; g < num_gpus; ++g) {
    if (caps[g] <= 0) continue;
    if (on_scale(caps[g])) top_mib = std::max(top_mib, caps[g] / kMiB);
    else if (!all_equal || g == 0) {
      off_scale.push_back((all_equal ? "capacity " : "gpu" + std::to_string(g) + " capacity ") +
                          capacity_text(caps[g]));
    }
  }
  const bool any_off_scale = !off_scale.empty();
  // The key sits under the x label in a margin sized for its rows (gnuplot's own "below"
  // placement overlaps the x label); a wide mesh needs more rows, so the image grows.
  const size_t key_entries =
      num_gpus + (card ? 1 : 0) +
      (all_equal ? 1 : std::count_if(caps.begin(), caps.end(), [](int64_t c) { return c > 0; }));
  const size_t key_rows = (key_entries + 2) / 3;
  const int height = 720 + 24 * static_cast<int>(key_rows > 3 ? key_rows - 3 : 0);

  std::string s;
  s += "# memory.png for meshsim: live MiB of every virtual GPU over the run\n";
  // noenhanced: a title such as "resnet_18^2" must print as given, not as sub/superscripts.
  s += "set terminal pngcairo size 1280," + std::to_string(height) +
       " noenhanced font 'sans,12' linewidth 1.5\n";
  s += "set output " + gnuplot_quote(output_png.string()) + "\n";
  s += "set title " + gnuplot_quote(title) + " font 'sans,14'\n";
  s += "set xlabel 'time (s)'\nset ylabel 'MiB'\nset grid\n";
  // Ten distinct colours and no black (gnuplot's default has black, the capacity line's colour).
  const char* colours[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                           "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  for (int i = 0; i < 10; ++i) {
    s += "set linetype " + std::to_string(i + 1) + " lc rgb '" + colours[i] + "'\n";
  }
  s += "set linetype cycle 10\n";
  s += "set key at screen 0.5, screen 0.012 center bottom horizontal Left reverse box samplen 5 "
       "spacing 1.2 width 1 maxcols 3\n";
  s += "set bmargin " + format("%.2f", 5 + key_rows * 1.25) + "\n";
  s += "set autoscale xfix\n";  // the x axis ends where the run did, not at a round number
  s += "set yrange [0:" + format("%.6g", top_mib * (any_off_scale ? 1.12 : 1.08)) + "]\n";
  s += "$mem << EOD\n";
  for (const auto* m : sorted) {
    s += format("%.6f", m->time_s);
    for (size_t g = 0; g < num_gpus; ++g) {
      s += g < m->bytes.size() ? format(" %.3f", m->bytes[g] / kMiB) : std::string(" NaN");
    }
    if (card)
      s += m->phys_used_bytes ? format(" %.3f", *m->phys_used_bytes / kMiB) : std::string(" NaN");
    s += '\n';
  }
  s += "EOD\n";

  const std::string style = sorted.size() >= 2 ? "lines lw 2" : "points pt 7 ps 1.5";
  std::vector<std::string> plots;
  for (size_t g = 0; g < num_gpus; ++g) {
    plots.push_back("$mem using 1:" + std::to_string(g + 2) + " with " + style + " lt " +
                    std::to_string(g + 1) + " title '" +
                    (g < labels.size() ? labels[g] : "gpu" + std::to_string(g)) + "'");
  }
  // The physical card holds every virtual GPU plus what they do not count (the CUDA context,
  // the caching allocator's rounding, other processes): solid black, above them all.
  if (card) {
    plots.push_back("$mem using 1:" + std::to_string(num_gpus + 2) + " with " + style +
                    " lc rgb 'black' title 'card (NVML) used'");
  }
  // A capacity line is a constant function; an off-scale one gets only a key entry, so the
  // reader still learns the limit without the curves being squashed against the x axis.
  auto capacity_plot = [&](int64_t cap, const std::string& colour, const std::string& label) {
    if (on_scale(cap)) {
      return format("%.6g", cap / kMiB) + " with lines dt 2 lw 2 " + colour + " title " +
             gnuplot_quote(label + " (" + capacity_text(cap) + ")");
    }
    return "keyentry with lines dt 2 lw 2 " + colour + " title " +
           gnuplot_quote(label + " " + capacity_text(cap) + " (off scale)");
  };
  if (all_equal) {
    plots.push_back(capacity_plot(caps[0], "lc rgb 'black'", "capacity"));
  } else {
    for (size_t g = 0; g < num_gpus; ++g) {
      if (caps[g] <= 0) continue;
      plots.push_back(capacity_plot(caps[g], "lt " + std::to_string(g + 1),
                                    "gpu" + std::to_string(g) + " capacity"));
    }
  }
  if (any_off_scale) {
    std::string note;
    for (const auto& o : off_scale) note += (note.empty() ? "" : ", ") + o;
    s += "set label 1 " + gnuplot_quote(note + ": far above this range, not drawn to scale") +
         " at graph 0.99, graph 0.96 right font 'sans,11' textcolor rgb '#303030'\n";
  }
  s += "plot ";
  for (size_t i = 0; i < plots.size(); ++i) s += (i ? ", \\\n     " : "") + plots[i];
  s += "\n";
  return s;
}

bool run_gnuplot(const std::filesystem::path& script, int timeout_ms, std::string* error) {
  const char* env = std::getenv("MESHSIM_GNUPLOT");
  const std::string program = (env != nullptr && *env != '\0') ? env : "gnuplot";
  const std::string script_arg = script.string();
  char* argv[] = {const_cast<char*>(program.c_str()), const_cast<char*>(script_arg.c_str()), nullptr};

  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) {
    *error = std::string("cannot run gnuplot: pipe: ") + std::strerror(errno);
    return false;
  }
  // posix_spawn rather than fork: safe while rank threads hold locks. stdin is /dev/null so
  // gnuplot can never sit waiting for input; its own process group lets a timeout kill it all.
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_adddup2(&actions, out[1], 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, program.c_str(), &actions, &attr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(out[1]);
  if (rc != 0) {
    ::close(out[0]);
    *error = rc == ENOENT ? "gnuplot not found (" + program + "); install gnuplot-nox"
                          : "cannot run " + program + ": " + std::strerror(rc);
    return false;
  }

  std::string output;
  bool timed_out = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) { timed_out = true; break; }
    pollfd p{out[0], POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) { timed_out = true; break; }  // a poll failure must not leave us in waitpid
    char buf[4096];
    const ssize_t n = ::read(out[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EOF: gnuplot has exited (or closed its output)
    if (output.size() < 65536) output.append(buf, static_cast<size_t>(n));
  }
  ::close(out[0]);
  if (timed_out) ::kill(-pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    *error = program + " timed out after " + std::to_string(timeout_ms) + " ms and was killed";
    return false;
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return true;
  const std::string detail = last_line(output); // gnuplot's error: "script", line N: ...
  *error = WIFSIGNALED(status)
               ? program + " killed by signal " + std::to_string(WTERMSIG(status))
               : program + " exited with status " + std::to_string(WEXITSTATUS(status));
  if (!detail.empty()) *error += ": " + detail;
  return false;
}

bool draw_with_gnuplot(const std::filesystem::path& png,
                       const std::function<std::string(const std::filesystem::path&)>& script_for,
                       std::string* error) {
  std::string ignored;
  if (error == nullptr) error = &ignored;
  const auto tmp_png = atomic_temp_path(png);
  const auto script = std::filesystem::path(tmp_png.string() + ".gp");
  try {
    {
      std::ofstream f(script);
      f << script_for(tmp_png);
      if (!f.flush()) throw std::runtime_error("cannot write " + script.string());
    }
    const bool ok = run_gnuplot(script, kPlotTimeoutMs, error);
    std::error_code ec;
    std::filesystem::remove(script, ec);
    const auto size = std::filesystem::file_size(tmp_png, ec);
    if (ok && (ec || size == 0)) {
      *error = "gnuplot wrote no image to " + tmp_png.string();
    } else if (ok) {
      commit_atomic_file(tmp_png, png);
      return true;
    }
  } catch (const std::exception& e) {
    *error = e.what();
  }
  std::error_code ec;
  std::filesystem::remove(script, ec);
  std::filesystem::remove(tmp_png, ec);
  return false;
}

bool plot_memory(const std::filesystem::path& png, const std::vector<MemorySample>& samples,
                 const std::vector<int64_t>& capacities, const std::string& title,
                 std::string* error, const std::vector<std::string>& labels) {
  if (samples.empty()) {
    if (error != nullptr) *error = "no memory samples to plot";
    return false;
  }
  return draw_with_gnuplot(
      png,
      [&](const std::filesystem::path& tmp_png) {
        return memory_plot_script(samples, capacities, title, tmp_png, labels);
      },
      error);
}

} // namespace meshsim
