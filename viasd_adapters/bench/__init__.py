"""`viasd-bench`: every method side by side on the same prompts, speed and quality.

Modules: `tasks` (prompts), `metrics` (quality and agreement), `resources` (memory and CPU
probes), `harness` (the interleaved loop and its records), `report` (tables), `plots`.
"""
