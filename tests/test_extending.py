"""docs/extending.md's worked example, run as written: a new host (block SD) and a new verifier
(top-k), registered and decoding on the tiny random pair from Python and through the CLI's run."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

import viasd_adapters as vsd
from tests.conftest import perturbed, tiny
from viasd_adapters.configs import CONFIG_DIR
from viasd_adapters.hosts.registry import HOSTS, HostSpec

DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"
PROMPT = torch.tensor([[5, 6, 7, 8, 9, 10, 11]])
# The example's package paths, and the top-level modules the test writes them as instead
MODULES = {"viasd_adapters.hosts.block": "extending_block", "viasd_adapters.verify.topk": "extending_topk"}


def doc_blocks() -> dict[str, str]:
    """The page's code blocks by the path their first line names (`# file: PATH` or `# entry: PATH`)."""
    blocks = {}
    for body in re.findall(r"```(?:python|yaml)\n(.*?)```", DOC.read_text(), flags=re.S):
        first, _, rest = body.partition("\n")
        kind, _, path = first.partition(": ")
        if kind in ("# file", "# entry"):
            blocks[f"{kind[2:]}:{path.strip()}"] = rest
    return blocks


def relocated(text: str) -> str:
    for package_path, module in MODULES.items():
        text = text.replace(package_path, module)
    return text


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    """The example's files written out (modules importable, configs in a user config directory)
    and the registry with its host entry."""
    blocks = doc_blocks()
    root = tmp_path_factory.mktemp("extending")
    for path, text in blocks.items():
        kind, _, name = path.partition(":")
        if kind == "file" and name.endswith(".py"):
            (root / f"{MODULES[name[:-3].replace('/', '.')]}.py").write_text(text)
        elif kind == "file":
            (root / name).parent.mkdir(parents=True, exist_ok=True)  # conf/<group>/<option>.yaml
            (root / name).write_text(relocated(text))
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(root))
        for module in MODULES.values():
            importlib.import_module(module)
        (entry,) = [text for path, text in blocks.items() if path.startswith("entry:")]
        spec = eval(relocated(entry), {"HostSpec": HostSpec})  # the entry, as the registry lists it
        yield blocks, root / "conf", HOSTS.with_host(spec)


@pytest.fixture(scope="module")
def pair():
    target = tiny(seed=0)
    return target, perturbed(target.model, scale=0.02)


def test_a_host_takes_three_files_and_a_verifier_two(example):
    blocks, _, _ = example
    verifier = [p for p in blocks if "topk" in p]
    host = [p for p in blocks if p not in verifier]
    assert sorted(host) == [
        "entry:viasd_adapters/hosts/registry.py",
        "file:conf/framework/block.yaml",
        "file:viasd_adapters/hosts/block.py",
    ]
    assert sorted(verifier) == ["file:conf/verifier/topk.yaml", "file:viasd_adapters/verify/topk.py"]


def test_the_new_host_decodes_from_python(example, pair):
    _, _, hosts = example
    target, draft = pair
    reference = target.model.generate(PROMPT, max_new_tokens=24, do_sample=False, pad_token_id=0)
    block = vsd.build(target.model, draft, framework="block", block=3, hosts=hosts)
    assert block.method == "block SD"
    assert torch.equal(block.generate(PROMPT, max_new_tokens=24), reference)  # lossless verifier: greedy = AR
    mask = vsd.RoutingMask(skip_layers=[2], num_layers=4)
    tiered = vsd.build(target.model, draft, framework="block", routing=mask, policy=(1.0, 1.0), hosts=hosts)
    assert tiered.method == "VIA-SD on block SD"  # every token escalates: still the target's output
    assert torch.equal(tiered.generate(PROMPT, max_new_tokens=24), reference)
    with pytest.raises(ValueError, match="framework 'block' is not one of"):
        vsd.build(target.model, draft, framework="block")  # the shipped registry does not know it


def test_a_capability_the_host_lacks_is_refused(example, pair):
    _, _, hosts = example
    target, draft = pair
    spec = hosts["block"]
    greedy_only = HOSTS.with_host(HostSpec(spec.key, spec.name, spec.decoder, spec.parts, sampling=False))
    generator = vsd.build(target.model, draft, framework="block", hosts=greedy_only)
    with pytest.raises(ValueError, match="block SD decodes greedily only: set the temperature to 0"):
        generator.generate(PROMPT, max_new_tokens=4, do_sample=True, temperature=0.7)


def compose_generate(conf: Path, monkeypatch, *overrides: str):
    monkeypatch.setenv("VIASD_CONFIG_DIR", str(conf))  # the example's configs, as a user's own
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose(
            config_name="generate",
            overrides=["model_pair=tiny-random", "max_new_tokens=12", "progress=false", *overrides],
        )


def test_the_new_host_and_verifier_run_through_the_cli(example, monkeypatch):
    from viasd_adapters.checks import check_config
    from viasd_adapters.cli.generate import run

    _, conf, hosts = example
    full = run(compose_generate(conf, monkeypatch, "framework=block"), hosts=hosts)
    assert full.method == "block SD" and len(full.result.tokens) == 12
    top1 = run(compose_generate(conf, monkeypatch, "framework=block", "verifier=topk", "verifier.k=1"), hosts=hosts)
    assert top1.result.tokens == full.result.tokens  # k = 1 is greedy SD's rule
    top4 = run(compose_generate(conf, monkeypatch, "framework=block", "verifier=topk", "verifier.k=4"), hosts=hosts)
    assert top4.result.stats.accepted >= top1.result.stats.accepted
    with pytest.raises(ValueError, match="is no host decoder of the registry"):
        check_config(compose_generate(conf, monkeypatch, "framework=block"), [])  # the shipped registry
    with pytest.raises(ValueError, match="BlockDecoder takes no setting 'blocks'"):
        check_config(
            compose_generate(conf, monkeypatch, "framework=block", "+framework.decoder.blocks=2"), [], hosts=hosts
        )
    eagle = compose_generate(conf, monkeypatch, "framework=eagle", "verifier=topk")
    with pytest.raises(ValueError, match="EAGLE.*not verifier=extending_topk.TopKVerifier"):
        check_config(eagle, [], hosts=hosts)


def test_a_verifier_without_verify_tree_says_so(example, pair):
    from viasd_adapters.compat import implements_trees
    from viasd_adapters.sampling import Sampler, SamplingConfig
    from viasd_adapters.verify import LosslessVerifier, TieredVerifier
    from viasd_adapters.verify.tree import DraftTree

    topk = importlib.import_module(MODULES["viasd_adapters.verify.topk"]).TopKVerifier
    assert not implements_trees(topk) and implements_trees(LosslessVerifier) and implements_trees(TieredVerifier)
    tree = DraftTree.chain(torch.tensor([3, 4]))
    with pytest.raises(NotImplementedError, match="TopKVerifier does not judge draft trees"):
        topk(pair[0].model).verify_tree(PROMPT, tree, Sampler(SamplingConfig(), PROMPT.device), judge=None)
