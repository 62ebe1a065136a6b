"""The communication model: ring all-reduce time, its fit to measured samples, and its
prediction with an interval (``comm``)."""
