"""The critic zoo: six critics after published designs, their programs, TPU compiles, capacity."""
