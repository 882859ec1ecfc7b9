"""SGLang launch plan: argv and --config YAML goldens, the real flag set, MoE dirs, router, server_info."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from tuner.backends import moe_configs
from tuner.backends.router import plan_topology, router_argv
from tuner.backends.sglang import (
    LAUNCH_FLAGS, SGLangBackend, config_to_argv, config_yaml_dict, kv_capacity_from_server_info,
    render_config_yaml, triton_cache_dirs,
)
from tuner.catalog.sglang_flags import load_flagset, parse_extra_args
from tuner.catalog import get_gpu, get_model
from tuner.errors import ConfigError, TrialError
from tuner.evaluation.base import TrialRequest

REPO = Path(__file__).resolve().parents[2]


def study(**options):
    return SimpleNamespace(model="glm-5.1", hardware=SimpleNamespace(gpu="h200", gpus_per_node=8, nodes=1),
                           backend_options={"server_command": ["sglang", "serve"], **options})


def request(tmp_path, flags, knobs=None, gpu_ids=tuple(range(8)), **options):
    return TrialRequest(study=study(**options), trial_number=7, flags=flags, knobs=knobs or {},
                        workdir=str(tmp_path), gpu_ids=gpu_ids)


# ---- config YAML -------------------------------------------------------------------------------

def test_config_yaml_golden():
    flags = {"tp-size": 8, "attn-dp-size": 8, "ep-size": 8, "quantization": "modelopt_fp4",
             "kv-cache-dtype": "fp8_e4m3", "mem-fraction-static": 0.8, "cuda-graph-max-bs-decode": 128,
             "enable-hicache": True, "disable-radix-cache": False, "chunked-prefill-size": None,
             "schedule-policy": "lpm"}
    assert render_config_yaml(flags) == (
        "attn-dp-size: 8\n"
        "cuda-graph-max-bs-decode: 128\n"
        "enable-hierarchical-cache: true\n"  # alias resolved; false switches omitted; None omitted
        "ep-size: 8\n"
        "kv-cache-dtype: fp8_e4m3\n"
        "mem-fraction-static: 0.8\n"
        "quantization: modelopt_fp4\n"
        "schedule-policy: lpm\n"
        "tp-size: 8\n"
    )


def test_config_yaml_reads_back_to_the_intended_argv():
    cfg = config_yaml_dict({"tp-size": 4, "enable-mixed-chunk": True, "disable-radix-cache": False,
                            "cuda-graph-bs-decode": [1, 2, 4]}, model_path="/m")
    assert config_to_argv(yaml.safe_load(yaml.safe_dump(cfg, sort_keys=False))) == [
        "--model-path", "/m", "--cuda-graph-bs-decode", "1", "2", "4", "--enable-mixed-chunk", "--tp-size", "4"]


def test_config_yaml_refuses_boolean_optional_and_unknown():
    with pytest.raises(ConfigError, match="cannot go into an SGLang --config"):
        config_yaml_dict({"enable-tf32-matmul": True})
    with pytest.raises(ConfigError, match="did you mean --cuda-graph-max-bs-decode"):
        config_yaml_dict({"cuda-graph-max-bs": 64})  # removed in 0.5.23
    with pytest.raises(ConfigError, match="enable-dp-attention"):
        config_yaml_dict({"enable-dp-attention": True})  # deprecated zero-arg action
    with pytest.raises(ConfigError, match="valid: "):
        config_yaml_dict({"kv-cache-dtype": "fp9"})
    with pytest.raises(ConfigError, match="set per launch"):
        config_yaml_dict({"port": 1})


def test_every_flag_tuner_can_emit_is_a_real_sglang_flag():
    from tuner.config.knobs import SGLANG_KNOBS

    fs = load_flagset()
    assert fs.version == "0.5.23"
    server_knobs = [k for k, v in SGLANG_KNOBS.items() if v.scope == "server"]
    fs.require(server_knobs)  # raises naming any invented flag
    fs.require(LAUNCH_FLAGS)
    fs.require(["nccl-port"])  # per-replica override
    for name in server_knobs:  # and none of them is refused by the config parser
        assert fs.info(name).config_yaml != "unsupported", name


def test_extra_server_args_are_validated():
    assert parse_extra_args(["--log-level", "info", "--enable-metrics"]) == ["--log-level", "info", "--enable-metrics"]
    with pytest.raises(ConfigError, match="did you mean --log-level"):
        parse_extra_args(["--log-levl", "info"])
    with pytest.raises(ConfigError, match="set by tuner"):
        parse_extra_args(["--port", "1"])
    with pytest.raises(ConfigError, match="list"):
        parse_extra_args("--log-level info")


# ---- the plan ----------------------------------------------------------------------------------

def test_plan_argv_env_and_files_golden(tmp_path):
    plan = SGLangBackend().build_plan(
        request(tmp_path, {"tp-size": 8, "quantization": "fp8", "attn-dp-size": 8}, gpu_ids=(0, 1, 2, 3, 4, 5, 6, 7),
                extra_server_args=["--log-level", "warning"]), tmp_path / "t")
    (s,) = plan.servers
    assert plan.router is None
    cfg = str(tmp_path / "t" / "sglang.yaml")
    assert s.argv == ["sglang", "serve", "--config", cfg, "--model-path", "zai-org/GLM-5.1-FP8",
                      "--host", "127.0.0.1", "--port", str(s.port), "--log-level", "warning"]
    assert s.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    assert s.env["SGLANG_MOE_CONFIG_DIR"] is None  # default tiles: SGLang's own directory
    assert s.ready_paths == ("/health",)
    assert yaml.safe_load(Path(cfg).read_text()) == {"attn-dp-size": 8, "quantization": "fp8", "tp-size": 8}
    assert plan.served_model == "zai-org/GLM-5.1-FP8" and plan.vocab_size == 154880


def test_kernel_cache_state_counts_what_the_server_will_find(tmp_path, monkeypatch):
    def kernels(where, names):
        for name, size in names:
            (where / name).mkdir(parents=True)
            (where / name / "k.cubin").write_bytes(b"x" * size)
            (where / name / "k.json").write_text("{}")

    cache = tmp_path / "triton"
    kernels(cache, (("A1", 100), ("B2", 50)))
    jit = tmp_path / "tvm-ffi"  # SGLang's nvcc-built modules, one cache for the machine
    monkeypatch.setenv("TVM_FFI_CACHE_DIR", str(jit))
    plan = SGLangBackend().build_plan(request(tmp_path, {"tp-size": 8}, env={"TRITON_CACHE_DIR": str(cache)}),
                                      tmp_path / "t")
    # a TRITON_CACHE_DIR of the user's is the only one: Inductor leaves a set one alone
    assert SGLangBackend().kernel_cache_state(plan) == {
        "triton": {"dir": str(cache), "kernels": 2, "files": 4, "bytes": 154},
        "jit": {"dir": str(jit), "modules": 0}}
    (jit / "sgl_kernel_jit_concat_mla_k_ab12").mkdir(parents=True)
    (jit / "sgl_kernel_jit_concat_mla_k_ab12" / "sgl_kernel_jit_concat_mla_k_ab12.so").write_bytes(b"x")
    (jit / "sgl_kernel_jit_concat_mla_k_ab12" / "build.ninja").write_text("")
    assert SGLangBackend().kernel_cache_state(plan)["jit"] == {"dir": str(jit), "modules": 1}
    # without it tuner pins Triton's default, so that Inductor leaves it there
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.setenv("TRITON_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    kernels(tmp_path / "home" / ".triton" / "cache", (("C3", 10),))
    plan = SGLangBackend().build_plan(request(tmp_path, {"tp-size": 8}), tmp_path / "t2")
    assert plan.servers[0].env["TRITON_CACHE_DIR"] == str(tmp_path / "home" / ".triton" / "cache")
    assert SGLangBackend().kernel_cache_state(plan) == {
        "triton": {"dir": str(tmp_path / "home" / ".triton" / "cache"), "kernels": 1, "files": 2, "bytes": 12},
        "jit": {"dir": str(jit), "modules": 1}}
    # unset by the user (None): Triton's default until Inductor's first kernel, then
    # <inductor cache>/triton/<device>, both counted
    kernels(tmp_path / "inductor" / "triton" / "0", (("D4", 7),))
    plan = SGLangBackend().build_plan(request(tmp_path, {"tp-size": 8}, env={"TRITON_CACHE_DIR": None}),
                                      tmp_path / "t3")
    state = SGLangBackend().kernel_cache_state(plan)
    assert state["triton"]["kernels"] == 1 and state["inductor_triton"]["kernels"] == 1
    assert state["inductor_triton"]["bytes"] == 9
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    assert triton_cache_dirs({})["inductor_triton"].parent.name.startswith("torchinductor_")


def test_every_server_gets_one_pinned_triton_cache_unless_the_user_sets_one(tmp_path, monkeypatch):
    from tuner.backends.sglang import pinned_triton_cache

    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.setenv("TRITON_HOME", str(tmp_path / "h"))
    assert pinned_triton_cache({}) == {"TRITON_CACHE_DIR": str(tmp_path / "h" / ".triton" / "cache")}
    assert pinned_triton_cache({"TRITON_HOME": "/x"}) == {"TRITON_CACHE_DIR": "/x/.triton/cache"}
    assert pinned_triton_cache({"TRITON_CACHE_DIR": "/mine"}) == {}
    assert pinned_triton_cache({"TRITON_CACHE_DIR": None}) == {}  # the user unsets it: left unset
    monkeypatch.setenv("TRITON_CACHE_DIR", "/inherited")
    assert pinned_triton_cache({}) == {}  # the process's own value reaches the server as it is
    monkeypatch.delenv("TRITON_CACHE_DIR")
    plan = SGLangBackend().build_plan(
        request(tmp_path, {"tp-size": 4, "dp-size": 2}, {"router-policy": "cache_aware"}), tmp_path / "t")
    assert len(plan.servers) == 2  # every replica shares the one cache
    assert [s.env["TRITON_CACHE_DIR"] for s in plan.servers] == [str(tmp_path / "h" / ".triton" / "cache")] * 2


def test_plan_refuses_infeasible_topologies(tmp_path):
    with pytest.raises(TrialError, match="attn-dp-size > 1 together with dp-size"):
        SGLangBackend().build_plan(request(tmp_path, {"tp-size": 4, "dp-size": 2, "attn-dp-size": 4}), tmp_path)
    with pytest.raises(TrialError) as e:
        SGLangBackend().build_plan(request(tmp_path, {"tp-size": 8, "quantization": "awq"}), tmp_path)
    assert e.value.failure_class == "infeasible"


def test_gpus_needed_is_world_size(tmp_path):
    b = SGLangBackend()
    assert b.gpus_needed(request(tmp_path, {"tp-size": 8, "attn-dp-size": 8})) == 8
    assert b.gpus_needed(request(tmp_path, {"tp-size": 4, "dp-size": 2})) == 8
    assert b.gpus_needed(request(tmp_path, {})) == 1


def test_router_for_replicas(tmp_path):
    plan = SGLangBackend().build_plan(
        request(tmp_path, {"tp-size": 4, "dp-size": 2, "quantization": "fp8"}, {"router-policy": "cache_aware"}),
        tmp_path)
    assert len(plan.servers) == 2
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in plan.servers] == ["0,1,2,3", "4,5,6,7"]
    assert all("--nccl-port" in s.argv for s in plan.servers)
    assert "dp-size" not in yaml.safe_load(Path(plan.files["config"]).read_text())
    r = plan.router.argv
    assert r[1:4] == ["-m", "sglang_router.launch_router", "--worker-urls"]
    assert r[4:6] == [s.base_url for s in plan.servers]
    assert r[6:] == ["--policy", "cache_aware", "--host", "127.0.0.1", "--port", str(plan.router.port)]
    assert plan.base_url == plan.router.base_url
    assert len({s.port for s in plan.all_specs}) == 3


def test_router_topologies():
    assert plan_topology({"tp-size": 8, "attn-dp-size": 8}, {"router-policy": "round_robin"}).dp_aware
    t = plan_topology({"tp-size": 8, "attn-dp-size": 8}, {})
    assert not t.uses_router  # in-server --load-balance-method
    t = plan_topology({"tp-size": 8}, {"router-policy": "random"})
    assert not t.uses_router and "ignored" in t.note
    assert router_argv(["http://a"], "power_of_two", "127.0.0.1", 9, dp_aware=True, python="py")[-1] == "--dp-aware"
    with pytest.raises(ConfigError, match="valid"):
        plan_topology({}, {"router-policy": "fastest"})


def test_server_info_capacity():
    assert kv_capacity_from_server_info({"max_total_num_tokens": 500_000, "attn_dp_size": 8}) == 4_000_000
    assert kv_capacity_from_server_info({"max_total_num_tokens": 100, "dp_size": 2}) == 200
    info = {"max_total_num_tokens": 10, "attn_dp_size": 2,
            "internal_states": [{"memory_usage": {"token_capacity": 10}}, {"memory_usage": {"token_capacity": 12}}]}
    assert kv_capacity_from_server_info(info) == 22  # per-rank figures win when every rank reports
    assert kv_capacity_from_server_info({"version": "x"}) is None


# ---- MoE tile configs --------------------------------------------------------------------------

def test_moe_file_names_match_sglang():
    assert moe_configs.config_file_name(257, 256, "NVIDIA H200", "fp8_w8a8", (128, 128)) == \
        "E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"
    assert moe_configs.config_file_name(128, 384, "NVIDIA H100 80GB HBM3", down=True) == \
        "E=128,N=384,device_name=NVIDIA_H100_80GB_HBM3_down.json"
    key = moe_configs.parse_config_file_name("E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128]_down.json")
    assert (key.E, key.N, key.dtype, key.block_shape, key.down) == (257, 256, "fp8_w8a8", (128, 128), True)
    assert key.file_name.endswith("_down.json")
    assert moe_configs.version_dir("3.6.0+git1a2b") == "triton_3_6_0"
    keys = moe_configs.trial_config_keys(get_model("glm-5.1"), get_gpu("h200"), "fp8_block", tp_size=8, ep_size=1)
    assert [k.file_name for k in keys][0] == \
        "E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"
    assert moe_configs.trial_config_keys(get_model("glm-5.1"), get_gpu("h200"), "nvfp4", tp_size=8, ep_size=1) == []


TILE = {"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
              "num_warps": 4, "num_stages": 3}}


def test_tuned_moe_dir_layout_and_env(tmp_path):
    src = tmp_path / "kernels" / "h200"
    name = "E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"
    (src / "triton_3_5_1").mkdir(parents=True)
    (src / "triton_3_5_1" / name).write_text(json.dumps(TILE))
    (src / "E=257,N=256,device_name=NVIDIA_H200.json").write_text(json.dumps(TILE))  # flat file
    (src / "notes.json").write_text("{}")  # not a tile config: ignored
    plan = SGLangBackend().build_plan(
        request(tmp_path, {"tp-size": 8, "quantization": "fp8"}, {"moe-tile-configs": "tuned"},
                moe_config_dir=str(src), triton_version="3.6.0"), tmp_path / "trial")
    moe = Path(plan.servers[0].env["SGLANG_MOE_CONFIG_DIR"])
    assert moe == (tmp_path / "trial" / "moe").resolve()
    assert (moe / "configs").is_dir()  # SGLang's fallback listdir needs it
    assert json.loads((moe / "configs" / "triton_3_5_1" / name).read_text()) == TILE
    assert (moe / "configs" / "triton_3_6_0" / "E=257,N=256,device_name=NVIDIA_H200.json").exists()
    assert not list(moe.rglob("notes.json"))


def test_tuned_moe_needs_a_valid_source(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="moe_config_dir"):
        SGLangBackend().build_plan(request(tmp_path, {"quantization": "fp8"}, {"moe-tile-configs": "tuned"},
                                           moe_config_dir=str(tmp_path / "absent")), tmp_path)
    # without the option: the default results/kernels/<gpu>, as `tuner study export` uses it
    monkeypatch.chdir(REPO)
    plan = SGLangBackend().build_plan(request(tmp_path, {"quantization": "fp8"}, {"moe-tile-configs": "tuned"}),
                                      tmp_path / "t")
    assert plan.servers[0].env["SGLANG_MOE_CONFIG_DIR"] == plan.files["moe_config_dir"]
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="results/kernels/h200.*does not exist"):
        SGLangBackend().build_plan(request(tmp_path, {"quantization": "fp8"}, {"moe-tile-configs": "tuned"}),
                                   tmp_path / "u")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "E=1,N=2,device_name=X.json").write_text("{not json")
    with pytest.raises(ConfigError):
        moe_configs.prepare_trial_moe_dir(tmp_path / "t", bad, triton_version="3.6.0", include_shipped=False)


def test_tiles_tuned_for_another_routing_are_named_at_launch_on_random_weights(tmp_path, caplog):
    """DeepSeek-V3 on random weights: its biased gate sends every token to the same few experts, so a
    folder tuned with tokens routed apart is named at launch (the trial still runs: the files are right
    for real weights); the folder tuned under that routing, or real weights, say nothing."""
    import shutil

    def moe_only(src, name):  # the MoE files and their tune reports (the GEMM overlay needs sglang here)
        dst = tmp_path / name
        shutil.copytree(src / "configs", dst / "configs")
        shutil.copytree(src / "reports", dst / "reports", ignore=shutil.ignore_patterns("*.gz"))
        return dst

    tuned = REPO / "results/kernels/h200/sglang"
    routed_apart, collapsed = moe_only(tuned, "apart"), moe_only(tuned / "collapsed", "collapsed")

    def plan(moe_dir, load_format, name):
        req = request(tmp_path, {"tp-size": 1, "quantization": "fp8"}, {"moe-tile-configs": "tuned"}, gpu_ids=(0,),
                      moe_config_dir=str(moe_dir), load_format=load_format)
        req = TrialRequest(study=SimpleNamespace(**{**vars(req.study), "model": "deepseek-v3"}), trial_number=7,
                           flags=req.flags, knobs=req.knobs, workdir=str(tmp_path), gpu_ids=(0,))
        return SGLangBackend().build_plan(req, tmp_path / name)

    with caplog.at_level("WARNING", logger="tuner.backends.sglang"):
        apart = plan(routed_apart, "dummy", "a")
    why = apart.facts["tile_routing_warning"]
    assert why.startswith("E=257,N=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json was "
                          "tuned with tokens routed apart") and "--routing collapsed" in why
    assert why in caplog.text
    assert "tile_routing_warning" not in plan(collapsed, "dummy", "b").facts
    assert "tile_routing_warning" not in plan(routed_apart, "auto", "c").facts


# ---- the extractor on the real wheel -----------------------------------------------------------

def _cached_wheel(version: str = "0.5.23") -> Path | None:
    for d in (os.environ.get("TUNER_SGLANG_WHEEL_DIR"), "/tmp/sglang_wheel", str(REPO / ".whl")):
        if d and Path(d).is_dir():
            found = sorted(Path(d).glob(f"sglang-{version}-*.whl"))
            if found:
                return found[0]
    return None


@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_extractor_reproduces_the_committed_flag_set(version):
    wheel = _cached_wheel(version)
    if wheel is None:
        pytest.skip(f"sglang {version} wheel not cached locally (TUNER_SGLANG_WHEEL_DIR)")
    from tuner.backends.sglang_flag_extract import extract_from_wheel

    data = extract_from_wheel(wheel)
    committed = json.loads((REPO / f"tuner/catalog/sglang-flags-{version}.json").read_text())
    assert data["wheel_sha256"] == committed["wheel_sha256"]
    assert data["flags"] == committed["flags"]
    flags = data["flags"]
    assert flags["tp-size"]["aliases"] == ["tensor-parallel-size"]
    assert flags["enable-hierarchical-cache"]["kind"] == "store_true"
    assert flags["load-balance-method"]["choices"][:2] == ["auto", "round_robin"]
    if version == "0.5.23":
        assert "cuda-graph-max-bs" not in flags and "cuda-graph-max-bs-decode" in flags
        assert flags["enable-tf32-matmul"]["config_yaml"] == "unsupported"
        assert len(flags) > 500
    else:  # 0.5.17 keys YAML by dest: the deprecated --cuda-graph-max-bs blocks its new twin
        assert flags["cuda-graph-max-bs"]["kind"] == "custom_action"
        assert flags["cuda-graph-max-bs-decode"]["config_yaml"] == "unsupported"
        assert "attn-dp-size" not in flags and flags["enable-dp-attention"]["kind"] == "store_true"
        assert len(flags) > 450


def test_committed_flag_sets_differ_where_tuner_cares():
    old, new = load_flagset("0.5.17"), load_flagset("0.5.23")
    assert (old.version, new.version) == ("0.5.17", "0.5.23")
    assert "attn-dp-size" not in old and "attn-dp-size" in new
    assert not old.in_config_yaml("cuda-graph-max-bs-decode") and new.in_config_yaml("cuda-graph-max-bs-decode")
    assert "hrrn" in new.info("schedule-policy").choices and "hrrn" not in old.info("schedule-policy").choices
    assert old.info("hicache-ratio").default == 2.0 and new.info("hicache-ratio").default is None
    assert "enable-dp-attention" in old.suggest("attn-dp-size")  # the replacement is named


def test_flags_the_yaml_refuses_go_on_the_command_line_for_0_5_17(tmp_path):
    fs = load_flagset("0.5.17")
    overflow: list[str] = []
    cfg = config_yaml_dict({"cuda-graph-max-bs-decode": 64, "mem-fraction-static": 0.8}, flagset=fs,
                           cli_overflow=overflow)
    assert cfg == {"mem-fraction-static": 0.8}
    assert overflow == ["--cuda-graph-max-bs-decode", "64"]
    with pytest.raises(ConfigError, match="cannot go into an SGLang --config"):
        config_yaml_dict({"cuda-graph-max-bs-decode": 64}, flagset=fs)
    # 0.5.23 takes it in the YAML
    assert config_yaml_dict({"cuda-graph-max-bs-decode": 64}) == {"cuda-graph-max-bs-decode": 64}


def test_unknown_versions_are_refused():
    from tuner.catalog.sglang_flags import resolve_version

    assert resolve_version("0.5.17.post1") == "0.5.17"
    assert resolve_version(None) == "0.5.23"
    with pytest.raises(ConfigError, match="0.5.17, 0.5.23"):
        resolve_version("0.4.0")


# ---- without sglang installed ------------------------------------------------------------------

def test_everything_but_the_launch_works_without_sglang(tmp_path):
    code = f"""
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split('.')[0] in ('sglang', 'sglang_router', 'pynvml'):
            raise ModuleNotFoundError(name)
