"""What to load (`ModelSpec`) and what loading returns (`LoadedModel`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .precision import INT8, Precision, check_precision

# Below this size compiling (tens of seconds) does not pay back on a short run: the model stays eager.
COMPILE_MIN_PARAMETERS = 100_000_000


@dataclass
class TinyModelConfig:
    """A randomly initialised model built from a config, for tests (nothing is downloaded)."""

    architecture: str = "llama"  # "llama" or "qwen2"
    num_layers: int = 4  # decoder layers
    hidden_size: int = 64
    num_heads: int = 4
    num_kv_heads: int = 2  # grouped-query attention, as the real targets use
    intermediate_size: int = 128
    max_position_embeddings: int = 512  # the context window
    vocab_size: int | None = None  # None: the byte tokenizer's 257 (a larger one pads the head)
    seed: int = 0  # weights are a pure function of this seed
    init_std: float = 0.3  # large enough that argmax ties (and so flaky greedy tests) are unlikely
    # Relative Gaussian noise added to every weight (0: none). The model of `seed` plus a little
    # noise is a draft that mostly agrees with the model of `seed` alone, as a trained draft does.
    perturb: float = 0.0
    perturb_seed: int = 1  # seeds that noise


@dataclass
class ModelSpec:
    """A model to load: an offline zoo name, a local folder, a hub id, or "tiny-random"."""

    name: str  # see `viasd_adapters.models.zoo.OFFLINE_MODELS` for the offline names
    weights: str = "bfloat16"  # float32 | bfloat16 | float16 | int8 (CPU): see models.precision
    activations: str | None = None  # what the linear layers multiply in; None: as the weights (int8: W8A8)
    device: str = "cpu"  # any torch device string
    tiny: TinyModelConfig | None = None  # only for name == "tiny-random"
    # The compiled decode step (models.compiled): true, false (the eager forward), or "auto": W8A8
    # models of at least COMPILE_MIN_PARAMETERS on a CPU, where per-operator overhead is most of a step.
    compile: bool | str = "auto"

    def __post_init__(self) -> None:
        check_precision(self.weights, self.activations, self.device)
        if self.compile not in (True, False, "auto"):
            raise ValueError(f"compile={self.compile!r} is not one of true, false, auto")
        if self.tiny is not None and not isinstance(self.tiny, TinyModelConfig):
            self.tiny = TinyModelConfig(**self.tiny)  # Hydra passes nested configs as mappings

    @property
    def precision(self) -> Precision:
        return Precision(self.weights, self.activations)

    @property
    def torch_dtype(self) -> torch.dtype:
        """The dtype the weights load in and everything but quantised layers computes in."""
        return self.precision.torch_dtype

    def compiles(self, num_parameters: int) -> bool:
        """Whether a model of this spec with `num_parameters` gets the compiled decode step."""
        if self.compile != "auto":
            return bool(self.compile)
        return (
            self.precision.quantization == INT8
            and torch.device(self.device).type == "cpu"
            and num_parameters >= COMPILE_MIN_PARAMETERS
        )


@dataclass
class LoadedModel:
    """A causal LM ready for decoding, with the tokenizer that matches it."""

    model: PreTrainedModel  # in eval mode, on `spec.device`, in `spec.precision` (int8 weights: quantised linears)
    tokenizer: PreTrainedTokenizerBase
    spec: ModelSpec
    stop_token_ids: tuple[int, ...] = field(default=())  # generation ends after any of these

    @property
    def context_length(self) -> int:
        return int(self.model.config.max_position_embeddings)
