"""Causal2Vec checkpoints: the local layout kvembed deploys (torch-free; the model side is
:mod:`kvembed.patch.contextual`)."""

from .layout import CONFIG, PROJECTOR, Causal2VecCheckpoint, assemble, is_checkpoint

__all__ = ["CONFIG", "PROJECTOR", "Causal2VecCheckpoint", "assemble", "is_checkpoint"]
