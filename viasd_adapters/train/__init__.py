"""Training what the adapters need (EAGLE draft heads). Import the submodule you need."""
