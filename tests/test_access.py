"""Restricted sets: tokens issued to partners, what they open and what stays closed to everyone
else (the Source's documents, the site's own record view, the hub, the REST API)."""

import datetime
import hashlib
import io
import logging
import time
import zipfile

import pytest
from django.core import checks
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone

from django_resourcesync import access
from django_resourcesync.models import AccessToken, ResourceSet, Subscription
from django_resourcesync.rebuild import rebuild_set
from example_project.repository.models import Item

from .conftest import demo_set
from .helpers import fetch, path_of
from .xmlcheck import SM, check_document, entries, md

pytestmark = pytest.mark.django_db

PARTNERS = "all-records"


@pytest.fixture
def partners(seed, committing):
    """The example's set for partners, and the public records, over 6 items of which 2 are private."""
    with committing():
        seed(6)
    hidden = list(Item.objects.order_by("pk")[:2])
    Item.objects.filter(pk__in=[item.pk for item in hidden]).update(is_public=False)
    restricted, public = demo_set(PARTNERS), demo_set("metadata")
    for resource_set in (restricted, public):
        resource_set.capabilities = ["resourcelist", "changelist", "resourcedump", "changedump"]
        resource_set.prior_versions = True
        resource_set.save()
        rebuild_set(resource_set)
    restricted.hidden = hidden
    return restricted


def bearer(token):
    return {"Authorization": f"Bearer {token}"}


def issue(*sets, **options):
    return access.issue("Partner Library", sets, **options)[1]


SET_DOCUMENTS = ["capabilitylist.xml", "resourcelist.xml", "changelist.xml", "resourcedump.xml", "changedump.xml"]


@pytest.mark.parametrize("name", SET_DOCUMENTS)
def test_a_restricted_sets_documents_answer_401_with_a_bearer_challenge_to_anyone_without_a_token(partners, name):
    status, body, response = fetch(f"/resourcesync/{PARTNERS}/{name}")
    assert status == 401
    assert response["WWW-Authenticate"].startswith('Bearer realm="resourcesync"')
    assert b"<url>" not in body
    assert "private" in response["Cache-Control"]


@pytest.mark.parametrize("name", SET_DOCUMENTS[:-1])  # a Change Dump has nothing to show before a change
def test_a_token_for_the_set_opens_its_documents_as_private_answers(partners, name):
    token = issue(partners)
    status, body, response = fetch(f"/resourcesync/{PARTNERS}/{name}", **bearer(token))
    assert status == 200
    capability = name.removesuffix(".xml")
    check_document(body, capability)
    assert "private" in response["Cache-Control"] and "Authorization" in response["Vary"]


def test_the_partners_resource_list_lists_private_items_and_the_public_one_does_not(partners):
    token = issue(partners)
    hidden = {f"http://testserver/items/{item.pk}/metadata.xml" for item in partners.hidden}
    _status, body, _ = fetch(f"/resourcesync/{PARTNERS}/resourcelist.xml", **bearer(token))
    listed = {entry.find(f"{{{SM}}}loc").text for entry in entries(check_document(body, "resourcelist"))}
    assert hidden <= listed and len(listed) == 6
    _status, body, _ = fetch("/resourcesync/metadata/resourcelist.xml")
    assert not hidden & {entry.find(f"{{{SM}}}loc").text for entry in entries(check_document(body, "resourcelist"))}


def test_a_token_for_another_set_is_refused_with_403(partners, metadata):
    other = ResourceSet.objects.create(name="Embargoed", slug="embargoed", source="metadata", access="token")
    token = issue(other)
    status, _body, response = fetch(f"/resourcesync/{PARTNERS}/resourcelist.xml", **bearer(token))
    assert status == 403
    assert 'error="insufficient_scope"' in response["WWW-Authenticate"]


@pytest.mark.parametrize("header", ["Bearer rs_not-a-token-we-issued", "Bearer ", "Bearer a b", "Bearer \u00e9t\u00e9"])
def test_an_unknown_or_malformed_token_is_refused_with_401_invalid_token(partners, header):
    response = Client().get(f"/resourcesync/{PARTNERS}/resourcelist.xml", headers={"Authorization": header})
    assert response.status_code == 401
    assert 'error="invalid_token"' in response["WWW-Authenticate"] or header.strip() == "Bearer"


