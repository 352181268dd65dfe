"""Choosing a launched vLLM or running servers, and the one-line errors for bad input (no vLLM needed)."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys

import pytest

from polar.errors import ConfigError, PolarError
from polar.inference import UpstreamUnavailable, load_engine
from polar.inference.vllm_launcher import VllmLaunchError, launch_vllm, vllm_python
from polar.testing.standin import FixedEngine, StandinServer, make_app


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed on exit: nothing listens there


def test_missing_vllm_venv_names_make_vllm(tmp_path, monkeypatch):
    monkeypatch.delenv("POLAR_VLLM_PYTHON", raising=False)
    with pytest.raises(VllmLaunchError, match=r"no \.vllm-venv/bin/python in .*; run `make vllm` \(or set POLAR_VLLM_PYTHON\)"):
        vllm_python(repo_root=tmp_path)
    monkeypatch.setenv("POLAR_VLLM_PYTHON", str(tmp_path / "nope" / "python"))
    with pytest.raises(VllmLaunchError, match=r"POLAR_VLLM_PYTHON=.*nope/python is not a file.*`make vllm`"):
        load_engine("tiny", engine="vllm", log_dir=str(tmp_path))


def test_launcher_options_are_checked_before_anything_starts(tmp_path):
    with pytest.raises(ConfigError, match=r"model\.engine_kwargs.*max_model_lenn"):
        launch_vllm("tiny", log_dir=tmp_path, max_model_lenn=10)
    with pytest.raises(ConfigError, match=r"gateway\.engine_kwargs.*kv_cache_space_gib"):
        launch_vllm("tiny", log_dir=tmp_path, config_key="gateway.model", kv_cache_space_gib=0)


def test_engine_vllm_needs_a_model_folder_not_urls_or_the_in_memory_preset(tmp_path, monkeypatch):
    fake_python = tmp_path / "python"
    fake_python.write_text("")
    monkeypatch.setenv("POLAR_VLLM_PYTHON", str(fake_python))
    with pytest.raises(PolarError, match=r"engine: vllm launches servers of a model folder or preset, not 'vllm:http"):
        load_engine("vllm:http://127.0.0.1:9", engine="vllm", log_dir=str(tmp_path))
    with pytest.raises(VllmLaunchError, match=r"model\.name_or_path 'tiny' is built in memory"):
        load_engine("tiny", engine="vllm", log_dir=str(tmp_path))
    with pytest.raises(VllmLaunchError, match=r"model\.name_or_path '.*nowhere' is neither a local Hugging Face"):
        load_engine(str(tmp_path / "nowhere"), engine="vllm", log_dir=str(tmp_path))


def test_run_config_model_section_takes_engine_replicas_and_kwargs():
    from polar.config.agentic import ModelConfig
    from polar.config.base import validate

    m = validate(ModelConfig, {"name_or_path": "smollm2-135m", "engine": "vllm", "replicas": 2,
                               "engine_kwargs": {"max_model_len": 4096}}, "model")
    assert (m.engine, m.replicas, m.engine_kwargs) == ("vllm", 2, {"max_model_len": 4096})
    with pytest.raises(ConfigError, match=r"engine"):
        validate(ModelConfig, {"engine": "sglang"}, "model")
    with pytest.raises(ConfigError, match=r"replicas"):
        validate(ModelConfig, {"engine": "vllm", "replicas": 0}, "model")


def test_unreachable_vllm_url_fails_at_start_naming_the_key():
    port = closed_port()
    with pytest.raises(UpstreamUnavailable) as err:
        load_engine(f"vllm:http://127.0.0.1:{port}", config_key="gateway.model")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"gateway.model: no vllm server is reachable: http://127.0.0.1:{port} refused")
    assert "check the URL(s) or start the server(s) first" in message


def test_a_url_that_is_not_vllm_is_named(tmp_path):
    """Something answers, but not as vLLM (an SGLang stand-in has /health but no /v1/models)."""
    with StandinServer(make_app(FixedEngine(), "sglang")) as other:
        with pytest.raises(UpstreamUnavailable, match=r"answered GET /v1/models with HTTP 404 .*not a vLLM server"):
            load_engine(f"vllm:{other.url}")


def test_one_unreachable_replica_of_two_warns_and_serves_degraded(caplog):
    dead = f"http://127.0.0.1:{closed_port()}"
    with StandinServer(make_app(FixedEngine(), "vllm", served_model="tiny")) as live:
        with caplog.at_level(logging.WARNING, logger="polar.inference.upstream"):
            engine = load_engine(f"vllm:{live.url},{dead}")
        assert engine.served_model == "tiny"  # resolved from the live replica's /v1/models at start
    assert any(dead in r.getMessage() and "degraded" in r.getMessage() for r in caplog.records)


def test_polar_gateway_with_a_wrong_url_prints_one_line_and_exits(tmp_path):
    port = closed_port()
    out = subprocess.run(
        [sys.executable, "-m", "polar.cli.main", "gateway", "--model", f"vllm:http://127.0.0.1:{port}",
         "--records-dir", str(tmp_path / "rec")],
        capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "400"})
    assert out.returncode != 0
    errors = [ln for ln in out.stderr.splitlines() if "no vllm server is reachable" in ln]
    assert len(errors) == 1 and "gateway.model" in errors[0] and "Traceback" not in out.stderr


AVX2_ONLY = "processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 fma f16c\n"
SAPPHIRE_RAPIDS = "processor\t: 0\nflags\t\t: fpu avx avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"


@pytest.mark.parametrize("cpuinfo, dtype", [(AVX2_ONLY, "float32"), (SAPPHIRE_RAPIDS, "bfloat16"),
                                            ("processor\t: 0\nflags\t\t: avx512f avx512_bf16\n", "bfloat16")])
def test_launcher_dtype_follows_the_cpu(tmp_path, monkeypatch, cpuinfo, dtype):
    """bf16 only where the CPU has bf16 instructions: on AVX2-only CPUs vLLM's bf16 was measured unusable."""
    from polar.inference import vllm_launcher
    from polar.inference.vllm_launcher import VllmLaunchConfig, cpu_dtype, cpu_flags

    (tmp_path / "cpuinfo").write_text(cpuinfo)
    assert cpu_dtype(cpu_flags(tmp_path / "cpuinfo")) == dtype
    monkeypatch.setattr(vllm_launcher, "cpu_flags", lambda: cpu_flags(tmp_path / "cpuinfo"))
    assert VllmLaunchConfig().dtype == dtype
    assert VllmLaunchConfig(dtype="float16").dtype == "float16"  # a dtype set by the user is kept


