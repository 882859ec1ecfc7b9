"""The knobs a search space may name, by their SGLang 0.5.23 flag names.

``server`` knobs are SGLang server flags (emitted on the command line / in the --config YAML);
``tuner`` knobs are choices tuner makes around the server (router in front, MoE tile files).
Types and choices here are what tuner validates before anything runs.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Knob:
    name: str
    type: type
    scope: str = "server"  # server | tuner
    choices: tuple = ()
    help: str = ""


_QUANT = ("fp8", "modelopt_fp4", "modelopt_fp8", "w8a8_fp8", "mxfp4")
_KV = ("auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16", "mxfp8", "nvfp4")

SGLANG_KNOBS: dict[str, Knob] = {k.name: k for k in [
    Knob("tp-size", int, help="tensor parallel size"),
    Knob("dp-size", int, help="data-parallel model replicas"),
    Knob("attn-dp-size", int, help="attention data parallel ranks inside the TP group"),
    Knob("ep-size", int, help="expert parallel size"),
    Knob("moe-dense-tp-size", int),
    Knob("quantization", str, choices=_QUANT, help="checkpoint quantization (None = bf16)"),
    Knob("kv-cache-dtype", str, choices=_KV),
    Knob("max-running-requests", int),
    Knob("max-total-tokens", int),
    Knob("chunked-prefill-size", int),
    Knob("max-prefill-tokens", int),
    Knob("mem-fraction-static", float),
    Knob("cuda-graph-max-bs-decode", int),
    Knob("schedule-policy", str, choices=("fcfs", "lpm", "random", "dfs-weight", "lof", "priority", "hrrn", "shortest-prefill-first")),
    Knob("schedule-conservativeness", float),
    Knob("page-size", int),
    Knob("enable-hierarchical-cache", bool),
    Knob("hicache-ratio", float),
    Knob("hicache-size", int),
    Knob("hicache-write-policy", str, choices=("write_back", "write_through", "write_through_selective")),
    Knob("load-balance-method", str, choices=("auto", "round_robin", "total_requests", "total_tokens")),
    Knob("moe-runner-backend", str, choices=("auto", "triton", "deep_gemm", "flashinfer_trtllm", "flashinfer_cutlass", "cutlass")),
    Knob("moe-a2a-backend", str, choices=("none", "deepep", "flashinfer", "mooncake")),
    Knob("disable-radix-cache", bool),
    Knob("enable-mixed-chunk", bool),
    Knob("enable-two-batch-overlap", bool),
    Knob("disable-shared-experts-fusion", bool),
    Knob("speculative-algorithm", str, choices=("EAGLE", "EAGLE3", "NEXTN")),
    Knob("speculative-num-steps", int),
    Knob("speculative-eagle-topk", int),
    Knob("speculative-num-draft-tokens", int),
    Knob("attention-backend", str),
    Knob("router-policy", str, scope="tuner", choices=("cache_aware", "round_robin", "random", "power_of_two"),
         help="sglang_router policy in front of DP ranks/replicas (None: in-server load balancing)"),
    Knob("moe-tile-configs", str, scope="tuner", choices=("default", "tuned"),
         help="use tuned Triton MoE tile config files (SGLANG_MOE_CONFIG_DIR) or SGLang's defaults"),
]}

ENGINES = ("sglang", "transformers")