def test_a_public_set_ignores_tokens_good_or_bad(partners):
    assert fetch("/resourcesync/metadata/resourcelist.xml", Authorization="Bearer rs_nonsense")[0] == 200


def test_an_expired_token_opens_nothing(partners):
    record, token = access.issue("Partner", [partners], expires=timezone.now() + datetime.timedelta(hours=1))
    assert fetch(f"/resourcesync/{PARTNERS}/resourcelist.xml", **bearer(token))[0] == 200
    AccessToken.objects.filter(pk=record.pk).update(expires=timezone.now() - datetime.timedelta(seconds=1))
    status, body, response = fetch(f"/resourcesync/{PARTNERS}/resourcelist.xml", **bearer(token))
    assert status == 401 and b"expired" in body


def test_revocation_takes_effect_on_the_next_request(partners):
    client = Client()
    record, token = access.issue("Partner", [partners])
    assert fetch(f"/resourcesync/{PARTNERS}/resourcelist.xml", client, **bearer(token))[0] == 200
    assert access.revoke(AccessToken.objects.filter(pk=record.pk)) == 1
    status, body, _ = fetch(f"/resourcesync/{PARTNERS}/resourcelist.xml", client, **bearer(token))
    assert status == 401 and b"revoked" in body
    assert access.revoke(AccessToken.objects.filter(pk=record.pk)) == 0


def test_only_a_digest_of_a_token_is_kept(partners):
    record, token = access.issue("Partner", [partners])
    record.refresh_from_db()
    stored = [str(value) for value in AccessToken.objects.filter(pk=record.pk).values_list().get()]
    assert token not in stored
    assert record.digest == hashlib.sha256(token.encode()).hexdigest() and token.startswith(record.prefix)


def test_every_use_of_a_token_is_logged_with_the_destinations_name(partners, caplog):
    record, token = access.issue("Partner Library of Somewhere", [partners])
    with caplog.at_level(logging.INFO, logger="django_resourcesync.access"):
        fetch(f"/resourcesync/{PARTNERS}/capabilitylist.xml", **bearer(token))
        fetch(f"/resourcesync/{PARTNERS}/resourcelist.xml", **bearer(token))
    uses = [r.getMessage() for r in caplog.records if "Partner Library of Somewhere read" in r.getMessage()]
    assert len(uses) == 2 and record.prefix in uses[0] and "/resourcelist.xml" in uses[1]
    record.refresh_from_db()
    assert record.last_used is not None


def test_prior_versions_of_a_restricted_set_need_its_token(partners, committing):
    item = partners.hidden[0]
    key = str(item.pk)
    with committing():
        item.title = "A title changed: a prior version is kept"
        item.save()
    assert partners.changes.filter(object_pk=key).exists()
    for path in (f"/resourcesync/{PARTNERS}/timemap/{key}", f"/resourcesync/{PARTNERS}/timegate/{key}"):
        assert fetch(path)[0] == 401
    token = issue(partners)
    status, body, _ = fetch(f"/resourcesync/{PARTNERS}/timemap/{key}", **bearer(token))
    assert status == 200
    memento = next(line for line in body.decode().split(",\n") if 'memento"' in line)
    uri = memento[memento.index("<") + 1 : memento.index(">")]
    assert fetch(path_of(uri))[0] == 401
    assert fetch(path_of(uri), **bearer(token))[0] == 200


# --- what the public reads ---------------------------------------------------------------------


def public_texts(client):
    """Everything the public reads of the Source: the Source Description, every Capability List
    it names and every document they name (parts and dump manifests too), robots.txt and the
    REST API's public answers."""
    texts = []
    status, body, _ = fetch("/.well-known/resourcesync", client)
    texts.append(body)
    for capability_list in entries(check_document(body, "description")):
        status, body, _ = fetch(path_of(capability_list.find(f"{{{SM}}}loc").text), client)
        assert status == 200
        texts.append(body)
        for entry in entries(check_document(body, "capabilitylist")):
            kind = md(entry)["capability"]
            status, body, _ = fetch(path_of(entry.find(f"{{{SM}}}loc").text), client)
            texts.append(body)
            if kind in ("resourcedump", "changedump"):  # every package: its names, its manifest
                for package in entries(check_document(body, kind)):
                    _status, data, _ = fetch(path_of(package.find(f"{{{SM}}}loc").text), client)
                    with zipfile.ZipFile(io.BytesIO(data)) as opened:
                        texts += [name.encode() for name in opened.namelist()] + [opened.read("manifest.xml")]
    texts.append(fetch("/robots.txt", client)[1])
    for endpoint in ("sets/", "documents/", "changes/"):
        texts.append(fetch(f"/resourcesync/api/{endpoint}", client)[1])
    return b"\n".join(texts)


