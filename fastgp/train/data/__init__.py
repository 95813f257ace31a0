"""The datasets and the quality metrics of generated samples.

    sets.py          the WGAN-GP toy distributions, 8x8 digits and 28x28 MNIST digits
    quality.py       the 2-D mixtures' mode metric; the digits and MNIST metric (C2ST, Frechet
                     distance, classes covered) with the pixel noise each figure is equivalent to
    calibration.py   the image metrics on real images and known damage to them (the noise curves)

The bottom layer, beside ``models``: imports nothing else of the application.
"""
