def slugify(title):
    """'Hello, World!' -> 'hello-world'"""
    return title.lower().replace(" ", "-")
