"""What a view needs to answer for a document a capability serves ``"live"``."""

import hashlib

XML = "application/xml"


class Served:
    """A document rendered on request (``body``, a callable giving its bytes) or a file in
    storage (``storage_name`` and ``size``), with the validators of a conditional GET."""

    def __init__(self, etag, last_modified, body=None, storage_name=None, size=None, media_type=XML):
        self.etag, self.last_modified = etag, last_modified
        self.body, self.storage_name, self.size = body, storage_name, size
        self.media_type = media_type
        self.headers = {}  #: more response headers (a topic's Link)

    @property
    def live(self):
        """Rendered now: it may change again within the second of its last change."""
        return self.body is not None

    @classmethod
    def rendered(cls, body, last_modified):
        return cls(hashlib.sha256(body).hexdigest(), last_modified, body=lambda: body)


#: What ``serve()`` answers for a file withdrawn for good (answered 410 Gone).
GONE = "gone"
