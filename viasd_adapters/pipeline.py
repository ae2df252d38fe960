"""Turn composed configs into loaded models and decoders; shared by every entry point."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.generation.streamers import BaseStreamer

from .decode import Decoder, GenerationResult
from .draft import Drafter
from .hosts.registry import HOSTS, HostRegistry
from .models import LoadedModel, load_model
from .sampling import SamplingConfig
from .verify import Verifier

logger = logging.getLogger(__name__)


@dataclass
class ModelPair:
    """The loaded models of one `model_pair` config; decoders share them, never copy them."""

    target: LoadedModel
    draft: LoadedModel | None  # None when no configured framework drafts with a model


def load_pair(model_pair: DictConfig, with_draft: bool = True) -> ModelPair:
    target = load_model(instantiate(model_pair.target))
    if not with_draft:
        return ModelPair(target, None)
    if model_pair.draft == model_pair.target:
        return ModelPair(target, target)  # self-drafting: one copy of the weights
    draft = load_model(instantiate(model_pair.draft))
    check_same_tokenizer(
        draft.tokenizer, target.tokenizer, f"draft {draft.spec.name!r}", f"target {target.spec.name!r}"
    )
    return ModelPair(target, draft)


def check_same_tokenizer(
    draft: PreTrainedTokenizerBase | None,
    target: PreTrainedTokenizerBase | None,
    draft_name: str = "the draft",
    target_name: str = "the target",
) -> None:
    """ValueError unless the two tokenizers map the same strings to the same ids (None: not known, not
    checked): the draft's token ids are the target's only then. Every tokenizer check ends here."""
    if draft is not None and target is not None and draft.get_vocab() != target.get_vocab():
        raise ValueError(
            f"{draft_name} and {target_name} use different tokenizers: speculative decoding needs one shared"
            " vocabulary; pick a draft model of the target's family"
        )


# A drafter or verifier config names a model of the loaded pair with one of these strings.
PAIR_MODELS = ("pair.draft", "pair.target")


def uses_draft_model(*nodes: DictConfig | None) -> bool:
    """Whether any of these component configs refers to the pair's draft model."""
    return any(node is not None and "pair.draft" in node.values() for node in nodes)


def _with_models(node: DictConfig, pair: ModelPair) -> dict:
    """Loaded models for the keys of `node` whose value is "pair.draft" or "pair.target"."""
    models = {}
    for key, value in node.items():
        if value in PAIR_MODELS:
            loaded = pair.draft if value == "pair.draft" else pair.target
            if loaded is None:
                raise ValueError(f"{key}: {value} is not loaded: load the pair with_draft=True")
            models[key] = loaded.model
    return models


def build_decoder(framework: DictConfig, verifier: DictConfig, pair: ModelPair, hosts: HostRegistry = HOSTS) -> Decoder:
    """Build `framework` around the loaded pair, with the parts its host takes (its `hosts` entry).

    The drafter and the verifier (with `target=` the pair's target) are built from their configs,
    in which "pair.draft" / "pair.target" stand for the loaded models.
    """
    host = hosts.for_decoder(get_class(framework.decoder._target_))
    drafter = (
        instantiate(framework.drafter, **_with_models(framework.drafter, pair)) if "drafter" in host.parts else None
    )
    built = (
        instantiate(verifier, target=pair.target.model, **_with_models(verifier, pair))
        if "verifier" in host.parts
        else None
    )
    return host.build(pair.target.model, drafter, built, decoder=framework.decoder)


def assemble(
    host: str,
    target: PreTrainedModel,
    drafter: Drafter | None = None,
    verifier: Verifier | None = None,
    decoder: DictConfig | None = None,
    hosts: HostRegistry = HOSTS,
    **options,
) -> Decoder:
    """The decoder of the host registered as `host` in `hosts` (`HostSpec.build`).

    Of `target`, `drafter` and `verifier` it passes the parts the host's entry lists. `decoder`: the
    framework config's decoder node (Hydra builds its nested nodes); None: the host's decoder class
    called with `options` (the Python API's, which may be objects no config can hold).
    """
    return hosts.host(host).build(target, drafter, verifier, decoder, **options)


def encode_prompt(target: LoadedModel, prompt: str, chat_template: bool = True) -> torch.Tensor:
    """Prompt text -> [1, T] ids on the target's device, in the chat template if it has one."""
    return encode_text(target.tokenizer, prompt, chat_template).to(target.model.device)


def encode_text(tokenizer: PreTrainedTokenizerBase, prompt: str, chat_template: bool = True) -> torch.Tensor:
    """Prompt text -> [1, T] ids (on the CPU), as a user turn of the chat template if it has one."""
    if not isinstance(prompt, str):
        raise TypeError(f"the prompt must be a string, got {type(prompt).__name__}")
    if not prompt.strip():
        raise ValueError('the prompt is empty: pass prompt="..."')
    if chat_template and tokenizer.chat_template:
        messages = [{"role": "user", "content": prompt}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
    return tokenizer(prompt, return_tensors="pt").input_ids


@dataclass
class Pipeline:
    """One decoder with the models it decodes for: what `viasd-generate` runs."""

    decoder: Decoder
    pair: ModelPair
    chat_template: bool  # wrap prompts in the target's chat template when it has one

    @classmethod
    def from_config(cls, cfg: DictConfig, hosts: HostRegistry = HOSTS) -> Pipeline:
        with_draft = uses_draft_model(cfg.framework.drafter, cfg.verifier)
        pair = load_pair(cfg.model_pair, with_draft)
        return cls(build_decoder(cfg.framework, cfg.verifier, pair, hosts), pair, cfg.chat_template)

    def encode(self, prompt: str) -> torch.Tensor:
        return encode_prompt(self.pair.target, prompt, self.chat_template)

    def generate(
        self,
        prompt: str | torch.Tensor,
        max_new_tokens: int,
        sampling: SamplingConfig,
        streamer: BaseStreamer | None = None,
    ) -> GenerationResult:
        """Decode `prompt` (text, or its [1, T] ids from `encode`); `streamer` gets every commit."""
        ids = self.encode(prompt) if isinstance(prompt, str) else prompt
        return self.decoder.generate(ids, max_new_tokens, sampling, self.pair.target.stop_token_ids, streamer)

    def decode(self, tokens: list[int]) -> str:
        return self.pair.target.tokenizer.decode(tokens, skip_special_tokens=True)