def test_nothing_the_public_reads_names_the_restricted_set_or_its_private_resources(partners, committing):
    # (What the hub sends of a restricted set, and to whom: tests/test_push.py.)
    with committing():  # a change of every item: Change Lists and Change Dump packages of both sets
        for item in Item.objects.all():
            item.title += " (changed)"
            item.save()
    for resource_set in ResourceSet.objects.filter(slug__in=[PARTNERS, "metadata"]):
        rebuild_set(resource_set)
    text = public_texts(Client())
    assert b"changedump/" in text and b"manifest" in text  # the walk did open the public packages
    assert PARTNERS.encode() not in text
    for item in partners.hidden:
        assert f"/items/{item.pk}/".encode() not in text
    assert b"/resourcesync/metadata/capabilitylist.xml" in text  # the walk did read the public set


def test_the_source_description_names_a_restricted_sets_capability_list_alone_where_the_setting_says(partners, settings):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "LIST_TOKEN_SETS": True}
    _status, body, _ = fetch("/.well-known/resourcesync")
    listed = {e.find(f"{{{SM}}}loc").text: e for e in entries(check_document(body, "description"))}
    entry = listed[f"http://testserver/resourcesync/{PARTNERS}/capabilitylist.xml"]
    assert entry.findall("{http://www.openarchives.org/rs/terms/}ln") == []  # no describedby: the URI alone
    assert fetch(f"/resourcesync/{PARTNERS}/capabilitylist.xml")[0] == 401


def test_no_discovery_link_names_the_restricted_set(partners):
    token = issue(partners)
    public_item = Item.objects.filter(is_public=True).first()
    response = Client().get(f"/items/{public_item.pk}/metadata.xml", headers=bearer(token))
    assert response.status_code == 200
    assert PARTNERS not in response.get("Link", "")
    assert "/resourcesync/metadata/capabilitylist.xml" in response.get("Link", "")


# --- the site's own view -------------------------------------------------------------------------


def test_the_record_view_serves_a_private_record_to_a_token_holder_with_the_listed_bytes(partners):
    token = issue(partners)
    item = partners.hidden[0]
    path = f"/items/{item.pk}/metadata.xml"
    assert Client().get(path).status_code == 404
    response = Client().get(path, headers=bearer(token))
    assert response.status_code == 200
    assert "private" in response["Cache-Control"] and "Authorization" in response["Vary"]
    record = partners.resources.get(object_pk=str(item.pk))
    assert hashlib.sha256(response.content).hexdigest() == record.sha256 and len(response.content) == record.length


def test_the_record_view_refuses_a_revoked_token_and_answers_a_token_of_other_sets_as_anyone(partners):
    record, token = access.issue("Partner", [partners])
    access.revoke(AccessToken.objects.filter(pk=record.pk))
    item = partners.hidden[0]
    assert Client().get(f"/items/{item.pk}/metadata.xml", headers=bearer(token)).status_code == 401
    other = ResourceSet.objects.create(name="Embargoed", slug="embargoed", source="metadata", access="token")
    other_token = issue(other)
    assert Client().get(f"/items/{item.pk}/metadata.xml", headers=bearer(other_token)).status_code == 404
    public_item = Item.objects.filter(is_public=True).first()
    response = Client().get(f"/items/{public_item.pk}/metadata.xml", headers=bearer(other_token))
    assert response.status_code == 200 and "Authorization" in response["Vary"]


def test_the_decorator_and_the_mixin_give_the_view_its_partner(partners, rf):
    from django.http import HttpResponse
    from django.views import View

    token = issue(partners)

    @access.token_access(PARTNERS)
    def view(request):
        return HttpResponse(request.resourcesync_partner.name if request.resourcesync_partner else "anyone")

    class Page(access.TokenAccessMixin, View):
        token_sets = [PARTNERS]

        def get(self, request):
            return HttpResponse(request.resourcesync_partner.name if request.resourcesync_partner else "anyone")

    for handler in (view, Page.as_view()):
        assert handler(rf.get("/")).content == b"anyone"
        assert handler(rf.get("/", headers=bearer(token))).content == b"Partner Library"
        assert handler(rf.get("/", headers=bearer("rs_unknown"))).status_code == 401


