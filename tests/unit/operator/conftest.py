"""Fixtures of the operator's unit tests."""

from __future__ import annotations

import pytest

from tests.unit.operator.operator_pki import OperatorPki, make_pki


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> OperatorPki:
    return make_pki(tmp_path_factory.mktemp("operator-pki"))
