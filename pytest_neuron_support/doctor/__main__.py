"""``python -m pytest_neuron_support.doctor``: the doctor without the ``neuron-support`` command."""

from __future__ import annotations

import argparse
import sys

from pytest_neuron_support.doctor.command import __doc__ as DOC
from pytest_neuron_support.doctor.command import add_arguments, main

parser = argparse.ArgumentParser(prog="python -m pytest_neuron_support.doctor", description=(DOC or "").splitlines()[0])
add_arguments(parser)
sys.exit(main(parser.parse_args()))
