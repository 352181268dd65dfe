"""The served model's tokenizer on polar's side: the gateway tokenizes, so it must be the server's own.

Also used by the hosted-endpoint engine (:mod:`polar.inference.openai_compat`), which tokenizes the same way."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from polar.inference.base import EngineError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def load_tokenizer(spec: str) -> PreTrainedTokenizerBase:
    """``"tiny"``, a polar preset with a folder (its converted folder's tokenizer), or a local HF folder."""
    if spec == "tiny":
        from polar.inference.tiny import build_tiny_tokenizer

        return build_tiny_tokenizer()
    from polar.inference.presets import get_preset, preset_folder

    if get_preset(spec) is not None:  # a preset with a folder (smollm2-135m): its converted folder's tokenizer
        spec = str(preset_folder(spec))
    if not Path(spec).expanduser().is_dir():
        raise EngineError(
            f"upstream tokenizer '{spec}' is not 'tiny' or a local folder; point it at a folder holding the "
            "served model's tokenizer (the gateway tokenizes, so it must match the server's)"
        )
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(Path(spec).expanduser(), local_files_only=True)


def model_folder(spec: str) -> Path | None:
    """The served model's local folder named by a tokenizer spec (a folder, or a preset's converted one):
    weight sync copies its config and checks logprobs against it. None for ``tiny`` or an unknown name."""
    if spec == "tiny":
        return None
    folder: Path | None = Path(spec).expanduser()
    if folder is not None and not folder.is_dir():  # a preset name: its converted folder
        from polar.inference.presets import get_preset, preset_folder

        folder = preset_folder(spec) if get_preset(spec) is not None else None
    return folder.resolve() if folder is not None else None


def model_name_of(spec: str) -> str:
    return spec if spec == "tiny" else Path(spec).name


def stop_token_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """End-of-turn ids the gateway adds to every chat request: ``<|im_end|>``, ``<|endoftext|>``, eos."""
    ids: list[int] = []
    for tok in ("<|im_end|>", "<|endoftext|>"):
        tid = tokenizer.convert_tokens_to_ids(tok)
        if isinstance(tid, int) and tid >= 0 and tid != tokenizer.unk_token_id:
            ids.append(tid)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(int(tokenizer.eos_token_id))
    return ids
