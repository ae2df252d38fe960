"""Console entry points: thin `@hydra.main` wrappers around plain `run(cfg)` functions."""

from pathlib import Path

# Absolute, so console scripts find the repository's conf/ whatever their working directory.
CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "conf")
