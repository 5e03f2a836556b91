"""A pytest plugin (``-p tensora_hf_shim``) that makes ``import safetensors``,
``safetensors.torch`` and ``safetensors.numpy`` import Tensora's modules: HF's own tests then run
against Tensora by import substitution only (``test_hf_suite.py`` runs them)."""

import sys

import tensora.numpy
import tensora.safetensors
import tensora.torch

sys.modules["safetensors"] = tensora.safetensors
sys.modules["safetensors.torch"] = tensora.torch
sys.modules["safetensors.numpy"] = tensora.numpy