# --- issuing and revoking ----------------------------------------------------------------------------


def test_the_command_issues_lists_and_revokes_tokens(partners):
    out, err = io.StringIO(), io.StringIO()
    call_command("resourcesync_token", "create", "--name", "Partner", "--set", PARTNERS, "--expires", "30",
                 stdout=out, stderr=err)
    token = out.getvalue().strip()
    assert token.startswith("rs_") and "shown this once" in err.getvalue()
    assert fetch(f"/resourcesync/{PARTNERS}/resourcelist.xml", **bearer(token))[0] == 200
    listing = io.StringIO()
    call_command("resourcesync_token", "list", stdout=listing)
    assert "Partner" in listing.getvalue() and token not in listing.getvalue() and "valid" in listing.getvalue()
    call_command("resourcesync_token", "revoke", "--name", "Partner", stdout=io.StringIO())
    assert fetch(f"/resourcesync/{PARTNERS}/resourcelist.xml", **bearer(token))[0] == 401


@pytest.mark.parametrize("arguments, message", [
    (["--set", "metadata"], "Anyone may read metadata"),
    (["--set", "nosuchset"], "No resource set with slug: nosuchset"),
    (["--set", PARTNERS, "--expires", "2001-01-01T00:00:00Z"], "in the past"),
    (["--set", PARTNERS, "--expires", "soon"], "number of days"),
])
def test_the_command_refuses_what_would_issue_a_useless_token(partners, arguments, message):
    with pytest.raises(CommandError, match=message):
        call_command("resourcesync_token", "create", "--name", "Partner", *arguments, stdout=io.StringIO(), stderr=io.StringIO())
    assert not AccessToken.objects.exists()


def test_the_admin_shows_a_new_token_once_and_revokes_it(partners, admin_client):
    response = admin_client.post("/admin/resourcesync/accesstoken/add/", {"name": "Partner", "sets": [partners.pk]})
    assert response.status_code == 200
    token = response.context["token"]
    assert token in response.content.decode() and "no-store" in response["Cache-Control"]
    assert fetch(f"/resourcesync/{PARTNERS}/resourcelist.xml", **bearer(token))[0] == 200
    record = AccessToken.objects.get()
    for page in ("/admin/resourcesync/accesstoken/", f"/admin/resourcesync/accesstoken/{record.pk}/change/"):
        shown = admin_client.get(page)
        assert shown.status_code == 200 and token not in shown.content.decode() and record.prefix in shown.content.decode()
    admin_client.post("/admin/resourcesync/accesstoken/", {"action": "revoke", "_selected_action": [record.pk]})
    assert fetch(f"/resourcesync/{PARTNERS}/resourcelist.xml", **bearer(token))[0] == 401


def test_the_api_issues_a_token_once_to_a_manager_and_revokes_it(partners, admin_client):
    response = admin_client.post("/resourcesync/api/tokens/", {"name": "Partner", "sets": [PARTNERS]},
                                 content_type="application/json")
    assert response.status_code == 201, response.content
    answer = response.json()
    token = answer["token"]
    assert answer["sets"] == [PARTNERS] and answer["state"] == "valid"
    assert fetch(f"/resourcesync/{PARTNERS}/resourcelist.xml", **bearer(token))[0] == 200
    listed = admin_client.get("/resourcesync/api/tokens/").content.decode()
    assert token not in listed and answer["prefix"] in listed
    assert admin_client.post(f"/resourcesync/api/tokens/{answer['id']}/revoke/").json()["state"] == "revoked"
    assert fetch(f"/resourcesync/{PARTNERS}/resourcelist.xml", **bearer(token))[0] == 401
    refused = admin_client.post("/resourcesync/api/tokens/", {"name": "X", "sets": ["metadata"]}, content_type="application/json")
    assert refused.status_code == 400 and "metadata" in refused.content.decode()


def test_the_api_shows_tokens_to_managers_only(partners):
    issue(partners)
    assert Client().get("/resourcesync/api/tokens/").status_code == 401
    assert Client().post("/resourcesync/api/tokens/", {"name": "X", "sets": [PARTNERS]}).status_code == 401


