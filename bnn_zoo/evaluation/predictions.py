"""A fit's test predictions as data (predictions.nc): what comparison plots and reference distances read.

One builder for both paths: ``bnn-zoo fit`` (whose predictions it gives the dataset's units) and
``bnn_zoo.compare`` on posteriors from ``bnn_zoo.fit`` (already in the data's units).
"""

from __future__ import annotations

import torch
import xarray as xr

from bnn_zoo.evaluation import reference, uncertainty


def test_predictions(pred, y: torch.Tensor, attrs: dict) -> xr.Dataset:
    """Per test point, in the data's units: class probabilities (their ``class`` coordinate the data's label
    names, where it has them) with entropy and mutual information, or
    the predictive mean, sd, PIT (predictive CDF at y) and, for one output, the predictive quantiles at
    ``reference.QUANTILE_LEVELS`` (for the distance to a reference posterior)."""
    if pred.likelihood.task == "classification":
        draws = pred.draw_probs
        ds = xr.Dataset(
            {
                "probs": (("obs", "class"), draws.mean(0).numpy()),
                "y": ("obs", y.long().reshape(-1).numpy()),
                "entropy": ("obs", uncertainty.predictive_entropy(draws).numpy()),
                "mutual_information": ("obs", uncertainty.mutual_information(draws).numpy()),
            },
            attrs=attrs,
        )
        names = getattr(pred.likelihood, "labels", None)  # the data's own labels, where it named them
        return ds if names is None else ds.assign_coords({"class": list(names)})
    y = y.reshape(len(y), -1)
    ds = xr.Dataset(
        {
            "y": ("obs", y[:, 0].numpy()),
            "mean": ("obs", pred.mean[:, 0].numpy()),
            "sd": ("obs", pred.variance.sqrt()[:, 0].numpy()),
            "pit": ("obs", pred.cdf(y)[:, 0].numpy()),
        },
        attrs=attrs,
    )
    if y.shape[1] == 1:
        q = reference.predictive_quantiles(pred)[..., 0]
        ds = ds.assign(quantile=(("obs", "level"), q.T.numpy()), level=("level", reference.QUANTILE_LEVELS.numpy()))
    return ds
