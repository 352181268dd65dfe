"""Fixtures: the tiny preset built once per session, and an embedded engine over it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def tiny_pair() -> tuple[Any, Any]:
    from polar.inference.tiny import build_tiny

    return build_tiny(0)


@pytest.fixture(scope="session")
def engine(tiny_pair: tuple[Any, Any]) -> Iterator[Any]:
    """A shared embedded engine; tests that change weights build their own."""
    import asyncio

    from polar.inference.embedded import EmbeddedEngine

    eng = EmbeddedEngine(tiny_pair[0], tiny_pair[1], model_name="tiny")
    yield eng
    asyncio.run(eng.close())


def chat_prompt(tokenizer: Any, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    return tokenizer.encode(rendered, add_special_tokens=False)
