"""rstar: serve, evaluate and train tool-using reasoning models the rStar2-Agent way."""

__version__ = "0.1.0"
