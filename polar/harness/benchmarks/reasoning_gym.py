"""reasoning-gym (``reasoning-gym==0.1.25``) as a polar harness: any of its procedural datasets.

- tasks: ``{source: reasoning_gym, name: chain_sum, size: 500, seed: 0, config: {...}, curriculum: {...}}``
  builds ``reasoning_gym.create_dataset(name, size=size, seed=seed, **config)``; item ``i`` is generated
  from seed ``seed + i``, so train and held-out splits are disjoint when their seed ranges are (the run
  config refuses overlapping ranges). ``curriculum`` sets the dataset's curriculum levels per attribute
  (``reasoning_gym.factory.create_curriculum``), e.g. ``{num_terms: 0, num_digits: 1}``;
- harness: the one-call chat harness (:mod:`polar.harness.benchmarks.chat`);
- verifier: ``reasoning_gym`` (:func:`verify`): the dataset's own ``score_answer`` on the answer, which is
  the last non-empty line of the reply unless ``answer_pattern`` says otherwise (partial credit as the
  dataset gives it; ``exact: true`` rounds it down to 0/1).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from polar.errors import ConfigError, HarnessError
from polar.harness.agent.verifiers import final_answer


def _rg() -> Any:
    try:
        import reasoning_gym.factory as factory
    except ImportError:
        raise ConfigError("tasks source reasoning_gym needs the reasoning-gym package: pip install "
                          "'polar[benchmarks]' (reasoning-gym==0.1.25)") from None
    return factory


def dataset(spec: Any) -> Any:
    """The reasoning-gym dataset a ``{source: reasoning_gym}`` spec names, with its curriculum applied."""
    from polar.config.base import did_you_mean

    factory = _rg()
    if spec.name not in factory.DATASETS:
        raise ConfigError(f"tasks.name: reasoning-gym has no dataset {spec.name!r}"
                          f"{did_you_mean(spec.name, list(factory.DATASETS))}")
    kwargs = dict(spec.config)
    if spec.curriculum:
        if not factory.has_curriculum(spec.name):
            raise ConfigError(f"tasks.curriculum: reasoning-gym dataset {spec.name!r} has no curriculum; use config")
        curriculum = factory.create_curriculum(spec.name)
        for attr, level in spec.curriculum.items():
            if attr not in curriculum.attributes:
                raise ConfigError(f"tasks.curriculum.{attr}: {spec.name!r} has no curriculum attribute {attr!r}"
                                  f"{did_you_mean(attr, list(curriculum.attributes))}; it has "
                                  f"{', '.join(curriculum.attributes)}")
            levels = curriculum.attributes[attr].levels
            if not 0 <= level < len(levels):
                raise ConfigError(f"tasks.curriculum.{attr}: level {level} is out of range 0..{len(levels) - 1}")
            curriculum.set_attr_level(attr, level)
        generated = dataclasses.asdict(curriculum.generate_configuration({"seed": spec.seed, "size": spec.size}))
        kwargs = {**generated, **kwargs}
    kwargs.update(seed=spec.seed, size=spec.size)
    try:
        return factory.create_dataset(spec.name, **kwargs)
    except (TypeError, ValueError, AssertionError) as e:
        raise ConfigError(f"tasks.config for reasoning-gym {spec.name!r} is not valid: {e}") from None


def _json_safe(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def tasks(spec: Any) -> list[dict[str, Any]]:
    ds = dataset(spec)
    out = []
    for i in range(spec.size):
        item = ds[i]
        out.append({
            "id": f"{spec.name}-{spec.seed + i}", "prompt": item["question"] + spec.prompt_suffix,
            "answer": str(item["answer"]), "rg_dataset": spec.name, "rg_entry": _json_safe(item),
            "max_tokens": spec.max_tokens, "temperature": spec.temperature,
            **({"system_prompt": spec.system_prompt} if spec.system_prompt else {}),
        })
    return out


def verify(task: dict[str, Any], output: str, answer_pattern: str | None = None, exact: bool = False) -> dict[str, Any]:
    """Verifier ``reasoning_gym``: the dataset's ``score_answer(answer, entry)``."""
    if "rg_dataset" not in task or "rg_entry" not in task:
        raise HarnessError("verifier reasoning_gym needs tasks from tasks: {source: reasoning_gym, ...}")
    score_fn = _rg().get_score_answer_fn(task["rg_dataset"])
    got = final_answer(output, answer_pattern)
    score = float(score_fn(got, task["rg_entry"])) if got is not None else 0.0
    reward = float(score >= 1.0) if exact else score
    return {"reward": reward, "score": score, "got": got, "expected": task.get("answer")}
