from textkit import slugify


def test_simple():
    assert slugify("Hello") == "hello"


def test_spaces():
    assert slugify("Hello World") == "hello-world"


def test_collapses_separators():
    assert slugify("Hello,   World!") == "hello-world"
