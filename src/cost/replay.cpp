// Replay: implementation.
//
// With in-order streams, explicit dependencies and rendezvous collectives as the only
// constraints (no contention for links or SMs is modelled), an event-driven simulation reduces
// to a longest-path pass over a DAG: every compute task is a node, every collective (all its
// members' instances) is one node, and a node starts at the latest end of its predecessors.
// Kahn's topological order processes nodes in the order their start events can fire; nodes it
// never reaches form a cycle, i.e. the program would deadlock.
#include "cost/replay.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <unordered_map>
#include <utility>

namespace meshsim {
namespace {

// The sender's instance of a point-to-point transfer (its group is {sender, receiver}).
bool is_send(const Task& task, int rank) {
  return task.kind == TaskKind::Comm && task.op == CollectiveOp::SendRecv &&
         task.group.size() == 2 && task.group[0] == rank && task.group[1] != rank;
}

constexpr size_t kMaxNamedInErrors = 8;

std::string group_text(const std::vector<int>& group) {
  std::string text;
  for (int rank : group)
    text += (text.empty() ? "" : ",") + std::to_string(rank);
  return "{" + text + "}";
}

struct TaskRef {
  int rank = 0;
  const Task* task = nullptr;
};

// One schedulable unit: a compute task, or all instances of one collective.
struct Node {
  size_t tasks = 0; // its flat task indexes are Graph::members[tasks]
  double duration_s = 0;
  double start_s = 0;
  double end_s = 0;
};

// Length of the overlap of two sorted lists of disjoint intervals.
double overlap(const std::vector<std::pair<double, double>>& a,
               const std::vector<std::pair<double, double>>& b) {
  double total = 0;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const double lo = std::max(a[i].first, b[j].first);
    const double hi = std::min(a[i].second, b[j].second);
    if (hi > lo)
      total += hi - lo;
    (a[i].second < b[j].second) ? ++i : ++j;
  }
  return total;
}

// `present` (null: every rank is) says which ranks have tasks; a missing member is allowed
// only where it is an absent rank, an image of a present one.
void validate_collective(const std::string& key, const std::vector<size_t>& members,
                         const std::vector<TaskRef>& flat, const std::vector<bool>* present) {
  const Task& first = *flat[members.front()].task;
  std::vector<int> seen;
  for (size_t t : members) {
    const Task& task = *flat[t].task;
    const int rank = flat[t].rank;
    // An all_to_all's members each send their own split (Task::peer_bytes).
    const bool same_bytes = task.op == CollectiveOp::AllToAll || task.bytes == first.bytes;
    if (task.op != first.op || task.group != first.group || !same_bytes)
      throw std::invalid_argument("replay: collective \"" + key + "\": task \"" + task.id +
                                  "\" disagrees with \"" + first.id + "\" on op, group or bytes");
    if (std::find(task.group.begin(), task.group.end(), rank) == task.group.end())
      throw std::invalid_argument("replay: task \"" + task.id + "\" on rank " +
                                  std::to_string(rank) + " is not a member of its group " +
                                  group_text(task.group));
    if (std::find(seen.begin(), seen.end(), rank) != seen.end())
      throw std::invalid_argument("replay: collective \"" + key + "\" has two instances on rank " +
                                  std::to_string(rank));
    seen.push_back(rank);
  }
  size_t expected = first.group.size();
  if (present)
    for (int member : first.group)
      if (member >= 0 && member < static_cast<int>(present->size()) &&
          !(*present)[static_cast<size_t>(member)])
        --expected;
  if (seen.size() != expected)
    throw std::invalid_argument("replay: collective \"" + key + "\" on group " +
                                group_text(first.group) + " has " + std::to_string(seen.size()) +
                                " of its " + std::to_string(first.group.size()) + " members");
}

// all_to_all's time from every member's split: a member with no instance (an image) sends as
// the first present one does, rotated to its own place.
double all_to_all_duration(const std::vector<size_t>& members, const std::vector<TaskRef>& flat,
                           const ClusterSpec& cluster) {
  const std::vector<int>& group = flat[members.front()].task->group;
  const size_t n = group.size();
  std::vector<std::vector<double>> bytes(n);
  std::vector<bool> known(n, false);
  for (size_t t : members) {
    const Task& task = *flat[t].task;
    const size_t i = static_cast<size_t>(
        std::find(group.begin(), group.end(), flat[t].rank) - group.begin());
    bytes[i] = task.peer_bytes;
    if (bytes[i].empty())
      bytes[i].assign(n, task.bytes / static_cast<double>(n));
    if (bytes[i].size() != n)
      throw std::invalid_argument("replay: all_to_all task \"" + task.id + "\" has " +
                                  std::to_string(bytes[i].size()) +
                                  " peer byte counts for a group of " + std::to_string(n));
    known[i] = true;
  }
  size_t first = 0;
  while (!known[first])
    ++first;
  for (size_t i = 0; i < n; ++i)
    if (!known[i]) {
      bytes[i].resize(n);
      for (size_t j = 0; j < n; ++j)
        bytes[i][j] = bytes[first][(j + n - i + first) % n];
    }
  return all_to_all_cost(bytes, group, cluster).time_s;
}

} // namespace

