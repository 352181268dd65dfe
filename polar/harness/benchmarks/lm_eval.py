"""lm-eval-style task definitions over data on disk: ``tasks: {source: lm_eval, task: mytask.yaml}``.

The subset of the LM Evaluation Harness task YAML that a generative, exact-match task needs:

- ``dataset_path``: a local ``.jsonl`` / ``.json`` / ``.parquet`` file or a folder holding
  ``<split>.jsonl`` / ``<split>.parquet``; or ``json`` / ``parquet`` with
  ``dataset_kwargs: {data_files: {<split>: PATH}}`` (how lm-eval names local files). Relative paths resolve
  next to the task YAML. Hub names are refused: nothing downloads here.
- ``test_split`` (else ``validation_split``), ``doc_to_text`` and ``doc_to_target`` (a field name or a Jinja
  template such as ``"Question: {{question}}\\nAnswer:"``), ``target_delimiter``;
- ``output_type: generate_until`` with ``generation_kwargs: {until: [...], max_gen_toks: N}``;
- ``metric_list: [{metric: exact_match, ignore_case, ignore_punctuation, regexes_to_ignore}]``;
- ``filter_list``: ``regex`` (``regex_pattern``, ``group_select``, ``fallback``), ``take_first``,
  ``lowercase``, ``uppercase``, ``remove_whitespace``, ``strip``. The first filter pipeline scores.

Anything else (loglikelihood tasks, other metrics, ``!function`` hooks) is refused with its key named.
"""

from __future__ import annotations

import json
import re
import string
from pathlib import Path
from typing import Any

import yaml

from polar.errors import ConfigError, HarnessError

_KNOWN = {"task", "tag", "group", "dataset_path", "dataset_name", "dataset_kwargs", "test_split", "validation_split",
          "training_split", "fewshot_split", "doc_to_text", "doc_to_target", "target_delimiter", "output_type",
          "generation_kwargs", "metric_list", "filter_list", "num_fewshot", "metadata", "description",
          "should_decontaminate", "doc_to_decontamination_query", "repeats"}
_FILTERS = ("regex", "take_first", "lowercase", "uppercase", "remove_whitespace", "strip")


def _render(template: Any, doc: dict[str, Any], key: str) -> str:
    if isinstance(template, int):
        return str(template)
    if not isinstance(template, str):
        raise ConfigError(f"lm_eval task: {key} must be a field name or a Jinja template, got {type(template).__name__}")
    if template in doc:
        return str(doc[template])
    if "{{" not in template and "{%" not in template:
        raise ConfigError(f"lm_eval task: {key} {template!r} is neither a field of the documents "
                          f"({', '.join(sorted(doc))}) nor a Jinja template")
    import jinja2

    try:
        return jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(template).render(**doc)
    except jinja2.TemplateError as e:
        raise ConfigError(f"lm_eval task: {key} {template!r} does not render on a document: {e}") from None


def _read(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    text = path.read_text()
    if path.suffix == ".json" and text.lstrip().startswith("["):
        return json.loads(text)
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path}:{n}: not valid JSON ({e.msg})") from None
    return rows


def _data_file(task: dict[str, Any], split: str, base: Path) -> Path:
    dp = task.get("dataset_path")
    if not dp:
        raise ConfigError("lm_eval task: dataset_path is required (a local JSONL/Parquet file or folder)")
    files = (task.get("dataset_kwargs") or {}).get("data_files")
    if dp in ("json", "parquet"):
        if not isinstance(files, dict | str):
            raise ConfigError(f"lm_eval task: dataset_path {dp!r} needs dataset_kwargs.data_files (a path, or "
                              "{split: path})")
        rel = files if isinstance(files, str) else files.get(split)
        if rel is None:
            raise ConfigError(f"lm_eval task: dataset_kwargs.data_files has no split {split!r} ({', '.join(files)})")
        path = Path(rel if isinstance(rel, str) else rel[0])
    else:
        path = Path(dp)
    path = path if path.is_absolute() else base / path
    if path.is_dir():
        found = [path / f"{split}{ext}" for ext in (".jsonl", ".json", ".parquet") if (path / f"{split}{ext}").is_file()]
        if not found:
            raise ConfigError(f"lm_eval task: dataset_path {path} has no {split}.jsonl or {split}.parquet")
        path = found[0]
    if not path.is_file():
        raise ConfigError(f"lm_eval task: dataset_path {dp!r} is not a local file or folder ({path} does not exist); "
                          "hub datasets are not downloaded here: point it at a JSONL/Parquet file")
    return path


