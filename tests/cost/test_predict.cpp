// build_step_program and predict on hand-built records whose replay is known exactly: DDP
// buckets overlapping backward, a tensor-parallel all-reduce splitting a region, pipeline
// send/recv, the step window, and the records' JSON round trip.
#include <gtest/gtest.h>

#include "base/errors.h"
#include "cost/predict.h"

namespace meshsim {
namespace {

constexpr double kMs = 1e-3;

ComputeRecord region(const std::string& name, int64_t step, double start_ms, double end_ms,
                     std::vector<LayerWork> layers = {}) {
  ComputeRecord c;
  c.name = name;
  c.step = step;
  c.start_s = start_ms * kMs;
  c.end_s = end_ms * kMs;
  c.layers = std::move(layers);
  return c;
}

CollectiveRecord coll(const std::string& op, std::vector<int> group, int64_t bytes, int64_t seq,
                      double start_ms, double end_ms, int peer = -1) {
  return {op, std::move(group), bytes, seq, peer, start_ms * kMs, end_ms * kMs};
}

double all_reduce_s(double bytes, const ClusterSpec& cluster, int n) {
  return collective_cost(CollectiveOp::AllReduce, bytes, GroupShape::within_node(n), cluster)
      .time_s;
}

// One DDP step per rank as the recorder sees it: forward 1 ms, backward 4 ms over four
// layers (last first) holding 1e8, 0.5e8, 0.5e8, 1e8 parameter bytes, three buckets of 1e8
// bytes recorded after backward, optimizer 1 ms, the loss all-reduce, and step 2's forward.
std::vector<Recorder> ddp_records(int world) {
  std::vector<int> group;
  for (int r = 0; r < world; ++r)
    group.push_back(r);
  std::vector<LayerWork> layers;
  for (int64_t bytes : {100000000, 50000000, 50000000, 100000000})
    layers.push_back({"fc", "matmul", 1e9, 1e6, bytes});
  std::vector<Recorder> ranks(world);
  for (Recorder& r : ranks) {
    r.collectives.push_back(coll("broadcast", group, 4, 0, -2, -1)); // setup: not in a step
    r.compute.push_back(region("forward", 1, 0, 1));
    r.compute.push_back(region("backward", 1, 1, 5, layers));
    r.collectives.push_back(coll("all_reduce", group, 100000000, 1, 5, 6));
    r.collectives.push_back(coll("all_reduce", group, 100000000, 2, 6, 7));
    r.collectives.push_back(coll("all_reduce", group, 100000000, 3, 7, 8));
    r.compute.push_back(region("optimizer", 1, 8, 9));
    r.collectives.push_back(coll("all_reduce", group, 16, 4, 9, 9.5));
    r.compute.push_back(region("forward", 2, 10, 11));
    r.collectives.push_back(coll("all_reduce", group, 100000000, 5, 12, 13));
  }
  return ranks;
}

TEST(CostPredict, DdpExposesOnlyTheLastBucket) {
  const ClusterSpec cluster = parse_cluster_spec("2xa100-80");
  PredictOptions options;
  options.measured_compute = true;
  options.step = 1;
  const Prediction p = predict(ddp_records(2), 64, cluster, options);
  const double bucket = all_reduce_s(1e8, cluster, 2);
  const double loss = all_reduce_s(16, cluster, 2);
  ASSERT_LT(bucket, 1 * kMs); // so buckets 1 and 2 hide behind backward
  // Buckets become ready at 1/4, 3/4 and all of backward (2, 4, 5 ms).
  const auto& tasks = p.replay.tasks;
  std::vector<double> starts;
  for (const TaskTiming& t : tasks)
    if (t.rank == 0 && t.kind == TaskKind::Comm)
      starts.push_back(t.start_s);
  ASSERT_EQ(starts.size(), 4u); // three buckets and the loss: not the broadcast, not step 2
  EXPECT_NEAR(starts[0], 2 * kMs, 1e-12);
  EXPECT_NEAR(starts[1], 4 * kMs, 1e-12);
  EXPECT_NEAR(starts[2], 5 * kMs, 1e-12);
  EXPECT_NEAR(p.exposed_comm_s, bucket + loss, 1e-12);
  // Buckets 1 and 2 hide behind backward, and slow it by the overlap factor.
  EXPECT_NEAR(p.overlap_penalty_s, Efficiency{}.overlap_slowdown * 2 * bucket, 1e-12);
  EXPECT_NEAR(p.step_time_s, 6 * kMs + bucket + loss + p.overlap_penalty_s, 1e-12);
  EXPECT_NEAR(p.samples_per_s, 64 / p.step_time_s, 1e-9);

  options.overlap_buckets = false; // every bucket waits for the whole backward
  const Prediction serial = predict(ddp_records(2), 64, cluster, options);
  EXPECT_NEAR(serial.exposed_comm_s, 3 * bucket + loss, 1e-12);
}

// 16-bit gradients reduced in fp32 (ZeRO 1's --reduce-fp32): each bucket carries twice its
// layers' parameter bytes, and still starts when its last layer's gradient is ready. An fp32
// run's parameters are as wide as its gradients: there, twice the bytes is no bucket.
TEST(CostPredict, BucketsOfSixteenBitGradientsReducedInFp32OverlapBackward) {
  const ClusterSpec cluster = parse_cluster_spec("2xa100-80");
  std::vector<Recorder> ranks = ddp_records(2);
  for (Recorder& r : ranks)
    for (CollectiveRecord& c : r.collectives)
      if (c.bytes == 100000000)
        c.bytes = 200000000;
  const auto bucket_starts = [&](Dtype dtype) {
    PredictOptions options;
    options.measured_compute = true;
    options.step = 1;
    options.dtype = dtype;
    const Prediction p = predict(ranks, 64, cluster, options);
    std::vector<double> starts;
    for (const TaskTiming& t : p.replay.tasks)
      if (t.rank == 0 && t.kind == TaskKind::Comm)
        starts.push_back(t.start_s);
    return starts;
  };
  const std::vector<double> bf16 = bucket_starts(Dtype::BF16);
  ASSERT_EQ(bf16.size(), 4u); // three buckets and the loss
  EXPECT_NEAR(bf16[0], 2 * kMs, 1e-12);
  EXPECT_NEAR(bf16[1], 4 * kMs, 1e-12);
  EXPECT_NEAR(bf16[2], 5 * kMs, 1e-12);
  const std::vector<double> fp32 = bucket_starts(Dtype::FP32);
  ASSERT_EQ(fp32.size(), 4u);
  EXPECT_NEAR(fp32[0], 5 * kMs, 1e-12); // after the whole backward, one after another
  EXPECT_GT(fp32[1], 5 * kMs);
}

TEST(CostPredict, RooflineComputeAndMfu) {
  const ClusterSpec cluster = parse_cluster_spec("1xa100-80");
  PredictOptions options;
  options.step = 1;
  std::vector<Recorder> ranks = ddp_records(1);
  for (ComputeRecord& c : ranks[0].compute)
    c.flops = 0;
  ranks[0].compute[1].flops = 4e9; // backward: four layers of 1e9 FLOPs
  const Prediction p = predict(ranks, 64, cluster, options);
  const double layer = roofline({1e9, 1e6, OpClass::Matmul, Dtype::FP32}, cluster.gpu).time_s;
  // forward and optimizer have no counted layers: they keep their measured 1 ms each.
  EXPECT_NEAR(p.step_time_s, 2 * kMs + 4 * layer, 1e-12);
  EXPECT_NEAR(p.tflops_per_gpu, 4e9 / p.step_time_s / 1e12, 1e-9);
  EXPECT_NEAR(p.mfu, p.tflops_per_gpu * 1e12 / cluster.gpu.fp32_flops, 1e-12);
}

TEST(CostPredict, CollectiveInsideARegionSplitsIt) {
  // Tensor parallel: each rank's forward blocks on an all-reduce in the middle.
  std::vector<Recorder> ranks(2);
  ranks[0].compute.push_back(region("forward", 1, 0, 4));
  ranks[0].collectives.push_back(coll("all_reduce", {0, 1}, 1000000, 0, 1, 3));
  ranks[1].compute.push_back(region("forward", 1, 0, 4));
  ranks[1].collectives.push_back(coll("all_reduce", {0, 1}, 1000000, 0, 2, 3));
  const ClusterSpec cluster = parse_cluster_spec("2xa100-80");
  PredictOptions options;
  options.measured_compute = true;
  const Prediction p = predict(ranks, 8, cluster, options);
  const double ar = all_reduce_s(1e6, cluster, 2);
  // Rank 0: 1 ms + 1 ms around it; rank 1: 2 ms + 1 ms. The all-reduce waits for rank 1.
  ASSERT_EQ(p.program.ranks[0].size(), 3u);
  const TaskTiming& second = p.replay.task(p.program.ranks[0][2].id);
  EXPECT_NEAR(second.start_s, 2 * kMs + ar, 1e-12);
  EXPECT_NEAR(second.end_s, 3 * kMs + ar, 1e-12);
  EXPECT_NEAR(p.step_time_s, 3 * kMs + ar, 1e-12);
}

// Overlapped tensor parallelism (--tp-comm-overlap): the collective runs beside the piece of
// compute after it, and only the piece after that waits for it.
TEST(CostPredict, AnOverlappedTensorParallelCollectiveRunsBesideTheNextPiece) {
  std::vector<Recorder> ranks(2);
  for (int r = 0; r < 2; ++r) {
    ranks[r].compute.push_back(region("forward", 1, 0, 6));
    ranks[r].collectives.push_back(coll("all_gather", {0, 1}, 4000000, 0, 1, 1));
    ranks[r].collectives.push_back(coll("all_gather", {0, 1}, 4000000, 1, 3, 3));
  }
  const ClusterSpec cluster = parse_cluster_spec("2xa100-80");
  PredictOptions options;
  options.measured_compute = true;
  const double ag = collective_cost(CollectiveOp::AllGather, 8e6, GroupShape::within_node(2),
                                    cluster).time_s;
  const Prediction blocking = predict(ranks, 8, cluster, options);
  // Pieces of 1, 2 and 3 ms: blocking, each all-gather sits on the critical path.
  EXPECT_NEAR(blocking.step_time_s, 6 * kMs + 2 * ag, 1e-12);
  options.overlap_tensor_parallel = true;
  options.tp = 2;
  const Prediction overlapped = predict(ranks, 8, cluster, options);
  // The first all-gather runs beside the 2 ms piece, the second beside the 3 ms one: hidden,
  // the compute beside them slowed by overlap_slowdown for as long as they run.
  ASSERT_LT(ag, 2 * kMs);
  EXPECT_NEAR(overlapped.step_time_s, 6 * kMs + Efficiency().overlap_slowdown * 2 * ag, 1e-12);
  // A group of another size (not tensor parallelism's) still blocks.
  options.tp = 4;
  EXPECT_NEAR(predict(ranks, 8, cluster, options).step_time_s, 6 * kMs + 2 * ag, 1e-12);
}

// Gradient buckets after a backward that tensor parallelism's collectives split: they start as
// their gradients are ready, on a stream of their own, beside the backward's collectives.
TEST(CostPredict, BucketsAfterASplitBackwardOverlapIt) {
  std::vector<Recorder> ranks(4); // tp 2 (0,1 and 2,3) × dp 2 (0,2 and 1,3)
  for (int r = 0; r < 4; ++r) {
    const std::vector<int> tp = r < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3};
    const std::vector<int> dp = r % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3};
    ranks[r].compute.push_back(region("backward", 1, 0, 4,
                                      {{"b1", "matmul", 1e12, 1e6, 50000000},
                                       {"b0", "matmul", 1e12, 1e6, 50000000}}));
    ranks[r].collectives.push_back(coll("all_reduce", tp, 1000000, 0, 1, 1));
    ranks[r].collectives.push_back(coll("all_reduce", tp, 1000000, 1, 3, 3));
    ranks[r].collectives.push_back(coll("all_reduce", dp, 50000000, 0, 4, 5));
    ranks[r].collectives.push_back(coll("all_reduce", dp, 50000000, 1, 5, 6));
  }
  const ClusterSpec cluster = parse_cluster_spec("4xa100-80");
  PredictOptions options;
  const Prediction p = predict(ranks, 8, cluster, options);
  // The first bucket (b1's gradients, half the parameters) starts before backward has ended.
  const auto& tasks = p.program.ranks[0];
  const auto bucket = std::find_if(tasks.begin(), tasks.end(), [](const Task& t) {
    return t.kind == TaskKind::Comm && t.stream == 1;
  });
  ASSERT_NE(bucket, tasks.end());
  double backward_end = 0;
  for (const Task& t : tasks)
    if (t.kind == TaskKind::Compute)
      backward_end = std::max(backward_end, p.replay.task(t.id).end_s);
  EXPECT_LT(p.replay.task(bucket->id).start_s, backward_end);
  options.overlap_buckets = false; // --no-overlap: both after backward
  const Prediction q = predict(ranks, 8, cluster, options);
  EXPECT_GT(q.step_time_s, p.step_time_s);
}

