"""Writes tests/data/saved/arviz-<major>/: a NUTS, an SVI and a GP posterior fitted on the toy data and
saved under the installed ArviZ, with the first 10 draws of what each predicts at X_NEW
(predictions.json). Run once under each ArviZ major (Python 3.11: 0.2x; Python 3.12: 1.x);
tests/test_saving.py reads both under either.

    python tests/data/saved/make.py
"""

import json
from pathlib import Path

import torch

import bnn_zoo as bz
from bnn_zoo import arviz_compat

X_NEW = torch.linspace(-3, 3, 11)[:, None]


def main() -> None:
    out = Path(__file__).parent / f"arviz-{arviz_compat.MAJOR}"
    x, y = bz.data.toy_cubic().train
    model = bz.BNN(bz.models.MLP(1, [4], 1), bz.priors.FanInNormal(), bz.likelihoods.Gaussian.learned())
    fits = {
        "nuts": bz.fit(model, x, y, bz.NUTS(num_warmup=20, num_samples=20, num_chains=2, seed=1, progress=False)),
        "svi": bz.fit(model, x, y, bz.SVI(steps=100, num_draws=40, seed=1, progress=False)),
        "gp": bz.fit(bz.GP("rbf"), x, y, bz.TypeII(steps=30, progress=False)),
    }
    predictions = {}
    for name, posterior in fits.items():
        posterior.save(out / name, idata=posterior.to_inference_data(num_samples=50) if name == "gp" else None)
        predictions[name] = posterior.predict(X_NEW).f[:10].tolist()  # the first 10 draws
    (out / "predictions.json").write_text(json.dumps({"arviz": arviz_compat.az.__version__, **predictions}))


if __name__ == "__main__":
    main()
