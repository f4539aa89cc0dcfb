"""Streamed answers, under a WSGI server and an ASGI server alike.

A WSGI server sends a streamed response by iterating it in the thread that made it. Under ASGI,
Django sends it from the event loop, and a synchronous iterator it is handed there is first read
whole into a list (Django warns "StreamingHttpResponse must consume synchronous iterators in
order to serve them asynchronously"): a package of 4 GiB would be held in memory. So every
streamed answer of the app is made by :func:`response`, which gives Django, under ASGI, an
asynchronous iterator that reads each chunk on a thread of the event loop's pool (the loop goes
on serving other requests meanwhile), and under WSGI the synchronous iterator itself. Either way
a web process holds about one chunk per download, whatever the size of the file.

The chunks are made by ``open_chunks()``, called only when the first one is wanted: a 304 never
calls it, nor does a HEAD (no server sends its body). A client that goes away closes them (the
file, the storage's connection) as soon as the server notices, on either kind of server.
"""

import asyncio
import sys

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import StreamingHttpResponse

#: The bytes read from storage at a time, and handed to the server at once.
CHUNK_SIZE = 1024 * 1024
_END = object()


def response(request, open_chunks, *, status=200, content_type=None, length=None):
    """A :class:`~django.http.StreamingHttpResponse` of the chunks ``open_chunks()`` yields, an
    iterator of bytes (a generator whose ``finally`` closes what it opened), fit for the server
    that serves ``request``; ``length`` is its ``Content-Length``."""
    streamed = StreamingHttpResponse(chunks(request, open_chunks), status=status, content_type=content_type)
    if length is not None:
        streamed["Content-Length"] = str(length)
    return streamed


def chunks(request, open_chunks):
    """The content of a streamed answer to ``request``: the chunks of ``open_chunks()``,
    asynchronously under ASGI; none for a HEAD."""
    if request.method == "HEAD":
        open_chunks = tuple
    if isinstance(request, ASGIRequest):
        return _async_chunks(open_chunks)
    return _sync_chunks(open_chunks)


def _sync_chunks(open_chunks):
    yield from open_chunks()  # closing this generator closes the chunks'


def _open(open_chunks):
    return iter(open_chunks())


async def _async_chunks(open_chunks):
    """``open_chunks()`` opened, read and closed on threads of the loop's pool, one chunk at a time.

    A client that goes away cancels the task that sends the response: a read under way is let
    to finish (asgiref waits for its thread, and then returns the chunk as if nothing happened,
    hence the look at ``cancelling()``), then the chunks are closed."""
    in_thread = sync_to_async(_call, thread_sensitive=False)
    task = asyncio.current_task()
    iterator = None
    try:
        iterator = await in_thread(_open, open_chunks)
        while (chunk := await in_thread(next, iterator, _END)) is not _END:
            if task is not None and task.cancelling():
                raise asyncio.CancelledError
            yield chunk
    finally:
        if iterator is not None and hasattr(iterator, "close"):
            await in_thread(iterator.close)


def _call(func, *args):
    return func(*args)


def _s3_object(store, storage_name):
    """The boto3 object behind ``storage_name`` and the parameters of a GET of it, if ``store``
    is django-storages' S3 storage whose bytes are stored as they are (not gzipped), else ``None``.

    A storage of that class was made after its module was imported: where it is not (most
    sites), boto3 is not imported here either, which would cost every ``manage.py`` command
    that reverses a URL a tenth of a second."""
    s3_module = sys.modules.get("storages.backends.s3")
    if s3_module is None or not isinstance(store, s3_module.S3Storage) or store.gzip:
        return None
    from s3transfer.constants import ALLOWED_DOWNLOAD_ARGS
    from storages.utils import clean_name, safe_join

    key = safe_join(store.location, clean_name(storage_name))
    params = {key: value for key, value in store.get_object_parameters(storage_name).items() if key in ALLOWED_DOWNLOAD_ARGS}
    return store.bucket.Object(key), params


def read_span(store, storage_name, start, end):
    """Bytes ``start`` to ``end`` (inclusive) of the file ``storage_name`` of the storage
    ``store``, in chunks of at most :data:`CHUNK_SIZE`: from S3 (django-storages) by one ranged
    GET of the object's body, from other storages through ``open()``.

    A generator: the file is opened when the first chunk is wanted, and closed when the
    generator ends or is closed."""
    if end < start:
        return
    s3 = _s3_object(store, storage_name)
    if s3 is not None:
        obj, params = s3
        body = obj.get(Range=f"bytes={start}-{end}", **params)["Body"]
        try:
            yield from body.iter_chunks(CHUNK_SIZE)
        finally:
            body.close()
        return
    handle = store.open(storage_name, "rb")
    try:
        handle.seek(start)
        remaining = end - start + 1
        while remaining > 0:
            chunk = handle.read(min(remaining, CHUNK_SIZE))
            if not chunk:
                break
            remaining -= len(chunk)
            yield chunk
    finally:
        handle.close()
