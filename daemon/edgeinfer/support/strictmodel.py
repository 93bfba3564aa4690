"""The one base of every configuration and file model: an unknown key is an error, a loaded value is frozen.

Frigate's `frigate/config/base.py` habit: the daemon's configuration (config/), a bundle's model.yaml and its
decoders' parameters (models/), the gateway's and the MQTT bridge's settings, a camera's file and a drift
reference all inherit it, so "extra inputs are not permitted" means the same everywhere.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["StrictModel"]


class StrictModel(BaseModel):
    """A pydantic model that refuses keys it does not declare and cannot be changed once validated."""

    model_config = ConfigDict(extra="forbid", frozen=True)
