"""Benchmark-only: record the wall time of the first CartPole reset in any Python process.

``benchmarks/ray_scaling.py`` puts this directory on PYTHONPATH of the polar runs it starts, with
POLAR_BENCH_FIRST_STEP_FILE set; every process (driver, Ray actors, forkserver workers) that
imports Gymnasium's CartPole then writes ``<file>.<pid>`` once. Inert without the variable.
"""

import os

_path = os.environ.get("POLAR_BENCH_FIRST_STEP_FILE")
if _path:
    import builtins
    import time

    _orig_import = builtins.__import__
    _done = {"patched": False}

    def _patch():
        from gymnasium.envs.classic_control import cartpole

        orig_reset = cartpole.CartPoleEnv.reset

        def reset(self, *args, **kwargs):
            try:
                fd = os.open(f"{_path}.{os.getpid()}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                with os.fdopen(fd, "w") as f:
                    f.write(repr(time.time()))
            except FileExistsError:
                pass
            return orig_reset(self, *args, **kwargs)

        cartpole.CartPoleEnv.reset = reset

    def _import(name, *args, **kwargs):
        mod = _orig_import(name, *args, **kwargs)
        if (not _done["patched"] and name == "gymnasium"
                and not getattr(getattr(mod, "__spec__", None), "_initializing", False)):
            _done["patched"] = True
            builtins.__import__ = _orig_import
            _patch()
        return mod

    builtins.__import__ = _import
