"""The Hydra config tree: one folder per config group, the primary configs beside them.

A package only so the wheel can ship it (as `viasd_adapters.conf`, pyproject.toml's
`package-dir`); `viasd_adapters.configs` finds it and the user config directory.
"""
