"""The FrozenLake shaping functions of ``examples/llm_frozenlake_shaping.py``, importable next to these configs
(a config's ``module:function`` is looked up in the config's own folder)."""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "_examples_llm_frozenlake_shaping", Path(__file__).resolve().parents[2] / "examples" / "llm_frozenlake_shaping.py")
assert _spec is not None and _spec.loader is not None
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)

progress = _module.progress
progress_no_bumps = _module.progress_no_bumps
progress_lost_in_holes = _module.progress_lost_in_holes
