"""Run an exported (or in-memory) policy graph: onnxruntime for ONNX, torch for TorchScript and the eager graph.

One ``Runner`` interface for all three (``run(feeds) -> outputs``, numpy in and out), so the parity check of
``polar export`` and the server call exactly the same code path.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

from polar.deploy.graph import GraphSpec
from polar.errors import DeployError

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1


class Runner:
    """A loaded graph. ``run`` takes every input of ``spec`` by name and returns every output by name."""

    backend = "?"
    platform = "?"

    def __init__(self, spec: GraphSpec) -> None:
        self.spec = spec

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class OnnxRunner(Runner):
    backend = "onnxruntime"
    platform = "onnxruntime_onnx"

    def __init__(self, spec: GraphSpec, model: str | Path | bytes, threads: int = 1) -> None:
        super().__init__(spec)
        ort = import_onnxruntime()
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        src = model if isinstance(model, bytes) else str(model)
        try:
            self.session = ort.InferenceSession(src, opts, providers=["CPUExecutionProvider"])
        except Exception as e:
            where = "the in-memory graph" if isinstance(model, bytes) else str(model)
            raise DeployError(f"onnxruntime cannot load {where}: {_first_line(e)}") from None
        self.output_names = [t.name for t in spec.outputs]
        have = {i.name for i in self.session.get_inputs()}
        missing = [t.name for t in spec.inputs if t.name not in have]
        if missing:
            raise DeployError(f"the ONNX graph lacks inputs {missing} that its manifest lists; re-export it")

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        outs = self.session.run(self.output_names, {t.name: feeds[t.name] for t in self.spec.inputs})
        return dict(zip(self.output_names, outs, strict=True))


class TorchRunner(Runner):
    """A TorchScript file, or the eager ``PolicyGraph`` itself (``polar serve RUN_DIR --backend torch``)."""

    backend = "torch"

    def __init__(self, spec: GraphSpec, module: torch.nn.Module, platform: str) -> None:
        super().__init__(spec)
        self.module = module.eval()
        self.platform = platform

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        args = [torch.from_numpy(np.ascontiguousarray(feeds[t.name])) for t in self.spec.inputs]
        with torch.inference_mode():
            outs = self.module(*args)
        return {t.name: o.detach().numpy() for t, o in zip(self.spec.outputs, outs, strict=True)}


def import_onnxruntime() -> ModuleType:
    try:
        import onnxruntime
    except ImportError:
        raise DeployError("onnxruntime is not installed; pip install 'polar-rl[deploy]' (onnx, onnxruntime)") from None
    return onnxruntime


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300]}" if text else type(e).__name__


def read_manifest(export_dir: Path) -> dict[str, Any]:
    """The manifest of an export directory, checked for the keys the server needs; a ``DeployError`` names the
    file and what is wrong."""
    path = Path(export_dir) / MANIFEST
    if not path.is_file():
        raise DeployError(f"{export_dir} is not a polar export (no {MANIFEST}); write one with `polar export`")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise DeployError(f"{path} is not readable JSON ({_first_line(e)}); re-export it") from None
    if not isinstance(manifest, dict):
        raise DeployError(f"{path} must hold a JSON object; re-export it")
    missing = [k for k in ("format", "file", "version", "name", "graph") if k not in manifest]
    if missing:
        raise DeployError(f"{path} lacks {missing}; it was not written by `polar export`")
    if manifest.get("manifest_format") != MANIFEST_FORMAT:
        raise DeployError(f"{path}: manifest_format {manifest.get('manifest_format')!r} is not {MANIFEST_FORMAT}, the "
                          "one this polar reads; re-export it with this polar")
    try:
        GraphSpec.from_json(manifest["graph"])
    except (TypeError, KeyError) as e:
        raise DeployError(f"{path}: 'graph' is malformed ({_first_line(e)}); re-export it") from None
    return manifest


def load_export(export_dir: str | Path, threads: int = 1, trust_code: bool = False) -> tuple[Runner, dict[str, Any]]:
    """(runner, manifest) of an export directory, loaded and checked with one inference on zeros.

    A TorchScript file is a program (it can read and write files when run), so it loads only with
    ``trust_code``; an ONNX graph is data for onnxruntime."""
    export_dir = Path(export_dir)
    manifest = read_manifest(export_dir)
    spec = GraphSpec.from_json(manifest["graph"])
    model = export_dir / manifest["file"]
    if not model.is_file():
        raise DeployError(f"{export_dir}: the manifest names {manifest['file']!r}, which is missing; re-export it")
    if manifest["format"] == "onnx":
        runner: Runner = OnnxRunner(spec, model, threads)
    elif manifest["format"] == "torchscript":
        if not trust_code:
            raise DeployError(f"{export_dir} is a TorchScript export: TorchScript is a program that runs with this "
                              "process's rights, not data. Pass --trust-code if you trust who wrote it, or export "
                              "the run as ONNX (the default format)")
        try:
            module = torch.jit.load(str(model), map_location="cpu")
        except Exception as e:
            raise DeployError(f"torch cannot load the TorchScript file {model}: {_first_line(e)}") from None
        runner = TorchRunner(spec, module, "pytorch_torchscript")
    else:
        raise DeployError(f"{export_dir}/{MANIFEST}: format {manifest['format']!r} is not 'onnx' or 'torchscript'")
    smoke_test(runner, str(export_dir))
    return runner, manifest


def zeros_feeds(spec: GraphSpec, batch: int) -> dict[str, np.ndarray]:
    return {t.name: np.zeros([batch if d == -1 else d for d in t.shape], dtype=t.dtype) for t in spec.inputs}


def smoke_test(runner: Runner, where: str) -> None:
    """One inference on zeros: a graph that loads but cannot run, or answers in the wrong shapes, is refused
    here, before it serves a request."""
    try:
        outs = runner.run(zeros_feeds(runner.spec, 2))
    except Exception as e:
        raise DeployError(f"{where}: the graph loads but fails on a test input: {_first_line(e)}") from None
    for t in runner.spec.outputs:
        got = outs.get(t.name)
        want = [2 if d == -1 else d for d in t.shape]
        if got is None or list(got.shape) != want:
            shape = None if got is None else list(got.shape)
            raise DeployError(f"{where}: output {t.name!r} has shape {shape}, its manifest says {t.shape}; re-export it")
