"""A tiny causal language model built on the spot: no download, trains on a CPU in seconds.

The tokenizer is character-level (printable ASCII plus ``<pad>``, ``<eos>`` and ``<unk>``), built
with the ``tokenizers`` library; the model is a two-layer Qwen2 with random weights. Both are
saved with ``save_pretrained`` so that anything that loads a model directory can load them.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import TYPE_CHECKING, Tuple

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<pad>", "<eos>", "<unk>")


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level fast tokenizer; every printable ASCII character is one token."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    characters = [c for c in string.printable if c not in "\x0b\x0c\r"]
    vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS, *characters])}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
    )


def build_tiny_model(
    directory: str | Path, *, hidden_size: int = 64, layers: int = 2, seed: int = 0
) -> Tuple[str, int]:
    """Save a random tiny Qwen2 model and its tokenizer in ``directory``; return (path, parameter count)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    tokenizer = build_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    path = Path(directory)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path), sum(p.numel() for p in model.parameters())
