"""Checks of a composed config before anything slow happens.

Every entry point calls `check_config(cfg)` first, before any model loads: a wrong setting
fails in a second with a message naming the key and the fix, not after minutes of loading or
silently. The component checks need no model: each `_target_` node's plain settings are bound
to its class's signature (unknown keys, wrong types), and the plain dataclasses among them
(sampling, policy, routing mask, PEARL's engine settings) are built, which runs their own checks.
"""

from __future__ import annotations

import inspect
import math
import types
import typing
from collections.abc import Iterable
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

from . import compat
from .draft.model import FOUR_BIT
from .hosts.registry import HOSTS, HostRegistry, HostSpec
from .models import native
from .models.precision import INT8, check_precision
from .pipeline import PAIR_MODELS


def check_config(
    cfg: DictConfig, overrides: Iterable[str] | None = None, identity_slim_ok: bool = False, hosts: HostRegistry = HOSTS
) -> None:
    """Raise `ValueError` for the first bad setting of a composed entry-point config.

    Args:
        cfg: the composed config of any entry point (generate, bench, calibrate, search, ...);
            only the keys it has are checked.
        overrides: the command-line overrides (None: Hydra's, when a `@hydra.main` runs).
        identity_slim_ok: allow a tiered verifier whose mask skips nothing (u = q), which
            calibration tests use on purpose; decoding commands refuse it.
        hosts: the host registry the framework configs' decoders are looked up in.
    """
    overrides = _overrides(cfg) if overrides is None else list(overrides)
    check_renamed(overrides, cfg)
    if "max_new_tokens" in cfg:
        check_positive_int("max_new_tokens", cfg.max_new_tokens)
    if (
        cfg.get("prompt_file") is None
        and cfg.get("prompt") is not None
        and (not isinstance(cfg.prompt, str) or not cfg.prompt.strip())
    ):
        raise ValueError('the prompt is empty: pass prompt="..."')
    if cfg.get("repetitions") is not None:
        check_positive_int("repetitions", cfg.repetitions)
    if cfg.get("warmup") is not None:
        check_positive_int("warmup", cfg.warmup, minimum=0)
    if "sampling" in cfg:
        _build("sampling", cfg.sampling)
    if "runtime" in cfg:
        check_runtime(cfg.runtime)
    components = _components(cfg)
    if "model_pair" in cfg:
        for role in ("target", "draft") if components else ("target",):  # search & co. load the target only
            if cfg.model_pair.get(role) is not None:
                _build(f"model_pair.{role}", cfg.model_pair[role])
    draft_weights = cfg.runtime.get("draft_weights") if "runtime" in cfg else None
    for name, framework, _ in components if draft_weights is not None else ():
        quantize = (framework.get("drafter") or {}).get("quantize")
        key = f"method.{name}.framework.drafter.quantize" if name else "framework.drafter.quantize"
        if draft_weights == INT8 and quantize not in (None, FOUR_BIT):
            raise ValueError(
                f"runtime.draft_weights=int8 loads the draft with int8 linear layers already, so"
                f" {key}={quantize} has nothing left to quantise: set {key}=null ({key}={FOUR_BIT} for"
                " 4-bit steps), or runtime.draft_weights=bfloat16 for the drafter's own int8 copy"
            )
        if draft_weights != INT8 and quantize == FOUR_BIT:
            raise ValueError(
                f"{key}={FOUR_BIT} makes 4-bit steps from a W8A8 draft's int8 weights: set"
                f" runtime.draft_weights=int8 (it is {draft_weights})"
            )
        unsupported = native.cpu_unsupported() if quantize == FOUR_BIT else None
        if unsupported is not None:
            raise ValueError(
                f"{key}={FOUR_BIT}: the 4-bit kernel needs an x86-64 CPU with AVX2 ({unsupported}); set {key}=null"
            )
    masks = []
    if "model_pair" in cfg and cfg.model_pair.get("target") is not None:
        from .configs import CONFIG_DIR

        masks = shipped_masks(cfg.model_pair.target.name, Path(CONFIG_DIR), cfg.model_pair.get("name"))
    needs = {
        "sampled": "sampling" in cfg and float(cfg.sampling.get("temperature") or 0.0) > 0,
        "int8": "runtime" in cfg and cfg.runtime.get("weights") == INT8,
    }
    for name, framework, verifier in components:
        check_components(name, framework, verifier, identity_slim_ok, masks, hosts, **needs)
    if components:
        _check_group_is_used("policy", overrides, components, hosts)
        _check_group_is_used("routing", overrides, components, hosts)


