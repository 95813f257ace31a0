"""approximate_r1 against exact R1: value ratios, mean gradients, TPU cost, capacity, training."""