// With counted layers the pieces take the region's predicted time in proportion to the memory
// charges the rank made in each (a count of its operations, the same every run), whatever the
// clock measured: here the all-reduce came after a quarter of the charges and, by the clock,
// near the end.
TEST(CostPredict, ACountedRegionSplitsAtItsCollectivesByItsCharges) {
  std::vector<Recorder> ranks(2);
  for (Recorder& r : ranks) {
    ComputeRecord forward = region("forward", 1, 0, 4, {{"block", "matmul", 4e12, 1e6, 0}});
    forward.start_charges = 1000;
    forward.end_charges = 1100;
    r.compute.push_back(forward);
    CollectiveRecord ar = coll("all_reduce", {0, 1}, 1000000, 0, 3.9, 3.95);
    ar.start_charges = ar.end_charges = 1025;
    r.collectives.push_back(ar);
  }
  const ClusterSpec cluster = parse_cluster_spec("2xa100-80");
  const Prediction p = predict(ranks, 8, cluster);
  ASSERT_EQ(p.program.ranks[0].size(), 3u);
  const TaskTiming& first = p.replay.task(p.program.ranks[0][0].id);
  const TaskTiming& second = p.replay.task(p.program.ranks[0][2].id);
  const double whole = (first.end_s - first.start_s) + (second.end_s - second.start_s);
  EXPECT_GT(whole, 0);
  EXPECT_NEAR((first.end_s - first.start_s) / whole, 0.25, 1e-12);
  // Records without the counts (older records.json) are split by the clock.
  for (Recorder& r : ranks)
    r.compute[0].start_charges = -1;
  const Prediction q = predict(ranks, 8, cluster);
  const TaskTiming& timed = q.replay.task(q.program.ranks[0][0].id);
  EXPECT_NEAR((timed.end_s - timed.start_s) / whole, 3.9 / 3.95, 1e-9);
}

