from roman import to_roman


def test_simple():
    assert to_roman(3) == "III"

def test_four():
    assert to_roman(4) == "IV"

def test_nine():
    assert to_roman(9) == "IX"

def test_year():
    assert to_roman(1994) == "MCMXCIV"

def test_big():
    assert to_roman(3888) == "MMMDCCCLXXXVIII"