def load_task(path: Path) -> dict[str, Any]:
    try:
        task = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(task, dict):
        raise ConfigError(f"{path}: an lm-eval task is a mapping")
    from polar.config.base import did_you_mean

    for key in task:
        if key not in _KNOWN:
            raise ConfigError(f"{path}: unknown lm-eval task key {key!r}{did_you_mean(key, sorted(_KNOWN))}")
    if task.get("output_type", "generate_until") != "generate_until":
        raise ConfigError(f"{path}: output_type {task['output_type']!r} is not supported; only generate_until")
    for m in task.get("metric_list") or [{"metric": "exact_match"}]:
        if m.get("metric") != "exact_match":
            raise ConfigError(f"{path}: metric_list: metric {m.get('metric')!r} is not supported; only exact_match")
    for pipeline in task.get("filter_list") or []:
        for f in pipeline.get("filter", []):
            if f.get("function") not in _FILTERS:
                raise ConfigError(f"{path}: filter_list {pipeline.get('name', '?')}: filter {f.get('function')!r} "
                                  f"is not supported; use {', '.join(_FILTERS)}")
            if f.get("function") == "regex":
                try:
                    re.compile(f.get("regex_pattern", r"#### (\-?[0-9\.\,]+)"))
                except re.error as e:
                    raise ConfigError(f"{path}: filter regex_pattern is not a valid regex: {e}") from None
    return task


def tasks(spec: Any, config_dir: Path | None = None) -> list[dict[str, Any]]:
    path = Path(spec.task)
    if not path.is_absolute() and config_dir is not None and (config_dir / path).exists():
        path = config_dir / path
    if not path.is_file():
        raise ConfigError(f"tasks.task: lm-eval task file {spec.task!r} not found (looked next to the config)")
    task = load_task(path)
    split = spec.split or task.get("test_split") or task.get("validation_split")
    if not split:
        raise ConfigError(f"{path}: no test_split or validation_split; set one, or tasks.split")
    docs = _read(_data_file(task, split, path.parent))[: spec.limit]
    gen = task.get("generation_kwargs") or {}
    until = gen.get("until") or []
    until = [until] if isinstance(until, str) else list(until)
    metric = next(iter(task.get("metric_list") or [{}]))
    name = task.get("task", path.stem)
    out = []
    for i, doc in enumerate(docs):
        out.append({
            "id": f"{name}-{i}", "prompt": _render(task.get("doc_to_text", "text"), doc, "doc_to_text"),
            "answer": _render(task.get("doc_to_target", "target"), doc, "doc_to_target"),
            "max_tokens": min(spec.max_tokens, int(gen.get("max_gen_toks", spec.max_tokens))),
            "temperature": float(gen.get("temperature", spec.temperature)),
            **({"stop": until[:4]} if until else {}),
            "lm_eval": {"filters": (task.get("filter_list") or [{}])[0].get("filter", []),
                        "metric": {k: v for k, v in metric.items()
                                   if k in ("ignore_case", "ignore_punctuation", "regexes_to_ignore")}},
        })
    return out


def apply_filters(response: str, filters: list[dict[str, Any]]) -> str:
    """lm-eval's filter pipeline on one response (``take_first`` is a no-op on a single response)."""
    out = response
    for f in filters:
        fn = f.get("function")
        if fn == "regex":
            matches = re.findall(f.get("regex_pattern", r"#### (\-?[0-9\.\,]+)"), out)
            if matches:
                m = matches[int(f.get("group_select", 0))] if -len(matches) <= int(f.get("group_select", 0)) < len(matches) \
                    else matches[0]
                if isinstance(m, tuple):
                    m = next((x for x in m if x), m[0])
                out = m.strip()
            else:
                out = f.get("fallback", "[invalid]")
        elif fn == "lowercase":
            out = out.lower()
        elif fn == "uppercase":
            out = out.upper()
        elif fn == "remove_whitespace":
            out = out.lstrip()
        elif fn == "strip":
            out = out.strip()
    return out


def exact_match(prediction: str, reference: str, ignore_case: bool = False, ignore_punctuation: bool = False,
                regexes_to_ignore: list[str] | None = None) -> float:
    """HF ``evaluate``'s exact_match, as lm-eval calls it."""
    for pattern in regexes_to_ignore or []:
        prediction, reference = re.sub(pattern, "", prediction), re.sub(pattern, "", reference)
    if ignore_case:
        prediction, reference = prediction.lower(), reference.lower()
    if ignore_punctuation:
        table = str.maketrans("", "", string.punctuation)
        prediction, reference = prediction.translate(table), reference.translate(table)
    return float(prediction == reference)


def verify(task: dict[str, Any], output: str) -> dict[str, Any]:
    """Verifier ``lm_eval``: the task's filters on the answer, then exact_match with its options."""
    spec = task.get("lm_eval")
    if spec is None:
        raise HarnessError("verifier lm_eval needs tasks from tasks: {source: lm_eval, task: FILE.yaml}")
    filtered = apply_filters(output, spec["filters"])
    score = exact_match(filtered, str(task["answer"]), **spec["metric"])
    return {"reward": score, "filtered": filtered, "expected": task["answer"]}
