"""Bayesian linear regression three ways: closed form, NUTS and mean-field SVI on the same BNN object.

python examples/linear_regression_ground_truth.py
"""

import torch

import bnn_zoo as bz
from bnn_zoo.evaluation.exact import linear_regression

g = torch.Generator().manual_seed(0)
z = torch.randn(50, 2, generator=g)
x = torch.stack([z[:, 0], 0.9 * z[:, 0] + 0.44 * z[:, 1]], 1)  # correlated inputs
y = x @ torch.tensor([1.0, -0.5]) + 0.2 + 0.5 * torch.randn(50, generator=g)

exact = linear_regression(x, y, weight_scale=1.0, bias_scale=1.0, noise_scale=0.5)
model = bz.BNN(bz.models.MLP(2, hidden=[], out_features=1), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(0.5))
nuts = bz.fit(model, x, y, bz.NUTS(num_warmup=300, num_samples=1000, num_chains=2))
svi = bz.fit(model, x, y, bz.SVI(steps=3000, lr=0.05, lr_decay=0.02, num_particles=16))


def summary(post):
    d = post.draws()
    w = torch.cat([d["layers.0.weight"].reshape(len(d["layers.0.bias"]), -1), d["layers.0.bias"]], 1).double()
    return w.mean(0), w.std(0)


print("parameter   exact mean  exact sd  mean-field sd (1/sqrt(Lambda_ii))")
for i, name in enumerate(["w1", "w2", "b"]):
    print(f"{name:>9} {exact.mean[i]:11.3f} {exact.cov[i, i].sqrt():9.3f} {exact.mean_field_variance[i].sqrt():10.3f}")
for label, post in [("NUTS", nuts), ("mean-field SVI", svi)]:
    mean, sd = summary(post)
    print(f"{label:>15}: means {[round(v, 3) for v in mean.tolist()]}, sds {[round(v, 3) for v in sd.tolist()]}")
elbo, se = svi.elbo(num_samples=4000)
print(f"log evidence {exact.log_evidence:.3f}; ELBO {elbo:.3f} +- {se:.3f} (gap = KL(q || posterior) > 0)")
