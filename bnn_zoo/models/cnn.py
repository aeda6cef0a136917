"""LeNet-style convolutional network on flattened images (Gal's thesis sec. 3.4.1, lenet-all / lenet-ip)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from bnn_zoo.errors import BnnZooError, checked

PLACEMENTS = ("all", "dense")


class LeNet(nn.Module):
    """[conv(kernel, same padding) -> relu -> maxpool(pool)] per entry of ``channels``, then a dense
    hidden layer (relu) and the output layer. Inputs are rows of C*H*W numbers (images flattened, as
    every bnn-zoo model takes (N, features)); the module reshapes them to ``image_shape``.

    ``dropout`` says where a dropout guide puts its masks (read through :attr:`dropout_layers`):
    ``"all"`` (Gal's lenet-all) after every convolution and after the dense hidden layer; ``"dense"``
    (lenet-ip) only after the dense hidden layer. Per-example masks (``masks=example``) on a
    convolution block's output act before its pooling, as in Gal's lenet-all (:attr:`mask_sites`);
    a whole weight draw (``masks=step``) zeroes input units of the next weight, i.e. after pooling.

    Args:
        image_shape: (channels, height, width) of one image.
        channels: output channels of each convolution block.
        kernel: convolution kernel size (same padding).
        pool: max-pooling size.
        dense: width of the dense hidden layer.
        out_features: outputs (classes).
        dropout: which weights the dropout guide drops: ``"all"`` (lenet-all) or the dense layers only
            (``"dense"``, lenet-ip).
    """

    @checked
    def __init__(
        self,
        image_shape: Sequence[int] = (1, 8, 8),
        channels: Sequence[int] = (16, 32),
        kernel: int = 3,
        pool: int = 2,
        dense: int = 64,
        out_features: int = 10,
        dropout: Literal["all", "dense"] = "all",
    ):
        super().__init__()
        if dropout not in PLACEMENTS:
            raise BnnZooError(f"unknown dropout placement {dropout!r}; choose all (lenet-all) or dense (lenet-ip)")
        c, h, w = image_shape
        blocks = []
        for out in channels:
            if h < pool or w < pool:
                raise BnnZooError(
                    f"{len(channels)} pooling blocks shrink a {image_shape[1]}x{image_shape[2]} image below the "
                    f"{pool}x{pool} pool; use fewer channels entries or a smaller pool"
                )
            blocks += [nn.Conv2d(c, out, kernel, padding=kernel // 2), nn.ReLU(), nn.MaxPool2d(pool)]
            c, h, w = out, h // pool, w // pool
        self.image_shape, self.channels, self.kernel, self.pool, self.dense = (
            tuple(image_shape),
            list(channels),
            kernel,
            pool,
            dense,
        )
        self.in_features, self.out_features, self.dropout = (
            image_shape[0] * image_shape[1] * image_shape[2],
            out_features,
            dropout,
        )
        self.features = nn.Sequential(nn.Unflatten(-1, tuple(image_shape)), *blocks, nn.Flatten(-3))
        self.hidden = nn.Linear(c * h * w, dense)
        self.out = nn.Linear(dense, out_features)

    @property
    def dropout_layers(self) -> list[str]:
        """Weights whose input units a dropout guide masks, by this net's placement."""
        convs = [f"features.{i}.weight" for i, m in enumerate(self.features) if isinstance(m, nn.Conv2d)]
        return ["out.weight"] if self.dropout == "dense" else [*convs[1:], "hidden.weight", "out.weight"]

    @property
    def mask_sites(self) -> dict[str, str]:
        """Where a weight's per-example input mask acts: the pooling after the previous convolution."""
        pools = [f"features.{i}" for i, m in enumerate(self.features) if isinstance(m, nn.MaxPool2d)]
        later = [f"features.{i}.weight" for i, m in enumerate(self.features) if isinstance(m, nn.Conv2d)][1:] + [
            "hidden.weight"
        ]
        return dict(zip(later, pools))

    def forward(self, x):
        lead = x.shape[:-1]
        h = self.features(x.reshape(-1, x.shape[-1]))
        return self.out(self.hidden(h).relu()).reshape(*lead, -1)

    def forward_draws(
        self, weights: dict[str, torch.Tensor], x: torch.Tensor, input_masks: dict[str, torch.Tensor] | None = None
    ) -> torch.Tensor:
        """B weight draws at once (:class:`~bnn_zoo.protocols.ForwardsDraws`): (B, N, out).

        The draws' channels side by side: a convolution of B draws is one convolution with B groups (as
        vmap batches it, without vmap's per-call cost), the dense layers batched products. Each block
        pools before its ReLU, on a quarter of the numbers: max pooling commutes with the monotone ReLU.

        Args:
            weights: every parameter by name, (B, *shape).
            x: inputs (N, C*H*W) shared by the draws, or (B, N, C*H*W).
            input_masks: per-example masks on a layer's input, by its weight's name: (B, N, C, H, W)
                for a convolution, (B, N, in) for a dense layer.
        """
        masks = input_masks or {}
        draws, rows = next(iter(weights.values())).shape[0], x.shape[-2]
        # (N, draws x channels, H, W); shared inputs stay one copy until a layer's weights differ per draw
        h = x.reshape(-1, rows, *self.image_shape).transpose(0, 1).flatten(1, 2)
        per_draw = x.dim() == 3
        for i, module in enumerate(self.features):
            if isinstance(module, nn.Conv2d):
                name = f"features.{i}.weight"
                if name in masks:
                    h = h if per_draw else h.unsqueeze(1).expand(rows, draws, *h.shape[1:]).flatten(1, 2)
                    h, per_draw = h * masks[name].transpose(0, 1).flatten(1, 2), True
                h = F.conv2d(
                    h,
                    weights[name].flatten(0, 1),
                    weights[f"features.{i}.bias"].flatten(),
                    module.stride,
                    module.padding,
                    module.dilation,
                    groups=draws if per_draw else 1,
                )
                per_draw = True
            elif isinstance(module, nn.MaxPool2d):
                h = F.max_pool2d(h, module.kernel_size, module.stride, module.padding, module.dilation).relu_()
        h = h.reshape(rows, draws, -1).transpose(0, 1)  # (B, N, C*H*W), as nn.Flatten orders a draw's features
        for name in ("hidden", "out"):
            if f"{name}.weight" in masks:
                h = h * masks[f"{name}.weight"]
            h = torch.baddbmm(weights[f"{name}.bias"].unsqueeze(1), h, weights[f"{name}.weight"].transpose(1, 2))
            h = h.relu_() if name == "hidden" else h
        return h

    def extra_repr(self):
        return (
            f"image_shape={self.image_shape}, channels={self.channels}, kernel={self.kernel}, pool={self.pool}, "
            f"dense={self.dense}, out_features={self.out_features}, dropout={self.dropout!r}"
        )
