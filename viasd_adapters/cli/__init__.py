"""Console entry points: thin `@hydra.main` wrappers around plain `run(cfg)` functions."""

import contextlib
import functools
import sys
import warnings
from collections.abc import Callable, Iterator

import hydra
import torch
from omegaconf import DictConfig, open_dict

from ..configs import CONFIG_DIR  # noqa: F401  (re-exported for the entry points)


def set_threads(threads: int | None) -> None:
    """torch's intra-op threads for this process; None keeps torch's default (all cores).
    On a busy host 1 thread is often faster: a 2-thread op waits for its slower thread."""
    if threads:
        torch.set_num_threads(int(threads))


@contextlib.contextmanager
def quiet_missing_user_config_dir() -> Iterator[None]:
    """Hydra warns about every search-path entry that does not exist; the user config
    directory is optional, so its absence is not worth a warning on every command."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"provider=hydra\.searchpath in main, path=.* is not available")
        yield


def entry_point(config_name: str) -> Callable[[Callable[[DictConfig], None]], Callable[[], None]]:
    """`@hydra.main` on the package's config `config_name` (CONFIG_DIR, then the user config
    directory), for a console script's `main`."""

    def wrap(task: Callable[[DictConfig], None]) -> Callable[[], None]:
        hydra_main = hydra.main(config_path=CONFIG_DIR, config_name=config_name, version_base="1.3")(task)

        @functools.wraps(task)
        def main() -> None:
            from ..checks import check_renamed

            # Hydra would refuse an old key (`threads=2`) without naming the new one: name it first
            check_renamed(arg for arg in sys.argv[1:] if "=" in arg and not arg.startswith("-"))
            with quiet_missing_user_config_dir():
                hydra_main()

        return main

    return wrap


def check_prompt_sources(calibration: DictConfig, key: str) -> None:
    """Read every JSONL prompt source of a calibration config now, before any model loads, so
    that a bad file's error comes at once and names its config key (`key`.sources.N.path)."""
    from ..bench.tasks import read_prompts_file

    for i, source in enumerate(calibration.sources):
        if source.get("kind") == "spec_bench" and source.get("path"):
            read_prompts_file(source.path, f"{key}.sources.{i}.path")


def apply_routing_file(cfg: DictConfig) -> None:
    """`routing_file=PATH` (a mask YAML, e.g. the mask.yaml `viasd-search` wrote) replaces the
    `routing` config group's choice: the file is loaded and checked here, before any model."""
    path = cfg.get("routing_file")
    if not path:
        return
    from pathlib import Path

    import yaml
    from omegaconf import OmegaConf

    from ..routing import RoutingMask

    file = Path(str(path)).expanduser()
    if not file.is_file():
        raise ValueError(
            f"routing_file={path}: no such file; pass a mask YAML (viasd-search writes"
            " <out_dir>/mask.yaml) or select a config by name with routing=NAME"
        )
    try:
        RoutingMask.from_yaml(file)
    except (ValueError, TypeError, KeyError, yaml.YAMLError) as err:
        raise ValueError(f"routing_file={path} is not a routing mask: {err}") from err
    with open_dict(cfg):
        cfg.routing = OmegaConf.load(file)