TEST(CostPredict, PipelineSendRecvAreDependencies) {
  std::vector<Recorder> ranks(2);
  // Stage 0: forward, send activations, receive their gradient, backward.
  ranks[0].compute.push_back(region("forward", 1, 0, 1));
  ranks[0].collectives.push_back(coll("send", {0, 1}, 1000000, 0, 1, 1.01, 1));
  ranks[0].collectives.push_back(coll("recv", {1, 0}, 1000000, 0, 1.01, 3, 1));
  ranks[0].compute.push_back(region("backward", 1, 3, 5));
  // Stage 1: receive (it started waiting before its own step began), forward, backward, send.
  ranks[1].collectives.push_back(coll("recv", {0, 1}, 1000000, 0, 0, 1.01, 0));
  ranks[1].compute.push_back(region("forward", 1, 1.01, 2));
  ranks[1].compute.push_back(region("backward", 1, 2, 2.9));
  ranks[1].collectives.push_back(coll("send", {1, 0}, 1000000, 0, 2.9, 3, 0));
  const ClusterSpec cluster = parse_cluster_spec("2xa100-80");
  PredictOptions options;
  options.measured_compute = true;
  const Prediction p = predict(ranks, 8, cluster, options);
  const double hop =
      collective_cost(CollectiveOp::SendRecv, 1e6, GroupShape::within_node(2), cluster).time_s;
  const auto& stage1 = p.program.ranks[1];
  const TaskTiming& fwd1 = p.replay.task(stage1[1].id);
  EXPECT_NEAR(fwd1.start_s, 1 * kMs + hop, 1e-12);
  const TaskTiming& bwd0 = p.replay.task(p.program.ranks[0][3].id);
  // stage 1: forward 0.99 ms + backward 0.9 ms, then the gradient travels back.
  EXPECT_NEAR(bwd0.start_s, 1 * kMs + hop + 1.89 * kMs + hop, 1e-12);
  EXPECT_NEAR(p.step_time_s, bwd0.start_s + 2 * kMs, 1e-12);
}

