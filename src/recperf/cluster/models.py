"""Parameter counts of well-known models, to turn a trace's model name into gradient bytes."""

from __future__ import annotations

# Millions of parameters (torchvision / reference implementations); fp32 gradients.
PARAMS_M: dict[str, float] = {
    "alexnet": 61.1,
    "vgg": 138.4,
    "vgg11": 132.9,
    "vgg16": 138.4,
    "vgg19": 143.7,
    "resnet18": 11.7,
    "resnet50": 25.6,
    "resnet101": 44.5,
    "resnet152": 60.2,
    "inception3": 23.8,
    "inception4": 42.7,
    "googlenet": 6.6,
    "mobilenetv3": 5.5,
    "bert": 110.0,
    "transformer": 65.0,
    "lm": 66.0,
    "dlrm": 540.0,
}

DEFAULT_PARAMS_M = 25.0
"""Used for a model not in the table (about a ResNet-50)."""


def grad_bytes_for(model: str) -> float:
    """fp32 gradient bytes of ``model`` (name matched case- and punctuation-insensitively)."""
    return PARAMS_M.get(_key(model), DEFAULT_PARAMS_M) * 1e6 * 4.0


def _key(model: str) -> str:
    return "".join(ch for ch in model.lower() if ch.isalnum())


# Seconds per training iteration on one V100 at a typical batch size, for traces whose own
# iteration counts are not physical (Helios/Lucid records 0.8 ms iterations for MobileNetV3).
ITER_S: dict[str, float] = {
    "alexnet": 0.03,
    "vgg": 0.20,
    "resnet18": 0.04,
    "resnet50": 0.10,
    "mobilenetv3": 0.05,
    "bert": 0.25,
}

DEFAULT_ITER_S = 0.1


def iter_s_for(model: str) -> float:
    """Typical per-iteration time of ``model`` (name matched as in ``grad_bytes_for``)."""
    return ITER_S.get(_key(model), DEFAULT_ITER_S)
