"""``polar export``: a run's checkpoint as an ONNX or TorchScript graph plus a manifest, checked for parity.

The graph (``polar.deploy.graph.PolicyGraph``) has observation normalisation, action sampling from given
noise, Box clipping and SAC's squash-and-scale inside, so the file alone turns raw observations into env
actions. Before an export is moved into place it is loaded with the same runner the server uses and run on
``samples`` observations recorded by the policy in its own env (with the recurrent states met on the way);
every output must match the eager policy within ``PARITY_TOL`` (relative to max(1, |x|)), or nothing is
written. ``--quantize int8`` adds a dynamically quantised copy (onnxruntime) and reports how far its actions
move; that copy is what the manifest then serves.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import shutil
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import torch

from polar.config.multi_agent import PettingZooHarnessConfig
from polar.deploy.graph import GraphSpec, PolicyGraph
from polar.deploy.runtime import (
    MANIFEST,
    MANIFEST_FORMAT,
    OnnxRunner,
    Runner,
    TorchRunner,
    _first_line,
    load_export,
)
from polar.errors import CheckpointError, DeployError

if TYPE_CHECKING:
    from polar.agents import State
    from polar.config.run import EnvRunConfig
    from polar.models.policy import Policy
    from polar.trainers.run_dir import RunDir

    # (run_dir, cfg, policy, checkpoint path, checkpoint state)
    LoadedRun = tuple[RunDir, EnvRunConfig, Policy, Path, dict[str, Any]]

log = logging.getLogger(__name__)

PARITY_TOL = 1e-5
FORMATS = ("onnx", "torchscript")
FILES = {"onnx": "model.onnx", "torchscript": "model.ts"}
INT8_FILE = "model.int8.onnx"
OPSET = 17


# ---------------------------------------------------------------------------------------------- loading
def _resolve(target: str | Path, checkpoint: int | None, trust_code: bool) -> tuple[RunDir, EnvRunConfig, Path | None]:
    """(run_dir, cfg, checkpoint file or None for the latest) of an env run; agent runs and untrusted code are
    refused."""
    from polar.config.run import EnvRunConfig
    from polar.config.trust import require_trust
    from polar.trainers.checkpoint import CheckpointManager
    from polar.trainers.loading import resolve_target

    run_dir, cfg, ckpt = resolve_target(Path(target))
    require_trust(cfg, f"run {run_dir.path}", trust_code)
    if not isinstance(cfg, EnvRunConfig):
        raise DeployError(f"{run_dir.path} is an LLM agent run (policy.type {cfg.policy.type}); polar export exports "
                          "env policies (ppo, appo, dqn, sac). Its checkpoint holds Hugging Face weights: serve them "
                          "with `polar gateway` or vLLM")
    if checkpoint is not None:
        if ckpt is not None:
            raise DeployError("--checkpoint: give a run directory with --checkpoint N, or a checkpoint file, not both")
        manager = CheckpointManager(run_dir.checkpoints_dir)
        ckpt = run_dir.checkpoints_dir / f"ckpt_{checkpoint:08d}.pt"
        if not ckpt.is_file():
            have = ", ".join(p.stem.removeprefix("ckpt_").lstrip("0") or "0" for p in manager.all()) or "none"
            raise CheckpointError(f"--checkpoint {checkpoint}: {run_dir.path} has no {ckpt.name} (iterations "
                                  f"checkpointed: {have})")
    return run_dir, cfg, ckpt


def load_run_policy(target: str | Path, checkpoint: int | None = None, trust_code: bool = False) -> LoadedRun:
    """(run_dir, cfg, policy, checkpoint_path, state) for a single-policy run directory (its latest checkpoint, or
    ``ckpt_<checkpoint>``) or a checkpoint file inside one. A run whose config names code (a custom agent, env
    or connector) is refused unless ``trust_code``; a multi-agent run has one policy per id
    (``export_multi_agent``)."""
    from polar.trainers.loading import load_policy_for_eval

    run_dir, cfg, ckpt = _resolve(target, checkpoint, trust_code)
    if cfg.harness.type == "pettingzoo":
        raise DeployError(f"{run_dir.path} is a multi-agent run (harness.type pettingzoo): it has one policy per "
                          "policy id; export them all with polar export (one folder each)")
    loaded: LoadedRun = load_policy_for_eval(Path(target) if ckpt is None else ckpt)
    return loaded


def config_hash(run_dir: RunDir) -> str:
    return "sha256:" + hashlib.sha256(run_dir.config_path.read_bytes()).hexdigest()


def space_json(space: gym.Space) -> dict[str, Any]:
    """A JSON description of a Gymnasium space (what a client needs to build observations and read actions)."""
    if isinstance(space, gym.spaces.Dict):
        return {"type": "Dict", "spaces": {k: space_json(s) for k, s in space.spaces.items()}}
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "nvec": np.asarray(space.nvec).tolist()}
    if isinstance(space, gym.spaces.MultiBinary):
        return {"type": "MultiBinary", "n": np.asarray(space.n).tolist()}
    if isinstance(space, gym.spaces.Box):
        def bound(given: np.ndarray) -> list[float | None]:
            a = np.asarray(given, dtype=np.float64)
            return [None if not np.isfinite(x) else float(x) for x in a.reshape(-1)]
        return {"type": "Box", "shape": list(space.shape), "dtype": str(space.dtype),
                "low": bound(space.low), "high": bound(space.high)}
    return {"type": type(space).__name__}


# ---------------------------------------------------------------------------------------------- recording
@torch.inference_mode()
def record_observations(policy: Policy, graph: PolicyGraph, cfg: EnvRunConfig, samples: int = 1000, seed: int = 0,
                        num_envs: int = 32) -> dict[str, np.ndarray]:
    """``samples`` rows of graph inputs (observations, and the recurrent state before each step) met by
    ``policy`` sampling actions in its own env: what the parity check feeds both the export and the eager policy."""
    from polar.agents import check_act_output, reset_state
    from polar.harness import make_vector_env
    from polar.rollout.runner import obs_to_tensor

    agent = policy.agent
    num_envs = max(1, min(num_envs, samples))
    env = make_vector_env(cfg.harness, num_envs, seed=seed, config_dir=cfg.config_dir)
    rows: dict[str, list[np.ndarray]] = {t.name: [] for t in graph.spec.inputs if t.name != "noise"}
    try:
        space = env.single_action_space
        obs, _ = env.reset(seed=seed)
        state = agent.get_initial_state(num_envs)
        initial = agent.get_initial_state(num_envs)
        steps = -(-samples // num_envs)
        for _ in range(steps):
            feeds = graph_obs_feeds(graph.spec, obs)
            for name, arr in feeds.items():
                rows[name].append(arr)
            for s, t in zip(graph.spec.state, _tensors(state), strict=True):
                rows[s["input"]].append(t.float().numpy().copy())
            action, state, _ = policy.act(obs_to_tensor(obs), state, False)
            act = check_act_output(agent, action, num_envs, space)
            if isinstance(space, gym.spaces.Box):
                act = np.clip(act, space.low, space.high)
            obs, _, term, trunc, _ = env.step(act)
            done = np.logical_or(term, trunc)
            if state is not None and done.any():
                state = reset_state(state, initial, torch.from_numpy(done))
    finally:
        env.close()
    return {k: np.concatenate(v)[:samples] for k, v in rows.items()}


def graph_obs_feeds(spec: GraphSpec, obs: np.ndarray | dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Observation batch(es) as the graph's observation inputs, in their dtypes."""
    if spec.obs_keys is None:
        t = spec.inputs[0]
        return {t.name: np.asarray(obs).astype(t.dtype, copy=True)}
    return {f"obs.{k}": np.asarray(obs[k]).astype(spec.require(f"obs.{k}").dtype, copy=True) for k in spec.obs_keys}


