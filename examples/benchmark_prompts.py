"""Benchmark decoding methods on your own prompt file, every method interleaved on the same prompts.

    python examples/benchmark_prompts.py                                  # examples/my_prompts.txt, Qwen pair
    python examples/benchmark_prompts.py --prompts questions.jsonl --methods ar sd tiered lookup

The prompt file is either plain text (one prompt per line) or JSONL in Spec-Bench's shape (one
object per line: question_id, category, turns, optional reference; references get a quality
metric per category, see docs/results/benchmark.md). A text file is turned into such a JSONL in the run
directory first. The script then runs exactly the command it prints:

    viasd-bench task=jsonl task.prompts_file=FILE 'method=[...]' out_dir=RUN ...

which writes records.jsonl, table.md, summary.json and plots to the run directory. Speedups are
medians of per-prompt ratios inside this one run; name the CPU and the threads when you quote them.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def to_jsonl(prompts: Path, out_dir: Path) -> Path:
    """`prompts` itself when it is JSONL, else a Spec-Bench-shaped copy of its non-empty lines."""
    if prompts.suffix == ".jsonl":
        return prompts
    lines = [line.strip() for line in prompts.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not lines:
        raise SystemExit(f"{prompts} holds no prompts (one per line)")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{prompts.stem}.jsonl"
    with path.open("w", encoding="utf-8") as f:
        for i, text in enumerate(lines):
            f.write(
                json.dumps({"question_id": f"{prompts.stem}/{i}", "category": prompts.stem, "turns": [text]}) + "\n"
            )
    return path


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=Path, default=HERE / "my_prompts.txt", help=".txt (one per line) or .jsonl")
    parser.add_argument("--model-pair", default="qwen2.5-coder-0.5b-1.5b", help="a model_pair config name")
    parser.add_argument("--methods", nargs="+", default=["ar", "sd", "tiered"], help="conf/method/ names")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repetitions", type=int, default=2, help="timed runs of every (method, prompt)")
    parser.add_argument("--limit", type=int, default=None, help="prompts per category (default: all)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads: every method gets the same")
    parser.add_argument("--out-dir", type=Path, default=Path("outputs/examples") / time.strftime("bench-%Y%m%d-%H%M%S"))
    parser.add_argument("overrides", nargs="*", help="more viasd-bench overrides, e.g. runtime.weights=float32")
    args = parser.parse_args(argv)
    if not args.prompts.is_file():
        raise SystemExit(f"no prompt file {args.prompts}: pass --prompts FILE (.txt, one prompt per line, or .jsonl)")

    prompts_file = to_jsonl(args.prompts, args.out_dir)
    command = [
        "viasd-bench",
        f"model_pair={args.model_pair}",
        "task=jsonl",
        f"task.prompts_file={prompts_file}",
        f"method=[{','.join(args.methods)}]",
        f"max_new_tokens={args.max_new_tokens}",
        f"repetitions={args.repetitions}",
        f"runtime.threads={args.threads}",
        f"out_dir={args.out_dir}",
        *([f"task.limit={args.limit}"] if args.limit else []),
        *args.overrides,
    ]
    print("running:", shlex.join(command), flush=True)
    print(f"CPU: {platform.processor() or platform.machine()}, {args.threads} torch thread(s) per method", flush=True)
    # The same command through this interpreter, so a checkout works like an installed package.
    subprocess.run([sys.executable, "-m", "viasd_adapters.cli.bench", *command[1:]], check=True)
    print(f"\nrecords, table and plots: {args.out_dir}")
    return args.out_dir


if __name__ == "__main__":
    main()
