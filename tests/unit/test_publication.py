"""The weights fingerprint and the publication check's rule (pure parts)."""

from __future__ import annotations

import pytest
import torch

from gyre.engine.checksum import fingerprints, weights_checksum
from gyre.engine.protocol import ModelInfo, UpdateWeightsResponse
from gyre.runtime.publication import PublicationError, check_served


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 300), torch.nn.Linear(300, 7))


def test_fingerprint_sees_a_step_a_swap_and_a_dtype():
    m = _model()
    base = weights_checksum(m)
    assert weights_checksum(_model()) == base  # same values: bit-equal
    with torch.no_grad():
        m[0].weight.add_(1e-6)  # a step of about lr 1e-6 on one tensor
    assert weights_checksum(m) != base
    sq = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    before = weights_checksum(sq)
    with torch.no_grad():  # the two weight matrices exchanged: same values, other places
        w0 = sq[0].weight.clone()
        sq[0].weight.copy_(sq[1].weight)
        sq[1].weight.copy_(w0)
    assert weights_checksum(sq) != before
    # an engine holding bfloat16 weights reports what the core's bfloat16 fingerprint says
    m16 = _model().to(torch.bfloat16)
    assert weights_checksum(m16) == fingerprints(_model())["bfloat16"]
    assert fingerprints(_model())["float32"] != fingerprints(_model())["bfloat16"]


def test_check_served():
    sums = {"float32": 1.5, "bfloat16": 1.25}
    ok = UpdateWeightsResponse(success=True, weight_version=3, weights_checksum=1.5)
    assert check_served("cell 1's engine", 3, ok, sums) is True
    bf = ModelInfo(
        model_path="m", weight_version=3, weights_checksum=1.25, weights_dtype="bfloat16"
    )
    assert check_served("cell 1's engine", 3, bf, sums) is True
    # no fingerprint (vLLM, SGLang): not checkable, not an error
    assert (
        check_served("x", 3, UpdateWeightsResponse(success=True, weight_version=3), sums) is False
    )
    stale = UpdateWeightsResponse(success=True, weight_version=3, weights_checksum=1.0)
    with pytest.raises(PublicationError, match=r"cell 2's engine .* version 3 .*stopping the run"):
        check_served("cell 2's engine", 3, stale, sums)
    wrong_version = UpdateWeightsResponse(success=True, weight_version=2, weights_checksum=1.5)
    with pytest.raises(PublicationError, match="reports weights version 2"):
        check_served("cell 2's engine", 3, wrong_version, sums)
