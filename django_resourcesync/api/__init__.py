"""The REST API of the Source, at ``/resourcesync/api/`` (see docs/api.rst).

What a Destination may read (the sets, their published documents, the change log) is read by
anyone, as the ResourceSync documents already show it; what only the site's managers may see or
do (builds and their reports, pending changes, subscriptions, writing sets, rebuilding) needs a
staff account with the app's model permissions, as the admin does.

Its modules, each of one concern: ``permissions`` (who may do what), ``throttling`` (how often
a client may ask, or fail to authenticate), ``pagination`` (cursors), ``filters`` (the query
parameters), ``serializers`` (what each answer shows), ``sending`` (sending a task from a
request), ``views`` (the viewsets), ``routes`` (the router), ``schema`` (the OpenAPI schema and
its page) and ``urls``. They sit at the top of the app: nothing else in it imports them.
"""
