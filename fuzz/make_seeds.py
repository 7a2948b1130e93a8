#!/usr/bin/env python3
"""Writes the seed corpus in fuzz/corpus/<target>/: a few small valid inputs per parser and
near misses, so the fuzzer starts from the formats' real shapes. Rerun after a format change;
crash reproducers found later are added by hand (their names start with crash-)."""
import gzip
import json
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(target, name, data):
    os.makedirs(os.path.join(ROOT, target), exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(ROOT, target, name), "wb") as f:
        f.write(data)


def idx(dims, payload):
    return bytes([0, 0, 8, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + payload


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


labels = idx([5], bytes([0, 1, 2, 9, 3]))
image = idx([1, 28, 28], bytes((i * 7) % 256 for i in range(784)))
put("fuzz_idx", "labels", labels)
put("fuzz_idx", "image", image)
put("fuzz_idx", "labels.gz", gzip.compress(labels, mtime=0))
put("fuzz_idx", "image.gz", gzip.compress(image, mtime=0))
put("fuzz_idx", "truncated", image[:100])

text = b"It is not the critic who counts; not the man who points out how the strong man stumbles.\n"
put("fuzz_text", "seq4", bytes([12, 20]) + text)
put("fuzz_text", "seq16-no-test", bytes([24, 0]) + text)
put("fuzz_text", "huge-seq", bytes([0xFF, 40]) + struct.pack("<q", 2**62 + 3) + text)

for name, spec in [("multi-node", "4x8xh100\nnvlink4\nndr"), ("one-node", "8xa100-80"),
                   ("bare", "a100"), ("pcie", "2x4xl4\x00pcie4\x00100gbe")]:
    put("fuzz_cluster", name, spec)

for s in ["512MiB", "2GiB", "1.5GB", "4096", "0.5k"]:
    put("fuzz_size", s.replace(".", "_"), s)

records = {
    "format": "meshsim-records-1",
    "samples_per_step": 64,
    "ranks": [{
        "compute": [{"name": "forward", "step": 1, "start_s": 0.0, "end_s": 0.01,
                     "flops": 1e6, "bytes": 4096.0, "op": "forward",
                     "layers": [["conv1", "conv", 5e5, 2048.0, 1024]]}],
        "collectives": [{"op": "all_reduce", "group": [0, 1], "bytes": 1024, "seq": 0,
                         "peer": -1, "start_s": 0.01, "end_s": 0.02}],
    }, {"compute": [], "collectives": []}],
}
# fuzz_routing: the first byte is the plan's experts less one, then a routing.csv.
routing = "step,rank,layer,expert,routed,ran\n" + "".join(
    f"{step},{rank},1,{e},{n},{n if e // 2 == rank else ''}\n"
    for step in (1, 2) for rank in (0, 1) for e, n in enumerate((3, 1, 0, 4) if step == 1 else (5, 1, 1, 1)))
put("fuzz_routing", "two-ranks-8", bytes([7]) + routing.encode())
put("fuzz_routing", "two-ranks-3", bytes([2]) + routing.encode())
put("fuzz_routing", "header-only", bytes([3]) + b"step,rank,layer,expert,routed,ran\n")

put("fuzz_records", "two-ranks.json", json.dumps(records, indent=1))
put("fuzz_records", "empty.json", json.dumps({"format": "meshsim-records-1",
                                              "samples_per_step": 1, "ranks": []}))

config = {
    "gpus": 4, "strategy": "ddp", "model": "cnn", "data": "/usr/share/datasets/fashion-mnist",
    "device": "cpu", "epochs": 1, "max_steps": 0, "batch_size": 64, "global_batch_size": 256,
    "tp": 1, "pp": 1, "dp": 4, "zero": 0, "schedule": "1f1b", "micro_batches": 1,
    "recompute": "none", "preset": "",
    "gpt": {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 0, "ffn_hidden": 0,
            "seq_len": 64, "vocab": 256, "tie_head": False, "rope_theta": 10000.0},
    "seed": 0, "log_every": 10, "optimizer": "adam", "lr": 0.001, "momentum": 0.9,
    "gpu_mem": "auto", "bucket_mb": 25.0, "comm_timeout_s": 60.0, "checkpoint_every": 0,
    "keep_checkpoints": 0, "resume": "", "synthetic_train": 4096, "synthetic_test": 1024,
    "eval_limit": 0, "cluster": "", "intra": "", "inter": "",
}
put("fuzz_config", "default.json", json.dumps(config, indent=2))
gpt = dict(config, model="gpt", gpus=8, tp=2, pp=2, dp=2, zero=1, micro_batches=4,
           global_batch_size=128, data="synthetic", gpu_mem="512MiB", cluster="2x4xh100")
put("fuzz_config", "gpt-mesh.json", json.dumps(gpt, indent=2))
put("fuzz_config", "partial.json", json.dumps({"model": "gpt", "gpus": 2, "optimizer": "sgd"}))
preset = dict(config, model="gpt", preset="gpt2", data="synthetic", gpus=1, strategy="single",
              dp=1, global_batch_size=64,
              gpt={"layers": 1, "hidden": 32, "heads": 2, "kv_heads": 0, "ffn_hidden": 100,
                   "seq_len": 32, "vocab": 256, "tie_head": True, "rope_theta": 500000.0})
put("fuzz_config", "preset.json", json.dumps(preset, indent=2))

# fuzz_hf_config: the presets' published config.json files (src/models/hf_configs/), each model
# type once more in miniature (two layers, so the target builds it), and near misses.
HF_CONFIGS = os.path.join(os.path.dirname(ROOT), "..", "src", "models", "hf_configs")
for name in sorted(os.listdir(HF_CONFIGS)):
    with open(os.path.join(HF_CONFIGS, name), "rb") as f:
        put("fuzz_hf_config", name, f.read())
tiny = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 48, "vocab_size": 64,
        "max_position_embeddings": 32, "rms_norm_eps": 1e-06, "rope_theta": 10000.0}
put("fuzz_hf_config", "tiny-llama.json", json.dumps(dict(tiny, model_type="llama")))
put("fuzz_hf_config", "tiny-qwen2.json", json.dumps(dict(tiny, model_type="qwen2")))
put("fuzz_hf_config", "tiny-qwen3.json", json.dumps(dict(tiny, model_type="qwen3", head_dim=16)))
put("fuzz_hf_config", "tiny-mixtral.json", json.dumps(dict(
    tiny, model_type="mixtral", num_local_experts=4, num_experts_per_tok=2)))
put("fuzz_hf_config", "tiny-qwen3-moe.json", json.dumps(dict(
    tiny, model_type="qwen3_moe", head_dim=8, num_experts=4, num_experts_per_tok=2,
    moe_intermediate_size=16, norm_topk_prob=False, mlp_only_layers=[0])))
put("fuzz_hf_config", "tiny-rope-parameters.json", json.dumps(dict(
    {k: v for k, v in tiny.items() if k != "rope_theta"}, model_type="llama",
    rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                     "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 16})))
put("fuzz_hf_config", "deepseek.json", json.dumps(dict(tiny, model_type="deepseek_v3")))
put("fuzz_hf_config", "sliding.json", json.dumps(dict(tiny, model_type="mistral")))

part = b"\x50\x4b\x03\x04 a part's bytes"
manifest = {"format": "meshsim checkpoint 1", "step": 42, "world_size": 2, "kind": "per-rank",
            "model": "gpt layers=2", "optimizer": "adam", "layout": "dp2",
            "parts": [{"file": "rank-0.pt", "rank": 0, "bytes": len(part), "crc32c": crc32c(part)},
                      {"file": "rank-1.pt", "rank": 1, "bytes": 3, "crc32c": 0}]}
put("fuzz_checkpoint", "per-rank", json.dumps(manifest, indent=2).encode() + b"\x00" + part)
whole = dict(manifest, kind="whole", layout="", world_size=4,
             parts=[{"file": "model.pt", "rank": 0, "bytes": len(part), "crc32c": crc32c(part)}])
put("fuzz_checkpoint", "whole", json.dumps(whole, indent=2).encode() + b"\x00" + part)
put("fuzz_checkpoint", "bad-crc", json.dumps(whole).encode() + b"\x00" + part[:-1] + b"!")

# fuzz_cli: the first byte picks the command (even: train, odd: plan), then one argument a line.
put("fuzz_cli", "train-small", "0" + "\n".join(["--gpus", "4", "--data", "synthetic", "--max-steps", "3"]))
put("fuzz_cli", "train-mesh", "0" + "\n".join(["--model", "gpt", "--tp", "2", "--pp", "2", "--gpus", "8",
                                              "--micro-batches", "4", "--sequence-parallel"]))
put("fuzz_cli", "train-sizes", "0" + "\n".join(["--gpu-mem", "24MiB", "--bucket-mb", "0.5", "--lr", "1e-3",
                                               "--seq-len", "99999999999", "--inject-fault", "1:2"]))
put("fuzz_cli", "plan-llama", "1" + "\n".join(["--preset", "llama3-8b", "--cluster", "8xh100", "--zero", "3",
                                              "--precision", "bf16", "--seq-len", "8192",
                                              "--global-batch-size", "8"]))
put("fuzz_cli", "plan-mesh", "1" + "\n".join(["--model", "gpt", "--cluster", "2x8xa100-80", "--inter", "4xhdr",
                                             "--tp", "8", "--pp", "2", "--layers", "24",
                                             "--micro-batch-size", "1", "--global-batch-size", "64"]))
put("fuzz_cli", "train-stage-layers", "0" + "\n".join(["--model", "gpt", "--pp", "3", "--gpus", "3", "--layers", "7",
                                                      "--stage-layers", "2, 3,2", "--tie-head"]))
put("fuzz_cli", "plan-first-last", "1" + "\n".join(["--preset", "llama3-405b", "--cluster", "2048x8xh100", "--tp", "8",
                                                   "--pp", "16", "--first-stage-layers", "7",
                                                   "--last-stage-layers", "7"]))
put("fuzz_cli", "plan-moe-alltoall", "1" + "\n".join(["--model", "llama", "--moe-experts", "8", "--ep", "4",
                                                    "--moe-dispatch", "alltoall", "--cluster", "2x4xh100",
                                                    "--layers", "2"]))
put("fuzz_cli", "plan-loss-upcast", "1" + "\n".join(["--preset", "qwen3-30b-a3b", "--cluster", "8xh100",
                                                   "--ep", "8", "--zero", "3", "--precision", "bf16",
                                                   "--no-loss-upcast", "--layers", "2"]))
put("fuzz_cli", "plan-reduce-fp32", "1" + "\n".join(["--preset", "llama3-8b", "--cluster", "8xh100",
                                                   "--zero", "3", "--precision", "bf16", "--reduce-fp32",
                                                   "--layers", "2"]))
put("fuzz_cli", "plan-reduce-fp32-zero1", "1" + "\n".join(["--preset", "llama3-8b", "--cluster", "8xh100",
                                                         "--zero", "1", "--distributed-optimizer",
                                                         "--precision", "bf16", "--reduce-fp32",
                                                         "--layers", "2"]))
# fuzz_predict_values: the bytes choose how each number of the target's own records changes.
put("fuzz_predict_values", "as-recorded", bytes(64))
put("fuzz_predict_values", "resized", bytes([1, 0, 0, 2, 11, 11, 3]))

# fuzz_safetensors: the first byte picks the reader (even: model.safetensors, odd: config.json
# against the default tiny gpt and llama).
def safetensors_file(tensors, metadata=None):
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, payload in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


put("fuzz_safetensors", "file", b"\x00" + safetensors_file(
    [("w", "F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4)), ("b", "BF16", [2], b"\x80\x3f\x00\xc0"),
     ("e", "I64", [0], b"")], {"format": "pt"}))
put("fuzz_safetensors", "overlap", b"\x00" + safetensors_file([("w", "F32", [1], b"abcd")])[:-2])
put("fuzz_safetensors", "gpt2-config", b"\x01" + json.dumps({
    "model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 64, "vocab_size": 256,
    "n_inner": 256, "activation_function": "gelu", "layer_norm_epsilon": 1e-5,
    "tie_word_embeddings": False}).encode())
put("fuzz_safetensors", "llama-config", b"\x01" + json.dumps({
    "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
    "num_key_value_heads": 4, "intermediate_size": 256, "vocab_size": 256, "head_dim": 16,
    "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_parameters": {"rope_type": "default",
    "rope_theta": 10000.0}, "tie_word_embeddings": False}).encode())

# fuzz_plan_request: meshsim serve's POST /api/plan bodies.
put("fuzz_plan_request", "preset", json.dumps({"preset": "llama3-8b", "cluster": "8xh100",
    "precision": "bf16", "layout": {"zero": 3}}))
put("fuzz_plan_request", "search", json.dumps({"preset": "llama3-70b", "cluster": "2x8xh100",
    "global_batch_size": 64, "search": True, "top": 5}))
put("fuzz_plan_request", "full-layout", json.dumps({"preset": "mixtral-8x7b", "cluster": "4x8xh100",
    "inter": "4xndr", "layout": {"tp": 2, "pp": 2, "cp": 1, "ep": 8, "zero": 1, "micro_batch_size": 1,
    "micro_batches": 8, "virtual_stages": 2, "recompute": "full", "attention": "fused",
    "cp_comm": "ring", "sequence_parallel": True, "tp_comm_overlap": False}, "seq_len": 4096}))
put("fuzz_plan_request", "moe-dispatch", json.dumps({"preset": "mixtral-8x7b", "cluster": "2x8xh100",
    "layout": {"ep": 8, "zero": 1, "moe_dispatch": "alltoall"}, "seq_len": 4096}))
put("fuzz_plan_request", "loss-upcast", json.dumps({"preset": "qwen3-30b-a3b", "cluster": "8xh100",
    "precision": "bf16", "layout": {"ep": 8, "zero": 3, "loss_upcast": False}, "seq_len": 4096}))
put("fuzz_plan_request", "hf-config", json.dumps({"cluster": "8xh100", "hf_config": {
    "model_type": "mixtral", "num_hidden_layers": 32, "hidden_size": 4096,
    "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
    "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000,
    "rope_theta": 1e6}}))
put("fuzz_plan_request", "bad-value", '{"preset": "llama3-8b", "cluster": "8xh100; rm -rf /"}')
