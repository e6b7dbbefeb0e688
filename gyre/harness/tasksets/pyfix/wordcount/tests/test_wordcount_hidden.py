from wordcount import word_counts


def test_case():
    assert word_counts("The the") == {"the": 2}

def test_punctuation():
    assert word_counts("hi, hi!") == {"hi": 2}

def test_whitespace():
    assert word_counts("a  b\nc") == {"a": 1, "b": 1, "c": 1}

def test_empty():
    assert word_counts("") == {}
