"""Experiments: runs as typed configs, one fit end to end (metrics, files, plots), sweeps, protocols, the demo."""