// Context parallelism's ring on two ranks: each sends its K/V block to the other and receives
// the other's with isend/irecv, started at 1 ms and waited for at 3 ms, with the attention of
// the block in hand (2 ms) in between. The exchange runs beside that compute: what follows
// the wait starts at 1 ms + max(2 ms, the transfer), so a short transfer is hidden whole and a
// long one exposed by what it exceeds the compute by.
TEST(CostPredict, ARingExchangeHidesUnderTheComputeBeforeItsWait) {
  const ClusterSpec cluster = parse_cluster_spec("2xa100-80");
  for (const double bytes : {1e6, 1e10}) {
    std::vector<Recorder> ranks(2);
    for (int r = 0; r < 2; ++r) {
      const int peer = 1 - r;
      ranks[r].compute.push_back(region("embed", 1, 0, 1));
      ranks[r].compute.push_back(region("forward", 1, 1, 4));
      CollectiveRecord send = coll("send", {r, peer}, static_cast<int64_t>(bytes), 0, 1, 1.01, peer);
      CollectiveRecord recv = coll("recv", {peer, r}, static_cast<int64_t>(bytes), 0, 1, 1.01, peer);
      send.waited_s = recv.waited_s = 3 * kMs;
      ranks[r].collectives.push_back(send);
      ranks[r].collectives.push_back(recv);
    }
    PredictOptions options;
    options.measured_compute = true;
    const Prediction p = predict(ranks, 8, cluster, options);
    const double hop =
        collective_cost(CollectiveOp::SendRecv, bytes, GroupShape::within_node(2), cluster).time_s;
    // embed, the forward up to the wait, send, a piece of no time, recv, the forward after.
    ASSERT_EQ(p.program.ranks[0].size(), 6u) << bytes;
    const TaskTiming& after_wait = p.replay.task(p.program.ranks[0][5].id);
    EXPECT_NEAR(after_wait.start_s, 1 * kMs + std::max(2 * kMs, hop), 1e-12) << bytes;
    if (bytes < 1e7)
      EXPECT_LT(hop, 2 * kMs) << "the small message must fit under the compute";
    else
      EXPECT_GT(hop, 2 * kMs) << "the large message must outlast the compute";
  }
}

