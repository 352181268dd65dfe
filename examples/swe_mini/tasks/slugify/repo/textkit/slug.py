import re


def slugify(text):
    """Lower-case ``text`` and join its words with single dashes."""
    text = text.strip().lower()
    return re.sub(r"[^a-z0-9]", "-", text)
