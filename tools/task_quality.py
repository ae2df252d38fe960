"""Task quality of one target precision: greedy answers to a benchmark task, decoded in batches.

Quality needs many complete answers, not timings, so the prompts are decoded several at a time by
transformers' `generate` (greedy, left padding) instead of one by one as `viasd-bench` does. The
overrides are viasd-bench's (model pair, task, runtime); the records hold the fields
`viasd_adapters.bench.quality` compares. Writes records.jsonl into `out_dir`.

    python tools/task_quality.py runtime.weights=int8 task=humaneval task.limit=20 out_dir=runs/int8-humaneval
    python -m viasd_adapters.bench.quality int8=runs/int8-humaneval bfloat16=runs/bf16-humaneval --reference bfloat16

A row of a batch is not computed as it would be alone (padding masks take other attention
kernels, and int8 attention is plain SDPA here, not row by row), so outputs can part from
one-prompt decoding at near-ties; the scores measure the precision, not one decoder.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from tqdm.auto import tqdm

from viasd_adapters.bench.metrics import QUALITY_METRICS, check_execution_enabled
from viasd_adapters.checks import check_config
from viasd_adapters.configs import CONFIG_DIR
from viasd_adapters.models import load_model
from viasd_adapters.models.precision import runtime_precision
from viasd_adapters.models.row_attention import ROW_INVARIANT_ATTENTION
from viasd_adapters.pipeline import encode_text


def main(argv: list[str]) -> None:
    overrides = [a for a in argv if not a.startswith(("out_dir=", "batch_size="))]
    settings = dict(a.split("=", 1) for a in argv if a.startswith(("out_dir=", "batch_size=")))
    if "out_dir" not in settings:
        raise SystemExit("give out_dir=DIR (records.jsonl is written there)")
    batch_size = int(settings.get("batch_size", 10))
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="bench", overrides=["method=[ar]", *overrides])
    check_config(cfg, overrides)
    task = instantiate(cfg.task, _convert_="all")
    prompts = task.prompts()
    if "pass@1" in task.metrics.values():
        check_execution_enabled()
    if cfg.runtime.threads:
        torch.set_num_threads(cfg.runtime.threads)
    target = load_model(instantiate(cfg.model_pair.target))
    tokenizer, model = target.tokenizer, target.model
    # int8's row-by-row attention keeps a verify block equal to one-token steps; under padding masks
    # it would copy every key for every row (GQA heads repeated per call): batches take plain SDPA.
    if model.config._attn_implementation == ROW_INVARIANT_ATTENTION:
        model.config._attn_implementation = "sdpa"
    budget = task.max_new_tokens or cfg.max_new_tokens
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else target.stop_token_ids[0]
    encoded = [encode_text(tokenizer, p.text, cfg.chat_template)[0] for p in prompts]
    order = sorted(range(len(prompts)), key=lambda i: len(encoded[i]))  # similar lengths share a batch
    out = Path(settings["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    path = out / "records.jsonl"
    path.write_text("")  # appended batch by batch: an interrupted run keeps what it finished
    bar = tqdm(total=len(prompts), desc=f"{task.name} {runtime_precision(cfg.runtime)}", unit="prompt")
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        width = max(len(encoded[i]) for i in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, i in enumerate(batch):
            ids[row, width - len(encoded[i]) :] = encoded[i]
            mask[row, width - len(encoded[i]) :] = 1
        begin = time.perf_counter()
        with torch.no_grad():
            generated = model.generate(
                input_ids=ids.to(model.device),
                attention_mask=mask.to(model.device),
                max_new_tokens=budget,
                do_sample=False,
                eos_token_id=list(target.stop_token_ids),
                pad_token_id=pad,
            )[:, width:].tolist()
        seconds = time.perf_counter() - begin
        records = []
        for row, i in enumerate(batch):
            tokens = generated[row]
            ends = [k for k, t in enumerate(tokens) if t in target.stop_token_ids]
            tokens = tokens[: ends[0] + 1] if ends else tokens  # the stop token kept, as the decoders keep it
            prompt = prompts[i]
            text = tokenizer.decode(tokens, skip_special_tokens=True)
            metric = task.metric_for(prompt.category)
            score = QUALITY_METRICS[metric](prompt, text) if metric else None
            records.append(
                {
                    "task": task.name,
                    "category": prompt.category,
                    "prompt_id": prompt.id,
                    "rep": 0,
                    "method": "ar",
                    "baseline": "ar",
                    "dtype": runtime_precision(cfg.runtime).label,
                    "batch_seconds": seconds,
                    "prompt_tokens": len(encoded[i]),
                    "max_new_tokens": budget,
                    "new_tokens": len(tokens),
                    "quality_metric": metric,
                    "quality": None if score is None else score.value,
                    "quality_detail": None if score is None else score.detail,
                    "output_tokens": tokens,
                    "output_text": text,
                }
            )
        with path.open("a") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
        bar.update(len(batch))
    bar.close()
    print(f"{len(prompts)} records in {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
