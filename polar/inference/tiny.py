"""The ``tiny`` preset: a tiny randomly initialised Qwen2-style chat model with a real tokenizer.

Nothing is downloaded. The tokenizer is a byte-level BPE trained in well under a second on a built-in,
deterministic corpus, with ChatML/Hermes special tokens and a Qwen2.5-style Jinja chat template
(system, user, assistant with ``tool_calls``, ``tool`` results, tools listed in the system prompt).
Weights come from a fixed seed, so every process builds the same model. It exists for tests and demos:
its outputs are gibberish, but every id and logprob it produces is real.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import torch

from polar.inference.templates import hermes_tools_template

TINY_VOCAB_SIZE = 1024
TINY_CONTEXT_LENGTH = 4096

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Added but not "special" (as in Qwen2.5): they survive decode(skip_special_tokens=True), so tool-call
# parsers see them in the text.
MARKUP_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."

# The built-in Hermes tools template (polar.inference.templates), with this preset's default system prompt.
CHAT_TEMPLATE = hermes_tools_template(DEFAULT_SYSTEM_PROMPT)


def _corpus() -> list[str]:
    """A small deterministic corpus: chat, code, JSON tool calls, numbers. Order matters for BPE ties."""
    words = (
        "the a an of to in and or is are was be it this that for on with as by at from you your we our "
        "hello hi thanks please help assistant user system tool function call result answer question "
        "what which how why when where who can could would should will do does did done make get set "
        "read write file files path directory list search find run command test tests error errors fix "
        "code python json name arguments value values key keys type string number integer boolean object "
        "array true false null none return def class import self print if else elif for while try except "
        "weather city temperature today tomorrow sunny rain cloudy add subtract multiply sum total count "
        "one two three four five six seven eight nine ten yes no ok sure here is the result done"
    ).split()
    lines: list[str] = []
    for i, w in enumerate(words):
        lines.append(f"{w} {words[(i * 7 + 3) % len(words)]} {words[(i * 13 + 5) % len(words)]}.")
        lines.append(f"{w.capitalize()}, {words[(i * 11 + 1) % len(words)]}? {i} {i * 37 % 1000}")
    for i in range(40):
        args = {"city": words[i % len(words)], "n": i, "flag": i % 2 == 0}
        lines.append(json.dumps({"name": f"get_{words[(i * 3) % len(words)]}", "arguments": args}))
        lines.append(f"def {words[i]}_{i}(x, y):\n    return x + y * {i}\n")
    lines.append(" ".join(str(n) for n in range(200)))
    lines.append("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~ \t\n\n    ")
    return lines


@functools.lru_cache(maxsize=1)
def _tokenizer_json() -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB_SIZE - len(SPECIAL_TOKENS) - len(MARKUP_TOKENS),
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    tok.add_special_tokens(SPECIAL_TOKENS)
    tok.add_tokens(MARKUP_TOKENS)
    return tok.to_str()


def build_tiny_tokenizer() -> Any:
    """A fresh ``PreTrainedTokenizerFast`` for the tiny preset (same ids in every process)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tokenizer_json()),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=TINY_CONTEXT_LENGTH,
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def tiny_config(vocab_size: int) -> Any:
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=TINY_CONTEXT_LENGTH,
        tie_word_embeddings=False,
        eos_token_id=[2, 0],  # <|im_end|>, <|endoftext|> (checked against the tokenizer in build_tiny)
        pad_token_id=0,
        bos_token_id=None,
        rope_theta=10000.0,
    )


def build_tiny(seed: int = 0) -> tuple[Any, Any]:
    """Return ``(model, tokenizer)``: a seeded random Qwen2ForCausalLM (hidden 64, 2 layers), float32, eval."""
    from transformers import Qwen2ForCausalLM

    tokenizer = build_tiny_tokenizer()
    im_end, eot = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    config = tiny_config(len(tokenizer))
    config.eos_token_id = [im_end, eot]
    config.pad_token_id = eot
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
        # The default init (std 0.02) gives near-uniform logits; a wider output head makes samples and
        # logprobs vary visibly (logit std ~2), which is what tests of capture and weight updates need.
        torch.nn.init.normal_(model.lm_head.weight, std=0.3)
    model.generation_config.eos_token_id = [im_end, eot]
    model.generation_config.pad_token_id = eot
    model.to(torch.float32).eval()
    return model, tokenizer


def save_tiny(path: str | Path, seed: int = 0) -> Path:
    """Write the tiny model and tokenizer as a local HF model folder (for the local-folder code path)."""
    path = Path(path)
    model, tokenizer = build_tiny(seed)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
