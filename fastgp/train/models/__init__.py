"""The networks: plain-JAX models as pure functions.

    networks.py      Model; mlp, conv_critic, conv_generator and vit_critic

The bottom layer, beside ``data``: imports nothing else of the application.
"""