def _tensors(state: State) -> list[torch.Tensor]:
    if state is None:
        return []
    return [state] if isinstance(state, torch.Tensor) else list(state)


# ---------------------------------------------------------------------------------------------- tracing
@contextlib.contextmanager
def _tracing(agent_name: str) -> Iterator[None]:
    """Tracer warnings become errors (a trace that hard-codes a Python value is wrong for other inputs), and
    every failure is one ``DeployError`` that names the agent."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("error", torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning, module=r"torch\.")  # its own checks
        try:
            yield
        except DeployError:
            raise
        except Exception as e:
            cause: BaseException | None = e
            while cause is not None and not isinstance(cause, torch.jit.TracerWarning):
                cause = cause.__cause__ or cause.__context__
            if cause is not None:  # raised inside a C++ conversion, it arrives wrapped in a SystemError
                raise DeployError(
                    f"cannot export {agent_name}: its act() turns a tensor into a Python value or numpy array "
                    f"({_first_line(cause)}), so a traced graph would hard-code it for every input. Keep act() in "
                    "torch operations (no .item(), .numpy(), float(tensor) or branches on tensor values)") from None
            raise DeployError(f"cannot export {agent_name}: tracing its act() failed: {_first_line(e)}. Keep act() in "
                              "torch operations on its inputs, or export a built-in agent") from None


def trace_onnx(graph: PolicyGraph, f: str | IO[bytes]) -> None:
    """Write ``graph`` as ONNX (TorchScript-based exporter, dynamic batch) to a path or a binary file."""
    spec = graph.spec
    names = [t.name for t in spec.inputs] + [t.name for t in spec.outputs]
    with _tracing(type(graph.policy.agent).__name__):
        torch.onnx.export(graph, graph.example_inputs(2), f, dynamo=False, opset_version=OPSET,
                          input_names=[t.name for t in spec.inputs], output_names=[t.name for t in spec.outputs],
                          dynamic_axes={n: {0: "batch"} for n in names})


def onnx_bytes(graph: PolicyGraph) -> bytes:
    buf = io.BytesIO()
    trace_onnx(graph, buf)
    return buf.getvalue()


def trace_torchscript(graph: PolicyGraph, path: Path) -> None:
    with _tracing(type(graph.policy.agent).__name__):
        traced = torch.jit.trace(graph, graph.example_inputs(2), check_trace=False)
        torch.jit.save(traced, str(path))


def graph_runner(graph: PolicyGraph, backend: str, threads: int = 1) -> Runner:
    """The in-memory graph of a checkpoint as a runner (``polar serve RUN_DIR``)."""
    if backend == "torch":
        return TorchRunner(graph.spec, graph, "pytorch")
    return OnnxRunner(graph.spec, onnx_bytes(graph), threads)


# ---------------------------------------------------------------------------------------------- parity
def noise_for(spec: GraphSpec, batch: int, rng: np.random.Generator | None) -> np.ndarray | None:
    """The ``noise`` input: zeros (deterministic) or samples of the graph's noise distribution."""
    if spec.noise is None:
        return None
    shape = (batch, spec.noise["width"])
    if rng is None:
        return np.zeros(shape, np.float32)
    if spec.noise["distribution"] == "gumbel":
        return rng.gumbel(size=shape).astype(np.float32)
    return rng.standard_normal(shape).astype(np.float32)


