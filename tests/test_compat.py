"""The host registry (`viasd_adapters.hosts.registry`) matches the decoders it describes."""

import inspect
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from viasd_adapters import compat
from viasd_adapters.configs import CONFIG_DIR
from viasd_adapters.hosts.registry import HOSTS, HostRegistry, HostSpec


@pytest.mark.parametrize("host", sorted(HOSTS))
def test_each_entry_says_what_its_decoder_takes(host):
    spec = HOSTS[host]
    if host == "eagle":
        pytest.importorskip("eagle.model.utils")
    cls = spec.decoder_class()
    assert HOSTS.for_decoder(cls) is spec and compat.host_for(cls) == host
    assert set(spec.parts) == {"target", "drafter", "verifier"} & set(inspect.signature(cls).parameters)
    assert spec.streams == ("streamer" in inspect.signature(cls.generate).parameters)
    if spec.trees:  # a tree host's verifiers must judge trees
        from viasd_adapters.verify import LosslessVerifier, TieredVerifier

        assert all(compat.implements_trees(v) for v in (LosslessVerifier, TieredVerifier))


@pytest.mark.parametrize("framework", sorted(p.stem for p in (Path(CONFIG_DIR) / "framework").glob("*.yaml")))
def test_every_shipped_framework_has_an_entry(framework):
    target = OmegaConf.load(Path(CONFIG_DIR) / "framework" / f"{framework}.yaml").decoder._target_
    assert target in {spec.decoder_path for spec in HOSTS.values()}


def test_a_decoder_without_an_entry_is_named_with_the_fix():
    class MyDecoder:
        pass

    with pytest.raises(ValueError, match="MyDecoder is no host decoder .*: add a HostSpec for it"):
        compat.host_for(MyDecoder)


def test_a_registry_is_extended_by_value_never_in_place():
    class MyDecoder:
        pass

    extended = HOSTS.with_host(HostSpec("mine", "Mine", MyDecoder, ("target",)))
    assert extended.for_decoder(MyDecoder).key == "mine" and "mine" not in HOSTS
    with pytest.raises(ValueError, match="two hosts are registered as 'sd'"):
        HOSTS.with_host(HostSpec("sd", "Mine", MyDecoder, ("target",)))
    with pytest.raises(ValueError, match="framework 'medusa' is not one of"):
        HOSTS.host("medusa")
    assert isinstance(extended, HostRegistry)


def test_capabilities_refuse_what_a_host_cannot_do():
    greedy_only = HostSpec("g", "G", "x.G", ("target",), sampling=False, int8=False, streams=False)
    for asked, fix in (
        ("sampled", "temperature to 0"),
        ("int8", "runtime.weights=bfloat16"),
        ("streamed", "drop the streamer"),
    ):
        with pytest.raises(ValueError, match=f"^G .*{fix}"):
            greedy_only.check_capabilities(**{asked: True})
    greedy_only.check_capabilities()
    with pytest.raises(ValueError, match="parts \\['head'\\] are not among"):
        HostSpec("h", "H", "x.H", ("target", "head"))
