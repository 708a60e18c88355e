"""qlinear's version, in a module of its own so that the writers that record it need not import the package."""

__version__ = "0.1.0"
