"""A tiny causal language model that plays blackjack by reading a prompt and saying HIT or STAND.

The prompt is built from the observation of ``openspiel_env`` (its ``metadata``: the player's
cards, total, soft/hard, the dealer's visible card), written as words::

    <bos> you hold 10 6 total 16 hard dealer shows 9 you say

The model is a from-scratch decoder-only transformer over a word-level vocabulary. Its action is
its next token after the prompt, with the distribution restricted to the two action words
(constrained decoding): every sample is a legal move, and the policy is still a language model.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Sequence, Tuple

import torch
from torch import nn

ACTIONS = ("HIT", "STAND")  # OpenSpiel blackjack: action 0 is HIT, 1 is STAND
CARDS = ("A", "2", "3", "4", "5", "6", "7", "8", "9", "10", "J", "Q", "K")
WORDS = ("<pad>", "<bos>", "you", "hold", "total", "soft", "hard", "dealer", "shows", "say", *ACTIONS)
VOCAB: Tuple[str, ...] = tuple(dict.fromkeys(WORDS + CARDS + tuple(str(n) for n in range(2, 32))))
TOKEN = {word: i for i, word in enumerate(VOCAB)}
PAD = TOKEN["<pad>"]
ACTION_TOKENS = [TOKEN[a] for a in ACTIONS]
MAX_LEN = 32


def prompt_words(facts: Dict[str, Any]) -> List[str]:
    """The prompt for a blackjack position, from the observation's ``metadata``."""
    cards = [str(c) for c in facts["player_cards"]]
    soft = "soft" if facts["player_soft"] else "hard"
    return ["<bos>", "you", "hold", *cards, "total", str(facts["player_total"]), soft]


def encode(facts: Dict[str, Any]) -> List[int]:
    words = [*prompt_words(facts), "dealer", "shows", str(facts["dealer_shows"]), "you", "say"]
    return [TOKEN[w] for w in words][-MAX_LEN:]


def batch(prompts: Sequence[List[int]]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Right-padded token ids and the index of each prompt's last token."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), PAD, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, : len(prompt)] = torch.tensor(prompt, dtype=torch.long)
    last = torch.tensor([len(p) - 1 for p in prompts], dtype=torch.long)
    return ids, last


class TinyLM(nn.Module):
    """A decoder-only transformer: token and position embeddings, pre-norm causal blocks, a tied
    output head. About 60k parameters with the defaults."""

    def __init__(self, d_model: int = 48, layers: int = 2, heads: int = 4, ff: int = 192, dropout: float = 0.0):
        super().__init__()
        self.embed = nn.Embedding(len(VOCAB), d_model, padding_idx=PAD)
        self.position = nn.Embedding(MAX_LEN, d_model)
        block = nn.TransformerEncoderLayer(
            d_model, heads, ff, dropout=dropout, activation="gelu", batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.register_buffer("causal", torch.triu(torch.full((MAX_LEN, MAX_LEN), float("-inf")), diagonal=1))
        nn.init.normal_(self.embed.weight, std=0.02)
        nn.init.normal_(self.position.weight, std=0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Next-token logits over the whole vocabulary at every position."""
        width = ids.shape[1]
        hidden = self.embed(ids) + self.position(torch.arange(width, device=ids.device))
        hidden = self.blocks(hidden, mask=self.causal[:width, :width], is_causal=True)
        return self.norm(hidden) @ self.embed.weight.T

    def action_logits(self, prompts: Sequence[List[int]]) -> torch.Tensor:
        """Logits of (HIT, STAND) as the next token after each prompt: shape (batch, 2)."""
        ids, last = batch(prompts)
        ids, last = ids.to(self.embed.weight.device), last.to(self.embed.weight.device)
        logits = self(ids)
        at_last = logits[torch.arange(len(prompts), device=ids.device), last]
        return at_last[:, ACTION_TOKENS]


def parameters_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def entropy_of(logits: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of each row's restricted two-way distribution."""
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


MAX_ENTROPY = math.log(len(ACTIONS))
