"""Sphinx configuration of the django-resourcesync documentation."""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))

from django_resourcesync import __version__  # noqa: E402  (plain module: needs no Django setup)

project = "django-resourcesync"
copyright = "django-resourcesync authors"
release = __version__
version = ".".join(__version__.split(".")[:2])

extensions = []
exclude_patterns = ["_build"]
html_theme = "alabaster"
