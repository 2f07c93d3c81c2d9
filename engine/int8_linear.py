"""Weight-only int8 linear layer: int8 weights with one scale per output channel.

The matmul runs in ``aten._weight_int8pack_mm`` (dequantization fused into the kernel). On
CPU that kernel is fast with bfloat16 activations and slow with float32 ones, which is why
the ``int8-weight`` variant runs bf16 activations.
"""

from __future__ import annotations

import torch


class WeightOnlyInt8Linear(torch.nn.Module):
    """y = x @ (W_int8 * scale)^T + b."""

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.register_buffer("qweight", qweight)
        self.register_buffer("scales", scales)
        self.bias = None if bias is None else torch.nn.Parameter(bias, requires_grad=False)
        self.out_features, self.in_features = qweight.shape

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear) -> WeightOnlyInt8Linear:
        weight = linear.weight.detach().float()
        scales = (weight.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
        qweight = torch.round(weight / scales[:, None]).clamp(-127, 127).to(torch.int8)
        bias = None if linear.bias is None else linear.bias.detach()
        return cls(qweight.contiguous(), scales.to(linear.weight.dtype), bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        out: torch.Tensor = torch.ops.aten._weight_int8pack_mm(flat, self.qweight, self.scales.to(x.dtype))
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)
