"""Reduced draft vocabularies (the FR-Spec idea): a drafter scores only the N most frequent ids.

The target still verifies over the full vocabulary, so greedy output is unchanged; in sampling
mode the draft distribution renormalised over the kept ids (zero elsewhere) is the proposal the
acceptance rule uses, which keeps rejection sampling exact. What it saves is the LM head: the
Qwen2.5-Coder 0.5B's tied 151,936 x 896 head is about a quarter of its weights.

A `DraftVocabulary` is a list of ids counted on calibration text (never on benchmark prompts),
stored as JSON with its provenance; `ReducedHead` is the model's LM head restricted to it.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import torch
from transformers import PreTrainedModel

from .quantize import Int8Linear

# Shipped vocabularies: package data, selected by name (a file path works too).
SHIPPED_DIR = "vocab"


@dataclass
class DraftVocabulary:
    """The token ids a reduced draft head scores, most frequent first."""

    token_ids: list[int]  # N distinct ids of the full vocabulary
    vocab_size: int  # V of the tokenizer the ids belong to (checked against the model)
    description: dict = field(default_factory=dict)  # provenance: tokenizer, texts, counts

    def __post_init__(self) -> None:
        if not self.token_ids:
            raise ValueError("a draft vocabulary needs at least one token id")
        if len(set(self.token_ids)) != len(self.token_ids):
            raise ValueError("draft vocabulary ids must be distinct")
        bad = [i for i in self.token_ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"draft vocabulary ids {bad[:5]} are outside [0, {self.vocab_size})")

    def __len__(self) -> int:
        return len(self.token_ids)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {"vocab_size": self.vocab_size, "description": self.description, "token_ids": self.token_ids}
        path.write_text(json.dumps(data))
        return path

    @classmethod
    def load(cls, name_or_path: str | Path) -> DraftVocabulary:
        """A shipped vocabulary by name (`viasd_adapters/models/vocab/<name>.json`) or a JSON file."""
        path = Path(name_or_path).expanduser()
        if not path.is_file():
            shipped = resources.files(__package__) / SHIPPED_DIR / f"{name_or_path}.json"
            if not shipped.is_file():
                available = sorted(
                    p.name[:-5]
                    for p in (resources.files(__package__) / SHIPPED_DIR).iterdir()
                    if p.name.endswith(".json")
                )
                raise ValueError(
                    f"draft vocabulary {str(name_or_path)!r} is neither a file nor a shipped name"
                    f" (shipped: {', '.join(available) or 'none'}); build one with"
                    " `python -m viasd_adapters.cli.build_vocab`"
                )
            path = Path(str(shipped))
        data = json.loads(path.read_text())
        return cls(data["token_ids"], data["vocab_size"], data.get("description", {}))

    @classmethod
    def from_counts(
        cls, counts: Counter, size: int, vocab_size: int, always: Iterable[int] = (), description: dict | None = None
    ) -> DraftVocabulary:
        """The `size` most frequent ids of `counts`, `always` included (e.g. stop tokens).

        Ties, and the ids no calibration text contains, are ordered by id: byte-level BPE
        tokenizers number their merges in training-frequency order, so a lower id is the more
        frequent token where the calibration text says nothing.
        """
        if not 1 <= size <= vocab_size:
            raise ValueError(f"vocabulary size must be in [1, {vocab_size}], got {size}")
        always = list(dict.fromkeys(always))
        pinned = set(always)
        ranked = sorted(range(vocab_size), key=lambda i: (-counts.get(i, 0), i))
        chosen = always + [i for i in ranked if i not in pinned][: max(size - len(always), 0)]
        covered = sum(counts.get(i, 0) for i in chosen)
        info = {
            "calibration_tokens": sum(counts.values()),
            "calibration_coverage": covered / max(sum(counts.values()), 1),
            **(description or {}),
        }
        return cls(chosen[:size], vocab_size, info)


def count_tokens(token_lists: Iterable[Iterable[int]]) -> Counter:
    """Occurrences of each id over some tokenised texts."""
    counts: Counter = Counter()
    for ids in token_lists:
        counts.update(ids)
    return counts


class ReducedHead(torch.nn.Module):
    """A model's LM head restricted to a draft vocabulary: hidden states -> [..., N] logits.

    It holds the N kept rows of the head's weight (for N = 32k of the 0.5B's 152k: 29 M of its
    494 M parameters, gathered once) and shares nothing else: the model stays as it is, and
    `token_ids` maps positions of the reduced logits back to ids of the full vocabulary.
    """

    token_ids: torch.Tensor  # [N] long; `register_buffer` sets it, untyped, in __init__

    def __init__(self, model: PreTrainedModel, vocabulary: DraftVocabulary):
        super().__init__()
        head = model.get_output_embeddings()
        V = int(head.out_features)
        if vocabulary.vocab_size != V:
            raise ValueError(
                f"the draft vocabulary was built for a vocabulary of {vocabulary.vocab_size} ids, the"
                f" model's head has {V}: rebuild it for this tokenizer (python -m viasd_adapters.cli.build_vocab)"
            )
        if getattr(model.config, "final_logit_softcapping", None):
            raise ValueError("reduced draft heads do not support models with final_logit_softcapping")
        ids = torch.tensor(vocabulary.token_ids, dtype=torch.long, device=model.device)
        self.register_buffer("token_ids", ids, persistent=False)  # [N]
        if isinstance(head, Int8Linear):  # an int8 model: the kept rows stay int8, each scoring as in the full head
            self.int8 = head.select_outputs(ids)
            return
        self.int8 = None
        self.weight = torch.nn.Parameter(head.weight.detach().index_select(0, ids), requires_grad=False)  # [N, d]
        bias = getattr(head, "bias", None)
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach()[ids], requires_grad=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., d] hidden states -> [..., N] logits over the kept ids."""
        if self.int8 is not None:
            return self.int8(hidden)
        return torch.nn.functional.linear(hidden, self.weight, self.bias)


class VocabularyDraftHead(torch.nn.Module):
    """The target's LM head scoring only a draft vocabulary (FR-Spec), for the head's tree growth.

    eagle-llm's tree growth feeds the top-k ids of `head(hidden)` back to the head as token ids and
    into the tree, so this returns logits over the full vocabulary, [..., V]: the N kept ids'
    scores, -inf elsewhere. The product costs N / V of the full head's (32k of Qwen's 152k rows);
    the scatter writes V values per row. In sampling, the draft distribution is then the
    renormalised one over the kept ids, and eagle-llm's tree rejection sampling uses exactly it.
    """

    def __init__(self, target, vocabulary):
        """`target`: the transformers model whose LM head is restricted; `vocabulary`: a
        `DraftVocabulary` of its tokenizer (checked against the head's size)."""
        super().__init__()
        self.reduced = ReducedHead(target, vocabulary)
        self.vocab_size = vocabulary.vocab_size  # the head's V: ReducedHead refuses any other

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., H] head outputs -> [..., V] logits, -inf outside the draft vocabulary."""
        logits = self.reduced(hidden)
        full = logits.new_full((*logits.shape[:-1], self.vocab_size), float("-inf"))
        return full.index_copy_(-1, self.reduced.token_ids, logits)
