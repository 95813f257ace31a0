"""Whole critic steps compiled for TPU chips and meshes, and the collectives of compiled steps."""