sys.meta_path.insert(0, Block())
from types import SimpleNamespace
from tuner.backends.sglang import SGLangBackend
from tuner.evaluation.base import TrialRequest
from tuner.evaluation.live import SGLangEvaluator
from tuner.backends import gpu
ev = SGLangEvaluator()
st = SimpleNamespace(model='glm-5.1', hardware=SimpleNamespace(gpu='h200'), backend_options={{}})
req = TrialRequest(study=st, trial_number=1, flags={{'tp-size': 8, 'quantization': 'fp8'}}, knobs={{'router-policy': None}})
plan = SGLangBackend().build_plan(req, {str(tmp_path)!r})
ok, why = SGLangBackend().availability()
assert not ok and 'not installed' in why, why
assert gpu.detect_gpus() == [] and not gpu.nvml_available()
print('OK', ev.gpus_needed(req), plan.servers[0].argv[2:4])
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("OK 8")


def test_the_version_comes_from_the_study_or_the_installed_package(monkeypatch, tmp_path):
    from tuner.backends import sglang as backend

    monkeypatch.setattr(backend, "installed_sglang_version", lambda: None)
    assert backend.sglang_version_for({}) == "0.5.23"  # nothing installed: the default
    assert backend.sglang_version_for({"sglang_version": "0.5.17"}) == "0.5.17"
    monkeypatch.setattr(backend, "installed_sglang_version", lambda: "0.5.17")
    assert backend.sglang_version_for({}) == "0.5.17"
    plan = SGLangBackend().build_plan(request(tmp_path, {"tp-size": 1, "cuda-graph-max-bs-decode": 64}), tmp_path / "a")
    assert plan.facts["sglang_version"] == "0.5.17"
    assert plan.facts["command_line_flags"] == ["--cuda-graph-max-bs-decode", "64"]  # 0.5.17's YAML refuses it
    with pytest.raises(ConfigError, match="targets SGLang 0.5.23 .* 0.5.17 is installed"):
        SGLangBackend().build_plan(request(tmp_path, {"tp-size": 1}, sglang_version="0.5.23"), tmp_path / "b")
    with pytest.raises(ConfigError, match="did you mean --enable-dp-attention"):
        SGLangBackend().build_plan(request(tmp_path, {"tp-size": 8, "attn-dp-size": 8}), tmp_path / "c")
