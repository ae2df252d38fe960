"""VIA-SD as a transformers `custom_generate` repository (this folder's layout is what
`generate(custom_generate="<path or Hub repo>")` loads). It needs `viasd-adapters` installed.

    model.generate(**inputs, custom_generate=PATH, draft=draft_model, routing=mask, max_new_tokens=64)
"""

from viasd_adapters.integrations.transformers import generate as viasd_generate


def generate(model, **kwargs):
    # transformers hands a repository's function the raw `generate` arguments; run them through
    # `generate` again with the callable hook, so its usual preparation happens first.
    kwargs = {key: value for key, value in kwargs.items() if value is not None}
    return model.generate(custom_generate=viasd_generate, **kwargs)
