"""vipu: an open Virtual-IPU management plane."""

__version__ = "0.1.0"
