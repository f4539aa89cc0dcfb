import socket

from django.test import Client

from django_resourcesync.rebuild import rebuild_set


def fetch(path, client=None, **headers):
    """GET through Django; returns (status, body bytes, response)."""
    response = (client or Client()).get(path, headers=headers)
    body = b"".join(response.streaming_content) if response.streaming else response.content
    return response.status_code, body, response


def path_of(uri):
    assert uri.startswith("http://testserver/"), uri
    return uri[len("http://testserver") :]


def build(resource_set, **kwargs):
    (result,) = rebuild_set(resource_set, **kwargs)
    return result


def resource_list_entries(resource_set):
    """Every <url> of the set's Resource List, following the index if there is one."""
    from .xmlcheck import SM, check_document, entries

    status, body, _ = fetch(f"/resourcesync/{resource_set.slug}/resourcelist.xml")
    assert status == 200
    doc = check_document(body, "resourcelist")
    if doc.tag == f"{{{SM}}}urlset":
        return entries(doc)
    found = []
    for sitemap in entries(doc):
        status, part, _ = fetch(path_of(sitemap.find(f"{{{SM}}}loc").text))
        assert status == 200
        found += entries(check_document(part, "resourcelist"))
    return found


def free_port():
    """A TCP port on loopback that no one listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