Task Task::compute(std::string id, double seconds, std::vector<std::string> deps) {
  Task task;
  task.id = std::move(id);
  task.duration_s = seconds;
  task.deps = std::move(deps);
  return task;
}

Task Task::compute(std::string id, const ComputeWork& work, std::vector<std::string> deps) {
  Task task;
  task.id = std::move(id);
  task.work = work;
  task.deps = std::move(deps);
  return task;
}

Task Task::comm(std::string id, CollectiveOp op, std::vector<int> group, double bytes,
                std::vector<std::string> deps, std::string key) {
  Task task;
  task.id = std::move(id);
  task.kind = TaskKind::Comm;
  task.op = op;
  task.group = std::move(group);
  task.bytes = bytes;
  task.deps = std::move(deps);
  task.key = std::move(key);
  return task;
}

const TaskTiming& ReplayResult::task(const std::string& id) const {
  for (const TaskTiming& timing : tasks)
    if (timing.id == id)
      return timing;
  throw std::out_of_range("replay result has no task \"" + id + "\"");
}

double ReplayResult::max_exposed_comm_s() const {
  double worst = 0;
  for (const RankStats& rank : ranks)
    worst = std::max(worst, rank.exposed_comm_s);
  return worst;
}

namespace {

// The program as a graph: every task (flat, by index), and the nodes they are grouped into (a
// compute task is a node of its own; the tasks of one collective instance, one per member,
// share a node), with each task's own predecessors. A plan has hundreds of thousands of
// tasks, so their predecessor lists are kept flat: task t's are pred_nodes[pred_begin[t]] up to
// pred_nodes[pred_begin[t + 1]], and schedule_nodes keeps the successors the same way.
struct Graph {
  std::vector<TaskRef> flat;
  std::unordered_map<std::string, size_t> index_of;
  std::vector<Node> nodes;
  std::vector<size_t> node_of;                // task -> node
  std::vector<std::vector<size_t>> members;   // Node::tasks -> its flat task indexes
  std::unordered_map<std::string, size_t> collective_node;
  /// The collectives' keys in program order (into collective_node, whose keys stay put): the
  /// order they are checked in, so that an error names the same one every time.
  std::vector<const std::string*> collective_keys;
  std::vector<size_t> pred_begin{0}; // task -> its predecessor nodes in pred_nodes
  std::vector<size_t> pred_nodes;