@torch.inference_mode()
def eager_deterministic(policy: Policy, spec: GraphSpec, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The eager policy's own deterministic step (``policy.act``, then clipping as evaluation does)."""
    from polar.agents import check_act_output

    agent = policy.agent
    batch = len(next(iter(feeds.values())))
    obs = (torch.from_numpy(feeds["obs"]) if spec.obs_keys is None
           else {k: torch.from_numpy(feeds[f"obs.{k}"]) for k in spec.obs_keys})
    state: State = None
    if spec.state:
        parts = tuple(torch.from_numpy(feeds[s["input"]]) for s in spec.state)
        state = parts[0] if isinstance(agent.get_initial_state(1), torch.Tensor) else parts
    action, new_state, info = policy.act(obs, state, True)
    act = check_act_output(agent, action, batch, agent.action_space)
    if isinstance(agent.action_space, gym.spaces.Box):
        act = np.clip(act, agent.action_space.low, agent.action_space.high)
    out: dict[str, np.ndarray] = {"action": act}
    v = info.get("values", info.get("value")) if isinstance(info, dict) else None
    if v is not None and any(t.name == "value" for t in spec.outputs):
        out["value"] = torch.as_tensor(v).reshape(batch, -1)[:, 0].numpy()
    for s, t in zip(spec.state, _tensors(new_state), strict=True):
        out[s["output"]] = t.float().numpy()
    return out


def compare(got: dict[str, np.ndarray], want: dict[str, np.ndarray], spec: GraphSpec) -> dict[str, Any]:
    """Per output: the largest |got - want| / max(1, |want|), or for integer actions the rows that differ."""
    out: dict[str, Any] = {}
    for name, w in want.items():
        g = np.asarray(got[name])
        w = np.asarray(w)
        if g.shape != w.shape:
            g = g.reshape(w.shape)
        if np.issubdtype(w.dtype, np.integer) or np.issubdtype(g.dtype, np.integer):
            differ = (g.reshape(len(g), -1) != w.reshape(len(w), -1)).any(-1)
            out[name] = {"rows_differ": int(differ.sum()), "agreement": float(1 - differ.mean())}
        else:
            with np.errstate(invalid="ignore"):
                d = np.abs(g.astype(np.float64) - w.astype(np.float64))
            d[g == w] = 0.0  # the same infinity (a masked-out action's -inf logit) is no difference
            rel = d / np.maximum(1.0, np.abs(w.astype(np.float64)))
            rel[g == w] = 0.0
            out[name] = {"max_abs": float(d.max(initial=0.0)), "mean_abs": float(d.mean()) if d.size else 0.0,
                         "max_rel": float(rel.max(initial=0.0))}
    return out


def _violations(report: dict[str, Any], tol: float) -> list[str]:
    bad: list[str] = []
    for name, r in report.items():
        if r.get("rows_differ"):
            bad.append(f"{name}: {r['rows_differ']} rows differ")
        elif "max_rel" in r and not r["max_rel"] <= tol:
            bad.append(f"{name}: max |delta| {r['max_abs']:.3g} (relative {r['max_rel']:.3g}) > {tol:g}")
    return bad


def check_parity(runner: Runner, graph: PolicyGraph, policy: Policy, feeds: dict[str, np.ndarray],
                 seed: int = 0) -> dict[str, Any]:
    """The export against the eager policy on recorded inputs: deterministic (zero noise) against
    ``policy.act``, and every output, deterministic and with the same sampled noise, against the eager graph."""
    spec = graph.spec
    batch = len(next(iter(feeds.values())))
    zero: dict[str, Any] = dict(feeds)
    sampled: dict[str, Any] = dict(feeds)
    if spec.noise is not None:
        zero["noise"] = noise_for(spec, batch, None)
        sampled["noise"] = noise_for(spec, batch, np.random.default_rng(seed))
    eager_graph = TorchRunner(spec, graph, "pytorch")
    exported_zero = runner.run(zero)
    report: dict[str, Any] = {"samples": batch,
              "vs_policy_act": compare(exported_zero, eager_deterministic(policy, spec, zero), spec),
              "deterministic": compare(exported_zero, eager_graph.run(zero), spec)}
    if spec.noise is not None:
        report["sampled"] = compare(runner.run(sampled), eager_graph.run(sampled), spec)
    return report


def parity_failures(report: dict[str, Any], tol: float = PARITY_TOL) -> list[str]:
    return [f"{part}/{v}" for part in ("vs_policy_act", "deterministic", "sampled") if part in report
            for v in _violations(report[part], tol)]


def int8_delta(runner: Runner, fp32: Runner, policy: Policy, graph: PolicyGraph,
               feeds: dict[str, np.ndarray]) -> dict[str, Any]:
    """How far the int8 graph moves from the fp32 one and from the eager policy (reported, not enforced)."""
    spec = graph.spec
    batch = len(next(iter(feeds.values())))
    zero: dict[str, Any] = dict(feeds)
    if spec.noise is not None:
        zero["noise"] = noise_for(spec, batch, None)
    q = runner.run(zero)
    report: dict[str, Any] = {"vs_policy_act": compare(q, eager_deterministic(policy, spec, zero), spec),
              "vs_fp32": compare(q, fp32.run(zero), spec)}
    act = report["vs_policy_act"].get("action", {})
    report["action_agreement" if "agreement" in act else "action_max_abs_delta"] = (
        act.get("agreement") if "agreement" in act else act.get("max_abs"))
    return report


def quantize_int8(src: Path, dst: Path) -> None:
    try:
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError:
        raise DeployError("--quantize int8 needs onnxruntime (pip install 'polar-rl[deploy]')") from None
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)  # onnxruntime.quantization logs advice on the root logger
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            quantize_dynamic(str(src), str(dst), weight_type=QuantType.QUInt8)
        except Exception as e:
            raise DeployError(f"--quantize int8: onnxruntime could not quantise {src.name}: {_first_line(e)}") from None
        finally:
            logging.disable(previous)


