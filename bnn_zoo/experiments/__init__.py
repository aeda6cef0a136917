"""Experiments: specs from the command line, one fit end to end (metrics, files, plots), the demo."""