# Settings that moved, by their old key: an old spelling fails naming the new one, never ignored.
_PRECISION = "precision is two settings now, weights and activations (int8 weights alone: W8A8)"
RENAMED = {
    "threads": ("runtime.threads", "one runtime group for every command"),
    "runtime.dtype": ("runtime.weights", _PRECISION),
    "runtime.draft_dtype": ("runtime.draft_weights", _PRECISION),
    "model_pair.draft_vocabulary_acceptance": (
        "model_pair.variant_acceptance.vocabulary",
        "one mapping holds the acceptance of every drafter variant",
    ),
    "vocabulary_acceptance": ("variant_acceptance.vocabulary", "one mapping holds every drafter variant's acceptance"),
}


def check_renamed(overrides: Iterable[str], cfg: DictConfig | None = None) -> None:
    """ValueError naming the new key for a setting given under its old one (`RENAMED`): on the
    command line (`threads=2`, `+threads=2`) or in a config."""
    for item in overrides:
        key, _, value = item.lstrip("+~").partition("=")
        if key in RENAMED:
            new, why = RENAMED[key]
            raise ValueError(f"{key}= is now {new}= ({why}): write {new}={value or 'VALUE'}")
    for key, (new, why) in RENAMED.items():
        old = OmegaConf.select(cfg, key, throw_on_missing=False) if cfg is not None else None
        if old is not None:
            raise ValueError(f"the config sets {key}, which is now {new} ({why}): move it there ({new}={old})")


def check_positive_int(name: str, value, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be a whole number >= {minimum}, got {value!r}")


def check_runtime(runtime: DictConfig) -> None:
    device = runtime.get("device")
    if device is not None:
        try:
            parsed = torch.device(device)
        except (RuntimeError, TypeError) as err:
            raise ValueError(
                f"runtime.device={device!r} is not a torch device: use cpu, cuda, cuda:1, mps, ..."
            ) from err
        if parsed.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"runtime.device={device}: this torch build sees no CUDA device; use runtime.device=cpu")
    if runtime.get("threads") is not None:
        check_positive_int("runtime.threads", runtime.threads)
    for prefix in ("", "draft_"):
        weights = runtime.get(f"{prefix}weights")
        if weights is not None:
            check_precision(weights, runtime.get(f"{prefix}activations"), device or "cpu", prefix=f"runtime.{prefix}")
    if runtime.get("compile", "auto") not in (True, False, "auto"):
        raise ValueError(f"runtime.compile={runtime.compile!r}: use true, false or auto")


def check_components(
    name: str,
    framework: DictConfig,
    verifier: DictConfig | None,
    identity_slim_ok: bool = False,
    masks: list[str] = (),
    hosts: HostRegistry = HOSTS,
    sampled: bool = False,
    int8: bool = False,
) -> None:
    """One decoding method: its framework and verifier configs make a pair its host's registry
    entry allows, the host can do what the run asks (`sampled`, an `int8` target), and each
    `_target_` node takes the settings it is given."""
    where = f"{name}: " if name else ""
    host = _host(framework, where, hosts)
    said = f"{where}framework={framework.get('name')}"
    host.check_capabilities(sampled=sampled, int8=int8, said=f"{said} ({host.name})")
    uses_verifier = "verifier" in host.parts
    if verifier is not None:
        routed = verifier.get("slim") not in PAIR_MODELS  # not an independent model of the pair
        cls = _class(verifier, f"{where}verifier")
        compat.check(host, compat.verifier_kind(cls, routed), verifier, said, verifier=cls, hosts=hosts)
    _check_node(framework.decoder, f"{where}framework.decoder")
    if framework.get("drafter") is not None:
        _check_node(framework.drafter, f"{where}framework.drafter", modelless_ok=True)
    if verifier is not None and uses_verifier:
        _check_node(verifier, f"{where}verifier")
    if identity_slim_ok:
        return
    for node in (verifier if uses_verifier else None, framework.decoder):
        mask = _slim_mask(node)
        if mask is not None and node.get("policy") is not None and mask.is_identity:
            pick = f"routing={masks[0]}" if masks else "routing=<name> (viasd-search finds one)"
            others = f" (this target's masks: {', '.join(masks)})" if len(masks) > 1 else ""
            raise ValueError(
                f"{where}the routing mask skips no layer (routing=none), so the slim verifier would be the "
                f"full target itself and the tiers only add cost: write {pick}{others}, or verifier=full "
                "for plain speculative decoding"
            )


