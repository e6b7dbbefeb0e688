from slugify import slugify


def test_basic():
    assert slugify("Hello, World!") == "hello-world"

def test_spaces():
    assert slugify("  many   spaces ") == "many-spaces"

def test_digits():
    assert slugify("Top 10 Tips") == "top-10-tips"
