"""transformers serve backend: knob validation against the installed --help, and a real server."""

from __future__ import annotations

import pytest

from tuner.backends.transformers import ServeFlag, flag_args, parse_serve_help
from tuner.errors import ConfigError

HELP = """
Options:
  --continuous-batching / --no-continuous-batching
                                  Enable continuous batching.
  --attn-implementation TEXT      Attention implementation.
  --reasoning [on|off|auto]       Reasoning mode.
  --cb-num-blocks INTEGER         Number of KV cache blocks.
  --cb-max-memory-percent FLOAT   Max GPU memory fraction for KV cache.
  --host TEXT                     Server listen address.
  --port INTEGER                  Server listen port.
  -h, --help                      Show this message and exit.
Formatting options:
  --format [auto|human|agent|json|quiet]
  --no-truncate                   Do not truncate.
"""


def test_parse_help_kinds():
    flags = parse_serve_help(HELP)
    assert flags["continuous-batching"] == ServeFlag("continuous-batching", "bool")
    assert flags["cb-num-blocks"].kind == "int"
    assert flags["cb-max-memory-percent"].kind == "float"
    assert flags["reasoning"].choices == ("on", "off", "auto")
    assert "help" not in flags and "format" not in flags and "no-truncate" not in flags


def test_flag_args_render_and_reject():
    flags = parse_serve_help(HELP)
    argv = flag_args({"continuous-batching": False, "cb-num-blocks": 64.0, "attn-implementation": "sdpa",
                      "cb-max-memory-percent": None}, flags)
    assert argv == ["--attn-implementation", "sdpa", "--cb-num-blocks", "64", "--no-continuous-batching"]
    with pytest.raises(ConfigError, match=r"no flag --cb-page-size; valid: attn-implementation, "
                                          r"cb-max-memory-percent, cb-num-blocks, continuous-batching, reasoning"):
        flag_args({"cb-page-size": 16}, flags)
    with pytest.raises(ConfigError, match="set per launch"):
        flag_args({"port": 9000}, flags)
    with pytest.raises(ConfigError, match="integer"):
        flag_args({"cb-num-blocks": 1.5}, flags)
    with pytest.raises(ConfigError, match="one of on, off, auto"):
        flag_args({"reasoning": "maybe"}, flags)
    with pytest.raises(ConfigError, match="switch"):
        flag_args({"continuous-batching": "yes"}, flags)


@pytest.mark.slow
def test_installed_version_rejects_unknown_knob_with_valid_list():
    pytest.importorskip("transformers")
    from tuner.backends.transformers import installed_flags

    flags = installed_flags()
    for name in ("continuous-batching", "cb-block-size", "cb-num-blocks", "cb-max-batch-tokens", "device", "dtype"):
        assert name in flags
    with pytest.raises(ConfigError) as err:
        flag_args({"max-running-requests": 8})
    assert "valid:" in str(err.value) and "cb-num-blocks" in str(err.value)


@pytest.mark.slow
def test_real_server_streams_exactly_max_tokens(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("fastapi")
    from tuner.backends.process import pid_alive
    from tuner.evaluation.base import TrialRequest
    from tuner.evaluation.live import TransformersEvaluator
    from tuner.tinymodels.tiny import TinyModelShape, make_tiny_model
    from tuner.tinymodels.tokenizer import words_text
    from tuner.backends.transformers import stream_completion
    from tuner.config.load import load_study

    model = tmp_path / "m"
    make_tiny_model(model, TinyModelShape(arch="qwen3_moe", words=300))
    study = load_study("studies/tiny-cpu.yaml").model_copy(update={"model": str(model)})
    req = TrialRequest(study=study, trial_number=0, flags={"continuous-batching": True, "cb-num-blocks": 64},
                       workdir=str(tmp_path / "run"))
    dep = TransformersEvaluator().deploy(req)
    try:
        assert dep.facts["warmup"]["tokens_exact"]
        res = stream_completion(dep.plan.base_url, dep.plan.served_model, words_text(range(50)), 23)
        assert res["error"] is None
        assert res["chunks"] == 23 and res["usage"]["completion_tokens"] == 23
        assert res["usage"]["prompt_tokens"] == 50
        m = dep.measure(2)
        assert m.valid and m.requests > 0 and m.p90_ttft_s > 0
    finally:
        pids = dep.pids
        dep.close()
    assert pids and not any(pid_alive(p) for p in pids)


def test_cpu_continuous_batching_needs_a_cache_bound(tmp_path):
    pytest.importorskip("transformers")
    from tuner.backends.transformers import TransformersBackend
    from tuner.errors import TrialError
    from tuner.evaluation.base import TrialRequest
    from tuner.config.load import load_study

    ok, _ = TransformersBackend().availability()
    if not ok:
        pytest.skip("transformers serving extras not installed")
    study = load_study("studies/tiny-cpu.yaml")
    req = TrialRequest(study=study, trial_number=0, flags={"continuous-batching": True}, workdir=str(tmp_path))
    with pytest.raises(TrialError) as err:
        TransformersBackend().build_plan(req, tmp_path)
    assert err.value.failure_class == "infeasible"
