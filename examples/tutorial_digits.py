"""Tutorial: architectures compared by evidence and by calibration on scikit-learn's digits.

An MLP (64-50-10, ReLU) and a LeNet (channels 16, 32; dense 64; dropout after the dense layer),
both under N(0, 1), fitted by mean-field SVI (ELBO and importance-weighted bound) and the CNN also by
MC dropout; then `bz.compare` puts them in one table and the report draws the reliability diagram
(Heek's expected-versus-observed bins with +-2 sd bands) and the evidence plot.

    python examples/tutorial_digits.py [--out runs/tutorial-digits]    (about a minute on 2 cores)
"""

import argparse
from pathlib import Path

import bnn_zoo as bz
from bnn_zoo.evaluation.compare import report
from bnn_zoo.experiments.run import run

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--out", default="runs/tutorial-digits")
out = Path(parser.parse_args().out)

data = bz.data.digits()
categorical = bz.likelihoods.Categorical()
mlp = bz.BNN(bz.models.MLP(64, [50], 10, activation="relu"), bz.priors.Normal(1.0), categorical)
cnn = bz.BNN(
    bz.models.LeNet((1, 8, 8), channels=(16, 32), dense=64, out_features=10, dropout="dense"),
    bz.priors.Normal(1.0),
    categorical,
)
svi = dict(steps=3000, lr=0.005, batch_size=128, num_draws=200, progress=False)

results = [
    run("mlp mean-field", data, mlp, bz.SVI(**svi), out / "mlp-mean-field", evidence=["iw"]),
    run("cnn mean-field", data, cnn, bz.SVI(**svi), out / "cnn-mean-field", evidence=["iw"]),
    run(
        "cnn dropout",
        data,
        cnn,
        bz.SVI(guide="dropout", guide_options={"p": 0.5, "masks": "example"}, **svi),
        out / "cnn-dropout",
    ),
]
table = report([out / "mlp-mean-field", out / "cnn-mean-field", out / "cnn-dropout"], out / "comparison")
columns = ["run", "architecture", "elbo", "evidence_iw", "accuracy", "nll", "ece", "runtime_s"]
print("| " + " | ".join(columns) + " |")
print("|---" * len(columns) + "|")
for _, row in table[columns].iterrows():
    print("| " + " | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in row) + " |")
print(f"\nfigures: {out / 'comparison'}/reliability.png, evidence.png")