def test_selecting_nccl_sync_says_it_has_never_run(caplog):
    from polar.inference.weight_sync import WeightSyncError, check_nccl_available

    with caplog.at_level(logging.WARNING), pytest.raises(WeightSyncError):
        check_nccl_available("sglang")
    assert any("gateway.sync.method: nccl has never run" in r.getMessage() for r in caplog.records)


def test_speculative_decoding_becomes_vllms_speculative_config(tmp_path):
    """engine_kwargs.speculative is passed to vLLM as --speculative-config (ngram: prompt lookup; draft_model:
    the draft's folder), and a config vLLM could not read is refused before anything starts."""
    import json

    from polar.config.base import validate
    from polar.inference.vllm_launcher import VllmFleet, VllmLaunchConfig

    def command(**kwargs) -> list[str]:
        config = validate(VllmLaunchConfig, {"dtype": "float32", **kwargs}, source="model.engine_kwargs")
        fleet = VllmFleet(tmp_path, 1, config, tmp_path / "logs", python=tmp_path / "python")
        return fleet._command(fleet.replicas[0])

    assert "--speculative-config" not in command()
    cmd = command(speculative={"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 5})
    spec = json.loads(cmd[cmd.index("--speculative-config") + 1])
    assert spec == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 5}
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text("{}")
    cmd = command(speculative={"method": "draft_model", "model": str(draft), "num_speculative_tokens": 2})
    spec = json.loads(cmd[cmd.index("--speculative-config") + 1])
    assert spec == {"method": "draft_model", "model": str(draft.resolve()), "num_speculative_tokens": 2}
    with pytest.raises(ConfigError, match=r"draft_model needs speculative\.model"):
        command(speculative={"method": "draft_model"})
    with pytest.raises(ConfigError, match=r"speculative\.model is for method: draft_model"):
        command(speculative={"method": "ngram", "model": str(draft)})
    with pytest.raises(ConfigError, match=r"prompt_lookup_min \(4\) is above prompt_lookup_max \(2\)"):
        command(speculative={"method": "ngram", "prompt_lookup_min": 4, "prompt_lookup_max": 2})
    with pytest.raises(ConfigError, match=r"speculative and extra_args both set --speculative-config"):
        command(speculative={"method": "ngram"}, extra_args=["--speculative-config", "{}"])
    with pytest.raises(ConfigError, match=r"speculative.*method"):
        command(speculative={"method": "eagle"})
    with pytest.raises(VllmLaunchError, match=r"model\.engine_kwargs\.speculative\.model 'tiny' is built in memory"):
        command(speculative={"method": "draft_model", "model": "tiny"})


def test_a_replica_that_is_still_starting_is_reported_with_its_last_log_line(tmp_path, monkeypatch, caplog):
    """A first vLLM start compiles for minutes: the run says every START_PROGRESS_S that the replica is still
    starting, with vLLM's last log line, instead of going quiet until /health answers or the timeout."""
    from polar.config.base import validate
    from polar.inference import vllm_launcher
    from polar.inference.vllm_launcher import VllmFleet, VllmLaunchConfig

    monkeypatch.setattr(vllm_launcher, "START_PROGRESS_S", 0.3)
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'Warming up model for the compilation...'\nexec sleep 30\n")
    fake.chmod(0o755)
    config = validate(VllmLaunchConfig, {"dtype": "float32", "start_timeout_s": 2.0}, source="model.engine_kwargs")
    fleet = VllmFleet(folder, 1, config, tmp_path / "logs", python=fake)
    with caplog.at_level(logging.INFO, logger="polar.inference.vllm_launcher"), pytest.raises(VllmLaunchError):
        fleet.start()
    notes = [r.getMessage() for r in caplog.records if "still starting" in r.getMessage()]
    assert len(notes) >= 3
    assert notes[-1].startswith("vLLM replica 0 still starting (")
    assert notes[-1].endswith("Warming up model for the compilation...")
