"""Sphinx configuration of the django-resourcesync documentation."""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))

import django  # noqa: E402

from django_resourcesync import __version__  # noqa: E402  (plain module: needs no Django setup)

# The API reference (reference.rst) imports the app's modules: Django is set up with the test
# settings, which need no service.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
django.setup()

project = "django-resourcesync"
copyright = "django-resourcesync authors"
release = __version__
version = ".".join(__version__.split(".")[:2])

# celery.contrib.sphinx documents the tasks of tasks.py (autodoc alone does not see Celery's task
# objects); it needs Sphinx 9's legacy autodoc, which it would switch on itself, with a warning.
extensions = ["sphinx.ext.autodoc", "celery.contrib.sphinx"]
autodoc_use_legacy_class_based = True
autodoc_member_order = "bysource"
# No default ``members``: it would override the member lists that reference.rst gives, and
# document every name a module re-exports (sources re-exports entries', uris' and exceptions').
exclude_patterns = ["_build"]
html_theme = "alabaster"
