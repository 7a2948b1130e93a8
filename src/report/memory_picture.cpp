// memory.png: one step stacked by category per class of GPUs, every GPU's peak, and the run's
// per-step peaks (see memory_picture.h).
#include "report/memory_picture.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <stdexcept>

#include "report/memory_report.h"

namespace meshsim {
namespace {

constexpr int kPanelColumns = 4;
constexpr int kWidth = 1400;
constexpr int kTitleHeight = 70;
constexpr int kStepPanelHeight = 290;
constexpr int kPeakPanelHeight = 300;
constexpr int kStripHeight = 200;

// One colour per category, in MemoryCategory order; the key names them.
constexpr const char* kCategoryColours[kNumCategories] = {"#1f77b4", "#ff7f0e", "#2ca02c",
                                                          "#d62728", "#9467bd", "#8c8c8c"};
// The strip's lines, one per class of GPUs.
constexpr const char* kLineColours[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                        "#9467bd", "#8c564b", "#e377c2", "#17becf"};

std::string num(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

// A datablock string: double-quoted, with no double quote or control character inside.
std::string datum(const std::string& s) {
  std::string out = "\"";
  for (char c : s) out += (c == '"' || static_cast<unsigned char>(c) < 0x20) ? ' ' : c;
  return out + "\"";
}

std::vector<const MemorySample*> by_time(const std::vector<MemorySample>& samples) {
  std::vector<const MemorySample*> sorted;
  for (const auto& s : samples) sorted.push_back(&s);
  // Rank threads append concurrently, so times can be slightly out of order.
  std::stable_sort(sorted.begin(), sorted.end(), [](const MemorySample* a, const MemorySample* b) {
    return a->time_s < b->time_s;
  });
  return sorted;
}

// Screen fractions of a panel `top_px` pixels from the top, `height_px` high.
std::string place(int left, int width, int top_px, int height_px, int total_px) {
  const double x = static_cast<double>(left) / kWidth;
  const double w = static_cast<double>(width) / kWidth;
  const double y = 1.0 - static_cast<double>(top_px + height_px) / total_px;
  const double h = static_cast<double>(height_px) / total_px;
  return "set origin " + num("%.5f", x) + "," + num("%.5f", y) + "\nset size " + num("%.5f", w) +
         "," + num("%.5f", h) + "\n";
}

// Stacked bars of `rows` (label, bytes by category), the capacity dashed if in range.
std::string stacked_bars(const std::string& block, const std::vector<std::string>& labels,
                         const std::vector<CategoryBytes>& rows, int64_t capacity,
                         const std::string& title, const std::string& xlabel) {
  std::string s = "$" + block + " << EOD\n";
  int64_t top = 1;
  for (size_t i = 0; i < rows.size(); ++i) {
    s += datum(labels[i]);
    for (int64_t v : rows[i]) s += num(" %.4f", v / kMiB);
    s += "\n";
    top = std::max(top, category_total(rows[i]));
  }
  s += "EOD\n";
  const bool capacity_drawn = capacity > 0 && capacity <= kCapacityInRange * static_cast<double>(top);
  std::string heading = title;
  if (capacity > 0 && !capacity_drawn)
    heading += " (capacity " + capacity_text(capacity) + ", off scale)";
  const double ymax = (capacity_drawn ? std::max<double>(top, capacity) : top) * 1.1 / kMiB;
  s += "set title " + gnuplot_quote(heading) + " font 'sans,11'\n";
  s += "set xlabel " + gnuplot_quote(xlabel) + "\n";
  s += "set yrange [0:" + num("%.6g", ymax) + "]\n";
  // Label every bar while they fit, then every k-th.
  const size_t every = std::max<size_t>(1, (rows.size() + 23) / 24);
  s += "plot ";
  for (int c = 0; c < kNumCategories; ++c) {
    const std::string column = std::to_string(c + 2);
    const std::string x = c == 0 ? "using " + column + ":xtic(int($0) % " +
                                       std::to_string(every) + " == 0 ? stringcolumn(1) : '')"
                                 : "using " + column;
    s += std::string(c ? ", " : "") + "$" + block + " " + x + " lc rgb '" + kCategoryColours[c] +
         "' notitle";
  }
  if (capacity_drawn)
    s += ", " + num("%.6g", capacity / kMiB) + " with lines dt 2 lw 2 lc rgb 'black' notitle";
  return s + "\n";
}

int64_t common_capacity(const std::vector<int64_t>& capacities, const std::vector<int>& gpus) {
  int64_t cap = 0;
  for (int g : gpus)
    if (static_cast<size_t>(g) < capacities.size()) cap = std::max(cap, capacities[g]);
  return cap;
}

} // namespace

int64_t picture_step(const std::vector<MemorySample>& samples) {
  std::set<int64_t> steps;
  for (const auto& s : samples)
    if (s.step >= 1 && !s.by_category.empty()) steps.insert(s.step);
  if (steps.empty()) return -1;
  if (steps.size() == 1) return *steps.begin();
  return *std::prev(steps.end(), 2);
}

std::vector<StepClass> step_classes(const std::vector<MemorySample>& samples, int64_t step) {
  const auto sorted = by_time(samples);
  size_t gpus = 0;
  for (const auto* s : sorted) gpus = std::max(gpus, s->by_category.size());
  std::vector<StepClass> classes;
  for (size_t g = 0; g < gpus; ++g) {
    bool own = false;
    for (const auto* s : sorted) own |= s->step == step && s->rank == static_cast<int>(g);
    StepClass course;
    course.gpus = {static_cast<int>(g)};
    for (const auto* s : sorted) {
      if (s->step != step || g >= s->by_category.size()) continue;
      if (own && s->rank != static_cast<int>(g)) continue;
      course.phases.push_back(s->phase);
      course.bytes.push_back(s->by_category[g]);
    }
    auto same = std::find_if(classes.begin(), classes.end(), [&](const StepClass& c) {
      return c.phases == course.phases && c.bytes == course.bytes;
    });
    if (same != classes.end()) same->gpus.push_back(static_cast<int>(g));
    else classes.push_back(std::move(course));
  }
  return classes;
}

std::string gpu_ranges(const std::vector<int>& gpus) {
  std::string out;
  for (size_t i = 0; i < gpus.size();) {
    size_t j = i;
    while (j + 1 < gpus.size() && gpus[j + 1] == gpus[j] + 1) ++j;
    out += (out.empty() ? "" : ", ") + ("gpu" + std::to_string(gpus[i]));
    if (j > i) out += "-gpu" + std::to_string(gpus[j]);
    i = j + 1;
  }
  return out;
}

std::string memory_picture_script(const MemoryPictureInput& in,
                                  const std::filesystem::path& output_png) {
  const int64_t step = picture_step(in.samples);
  if (step < 0)
    throw std::invalid_argument("no memory sample of a training step has bytes by category");
  const auto classes = step_classes(in.samples, step);
  const size_t drawn = std::min<size_t>(classes.size(), kMaxStepPanels);
  const int rows = static_cast<int>((drawn + kPanelColumns - 1) / kPanelColumns);
  const int columns = static_cast<int>(std::min<size_t>(drawn, kPanelColumns));
  const int height = kTitleHeight + rows * kStepPanelHeight + kPeakPanelHeight + kStripHeight;

  std::string s = "# memory.png for meshsim: one step by category, every GPU's peak, the run\n";
  s += "set terminal pngcairo size " + std::to_string(kWidth) + "," + std::to_string(height) +
       " noenhanced font 'sans,10'\n";
  s += "set output " + gnuplot_quote(output_png.string()) + "\n";
  s += "set multiplot\n";
  // The title and one key of the categories for every panel, across the top.
  s += "set label 1 " + gnuplot_quote(in.title) + " at screen 0.5, screen " +
       num("%.5f", 1.0 - 22.0 / height) + " center font 'sans,14'\n";
  s += place(0, kWidth, 30, kTitleHeight - 30, height);
  s += "unset border\nunset tics\nset xrange [0:1]\nset yrange [0:1]\n";
  s += "set key at screen 0.5, screen " + num("%.5f", 1.0 - 52.0 / height) +
       " center center horizontal samplen 2 width 2\n";
  // A key alone is not a plot to gnuplot: one invisible line below the range carries it.
  s += "plot -1 notitle lc rgb 'white'";
  for (int c = 0; c < kNumCategories; ++c)
    s += std::string(", keyentry with boxes fs solid lc rgb '") + kCategoryColours[c] +
         "' title " + gnuplot_quote(category_name(kAllCategories[c]));
  s += ", keyentry with lines dt 2 lw 2 lc rgb 'black' title 'capacity'\n";
  s += "unset label 1\nunset key\nset border\nset tics\nset grid ytics\nset xrange [*:*]\n";
  s += "set style data histograms\nset style histogram rowstacked\n";
  s += "set style fill solid 0.9 border rgb 'white'\nset boxwidth 0.8\n";
  s += "set ylabel 'MiB'\nset xtics rotate by -40 scale 0 font 'sans,8'\n";
  s += "set offsets 0.5, 0.5, 0, 0\n";

  // 1. The representative step, one panel per class of GPUs.
  const int panel_width = kWidth / std::max(columns, 1);
  for (size_t i = 0; i < drawn; ++i) {
    const StepClass& c = classes[i];
    const int row = static_cast<int>(i) / kPanelColumns;
    const int col = static_cast<int>(i) % kPanelColumns;
    s += place(col * panel_width, panel_width, kTitleHeight + row * kStepPanelHeight,
               kStepPanelHeight, height);
    std::string title = gpu_ranges(c.gpus) + ": step " + std::to_string(step);
    if (i + 1 == drawn && classes.size() > drawn)
      title += " (" + std::to_string(classes.size() - drawn) + " more kinds of GPU not drawn)";
    s += stacked_bars("step" + std::to_string(i), c.phases, c.bytes,
                      common_capacity(in.capacities, c.gpus), title, "");
  }

  // 2. Every GPU's training peak.
  const int peak_top = kTitleHeight + rows * kStepPanelHeight;
  s += place(0, kWidth, peak_top, kPeakPanelHeight, height);
  std::vector<std::string> names;
  std::vector<int> all;
  for (size_t g = 0; g < in.peaks.size(); ++g) {
    names.push_back("gpu" + std::to_string(g));
    all.push_back(static_cast<int>(g));
  }
  if (!in.peaks.empty())
    s += stacked_bars("peaks", names, in.peaks, common_capacity(in.capacities, all),
                      "each GPU's peak of each category during training (each category's own peak)",
                      "");

  // 3. The run: each step's peak of each drawn class (its GPUs' highest), and the card's.
  s += place(0, kWidth, peak_top + kPeakPanelHeight, kStripHeight, height);
  std::map<int64_t, std::vector<double>> strip;  // step -> MiB per class, then the card
  bool card = false;
  for (const auto& m : in.samples) {
    if (m.step < 1) continue;
    auto& row = strip[m.step];
    row.resize(drawn + 1, NAN);
    for (size_t i = 0; i < drawn; ++i)
      for (int g : classes[i].gpus)
        if (static_cast<size_t>(g) < m.bytes.size()) {
          const double mib = m.bytes[g] / kMiB;
          row[i] = std::isnan(row[i]) ? mib : std::max(row[i], mib);
        }
    if (m.phys_used_bytes) {
      card = true;
      const double mib = *m.phys_used_bytes / kMiB;
      row[drawn] = std::isnan(row[drawn]) ? mib : std::max(row[drawn], mib);
    }
  }
  s += "$strip << EOD\n";
  for (const auto& [k, row] : strip) {
    s += std::to_string(k);
    for (double v : row) s += std::isnan(v) ? std::string(" NaN") : num(" %.4f", v);
    s += "\n";
  }
  s += "EOD\n";
  s += "unset offsets\nset xtics norotate scale 1 font 'sans,9'\nset xlabel 'step'\n";
  s += "set title 'the run: each step''s peak' font 'sans,11'\nset yrange [0:*]\n";
  s += "set key default\nset key outside right top vertical font 'sans,9'\n";
  s += "set autoscale xfix\n";
  const std::string style = strip.size() >= 2 ? "lines lw 2" : "points pt 7 ps 1.2";
  s += "plot ";
  for (size_t i = 0; i < drawn; ++i)
    s += std::string(i ? ", " : "") + "$strip using 1:" + std::to_string(i + 2) + " with " + style +
         " lc rgb '" + kLineColours[i % 8] + "' title " + gnuplot_quote(gpu_ranges(classes[i].gpus));
  if (card)
    s += ", $strip using 1:" + std::to_string(drawn + 2) + " with " + style +
         " lc rgb 'black' title 'card (NVML) used'";
  s += "\nunset multiplot\n";
  return s;
}

bool plot_memory_picture(const std::filesystem::path& png, const MemoryPictureInput& input,
                         std::string* error) {
  return draw_with_gnuplot(
      png, [&](const std::filesystem::path& tmp) { return memory_picture_script(input, tmp); },
      error);
}

} // namespace meshsim
