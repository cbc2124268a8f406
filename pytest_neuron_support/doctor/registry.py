"""The doctor's checks, in table order: a check runs after the checks it needs.

Adding a check: a module under ``doctor/checks/`` (its row as ``CHECK``, its runner), its scripts under
``doctor/scripts/`` if it runs any, its import and its place in :data:`CHECKS` here, and its test in
tests/test_doctor.py.
"""

from __future__ import annotations

from pytest_neuron_support.doctor.check import Check
from pytest_neuron_support.doctor.checks.bf16 import CHECK as BF16
from pytest_neuron_support.doctor.checks.compile import CHECK as COMPILE
from pytest_neuron_support.doctor.checks.compile_cache import CHECK as COMPILE_CACHE
from pytest_neuron_support.doctor.checks.compiler import CHECK as COMPILER
from pytest_neuron_support.doctor.checks.core_ids import CHECK as CORE_IDS
from pytest_neuron_support.doctor.checks.device import CHECK as DEVICE
from pytest_neuron_support.doctor.checks.exclusive import CHECK as EXCLUSIVE
from pytest_neuron_support.doctor.checks.fallback_ops import CHECK as FALLBACK_OPS
from pytest_neuron_support.doctor.checks.generation import CHECK as GENERATION
from pytest_neuron_support.doctor.checks.imports import CHECK as IMPORTS
from pytest_neuron_support.doctor.checks.memory import CHECK as MEMORY
from pytest_neuron_support.doctor.checks.owners import CHECK as OWNERS
from pytest_neuron_support.doctor.checks.process_group import CHECK as PROCESS_GROUP
from pytest_neuron_support.doctor.checks.slice import CHECK as SLICE
from pytest_neuron_support.doctor.checks.two_processes import CHECK as TWO_PROCESSES

#: The doctor's checks, in table order.
CHECKS: tuple[Check, ...] = (
    IMPORTS,
    DEVICE,
    SLICE,
    OWNERS,
    MEMORY,
    BF16,
    TWO_PROCESSES,
    EXCLUSIVE,
    COMPILE,
    COMPILE_CACHE,
    COMPILER,
    FALLBACK_OPS,
    PROCESS_GROUP,
    GENERATION,
    CORE_IDS,
)
