import pytest
from temperature import c_to_f, f_to_c


def test_boiling():
    assert c_to_f(100) == 212

def test_freezing():
    assert f_to_c(32) == 0

def test_body():
    assert f_to_c(98.6) == pytest.approx(37.0)

def test_roundtrip():
    assert f_to_c(c_to_f(-40)) == pytest.approx(-40)
