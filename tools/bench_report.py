"""Rebuild one viasd-bench report from the records of several runs (a long benchmark split into
chunks by category, e.g. to share a machine): the tables of `viasd-bench`, over all records.

    python tools/bench_report.py OUT_DIR_1 OUT_DIR_2 ... [--ablation sd:sd-confident,sd-vocab,sd-int8:sd-fast]

Each chunk must hold every method (the ratios pair records of one prompt and repetition, which
live in one chunk). Prints Markdown.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from viasd_adapters.bench.report import ablation, build_report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="viasd-bench out_dirs (each with records.jsonl)")
    parser.add_argument("--ablation", help="REFERENCE:LEVER,LEVER,...[:COMBINED]")
    args = parser.parse_args()
    records, methods = [], None
    for run in args.runs:
        rows = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
        names = list(dict.fromkeys(r["method"] for r in rows))
        if methods is not None and names != methods:
            raise SystemExit(f"{run}: methods {names} differ from the first run's {methods}")
        methods = names
        records += rows
    first = records[0]
    baseline = first["baseline"]
    title = f"{first['task']} on {first['model_pair']} ({first['dtype']}, {first.get('hardware', first['device'])})"
    text, _ = build_report(records, baseline, first.get("host"), title)
    if args.ablation:
        reference, levers, *combined = args.ablation.split(":")
        table, _ = ablation(records, reference, levers.split(","), combined[0] if combined else None)
        text += f"\n### Ablation: each lever against {reference}\n\n{table}\n"
    print(text)


if __name__ == "__main__":
    main()