# ---------------------------------------------------------------------------------------------- export
def export_run(target: str | Path, out: str | Path, fmt: str = "onnx", checkpoint: int | None = None,
               quantize: str | None = None, samples: int = 1000, seed: int = 0,
               tolerance: float = PARITY_TOL, trust_code: bool = False) -> dict[str, Any]:
    """Export a run's checkpoint into ``out`` (see the module docstring); returns the manifest written.
    ``trust_code``: the run's config may name code (a custom agent or env), which exporting imports."""
    if fmt not in FORMATS:
        raise DeployError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if quantize not in (None, "int8"):
        raise DeployError(f"--quantize {quantize!r}: only int8 is supported")
    if quantize and fmt != "onnx":
        raise DeployError("--quantize int8 needs --format onnx (dynamic quantisation is done by onnxruntime)")
    if samples < 1:
        raise DeployError(f"--samples must be at least 1 (got {samples})")
    out = Path(out)
    if out.exists() and not _replaceable(out):
        raise DeployError(f"--out {out} already holds files that are not a polar export; choose a new directory")
    run_dir, cfg, ckpt = _resolve(target, checkpoint, trust_code)
    if isinstance(cfg.harness, PettingZooHarnessConfig):
        return export_multi_agent(run_dir, cfg, ckpt, out, fmt, quantize, samples, seed, tolerance)
    run_dir, cfg, policy, ckpt, state = load_run_policy(target, checkpoint, trust_code)
    policy.eval()
    graph = PolicyGraph(policy).eval()
    feeds = record_observations(policy, graph, cfg, samples, seed)
    manifest = write_export(policy, graph, feeds, out, fmt, quantize, seed, tolerance,
                            _manifest_head(run_dir, cfg, ckpt, state, fmt, quantize, cfg.name))
    log.info("exported %s (%s) to %s", ckpt.name, fmt, out)
    return manifest


