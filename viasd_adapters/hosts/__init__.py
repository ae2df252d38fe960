"""The host adapters: each wraps one host framework's verify step (`viasd_adapters.third_party`)
with VIA-SD's `TieredVerifier`. Plain draft-model SD, lookup and cascade need none: they are
`decode.SpeculativeDecoder` with a drafter.

Every host, wherever its decoder lives, is one entry of the registry (`hosts/registry.py`), which
the API, the commands and the checks read (docs/extending.md)."""
