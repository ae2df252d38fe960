"""Where the Hydra configs are: the config tree (`conf/` in a checkout, `viasd_adapters.conf` in
the wheel), then the user's own.

Every command also searches a user config directory, after the package's own configs: the
folder named by `$VIASD_CONFIG_DIR`, else `$XDG_CONFIG_HOME/viasd-adapters/conf` (by default
`~/.config/viasd-adapters/conf`). Put a config group file there (`routing/NAME.yaml`,
`policy/NAME.yaml`, `model_pair/NAME.yaml`, ...) and select it as `routing=NAME`; `viasd-search`
and `viasd-calibrate` write their results there. A name the package already uses stays the
package's: pick new names.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from . import conf as _config_tree
from .models.precision import precision_label
from .schema import register as _register_schemas

# Absolute, so console scripts find the configs whatever their working directory.
CONFIG_DIR = str(Path(_config_tree.__file__).resolve().parent)


def user_config_dir() -> Path:
    """The user config directory (see the module docstring); it need not exist."""
    if os.environ.get("VIASD_CONFIG_DIR"):
        return Path(os.environ["VIASD_CONFIG_DIR"]).expanduser().resolve()
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return (Path(base).expanduser() / "viasd-adapters" / "conf").resolve()


def config_file(group: str, name: str | Path) -> Path | None:
    """A YAML path as given, else `<group>/<name>.yaml` where Hydra finds it: the package's
    configs first, then the user config directory; None when neither has it."""
    path = Path(name).expanduser()
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return path
    for root in (Path(CONFIG_DIR), user_config_dir()):
        candidate = root / group / f"{name}.yaml"
        if candidate.is_file():
            return candidate
    return None


def config_names(group: str) -> list[str]:
    """The options of a config group: the package's and the user config directory's."""
    return sorted({p.stem for root in (Path(CONFIG_DIR), user_config_dir()) for p in (root / group).glob("*.yaml")})


ROUTING_FORMS = "a mask YAML file (viasd-search ... mask_name=NAME writes one and installs it as routing=NAME)"


def named_config(group: str, name: str | Path, what: str, forms: str) -> Path:
    """The YAML file `name` stands for (`config_file`), or an error naming the forms it may take
    and the group's options."""
    path = config_file(group, name)
    if path is None:
        raise ValueError(
            f"no {what} {str(name)!r}: give {forms} or the name of one of {', '.join(config_names(group))}"
        )
    return path


def mask_file(name: str | Path, what: str = "routing mask", forms: str = ROUTING_FORMS) -> Path:
    """The YAML file of a routing mask given by name or path, as `routing=NAME` finds it: a mask
    YAML path, else a routing config's name (the package's, then the user config directory's).

    Args:
        name: a YAML path or a routing option's name.
        what: the mask's role, as an error names it (e.g. "routing mask for seed 'routing:x'").
        forms: the other forms the caller accepts, as an error lists them.
    """
    return named_config("routing", name, what, forms)


def named_mask(name: str | Path, what: str = "routing mask", forms: str = ROUTING_FORMS):
    """The `RoutingMask` of `mask_file(name, what, forms)`: every by-name mask lookup ends here."""
    from .routing import RoutingMask  # the config helpers load no model code until a mask is asked for

    return RoutingMask.from_yaml(mask_file(name, what, forms))


def load_routing(names: list[str]) -> dict[str, DictConfig]:
    """Routing configs by name or YAML path, as `routing=NAME` finds them (clear error for a missing one)."""
    return {name: OmegaConf.load(mask_file(name)) for name in names}


def result_option(key: str, name: str, group: str, custom_dir: bool) -> str:
    """Check `name`, under which a command writes its result as `<group>=<name>` (`key` sets it).

    Unless the result goes to a directory of the user's choosing (`custom_dir`), a name the
    package already ships is refused: Hydra would still select the package's file.
    """
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise ValueError(f"{key}={name!r}: use letters, digits, '.', '_' and '-' (it becomes {group}=<name>)")
    if not custom_dir and (Path(CONFIG_DIR) / group / f"{name}.yaml").exists():
        raise ValueError(
            f"{key}={name!r} is a {group} config shipped with the package, which {group}={name}"
            f" would still select: pick another {key}"
        )
    return name


# The primary configs name it `${viasd.user_config_dir:}` in `hydra.searchpath`; registering is
# idempotent, so importing this module (Hydra does, to find CONFIG_DIR) is all it takes.
OmegaConf.register_new_resolver("viasd.user_config_dir", lambda: str(user_config_dir()), replace=True)
# `${viasd.precision:WEIGHTS,ACTIVATIONS}`: the latency profile's label of a precision, for the
# configs whose costs are looked up in it ("int8", "bfloat16+int8-weight"; models.precision).
OmegaConf.register_new_resolver("viasd.precision", precision_label, replace=True)

# The runtime, policy and framework YAMLs and verifier/tiered.yaml extend typed schemas (schema.py),
# which must be in Hydra's store before a config is composed: importing this module is again all it takes.
_register_schemas()
