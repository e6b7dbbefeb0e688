"""``gyre runs``: list, show and compare run directories from their files alone."""
