"""`viasd-generate`: decode one prompt with the configured model pair, framework and verifier.

viasd-generate prompt="Write a haiku about caches."
viasd-generate prompt_file=question.txt framework=sd verifier=tiered    # any characters
echo "What is 2 + 2?" | viasd-generate prompt_file=-                     # stdin
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from hydra.utils import instantiate
from omegaconf import DictConfig

from ..api import describe
from ..checks import check_config
from ..decode import GenerationResult
from ..hosts.registry import HOSTS, HostRegistry
from ..pipeline import Pipeline
from ..progress import TokenProgress
from . import apply_routing_file, entry_point, set_threads


@dataclass
class GenerateOutcome:
    """What one `viasd-generate` run produced."""

    text: str  # the new text, special tokens removed
    result: GenerationResult  # new token ids and `DecodeStats`
    method: str  # what ran, e.g. "VIA-SD on SD" (`viasd_adapters.api.describe`)
    prompt: str  # the user message as read (from `prompt`, `prompt_file` or stdin)
    prompt_tokens: int  # T, after the chat template

    def stats_line(self) -> str:
        return f"[{self.method}] {self.result.stats.summary()}"

    def __iter__(self):
        """`text, result = run(cfg)` keeps working for callers written against the older tuple."""
        return iter((self.text, self.result))


def read_prompt(cfg: DictConfig) -> str:
    """The prompt: `prompt_file` ("-" for stdin, read as UTF-8) when set, else `prompt`."""
    source = cfg.get("prompt_file")
    if source is None:
        return cfg.prompt
    if str(source) == "-":
        text = sys.stdin.read()
    else:
        path = Path(str(source)).expanduser()
        if not path.is_file():
            raise ValueError(f"prompt_file {str(path)!r} does not exist: give a text file, or prompt_file=- for stdin")
        text = path.read_text(encoding="utf-8")
    if not text.strip():
        raise ValueError(f"the prompt read from {'stdin' if str(source) == '-' else source} is empty")
    return text.rstrip("\n")


def run(cfg: DictConfig, hosts: HostRegistry = HOSTS) -> GenerateOutcome:
    """Decode the configured prompt; `hosts`: the host registry the framework's decoder is found in."""
    check_config(cfg, hosts=hosts)
    set_threads(cfg.runtime.threads)
    prompt = read_prompt(cfg)  # before loading: a missing file fails fast
    apply_routing_file(cfg)
    sampling = instantiate(cfg.sampling)
    pipeline = Pipeline.from_config(cfg, hosts)
    method = describe(pipeline.decoder, hosts)
    ids = pipeline.encode(prompt)
    progress = TokenProgress(cfg.max_new_tokens, enabled=bool(cfg.progress), desc=method)
    result = pipeline.generate(ids, cfg.max_new_tokens, sampling, streamer=progress)
    progress.end()
    return GenerateOutcome(pipeline.decode(result.tokens), result, method, prompt, ids.shape[1])


@entry_point("generate")
def main(cfg: DictConfig) -> None:
    outcome = run(cfg)
    print(outcome.text)
    print(outcome.stats_line())


if __name__ == "__main__":
    main()
