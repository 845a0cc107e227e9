"""Model FLOPs per sample, counted once per model and input shape, and device peaks.

``forward_flops_per_sample`` runs one forward pass of a single sample under
``torch.utils.flop_counter.FlopCounterMode`` (which counts matmuls, convolutions and
scaled-dot-product attention at 2 FLOPs per multiply-add). A training step costs about
three forwards (the backward pass computes gradients of activations and of weights, each
as costly as the forward; Kaplan et al. 2020, and the convention of PaLM's model-FLOPs
utilisation, Chowdhery et al. 2022). Element-wise work (norms, activations, softmax) is
not counted, as in those references.

``peak_tflops`` looks up the dense peak of the device for the run's precision in
``PEAK_TFLOPS`` (vendor data sheets, dense, no sparsity), or None when unknown.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a model is run: checking a config loads the throughput hook without it
    import torch

TRAIN_FORWARD_MULTIPLE = 3

# Dense peak TFLOP/s by device-name fragment (matched in order, case-insensitive) and
# number format: '16' is bf16/fp16 on tensor cores / MMEs, 'tf32' fp32 matmuls in TF32,
# '32' plain fp32 on the CUDA cores (TF32 off).
PEAK_TFLOPS: list[tuple[str, dict[str, float]]] = [
    ("H200", {"16": 989.0, "tf32": 494.0, "32": 67.0}),
    ("H100 PCIe", {"16": 756.0, "tf32": 378.0, "32": 51.0}),
    ("H100 NVL", {"16": 835.0, "tf32": 418.0, "32": 60.0}),
    ("H100", {"16": 989.0, "tf32": 494.0, "32": 67.0}),  # SXM
    ("GH200", {"16": 989.0, "tf32": 494.0, "32": 67.0}),
    ("B200", {"16": 2250.0, "tf32": 1100.0}),
    ("A100", {"16": 312.0, "tf32": 156.0, "32": 19.5}),
    ("A10G", {"16": 70.0, "tf32": 35.0}),
    ("L40S", {"16": 362.0, "tf32": 183.0}),
    ("L4", {"16": 121.0, "tf32": 60.0}),
    ("A10", {"16": 125.0, "tf32": 62.5}),
    ("V100", {"16": 125.0}),
    ("GAUDI3", {"16": 1835.0}),
    ("GAUDI2", {"16": 432.0}),
]


def forward_flops_per_sample(model: torch.nn.Module, sample_shape: tuple[int, ...], device: torch.device | str = "cpu") -> int:
    """FLOPs of one forward pass of one sample of shape ``sample_shape`` (no batch dim).

    The model runs in eval mode (no dropout, so no random numbers are drawn) under
    ``torch.no_grad``, then returns to its previous mode. Attention runs on PyTorch's
    math kernel for the count: ``FlopCounterMode`` has no formula for the CPU's fused
    attention kernel and would miss its FLOPs (the GPU's fused kernels count the same).
    """
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
            model(torch.zeros((1, *sample_shape), device=device))
    finally:
        model.train(was_training)
    return int(counter.get_total_flops())


def number_format(precision: str, tf32: bool) -> str:
    """The ``PEAK_TFLOPS`` column for a run's precision."""
    if precision in ("bf16", "fp16"):
        return "16"
    return "tf32" if tf32 else "32"


def lookup_peak(device_name: str, fmt: str) -> float | None:
    """The dense peak TFLOP/s of ``device_name`` in number format ``fmt``, or None."""
    name = device_name.upper()
    for fragment, peaks in PEAK_TFLOPS:
        if fragment.upper() in name:
            return peaks.get(fmt)
    return None


def device_name(backend) -> str | None:
    """The accelerator's product name (``NVIDIA H100 80GB HBM3``, ``GAUDI2``), or None."""
    if backend.device.type == "cuda":
        import torch

        return torch.cuda.get_device_name(backend.device)
    if backend.device.type == "hpu":
        hpu = getattr(backend, "hpu", None)
        getter = getattr(hpu, "get_device_name", None)
        return str(getter()) if callable(getter) else None
    return None


def peak_tflops(backend) -> float | None:
    """The backend's device peak for its precision (None: not in ``PEAK_TFLOPS``)."""
    name = device_name(backend)
    if name is None:
        return None
    tf32 = backend.options.tf32 if backend.device.type == "cuda" else False
    return lookup_peak(name, number_format(backend.precision, tf32))
