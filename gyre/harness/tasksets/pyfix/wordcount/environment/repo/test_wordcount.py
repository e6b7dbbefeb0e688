from wordcount import word_counts


def test_case():
    assert word_counts("The the") == {"the": 2}
