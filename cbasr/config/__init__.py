"""Typed configuration schemas (dataclasses) registered in Hydra's ConfigStore."""
