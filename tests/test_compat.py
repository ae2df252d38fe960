"""The framework x verifier table (`viasd_adapters.compat`) matches the decoders it describes."""

import inspect
from pathlib import Path

import pytest
from hydra.utils import get_class
from omegaconf import OmegaConf

from viasd_adapters import compat
from viasd_adapters.configs import CONFIG_DIR


@pytest.mark.parametrize("host", sorted(compat.HOSTS))
def test_each_row_says_what_its_decoder_takes(host):
    row = compat.HOSTS[host]
    if host == "eagle":
        pytest.importorskip("eagle.model.utils")
    cls = get_class(row.decoder)
    assert compat.host_for(cls) == host
    assert set(row.parts) == {"target", "drafter", "verifier"} & set(inspect.signature(cls).parameters)
    assert "streamer" in inspect.signature(cls.generate).parameters  # every decoder streams


@pytest.mark.parametrize("framework", sorted(p.stem for p in (Path(CONFIG_DIR) / "framework").glob("*.yaml")))
def test_every_shipped_framework_has_a_row(framework):
    target = OmegaConf.load(Path(CONFIG_DIR) / "framework" / f"{framework}.yaml").decoder._target_
    assert target in {row.decoder for row in compat.HOSTS.values()}


def test_a_decoder_without_a_row_is_named_with_the_fix():
    class MyDecoder:
        pass

    with pytest.raises(ValueError, match="MyDecoder is no host decoder .*: add a row for it there"):
        compat.host_for(MyDecoder)
