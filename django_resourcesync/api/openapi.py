"""How the OpenAPI schema describes the API's views, whatever the site's DRF settings.

:class:`ApiSchema` is drf-spectacular's ``AutoSchema``, set on every view of the API so that a
site need not make it its ``DEFAULT_SCHEMA_CLASS``, and told that the reads the permission
:class:`~.permissions.ReadByAnyone` lets through need no credentials (drf-spectacular knows this
of DRF's own ``AllowAny`` only).

:func:`described` is drf-spectacular's ``extend_schema`` based on :class:`ApiSchema`. Plain
``extend_schema`` on a view's method builds on the site's ``DEFAULT_SCHEMA_CLASS`` as it is when
the module is imported, and when that is DRF's own (a site that never set it) the schema of the
method cannot be generated at all.
"""

import inspect

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import extend_schema
from rest_framework.permissions import SAFE_METHODS

from .permissions import ReadByAnyone


class ApiSchema(AutoSchema):
    def get_auth(self):
        auths = super().get_auth()
        public = self.method in SAFE_METHODS and any(isinstance(p, ReadByAnyone) for p in self.view.get_permissions())
        if public and {} not in auths:
            auths.append({})
        return auths


def described(**kwargs):
    """``extend_schema(**kwargs)`` for a method of one of the API's views."""
    annotate = extend_schema(**kwargs)

    def decorator(method):
        if not inspect.isclass(method) and "schema" not in getattr(method, "kwargs", {}):
            # Where extend_schema looks for the schema class to build on (a copy: DRF's @action
            # keeps its own options in the same dict).
            method.kwargs = {**getattr(method, "kwargs", {}), "schema": ApiSchema}
        return annotate(method)

    return decorator