# --- checks ------------------------------------------------------------------------------------------


def test_checks_warn_of_what_would_let_a_restricted_set_be_read_without_a_token(partners, settings):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "SERVE_BY_REDIRECT": True, "HUB_URL": "https://hub.example.org/"}
    partners.capabilities = [*partners.capabilities, "change-notification"]
    partners.save()
    found = {message.id for message in checks.run_checks(databases=["default"]) if message.obj == partners}
    assert {"resourcesync.W014", "resourcesync.W015"} <= found
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "LIST_TOKEN_SETS": "yes"}
    assert "resourcesync.E028" in {message.id for message in checks.run_checks()}


def test_a_token_set_change_ends_the_subscriptions_of_sets_it_no_longer_opens(partners):
    record, _token = access.issue("Partner", [partners])
    subscription = Subscription.objects.create(
        resource_set=partners, capability="change-notification", callback="https://partner.example.org/cb",
        lease_seconds=600, expires=timezone.now() + datetime.timedelta(minutes=10), token=record,
    )
    record.sets.remove(partners)
    assert not Subscription.objects.filter(pk=subscription.pk).exists()



# --- what a review found ---------------------------------------------------------------------------


def test_a_restricted_sets_stored_files_are_streamed_even_where_the_others_are_redirected(partners, settings):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "SERVE_BY_REDIRECT": True}
    token = issue(partners)
    assert fetch("/resourcesync/metadata/resourcelist.xml")[0] == 302
    status, body, _ = fetch(f"/resourcesync/{PARTNERS}/resourcelist.xml", **bearer(token))
    assert status == 200 and b"<urlset" in body


def test_the_description_page_of_a_set_for_partners_is_for_them_alone(partners):
    assert Client().get(f"/about/sets/{PARTNERS}/").status_code == 404
    response = Client().get(f"/about/sets/{PARTNERS}/", headers=bearer(issue(partners)))
    assert response.status_code == 200 and "private" in response["Cache-Control"]


def test_a_set_form_without_the_access_field_keeps_the_sets_access(partners):
    from django_resourcesync.admin import ResourceSetForm

    form = ResourceSetForm(
        {"name": partners.name, "slug": partners.slug, "source": partners.source, "lookups": "{}",
         "capabilities": ["resourcelist"], "enabled": "on", "position": 4},
        instance=partners,
    )
    assert form.is_valid(), form.errors
    assert form.save().access == "token"


def test_a_disabled_set_for_partners_opens_the_site_view_no_more(partners):
    token = issue(partners)
    ResourceSet.objects.filter(pk=partners.pk).update(enabled=False)
    response = Client().get(f"/items/{partners.hidden[0].pk}/metadata.xml", headers=bearer(token))
    assert response.status_code == 404 and "Authorization" in response["Vary"]


def test_the_hub_says_nothing_of_a_restricted_sets_channels_without_its_token(partners):
    for channel in ("change-notification", "framework-notification", "nonsense"):
        response = Client().post("/resourcesync/hub", {
            "hub.mode": "subscribe", "hub.callback": "https://partner.example.org/cb",
            "hub.topic": f"http://testserver/resourcesync/{PARTNERS}/{channel}",
        })
        assert response.status_code == 401, channel


def test_editing_a_set_for_partners_leaves_the_public_source_descriptions_date_alone(partners):
    time.sleep(1.1)  # a live document's date is sent once its second is over
    before = fetch("/.well-known/resourcesync")[2]["Last-Modified"]
    partners.name = "Renamed for partners"
    partners.save()
    assert fetch("/.well-known/resourcesync")[2]["Last-Modified"] == before


def test_the_api_refuses_a_token_that_would_be_born_expired_and_its_answer_is_never_stored(partners, admin_client):
    refused = admin_client.post("/resourcesync/api/tokens/", {"name": "X", "sets": [PARTNERS], "expires": "2001-01-01T00:00Z"},
                                content_type="application/json")
    assert refused.status_code == 400 and "expires" in refused.json()
    issued = admin_client.post("/resourcesync/api/tokens/", {"name": "X", "sets": [PARTNERS]}, content_type="application/json")
    assert issued.status_code == 201 and issued["Cache-Control"] == "no-store"
