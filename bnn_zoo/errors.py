"""The one exception bnn-zoo raises for bad input: its message says what is wrong and how to fix it."""


class BnnZooError(ValueError):
    """Bad input caught at the boundary, before any training starts."""
