"""Shared fixtures: synthetic measurements from known parameters (3 % noise) and their fit."""

import calibrate_synth as synth
import pytest

from ccoverlap.calibrate import fit as F
from ccoverlap.catalog.hardware import GPUS
from ccoverlap.cost.params import default_params

GPU = GPUS["H100-SXM"]


@pytest.fixture(scope="session")
def gpu():
    return GPU


@pytest.fixture(scope="session")
def base():
    return default_params(GPU)


@pytest.fixture(scope="session")
def truth(base):
    return synth.true_params(base)


@pytest.fixture(scope="session")
def noisy_records(truth):
    return synth.records(GPU, truth, noise=0.03, seed=0, quick=False)


@pytest.fixture(scope="session")
def noisy_fit(noisy_records, base):
    return F.fit(noisy_records, GPU, base)
