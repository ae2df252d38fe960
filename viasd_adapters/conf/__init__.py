"""The package's Hydra configs (package data): one folder per config group.

Every command also searches a user config directory, after the package's own configs: the
folder named by `$VIASD_CONFIG_DIR`, else `$XDG_CONFIG_HOME/viasd-adapters/conf` (by default
`~/.config/viasd-adapters/conf`). Put a config group file there (`routing/NAME.yaml`,
`policy/NAME.yaml`, `model_pair/NAME.yaml`, ...) and select it as `routing=NAME`; `viasd-search`
and `viasd-calibrate` write their results there. A name the package already uses stays the
package's: pick new names.
"""

import os
from pathlib import Path

from omegaconf import OmegaConf

# Absolute, so console scripts find the configs whatever their working directory.
CONFIG_DIR = str(Path(__file__).resolve().parent)


def user_config_dir() -> Path:
    """The user config directory (see the module docstring); it need not exist."""
    if os.environ.get("VIASD_CONFIG_DIR"):
        return Path(os.environ["VIASD_CONFIG_DIR"]).expanduser().resolve()
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return (Path(base).expanduser() / "viasd-adapters" / "conf").resolve()


# The primary configs name it `${viasd.user_config_dir:}` in `hydra.searchpath`; registering is
# idempotent, so importing this module (Hydra does, to find CONFIG_DIR) is all it takes.
OmegaConf.register_new_resolver("viasd.user_config_dir", lambda: str(user_config_dir()), replace=True)
