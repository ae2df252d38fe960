"""The package's Hydra configs (package data): one folder per config group."""

from pathlib import Path

# Absolute, so console scripts find the configs whatever their working directory.
CONFIG_DIR = str(Path(__file__).resolve().parent)
