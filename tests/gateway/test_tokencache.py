"""Segment-wise tokenization with a cache gives exactly the whole-text ids."""

import random

from polar.gateway.prompt import PromptBuilder
from polar.gateway.tokencache import SegmentEncoder
from polar.inference.tiny import build_tiny_tokenizer


def whole(tok):
    return lambda text: tok.backend_tokenizer.encode(text, add_special_tokens=False).ids


def test_segments_match_whole_text_encoding_on_random_prompts():
    tok = build_tiny_tokenizer()
    enc = SegmentEncoder.build(tok, whole(tok))
    assert enc is not None
    rng = random.Random(0)
    pieces = [*enc._added, " ", "\n", "  ", "hello", "Hello world.", "{\"a\": 1}", "é中", "\t", "<|im", "end|>", "<", ">"]
    for _ in range(500):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 25)))
        assert enc.encode(text) == whole(tok)(text), repr(text)
    # the second pass is served from the cache and is still exact
    for _ in range(200):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 25)))
        assert enc.encode(text) == whole(tok)(text) == enc.encode(text), repr(text)
    assert enc.hits > 0 and enc.misses > 0


def test_repeated_system_prompt_is_tokenized_once():
    tok = build_tiny_tokenizer()
    pb = PromptBuilder(tok, [tok.convert_tokens_to_ids("<|im_end|>")])
    system = "You are a careful coding agent. " * 200
    for turn in range(5):
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": f"question number {turn}"}]
        ids = pb.build(msgs, [], lambda key: None).ids
        full = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        assert ids == whole(tok)(full)
    assert pb.segments is not None
    assert pb.segments.misses <= 5 + 3  # the system segment once; each new user segment once


def test_cache_stays_within_its_character_budget():
    tok = build_tiny_tokenizer()
    enc = SegmentEncoder.build(tok, whole(tok), max_chars=10_000)
    for i in range(500):
        text = f"<|im_start|>user\nmessage {i} " + "x" * 100 + "<|im_end|>"
        assert enc.encode(text) == whole(tok)(text)
    assert enc._chars <= 10_000


def test_tokenizers_whose_added_tokens_strip_whitespace_are_not_split():
    from tokenizers import AddedToken

    tok = build_tiny_tokenizer()
    tok.add_tokens([AddedToken("<mask>", lstrip=True)])
    assert SegmentEncoder.build(tok, whole(tok)) is None
