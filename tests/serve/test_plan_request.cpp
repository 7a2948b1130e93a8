// /api/plan's bodies (serve/plan_request.h): each field to its flag, and every refusal a 400
// with one line.
#include <gtest/gtest.h>

#include "serve/plan_request.h"

using namespace meshsim;

namespace {

std::string refusal(const std::string& body) {
  try {
    parse_plan_request(body);
  } catch (const RequestError& e) {
    EXPECT_EQ(e.status(), 400) << body;
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "taken: " << body;
  return "";
}

} // namespace

TEST(PlanRequest, EachFieldBecomesItsFlag) {
  const PlanRequest r = parse_plan_request(R"({"preset": "llama3-8b", "cluster": "2x8xh100",
      "inter": "4xndr", "precision": "bf16", "global_batch_size": 64, "seq_len": 4096,
      "layout": {"tp": 2, "pp": 2, "zero": 1, "micro_batch_size": 1, "micro_batches": 8,
                 "recompute": "selective", "sequence_parallel": true, "virtual_stages": 2,
                 "attention": "eager", "elementwise": "eager", "cp": 1, "ep": 1, "cp_comm": "ring",
                 "moe_dispatch": "alltoall", "tp_comm_overlap": false, "loss_upcast": false}})");
  EXPECT_FALSE(r.search);
  EXPECT_TRUE(r.hf_config.is_null());
  EXPECT_EQ(r.command_line(),
            "meshsim plan --preset llama3-8b --cluster 2x8xh100 --inter 4xndr --precision bf16 "
            "--global-batch-size 64 --seq-len 4096 --tp 2 --pp 2 --cp 1 --cp-comm ring --ep 1 "
            "--moe-dispatch alltoall --zero 1 --virtual-stages 2 --micro-batches 8 "
            "--micro-batch-size 1 --recompute selective --attention eager --elementwise eager "
            "--sequence-parallel --no-loss-upcast");
}

TEST(PlanRequest, ASearchAndAConfigJson) {
  const PlanRequest r = parse_plan_request(
      R"({"hf_config": {"model_type": "mixtral", "hidden_size": 4096}, "cluster": "8xh100",
          "search": true, "top": 3, "global_batch_size": 32})");
  EXPECT_TRUE(r.search);
  EXPECT_EQ(r.hf_config["model_type"], "mixtral");
  EXPECT_EQ(r.command_line(), "meshsim plan --hf-config config.json --cluster 8xh100 "
                              "--global-batch-size 32 --search --top 3");
}

TEST(PlanRequest, RefusesWhatIsNotAPlanInOneLine) {
  EXPECT_NE(refusal("{\"preset\": "), "");
  EXPECT_NE(refusal("[1, 2]").find("must be a JSON object"), std::string::npos);
  EXPECT_NE(refusal(R"({"cluster": "8xh100"})").find("give a model"), std::string::npos);
  EXPECT_NE(refusal(R"({"preset": "llama3-8b"})").find("give a 'cluster'"), std::string::npos);
  EXPECT_NE(refusal(R"({"preset": "llama9", "cluster": "8xh100"})").find("unknown preset 'llama9'"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"preset": "gpt2", "hf_config": {}, "cluster": "8xh100"})").find("not both"),
            std::string::npos);
  EXPECT_NE(
      refusal(R"({"preset": "gpt2", "cluster": "8xh100 --out /etc"})").find("letters, digits"),
      std::string::npos);
  EXPECT_NE(refusal(R"({"preset": "gpt2", "cluster": "8xh100", "layout": {"tp": 0}})")
                .find("'layout.tp' must be 1 to"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"preset": "gpt2", "cluster": "8xh100", "layout": {"tp": 1.5}})")
                .find("not a fraction"),
            std::string::npos);
  EXPECT_NE(
      refusal(R"({"preset": "gpt2", "cluster": "8xh100", "layout": {"tp": 18446744073709551615}})")
          .find("must be 1 to"),
      std::string::npos);
  EXPECT_NE(
      refusal(R"({"preset": "gpt2", "cluster": "8xh100", "layout": {"zero": 4}})").find("0 to 3"),
      std::string::npos);
  EXPECT_NE(refusal(R"({"preset": "gpt2", "cluster": "8xh100", "layout": {"recompute": "some"}})")
                .find("one of none, selective, op, full"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"preset": "gpt2", "cluster": "8xh100", "layout": {"dp": 2}})")
                .find("unknown field 'layout.dp'"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"preset": "gpt2", "cluster": "8xh100", "out": "/tmp"})")
                .find("unknown field 'out'"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"preset": "gpt2", "cluster": "8xh100", "top": 3})").find("search"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"preset": "gpt2", "cluster": "8xh100", "precision": "int4"})")
                .find("one of fp32, bf16, fp16, fp8"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"preset": "gpt2", "clust\r": "8xh100"})").find("unknown field 'clust\\x0d'"),
            std::string::npos);
  EXPECT_NE(refusal(std::string(100, '[') + std::string(100, ']')).find("nests"),
            std::string::npos);
}
