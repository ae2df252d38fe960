"""Draft-model drafting: a small LM of the same tokenizer proposes tokens autoregressively."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from ..models.int4_gemv import four_bit_copy
from ..models.precision import INT8
from ..models.quantize import QUANTIZATIONS, quantized_copy
from ..models.vocab import DraftVocabulary, ReducedHead
from ..runner import CallStats, CausalLMRunner
from ..sampling import Sampler
from .base import DraftBlock, Drafter

FOUR_BIT = "int4"  # `quantize` of a W8A8 draft: its steps on 4-bit weights
QUANTIZE_OPTIONS = tuple(sorted([*QUANTIZATIONS, FOUR_BIT]))  # what `quantize` takes


class ModelDrafter(Drafter):
    """Drafts up to K tokens with one forward pass of a draft model each (its cache rolls back
    itself).

    Levers that make drafting cheaper (docs/results/drafting.md); none can change what the verifier
    commits, only how many draft tokens it accepts:

    * `confidence_threshold`: the block ends after a token whose draft probability p(x) is
      below it (transformers' `assistant_confidence_threshold`), so K is a maximum and rounds
      that would end early waste fewer draft forwards;
    * `vocabulary`: the LM head scores only a `DraftVocabulary`'s N ids (a `ReducedHead`); p is
      the renormalised distribution over them, zero elsewhere, which is the exact proposal
      rejection sampling needs;
    * `quantize`: the drafter runs a quantised copy of the model: of a float draft, one of
      `models.quantize`'s schemes; of a W8A8 draft, "int4", its steps on 4-bit weights
      (`models.int4_gemv`). The pair's model itself is untouched, so other decoders sharing it
      are not affected.
    """

    @staticmethod
    def check_settings(confidence_threshold: float | None = None, quantize: str | None = None, **_) -> None:
        """The plain settings' rules (also checked before any model loads: `viasd_adapters.checks`)."""
        if confidence_threshold is not None and not 0 <= confidence_threshold <= 1:
            raise ValueError(f"confidence_threshold must be in [0, 1] (null: off), got {confidence_threshold}")
        if quantize is not None and quantize not in QUANTIZE_OPTIONS:
            raise ValueError(f"quantize {quantize!r} is not one of {list(QUANTIZE_OPTIONS)} (null: off)")

    def __init__(
        self,
        model: PreTrainedModel,
        name: str = "draft",
        confidence_threshold: float | None = None,
        vocabulary: str | DraftVocabulary | None = None,
        quantize: str | None = None,
    ):
        self.check_settings(confidence_threshold=confidence_threshold, quantize=quantize)
        self.name = name
        self.confidence_threshold = confidence_threshold
        self.full_vocab_size = int(model.get_output_embeddings().out_features)
        vocabulary_label = ""  # a vocabulary given by name is named in the variant, as the profile does
        if isinstance(vocabulary, str):
            vocabulary_label = f"@{vocabulary}"
            vocabulary = DraftVocabulary.load(vocabulary)
        variant = None
        if quantize == FOUR_BIT:
            variant = f"{INT8}+{FOUR_BIT}{vocabulary_label}"  # the latency profile's name for it
            model = four_bit_copy(model)  # before the reduced head, whose rows it then holds in 4 bits
        head = ReducedHead(model, vocabulary) if vocabulary is not None else None
        if quantize not in (None, FOUR_BIT):
            if not any(isinstance(m, torch.nn.Linear) for m in model.modules()):
                raise ValueError(
                    f"quantize={quantize}: the draft model has no dense linear layer left to quantise (it is"
                    " int8 already, e.g. runtime.draft_weights=int8); set quantize=null, or quantize=int4"
                    " for its steps on 4-bit weights"
                )
            variant = f"{str(model.dtype).removeprefix('torch.')}+{quantize}"  # the latency profile's name for it
            model = quantized_copy(model, quantize, keep_head=head is not None)
        self.head = head
        self.runner = CausalLMRunner(model, name, head=head, variant=variant)

    @property
    def vocab_size(self) -> int:
        return self.full_vocab_size

    def reset(self) -> None:
        self.runner.reset()

    @property
    def stats(self) -> dict[str, CallStats]:
        return {self.name: self.runner.stats}

    def propose(self, input_ids: torch.Tensor, num_tokens: int, sampler: Sampler) -> DraftBlock:
        tokens, probs = [], []
        ids = input_ids
        for _ in range(num_tokens):
            logits = self.runner.logits(ids, 1)[0]  # [N]: N = V without a reduced head
            p = sampler.probs(logits)  # [N]
            index = sampler.choose_from(p, logits)
            token = index if self.head is None else int(self.head.token_ids[index])
            tokens.append(token)
            probs.append(p)
            ids = torch.cat([ids, ids.new_tensor([[token]])], dim=1)
            if self.confidence_threshold is not None and float(p[index]) < self.confidence_threshold:
                break
        if not probs:
            return DraftBlock(tokens=input_ids.new_tensor(tokens), probs=None)
        p = torch.stack(probs)  # [K, N]
        if self.head is not None:  # zero outside the kept ids
            K, N = p.shape
            p = p.new_zeros(K, self.full_vocab_size).scatter_(1, self.head.token_ids.expand(K, N), p)
        return DraftBlock(tokens=input_ids.new_tensor(tokens), probs=p)
