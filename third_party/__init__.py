"""The host frameworks, as their users know them: EAGLE (eagle-llm made to run on this stack) and
PEARL (parallel drafting). They work without VIA-SD and import nothing of it; the adapters in
`viasd_adapters.hosts` wire VIA-SD's tiers into their verify steps.

In a checkout this is the top-level `third_party/` folder; the wheel ships it as the subpackage
`viasd_adapters.third_party` (pyproject.toml's `package-dir`).
"""
