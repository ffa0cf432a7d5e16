"""Shared pytest setup: tests run on CPU with 4 host devices for multi-device checks.

Set JAX_PLATFORMS (e.g. to "" or "cuda") to run on an accelerator instead: tests/test_gpu.py.
"""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