def _manifest_head(run_dir: RunDir, cfg: EnvRunConfig, ckpt: Path, state: dict[str, Any], fmt: str,
                   quantize: str | None, name: str) -> dict[str, Any]:
    from polar import __version__

    return {
        "manifest_format": MANIFEST_FORMAT,
        "name": name,
        "version": str(int(state.get("iteration", 0))),
        "format": fmt,
        "file": FILES[fmt],
        "quantize": quantize,
        "polar_version": __version__,
        "created": time.time(),
        "run": {"path": str(run_dir.path.resolve()), "config_hash": config_hash(run_dir), "checkpoint": ckpt.name,
                "iteration": int(state.get("iteration", 0)), "env_steps": int(state.get("env_steps", 0)),
                "policy_version": int(state.get("policy_version", 0)), "algorithm": cfg.policy.type},
    }


def write_export(policy: Policy, graph: PolicyGraph, feeds: dict[str, np.ndarray], out: Path, fmt: str,
                 quantize: str | None, seed: int, tolerance: float, head: dict[str, Any]) -> dict[str, Any]:
    """Trace ``graph`` into a temporary folder beside ``out``, check it against ``policy`` on ``feeds``, and move
    it into place only when every output matches; returns the manifest written."""
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        model = tmp / FILES[fmt]
        if fmt == "onnx":
            trace_onnx(graph, str(model))
        else:
            trace_torchscript(graph, model)
        manifest: dict[str, Any] = {
            **head,
            "run": {**head["run"], "agent": type(policy.agent).__name__},
            "observation_space": space_json(policy.agent.observation_space),
            "action_space": space_json(policy.agent.action_space),
            "recurrent_state": [{"input": s["input"], "output": s["output"], "shape": s["shape"], "dtype": "float32"}
                                for s in graph.spec.state],
            "graph": graph.spec.to_json(),
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
        runner, _ = load_export(tmp, trust_code=True)  # the file this process just traced
        report = check_parity(runner, graph, policy, feeds, seed)
        report["tolerance"] = tolerance
        failures = parity_failures(report, tolerance)
        if failures:
            raise DeployError(f"parity check failed for {type(policy.agent).__name__} ({fmt}) on {report['samples']} "
                              f"recorded observations: {'; '.join(failures[:4])}; nothing was written to {out}")
        manifest["parity"] = report
        if quantize:
            quantize_int8(model, tmp / INT8_FILE)
            manifest["fp32_file"] = manifest["file"]
            manifest["file"] = INT8_FILE
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
            q_runner, _ = load_export(tmp)
            manifest["int8"] = int8_delta(q_runner, runner, policy, graph, feeds)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
        _move_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def export_multi_agent(run_dir: RunDir, cfg: EnvRunConfig, ckpt: Path | None, out: Path, fmt: str,
                       quantize: str | None, samples: int, seed: int, tolerance: float) -> dict[str, Any]:
    """A PettingZoo run: one export per policy id, ``out/<policy id>/`` (each one servable by ``polar serve``),
    checked on observations its agents met in games of the run's policies; returns ``{"policies": {id: manifest}}``."""
    from polar.rollout.backends.multi_agent import record_policy_observations
    from polar.trainers.checkpoint import CheckpointManager, load_checkpoint
    from polar.trainers.multi_agent import load_multi_agent_policies

    if ckpt is None:
        ckpt = CheckpointManager(run_dir.checkpoints_dir).latest()
        if ckpt is None:
            raise CheckpointError(f"{run_dir.path} has no checkpoint yet; nothing to export")
    state = load_checkpoint(ckpt)
    policies, mapping, _pool = load_multi_agent_policies(cfg, state)
    assert isinstance(cfg.harness, PettingZooHarnessConfig)
    observed = record_policy_observations(cfg.harness, policies, mapping, samples, seed, cfg.config_dir)
    manifests: dict[str, Any] = {}
    for pid, policy in policies.items():
        graph = PolicyGraph(policy).eval()
        feeds = graph_obs_feeds(graph.spec, observed[pid])
        head = _manifest_head(run_dir, cfg, ckpt, state, fmt, quantize, f"{cfg.name}.{pid}")
        head["policy_id"] = pid
        head["agents"] = sorted(a for a, p in mapping.items() if p == pid)
        manifests[pid] = write_export(policy, graph, feeds, out / pid, fmt, quantize, seed, tolerance, head)
        log.info("exported policy %s of %s (%s) to %s", pid, ckpt.name, fmt, out / pid)
    return {"name": cfg.name, "format": fmt, "policies": manifests}


def _replaceable(out: Path) -> bool:
    """``out`` may be written over: an empty folder, a polar export, or a multi-agent export (export folders)."""
    if not out.is_dir():
        return False
    entries = [e for e in out.iterdir() if not e.name.startswith(".")]
    return (out / MANIFEST).is_file() or all(e.is_dir() and (e / MANIFEST).is_file() for e in entries)


def _move_into_place(tmp: Path, out: Path) -> None:
    """Replace ``out`` by ``tmp`` with renames, so a server watching the parent never sees half an export."""
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        os.replace(out, old)
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