def _host(framework: DictConfig, where: str, hosts: HostRegistry) -> HostSpec:
    """The framework's host (its `hosts` entry); it configures a drafter exactly when its host drafts with one."""
    host = hosts.for_decoder(_class(framework.decoder, f"{where}framework.decoder"))
    drafts = "drafter" in host.parts
    if drafts != (framework.get("drafter") is not None):
        raise ValueError(
            f"{where}framework={framework.get('name')} ({host.name}) "
            + (
                "drafts with framework.drafter, which is null: give one, e.g."
                " framework.drafter={_target_: viasd_adapters.draft.PromptLookupDrafter}"
                if drafts
                else "drafts for itself: set framework.drafter=null"
            )
        )
    return host


def _slim_mask(node: DictConfig | None):
    """The routing mask a tiered verifier or decoder config routes its slim verifier with."""
    if node is None:
        return None
    raw = node.get("slim") if isinstance(node.get("slim"), DictConfig) else None
    mask = raw.get("mask") if raw is not None else node.get("routing")
    if not isinstance(mask, DictConfig) or "_target_" not in mask:
        return None
    return _build("routing", mask)


def _check_node(node: DictConfig, path: str, modelless_ok: bool = False) -> None:
    """Bind a `_target_` node's plain settings to its class and check their types; recurse into
    nested nodes; build plain dataclasses (their `__post_init__` checks the values)."""
    cls = _class(node, path)
    target = cls.__init__ if inspect.isclass(cls) else cls
    try:
        signature = inspect.signature(target)
        hints = typing.get_type_hints(target)
    except (TypeError, ValueError, NameError):
        return
    takes_any = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    for key in node:
        if str(key).startswith("_"):
            continue
        value = node[key]
        if key not in signature.parameters and not takes_any:
            known = ", ".join(p for p in signature.parameters if p != "self")
            raise ValueError(f"{path}.{key}: {cls.__name__} takes no setting {key!r} (it takes: {known})")
        if isinstance(value, DictConfig) and "_target_" in value:
            if value.get("_partial_"):
                _check_node(value, f"{path}.{key}")
            else:
                _build(f"{path}.{key}", value)
            continue
        if value in PAIR_MODELS or key not in hints:
            continue
        _check_type(f"{path}.{key}", value, hints[key])
    required = [
        n
        for n, p in signature.parameters.items()
        if n != "self" and p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if modelless_ok and all(n in node for n in required) and not any(v in PAIR_MODELS for v in node.values()):
        _build(path, node)  # needs no model (e.g. prompt lookup): build it, its constructor checks
        return
    check = getattr(cls, "check_settings", None)
    if check is not None:  # the class's own value rules, which its constructor applies too
        plain = {
            k: v
            for k, v in node.items()
            if not str(k).startswith("_")
            and v not in PAIR_MODELS
            and not (isinstance(v, DictConfig) and "_target_" in v)
        }
        _build(path, OmegaConf.to_container(OmegaConf.create(plain), resolve=True), check)


_PLAIN = (bool, int, float, str)


def _check_type(path: str, value, hint) -> None:
    allowed = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    if not all(a in _PLAIN or a is type(None) for a in allowed):
        return  # not a plain setting: the class checks it itself
    if value is None:
        if type(None) in allowed:
            return
    elif isinstance(value, bool):
        if bool in allowed:
            return
    elif isinstance(value, int) and (int in allowed or float in allowed):
        return
    elif isinstance(value, float) and float in allowed:
        if math.isfinite(value):
            return
        raise ValueError(f"{path} must be a finite number, got {value!r}")
    elif isinstance(value, str) and str in allowed:
        return
    names = " or ".join("null" if a is type(None) else a.__name__ for a in allowed)
    raise ValueError(f"{path} must be {names}, got {value!r}")


def _class(node: DictConfig, path: str):
    try:
        return get_class(node._target_)
    except Exception as err:  # hydra raises ImportError or its own InstantiationException
        raise ValueError(f"{path}: cannot import {node._target_!r}: {err}") from err


def _build(path: str, node, cls=None):
    """Instantiate a plain config object (no model) so that its own checks run now."""
    try:
        if cls is not None:
            return cls(**node)
        return instantiate(node, _convert_="all")
    except (ValueError, TypeError) as err:
        raise ValueError(f"{path}: {err}") from err
    except Exception as err:  # instantiate wraps the constructor's error
        cause = err.__cause__ or err
        if isinstance(cause, (ValueError, TypeError)):
            raise ValueError(f"{path}: {cause}") from err
        raise


def _components(cfg: DictConfig) -> list[tuple[str, DictConfig, DictConfig | None]]:
    """(method name, framework, verifier) of every decoder the config builds."""
    if "method" in cfg and isinstance(cfg.method, DictConfig):
        return [(str(name), m.framework, m.get("verifier")) for name, m in cfg.method.items()]
    if "framework" in cfg:
        return [("", cfg.framework, cfg.get("verifier"))]
    return []


def _overrides(cfg: DictConfig) -> list[str]:
    if HydraConfig.initialized():
        return list(HydraConfig.get().overrides.task)
    if "hydra" in cfg:
        return list(cfg.hydra.overrides.task)
    return []


def _overridden(group: str, overrides: Iterable[str]) -> list[str]:
    keys = []
    for item in overrides:
        key = item.lstrip("+~").split("=", 1)[0]
        if key == group or key.startswith(f"{group}."):
            keys.append(item)
    return keys


def _check_group_is_used(group: str, overrides: list[str], components, hosts: HostRegistry) -> None:
    """An override of the `policy` or `routing` group that no decoder reads is a mistake."""
    given = _overridden(group, overrides)
    if not given:
        return
    for _, framework, verifier in components:
        takes_verifier = verifier is not None and "verifier" in _host(framework, "", hosts).parts
        nodes = [framework.decoder] + ([verifier] if takes_verifier else [])
        for node in nodes:
            raw = OmegaConf.to_container(node, resolve=False)
            if "${" + group in str(raw) and _active(node):
                return
    fix = {
        "policy": "verifier=tiered (VIA-SD's tiers) with framework=sd, lookup or pearl",
        "routing": "verifier=tiered with framework=sd, lookup or pearl",
    }[group]
    raise ValueError(
        f"{' '.join(given)}: no decoder of this run reads the {group} (the verifier is plain lossless SD, "
        f"framework=ar, or the tiers are off with verifier.policy=null); for the tiers write {fix}"
    )


def _active(node: DictConfig) -> bool:
    """Whether a node that refers to the policy / routing runs tiers (its policy is not null)."""
    return "policy" not in node or node.policy is not None


def shipped_masks(target_name: str, conf_dir: Path, pair_name: str | None = None) -> list[str]:
    """The shipped routing configs made for the model `target_name` (file stems), the default
    routing of the model pair `pair_name` first."""
    out = []
    for file in sorted((conf_dir / "routing").glob("*.yaml")):
        if OmegaConf.load(file).get("model") == target_name:
            out.append(file.stem)
    pair_file = conf_dir / "model_pair" / f"{pair_name}.yaml"
    if pair_name and pair_file.is_file():
        for entry in OmegaConf.load(pair_file).get("defaults", []):
            default = entry.get("/routing@_global_.routing") if isinstance(entry, DictConfig) else None
            if default in out:
                out.remove(default)
                out.insert(0, default)
    return out
