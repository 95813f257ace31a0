"""What a dataset trains with by default: its tuned recipe, networks and real data.

    defaults.py      the recipe of each dataset (and of the ViT critic): TrainConfig fields, steps,
                     widths; default_config, and build_problem: the networks and the real sampler

Imports ``training`` and the layers below it at most.
"""
