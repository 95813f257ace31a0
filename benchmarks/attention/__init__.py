"""Long-sequence ViT critic steps with flash and jnp attention, compiled for TPU chips."""