  const std::vector<size_t>& tasks_of(const Node& node) const { return members[node.tasks]; }
  template <class Fn>
  void for_each_pred_of_task(size_t t, Fn&& fn) const {
    for (size_t i = pred_begin[t]; i < pred_begin[t + 1]; ++i)
      fn(pred_nodes[i]);
  }
  // A node's predecessors: its tasks', one entry per edge.
  template <class Fn>
  void for_each_pred(const Node& node, Fn&& fn) const {
    for (size_t t : tasks_of(node))
      for_each_pred_of_task(t, fn);
  }
};

Graph build_graph(const Program& program, int num_ranks) {
  Graph g;
  size_t tasks = 0;
  for (int r = 0; r < num_ranks; ++r)
    tasks += program.ranks[static_cast<size_t>(r)].size();
  g.flat.reserve(tasks);
  g.index_of.reserve(tasks);
  // Flatten, index ids, and assign every task to a node.
  for (int r = 0; r < num_ranks; ++r)
    for (const Task& task : program.ranks[static_cast<size_t>(r)]) {
      if (!g.index_of.emplace(task.id, g.flat.size()).second)
        throw std::invalid_argument("replay: duplicate task id \"" + task.id + "\"");
      g.flat.push_back({r, &task});
    }

  g.node_of.resize(g.flat.size());
  g.members.reserve(g.flat.size());
  std::vector<std::map<std::string, int>> calls_per_rank(static_cast<size_t>(num_ranks));
  for (size_t t = 0; t < g.flat.size(); ++t) {
    const Task& task = *g.flat[t].task;
    if (task.kind == TaskKind::Compute) {
      g.node_of[t] = g.nodes.size();
      g.nodes.push_back({g.members.size(), 0, 0, 0});
      g.members.push_back({t});
      continue;
    }
    std::string key = "key:" + task.key;
    if (task.key.empty()) { // NCCL's rule: the k-th call on a group matches the k-th call
      const std::string base = std::string(to_string(task.op)) + group_text(task.group);
      key = "auto:" + base + "#" + std::to_string(calls_per_rank[g.flat[t].rank][base]++);
    }
    auto [it, inserted] = g.collective_node.emplace(std::move(key), g.nodes.size());
    if (inserted) {
      g.nodes.push_back({g.members.size(), 0, 0, 0});
      g.members.emplace_back();
      g.collective_keys.push_back(&it->first);
    }
    g.node_of[t] = it->second;
    g.members[g.nodes[it->second].tasks].push_back(t);
  }
  return g;
}

void set_durations(Graph& g, const ClusterSpec& cluster, const ReplayOptions& options,
                   const std::vector<bool>& present) {
  for (const std::string* key : g.collective_keys)
    validate_collective(*key, g.tasks_of(g.nodes[g.collective_node.at(*key)]), g.flat,
                        options.absent_ranks_are_images ? &present : nullptr);
  for (Node& node : g.nodes) {
    const std::vector<size_t>& tasks = g.tasks_of(node);
    const Task& first = *g.flat[tasks.front()].task;
    double given = -1;
    for (size_t t : tasks)
      given = std::max(given, g.flat[t].task->duration_s);
    if (given >= 0)
      node.duration_s = given;
    else if (first.kind == TaskKind::Compute)
      node.duration_s = roofline(first.work, cluster.gpu, options.efficiency).time_s;
    else if (first.op == CollectiveOp::AllToAll)
      node.duration_s = all_to_all_duration(tasks, g.flat, cluster);
    else
      node.duration_s = collective_cost(first.op, first.bytes, group_shape(first.group, cluster),
                                        cluster, options.algorithm)
                            .time_s;
  }
}

void add_edges(Graph& g, const Program& program, int num_ranks) {
  // Edges: stream order, then explicit dependencies, each task's own (a collective's node has
  // its instances' together), so an instance's ready time (before waiting for peers) can be
  // reported. Tasks are visited in flat order, so each one's list follows the previous one's.
  g.pred_nodes.reserve(g.flat.size() * 2);
  g.pred_begin.reserve(g.flat.size() + 1);
  for (int r = 0; r < num_ranks; ++r) {
    // Previous task on the compute / comm / send stream. Sends have a stream of their own:
    // a pipeline stage's send is asynchronous (buffered here, batched with the opposite
    // receive by Megatron), so a receive queued after it must not wait for its peer to
    // reach the matching receive, or 1F1B's steady state would deadlock.
    size_t last[4] = {SIZE_MAX, SIZE_MAX, SIZE_MAX, SIZE_MAX};
    for (const Task& task : program.ranks[static_cast<size_t>(r)]) {
      const size_t t = g.pred_begin.size() - 1; // its flat index (build_graph's order)
      const int stream = task.kind == TaskKind::Compute ? 0
                         : is_send(task, r)             ? 2
                         : task.stream == 1             ? 3
                                                        : 1;
      size_t& prev = last[stream];
      if (prev != SIZE_MAX)
        g.pred_nodes.push_back(g.node_of[prev]);
      prev = t;
      for (const std::string& dep : task.deps) {
        const auto found = g.index_of.find(dep);
        if (found == g.index_of.end())
          throw std::invalid_argument("replay: task \"" + task.id +
                                      "\" depends on unknown task \"" + dep + "\"");
        g.pred_nodes.push_back(g.node_of[found->second]);
      }
      g.pred_begin.push_back(g.pred_nodes.size());
    }
  }
}

// Every node's start and end: the latest end of its predecessors, in topological order.
void schedule_nodes(Graph& g) {
  // Kahn's algorithm over the nodes; start = latest predecessor end. Successors kept flat:
  // node n's are succ_nodes[succ_begin[n] .. succ_begin[n + 1]).
  const size_t n_nodes = g.nodes.size();
  std::vector<size_t> waiting(n_nodes, 0), succ_begin(n_nodes + 1, 0);
  for (size_t n = 0; n < n_nodes; ++n)
    g.for_each_pred(g.nodes[n], [&](size_t p) {
      ++succ_begin[p + 1];
      ++waiting[n];
    });
  for (size_t n = 0; n < n_nodes; ++n)
    succ_begin[n + 1] += succ_begin[n];
  std::vector<size_t> succ_nodes(succ_begin.back());
  std::vector<size_t> filled(succ_begin.begin(), succ_begin.end() - 1);
  for (size_t n = 0; n < n_nodes; ++n)
    g.for_each_pred(g.nodes[n], [&](size_t p) { succ_nodes[filled[p]++] = n; });
  std::vector<size_t> ready;
  for (size_t n = 0; n < n_nodes; ++n)
    if (waiting[n] == 0)
      ready.push_back(n);
  size_t done = 0;
  while (!ready.empty()) {
    const size_t n = ready.back();
    ready.pop_back();
    ++done;
    Node& node = g.nodes[n];
    g.for_each_pred(node,
                    [&](size_t p) { node.start_s = std::max(node.start_s, g.nodes[p].end_s); });
    node.end_s = node.start_s + node.duration_s;
    for (size_t i = succ_begin[n]; i < succ_begin[n + 1]; ++i)
      if (--waiting[succ_nodes[i]] == 0)
        ready.push_back(succ_nodes[i]);
  }
  if (done != n_nodes) {
    std::string stuck;
    size_t named = 0, count = 0;
    for (size_t t = 0; t < g.flat.size(); ++t)
      if (waiting[g.node_of[t]] > 0) {
        ++count;
        if (named++ < kMaxNamedInErrors)
          stuck += (stuck.empty() ? "" : ", ") + g.flat[t].task->id;
      }
    throw std::runtime_error("replay: deadlock: " + std::to_string(count) +
                             " tasks can never start (dependency cycle, or ranks issue "
                             "collectives in different orders): " +
                             stuck + (count > kMaxNamedInErrors ? ", ..." : ""));
  }
}

ReplayResult replay_result(const Graph& g, int num_ranks, const ReplayOptions& options,
                           const std::vector<bool>& present) {
  // Per-task timings and per-rank statistics.
  ReplayResult result;
  result.ranks.resize(static_cast<size_t>(num_ranks));
  std::vector<std::vector<std::pair<double, double>>> busy_compute(result.ranks.size());
  std::vector<std::vector<std::pair<double, double>>> busy_comm(result.ranks.size());
  result.tasks.reserve(g.flat.size());
  for (size_t t = 0; t < g.flat.size(); ++t) {
    const Node& node = g.nodes[g.node_of[t]];
    TaskTiming timing;
    timing.id = g.flat[t].task->id;
    timing.rank = g.flat[t].rank;
    timing.kind = g.flat[t].task->kind;
    g.for_each_pred_of_task(
        t, [&](size_t p) { timing.ready_s = std::max(timing.ready_s, g.nodes[p].end_s); });
    timing.start_s = node.start_s;
    timing.end_s = node.end_s;
    result.makespan_s = std::max(result.makespan_s, timing.end_s);
    auto& busy = (timing.kind == TaskKind::Compute ? busy_compute : busy_comm)[timing.rank];
    // A send is the sender's side of its receiver's transfer, which the receiver counts.
    if (!is_send(*g.flat[t].task, timing.rank)) busy.emplace_back(timing.start_s, timing.end_s);
    result.tasks.push_back(timing);
  }
  double idle_total = 0;
  int counted = 0;
  for (size_t r = 0; r < result.ranks.size(); ++r) {
    RankStats& stats = result.ranks[r];
    if (options.absent_ranks_are_images && !present[r])
      continue;
    ++counted;
    for (const auto& [start, end] : busy_compute[r])
      stats.compute_busy_s += end - start;
    // The two comm streams' intervals, sorted and merged into disjoint ones.
    auto& comm = busy_comm[r];
    std::sort(comm.begin(), comm.end());
    std::vector<std::pair<double, double>> merged;
    for (const auto& interval : comm)
      if (!merged.empty() && interval.first <= merged.back().second)
        merged.back().second = std::max(merged.back().second, interval.second);
      else
        merged.push_back(interval);
    comm = std::move(merged);
    for (const auto& [start, end] : busy_comm[r])
      stats.comm_busy_s += end - start;
    // Each stream is in order, so its intervals are already sorted and disjoint.
    stats.exposed_comm_s = stats.comm_busy_s - overlap(busy_comm[r], busy_compute[r]);
    stats.compute_idle_s = result.makespan_s - stats.compute_busy_s;
    idle_total += stats.compute_idle_s;
  }
  if (result.makespan_s > 0 && counted > 0)
    result.bubble_fraction = idle_total / (counted * result.makespan_s);
  return result;
}

} // namespace

ReplayResult replay(const Program& program, const ClusterSpec& cluster,
                    const ReplayOptions& options) {
  const int num_ranks = static_cast<int>(program.ranks.size());
  if (num_ranks > cluster.world_size())
    throw std::invalid_argument("replay: program has " + std::to_string(num_ranks) +
                                " ranks but cluster " + cluster.to_string() + " has " +
                                std::to_string(cluster.world_size()) + " GPUs");
  Graph g = build_graph(program, num_ranks);
  std::vector<bool> present(static_cast<size_t>(num_ranks));
  for (int r = 0; r < num_ranks; ++r)
    present[static_cast<size_t>(r)] = !program.ranks[static_cast<size_t>(r)].empty();
  set_durations(g, cluster, options, present);
  add_edges(g, program, num_ranks);
  schedule_nodes(g);
  return replay_result(g, num_ranks, options, present);
}

} // namespace meshsim
