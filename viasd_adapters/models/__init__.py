"""The model zoo: tiny random models for tests, offline real models, local folders, hub ids."""

from .offline import OFFLINE_MODELS, OfflineSource
from .spec import LoadedModel, ModelSpec, TinyModelConfig
from .zoo import load_model

__all__ = [
    "OFFLINE_MODELS",
    "LoadedModel",
    "ModelSpec",
    "OfflineSource",
    "TinyModelConfig",
    "load_model",
]
