"""Host-framework adapters (EAGLE, PEARL). Import the submodule you need: each pulls in its framework."""
