"""The CUDA device a kernel call runs on.

Triton launches on the *current* CUDA device and its current stream, whatever device the tensors live on; a call
with tensors on ``cuda:1`` while ``cuda:0`` is current would launch on the wrong GPU (a fault, or remote reads
over the interconnect).  The public entry points run their kernel backends under ``on_device(q.device)``: the
tensors' device made current for the call (a no-op when it already is, as in the usual one-process-per-GPU
setup), the caller's device restored after it.  The backward needs no guard: autograd runs a CUDA node on a
thread whose current device is that node's.
"""
from __future__ import annotations

import contextlib

import torch


def on_device(device: torch.device):
    """A context manager making ``device`` the current CUDA device (``torch.cuda.device``) for a CUDA device
    with an index; a no-op context for any other device."""
    if device.type == "cuda" and device.index is not None:
        return torch.cuda.device(device.index)
    return contextlib.nullcontext()
