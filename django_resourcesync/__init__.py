"""django-resourcesync: make a Django site a ResourceSync Source (ANSI/NISO Z39.99-2017)."""

__version__ = "0.1.0"
