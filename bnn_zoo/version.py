"""The installed package's version, read from its metadata (pyproject.toml is the one place it is set)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("bnn-zoo")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