// The distributed optimizer's and ZeRO 3's gathers and ZeRO 2's and 3's reduce-scatters
// (zero.h): a collective started at 1.5 ms inside the forward (the block before's) and waited
// for at 4 ms (this block's start) runs on the data-parallel stream beside the 2.5 ms of
// compute between, so what follows its wait starts at 1.5 ms + max(2.5 ms, the collective); a
// second one, started at 0.5 ms inside the embedding before anything else ended, waits for
// nothing and hides under both regions.
TEST(CostPredict, ACollectiveStartedAheadHidesUnderTheComputeBeforeItsWait) {
  const ClusterSpec cluster = parse_cluster_spec("2xa100-80");
  for (const char* op : {"all_gather", "reduce_scatter"})
    for (const double bytes : {1e6, 1e10}) {
      std::vector<Recorder> ranks(2);
      for (int r = 0; r < 2; ++r) {
        ranks[r].compute.push_back(region("embed", 1, 0, 1));
        ranks[r].compute.push_back(region("forward", 1, 1, 6));
        CollectiveRecord early = coll(op, {0, 1}, 1000, 0, 0.5, 0.51);
        early.waited_s = 1.5 * kMs;
        CollectiveRecord ahead = coll(op, {0, 1}, static_cast<int64_t>(bytes), 1, 1.5, 1.51);
        ahead.waited_s = 4 * kMs;
        ranks[r].collectives.push_back(early);
        ranks[r].collectives.push_back(ahead);
      }
      PredictOptions options;
      options.measured_compute = true;
      const Prediction p = predict(ranks, 8, cluster, options);
      // What the replay costs it at: an all-gather by its output (twice its input here).
      const auto time = [&](double b) {
        return std::string(op) == "all_gather"
                   ? collective_cost(CollectiveOp::AllGather, 2 * b, GroupShape::within_node(2),
                                     cluster)
                         .time_s
                   : collective_cost(CollectiveOp::ReduceScatter, b, GroupShape::within_node(2),
                                     cluster)
                         .time_s;
      };
      // embed, the forward up to the first wait, the collective, the forward to the second
      // wait, the collective, the forward after.
      const auto& tasks = p.program.ranks[0];
      ASSERT_EQ(tasks.size(), 6u) << op << " " << bytes;
      EXPECT_EQ(tasks[2].stream, 1) << op;
      EXPECT_TRUE(tasks[2].deps.empty()) << op << ": started before any task of the step ended";
      EXPECT_NEAR(p.replay.task(tasks[2].id).start_s, 0, 1e-12) << op;
      ASSERT_LT(time(1000), 1.5 * kMs) << op;
      const TaskTiming& after_wait = p.replay.task(tasks[5].id);
      EXPECT_NEAR(after_wait.start_s, 1.5 * kMs + std::max(2.5 * kMs, time(bytes)), 1e-12)
          << op << " " << bytes;
      if (bytes < 1e7)
        EXPECT_LT(time(bytes), 2.5 * kMs) << op << ": the small one must fit under the compute";
      else
        EXPECT_GT(time(bytes), 2.5 * kMs) << op << ": the large one must outlast the compute";
    }
}

