"""The prompt set that ships with the package (package data), written for this project.

`default.jsonl` follows Spec-Bench's JSONL format and categories: multi-turn chat (`mt_bench`),
translation, summarization, qa, math_reasoning and rag, plus code; 8 prompts each. Config files
name it `pkg://viasd_adapters.prompts/default.jsonl` (see `viasd_adapters.bench.tasks.resolve_path`).
"""

from pathlib import Path

PROMPTS_DIR = Path(__file__).resolve().parent
DEFAULT = "pkg://viasd_adapters.prompts/default.jsonl"  # how configs name the shipped set