TEST(CostPredict, RecordsRoundTripThroughJson) {
  std::vector<Recorder> ranks = ddp_records(2);
  ranks[0].compute[0].flops = 123.456789e9;
  ranks[1].compute[1].op = "matmul";
  ranks[0].compute[1].start_charges = 7;
  ranks[0].compute[1].end_charges = 9;
  ranks[0].collectives[1].start_charges = ranks[0].collectives[1].end_charges = 9;
  int64_t samples = 0;
  const auto back =
      records_from_json(nlohmann::json::parse(records_to_json(ranks, 64).dump()), &samples);
  EXPECT_EQ(samples, 64);
  EXPECT_EQ(back[0].compute[1].start_charges, 7);
  EXPECT_EQ(back[0].compute[1].end_charges, 9);
  EXPECT_EQ(back[0].collectives[1].start_charges, 9);
  EXPECT_EQ(back[1].compute[1].start_charges, -1);
  const ClusterSpec cluster = parse_cluster_spec("2xh100");
  EXPECT_EQ(to_json(predict(ranks, 64, cluster)), to_json(predict(back, 64, cluster)));
  // Malformed records are damaged data (exit 3), not a bad flag.
  EXPECT_THROW(records_from_json(nlohmann::json{{"format", "x"}}, nullptr), DataError);
  EXPECT_THROW(records_from_json(nlohmann::json::object(), nullptr), DataError);
}

// json's get<int> casts a float such as 1e300 to int, which is undefined (UBSan's
// float-cast-overflow, which fuzz/fuzz_records runs under), and wraps integers too large.
TEST(CostPredict, RecordsWithOutOfRangeIntegersAreRefused) {
  const nlohmann::json good = records_to_json(ddp_records(2), 64);
  const auto refused = [](nlohmann::json doc) {
    try {
      int64_t samples = 0;
      records_from_json(doc, &samples);
    } catch (const DataError& e) {
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  nlohmann::json doc = good;
  doc["ranks"][0]["collectives"][0]["peer"] = 1e300;
  EXPECT_NE(refused(doc).find("\"peer\" is not an integer"), std::string::npos) << refused(doc);
  doc = good;
  doc["ranks"][0]["collectives"][0]["group"] = {0, 4294967296LL};
  EXPECT_NE(refused(doc).find("\"group\""), std::string::npos) << refused(doc);
  doc = good;
  doc["samples_per_step"] = 18446744073709551615ULL;
  EXPECT_NE(refused(doc).find("\"samples_per_step\""), std::string::npos) << refused(doc);
  doc = good;
  doc["ranks"][0]["compute"][0]["layers"] = {{"fc", "matmul", 1.0, 2.0, 1.5}};
  EXPECT_NE(refused(doc).find("\"layers\""), std::string::npos) << refused(doc);
}

TEST(CostPredict, StepsAndResizing) {
  EXPECT_EQ(representative_step(ddp_records(2)), 1);
  EXPECT_THROW(build_step_program(ddp_records(2), 7, gpu_preset("a100-80"), {}),
               std::invalid_argument);
  const auto eight = resize_data_parallel(ddp_records(2), 8);
  ASSERT_EQ(eight.size(), 8u);
  EXPECT_EQ(eight[5].collectives[1].group, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  std::vector<Recorder> pipeline(2);
  pipeline[0].collectives.push_back(coll("send", {0, 1}, 4, 0, 0, 1, 1));
  EXPECT_THROW(resize_data_parallel(pipeline, 4), std::invalid_argument);
}

} // namespace
} // namespace meshsim
