"""The manager's view of the Source in the admin: what each set publishes at a glance, the
change activity, the buttons of a set's page, and the pages a manager reads (one date format,
sizes in human units, URIs as links); and the demo that shows it all."""

import datetime
import io
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import pytest
from django.utils import timezone

from django_resourcesync import charts, overview, storage
from django_resourcesync.models import Build, ChangeEvent, PendingChange, ResourceSet
from django_resourcesync.rebuild import rebuild_set

from .helpers import build

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.django_db

DATE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC")


def messages_of(response):
    return [(m.level_tag, str(m)) for m in response.context["messages"]]


def test_each_capability_of_a_set_shows_its_state_age_entries_and_size(admin_client, seed, bitstreams):
    bitstreams.capabilities = ["resourcelist", "changelist", "resourcedump", "changedump"]
    bitstreams.save()
    seed(3)
    built = next(b for b in rebuild_set(bitstreams) if b.capability == "resourcelist")
    states = {state.capability.name: state for state in overview.capability_states(bitstreams)}
    assert states["resourcelist"].state == overview.PUBLISHED
    assert states["resourcelist"].entries == built.entries
    assert states["resourcelist"].bytes > 0
    assert states["resourcedump"].state == overview.PUBLISHED
    assert states["changedump"].state == overview.NOT_BUILT  # no change packed yet
    html = admin_client.get("/admin/resourcesync/resourceset/").content.decode()
    assert "resourcesync-state-published" in html and "not built yet" in html
    assert re.search(r"<td>\d+(\.\d)?\xa0(bytes|KB)</td>", html), "sizes in human units"
    assert "0\xa0minutes ago" in html
    assert 'href="http://testserver/resourcesync/bitstreams/resourcelist.xml"' in html


def test_a_new_set_says_its_documents_are_not_built_yet(admin_client, metadata):
    fresh = ResourceSet.objects.create(name="Fresh", slug="fresh", source="metadata", capabilities=["resourcelist"])
    (state,) = overview.capability_states(fresh)
    assert state.state == overview.NOT_BUILT
    page = admin_client.get(f"/admin/resourcesync/resourceset/{fresh.pk}/change/").content.decode()
    assert "not built yet" in page
    # The document is not offered as a link while it answers 404.
    assert 'href="http://testserver/resourcesync/fresh/resourcelist.xml"' not in page


def test_a_failed_build_shows_its_one_line_reason_linked_to_the_build_with_the_traceback_folded(
    admin_client, seed, metadata, full_disk_for_metadata
):
    seed(2)
    with pytest.raises(OSError):
        build(metadata)
    failed = Build.objects.get(resource_set=metadata, status=Build.Status.FAILED)
    (state,) = [s for s in overview.capability_states(metadata) if s.capability.name == "resourcelist"]
    assert state.state == overview.FAILED
    assert state.reason == "OSError: [Errno 28] No space left on device"
    sets = admin_client.get("/admin/resourcesync/resourceset/").content.decode()
    assert f'href="/admin/resourcesync/build/{failed.pk}/change/" class="resourcesync-failure"' in sets
    assert "OSError: [Errno 28] No space left on device</a>" in sets
    assert 'href="http://testserver/resourcesync/metadata/resourcelist.xml"' not in sets  # it answers 404
    page = admin_client.get(f"/admin/resourcesync/build/{failed.pk}/change/").content.decode()
    reason = page.index('<p class="resourcesync-failure">OSError: [Errno 28] No space left on device</p>')
    folded = page.index("<details><summary>traceback</summary>")
    assert reason < folded < page.index("Traceback (most recent call last)")


def test_a_failure_after_a_published_build_leaves_the_published_one_served_and_says_failed(
    admin_client, seed, metadata
):
    seed(2)
    good = build(metadata)
    save = storage.save
    with mock.patch.object(storage, "save", side_effect=OSError(28, "No space left on device")):
        with pytest.raises(OSError):
            build(metadata)
    del save
    (state,) = [s for s in overview.capability_states(metadata) if s.capability.name == "resourcelist"]
    assert state.state == overview.FAILED
    assert state.entries == good.entries  # what is still served
    build(metadata)
    (state,) = [s for s in overview.capability_states(metadata) if s.capability.name == "resourcelist"]
    assert state.state == overview.PUBLISHED and state.failure is None


def test_the_activity_counts_each_kind_of_change_per_day_in_the_sites_time_zone(seed, metadata, settings):
    seed(1)
    build(metadata)
    seed(3)  # after the first build: changes
    build(metadata)
    now = timezone.now()
    events = list(ChangeEvent.objects.filter(resource_set=metadata).order_by("pk"))
    assert len(events) >= 3
    # Spread the changes: one today, one three days ago, one 40 days ago (outside the chart).
    ChangeEvent.objects.filter(pk=events[0].pk).update(change="updated", datetime=now - datetime.timedelta(days=3))
    ChangeEvent.objects.filter(pk=events[1].pk).update(change="deleted", datetime=now - datetime.timedelta(days=40))
    metadata.changelists.update(from_time=now - datetime.timedelta(days=50))
    activity = overview.activity(metadata, now=now)
    assert len(activity.days) == overview.ACTIVITY_DAYS and activity.days[-1] == timezone.localtime(now).date()
    three_days_ago = timezone.localtime(now - datetime.timedelta(days=3)).date()
    assert activity.of(three_days_ago) == {"updated": 1}
    assert sum(activity.of(activity.days[-1]).values()) == len(events) - 2
    assert activity.total == len(events) - 1
    assert activity.last_day == len(events) - 2 and activity.last_week == len(events) - 1
    svg = str(charts.activity_svg(activity))
    assert svg.startswith("<svg") and svg.count('class="day"') == overview.ACTIVITY_DAYS
    assert f"{three_days_ago.isoformat()}: 0 created, 1 updated, 0 deleted" in svg
    assert svg.count('<rect class="updated"') == 1


def test_pending_changes_are_counted_per_set_and_have_a_page(admin_client, seed, metadata, bitstreams):
    seed(1)
    build(metadata)
    PendingChange.objects.create(source="metadata", object_pk="1")
    PendingChange.objects.create(source="metadata", object_pk="2", resource_set=bitstreams)  # kept for another set
    assert overview.pending_changes(metadata).count() == 1
    sets = admin_client.get("/admin/resourcesync/resourceset/").content.decode()
    assert "1 pending</a>" in sets
    page = admin_client.get("/admin/resourcesync/pendingchange/?source__exact=metadata")
    assert page.status_code == 200 and page.content.decode().count('class="field-object_pk"') == 2


def test_the_set_page_buttons_rebuild_and_reconcile(admin_client, seed, metadata):
    seed(2)
    page = admin_client.get(f"/admin/resourcesync/resourceset/{metadata.pk}/change/").content.decode()
    assert f'action="/admin/resourcesync/resourceset/{metadata.pk}/rebuild/"' in page
    assert f'action="/admin/resourcesync/resourceset/{metadata.pk}/reconcile/"' in page
    response = admin_client.post(f"/admin/resourcesync/resourceset/{metadata.pk}/rebuild/", follow=True)
    assert response.redirect_chain[-1][0] == f"/admin/resourcesync/resourceset/{metadata.pk}/change/"
    assert ("success", "Rebuilt 1 set.") in messages_of(response)
    assert Build.objects.get(resource_set=metadata).status == Build.Status.PUBLISHED
    response = admin_client.post(f"/admin/resourcesync/resourceset/{metadata.pk}/reconcile/", follow=True)
    assert ("success", "Reconciled 1 set.") in messages_of(response)


def test_a_rebuild_failing_from_the_set_page_is_a_message_not_a_500(admin_client, seed, metadata, full_disk_for_metadata):
    seed(2)
    response = admin_client.post(f"/admin/resourcesync/resourceset/{metadata.pk}/rebuild/", follow=True)
    assert response.status_code == 200
    assert ("error", f"Rebuilding “{metadata}” failed: [Errno 28] No space left on device") in messages_of(response)
    assert "Rebuilt" not in " ".join(text for _level, text in messages_of(response))


def test_the_buttons_need_a_post_and_the_change_permission(client, admin_client, seed, metadata):
    from django.contrib.auth.models import Permission, User

    assert admin_client.get(f"/admin/resourcesync/resourceset/{metadata.pk}/rebuild/").status_code == 405
    assert admin_client.post("/admin/resourcesync/resourceset/999999/rebuild/").status_code == 404
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_resourceset"))
    client.force_login(viewer)
    assert client.post(f"/admin/resourcesync/resourceset/{metadata.pk}/rebuild/").status_code == 403
    assert "/rebuild/" not in client.get(f"/admin/resourcesync/resourceset/{metadata.pk}/change/").content.decode()
    assert not Build.objects.exists()


def test_the_set_form_reads_well_and_its_filter_example_works_for_every_source(admin_client, seed):
    from django_resourcesync.admin import ResourceSetForm
    from django_resourcesync.sources import registry

    page = admin_client.get("/admin/resourcesync/resourceset/add/").content.decode()
    assert "/resourcesync/&lt;slug&gt;/capabilitylist.xml" in page
    labels = re.findall(r"<label[^>]*for=\"id_(?:name|slug|source|lookups|capabilities)\"[^>]*>([^<]+)</label>", page)
    assert labels and all(label[0].isupper() for label in labels), labels
    example = re.search(r"e\.g\. (\{[^}]*\})", page.replace("&quot;", '"')).group(1)
    seed(3)
    for number, source in enumerate(registry.names()):
        form = ResourceSetForm(data={
            "name": f"Set {number}", "slug": f"set-{number}", "source": source, "lookups": example,
            "capabilities": ["resourcelist"], "enabled": "on", "position": 0,
        })
        assert form.is_valid(), (source, form.errors)


def test_dates_sizes_and_uris_read_the_same_on_every_page(admin_client, seed, bitstreams):
    bitstreams.capabilities = ["resourcelist", "changelist", "changedump"]
    bitstreams.save()
    seed(1)
    rebuild_set(bitstreams)
    seed(1)  # after the first build: changes
    built = rebuild_set(bitstreams)[0]
    pages = {
        "builds": admin_client.get("/admin/resourcesync/build/").content.decode(),
        "build": admin_client.get(f"/admin/resourcesync/build/{built.pk}/change/").content.decode(),
        "changes": admin_client.get("/admin/resourcesync/changeevent/").content.decode(),
        "resources": admin_client.get("/admin/resourcesync/resource/").content.decode(),
        "packages": admin_client.get("/admin/resourcesync/changedumppackage/").content.decode(),
        "lists": admin_client.get("/admin/resourcesync/changelist/").content.decode(),
    }
    for name, html in pages.items():
        assert "Traceback" not in html, name
    for name in ("builds", "build", "changes", "resources", "lists"):
        assert DATE.search(pages[name]), name
        assert not re.search(r"[A-Z][a-z]{2}\.? \d{1,2}, \d{4}, \d{1,2}:\d\d", pages[name]), f"{name}: a second format"
    assert re.search(r"\d+(\.\d)?\xa0(bytes|KB)", pages["resources"])
    assert re.search(r'<a href="http://testserver/items/\d+/files/\d+/[^"]+" class="resourcesync-uri"', pages["resources"])
    assert 'class="resourcesync-uri"' in pages["changes"] and 'class="resourcesync-uri"' in pages["build"]


def test_the_example_models_can_be_edited_in_the_admin(admin_client, seed):
    from example_project.repository.models import Item

    seed(1)
    item = Item.objects.get()
    for url in ("/admin/repository/item/", f"/admin/repository/item/{item.pk}/change/", "/admin/repository/collection/",
                "/admin/repository/itemfile/"):
        assert admin_client.get(url).status_code == 200, url


def test_prepare_demo_offers_every_capability_and_a_login(db, tmp_path, settings):
    from django.contrib.auth import authenticate
    from django.core.management import call_command

    from django_resourcesync import capabilities
    from tests.conftest import demo_set

    settings.VAR_DIR = tmp_path
    for slug in ("bitstreams", "metadata", "pages"):
        demo_set(slug)
    call_command("prepare_demo", stdout=open(os.devnull, "w"))
    call_command("prepare_demo", stdout=open(os.devnull, "w"))  # again: the same login
    password = (tmp_path / "demo-password").read_text()
    assert authenticate(username="demo", password=password).is_superuser
    every = [capability.name for capability in capabilities.TABLE]
    for resource_set in ResourceSet.objects.all():
        if resource_set.get_source().gives_bytes:
            assert resource_set.capabilities == every


def test_the_demo_refuses_a_port_already_taken_before_any_work():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "dev.py", "demo", "--port", str(port)], cwd=ROOT, capture_output=True, text=True, timeout=60,
            env={**os.environ, "EXAMPLE_VAR_DIR": "/nonexistent/not-to-be-made"},
        )
    assert result.returncode != 0
    assert f"port {port} is taken" in result.stderr
    assert time.monotonic() - started < 10
    assert "migrat" not in result.stdout + result.stderr


# In a real browser: what a manager sees.


@pytest.fixture
def live_admin(live_server, settings, transactional_db):
    from django.contrib.auth.models import User

    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "BASE_URL": live_server.url}
    User.objects.create_superuser("manager", "manager@example.org", "a-long-demo-password")
    return live_server.url


def test_in_a_browser_the_sets_page_shows_states_and_the_chart(browser, live_admin, seed, metadata, bitstreams):
    from example_project.repository.models import Item

    seed(4)
    build(metadata)
    build(bitstreams)
    for item in Item.objects.all()[:2]:
        item.title += " (revised)"
        item.save()
    build(metadata)
    browser.log_in(live_admin, "manager", "a-long-demo-password")
    browser.get(f"{live_admin}/admin/resourcesync/resourceset/")
    # Styled: the admin's stylesheet and the app's were served.
    assert browser.driver.execute_script(
        "return getComputedStyle(document.querySelector('.resourcesync-state-published')).backgroundColor"
    ) == "rgb(27, 127, 59)"
    states = [element.text for element in browser.find_all(".resourcesync-state")]
    assert "PUBLISHED" in [state.upper() for state in states]
    assert browser.find_all("svg.resourcesync-activity"), "the chart of each set"
    browser.keep("sets")
    browser.get(f"{live_admin}/admin/resourcesync/resourceset/{metadata.pk}/change/")
    bars = browser.find_all("svg.resourcesync-activity g.day rect.updated")
    assert bars, "today's updates are drawn"
    assert float(bars[-1].get_attribute("height")) > 0
    browser.keep("set")


def test_in_a_browser_a_failing_rebuild_is_a_message(browser, live_admin, seed, metadata, full_disk_for_metadata):
    seed(2)
    browser.log_in(live_admin, "manager", "a-long-demo-password")
    browser.get(f"{live_admin}/admin/resourcesync/resourceset/{metadata.pk}/change/")
    browser.find("button[name=rebuild]").click()
    browser.wait_for(lambda driver: driver.find_elements("css selector", "ul.messagelist li"))
    message = browser.find("ul.messagelist li.error").text
    assert "No space left on device" in message
    browser.keep("rebuild-failed")
    browser.get(f"{live_admin}/admin/resourcesync/resourceset/")
    assert "No space left on device" in browser.find("a.resourcesync-failure").text
    browser.find("a.resourcesync-failure").click()
    browser.wait_for(lambda driver: "/build/" in driver.current_url)
    assert not browser.find("details pre.resourcesync-traceback").is_displayed()  # folded
    browser.find("details summary").click()
    assert browser.find("details pre.resourcesync-traceback").is_displayed()
    browser.keep("build-failure")


# Found in review.


def test_the_page_of_a_set_whose_source_is_gone_still_answers(admin_client, db):
    gone = ResourceSet.objects.create(
        name="Gone", slug="gone", source="gone", capabilities=["resourcelist", "changedump"], prior_versions=True
    )
    assert admin_client.get(f"/admin/resourcesync/resourceset/{gone.pk}/change/").status_code == 200
    assert admin_client.get("/admin/resourcesync/resourceset/").status_code == 200


def test_rebuilding_a_disabled_set_says_it_is_disabled(admin_client, seed, metadata):
    metadata.enabled = False
    metadata.save()
    response = admin_client.post(f"/admin/resourcesync/resourceset/{metadata.pk}/rebuild/", follow=True)
    shown = messages_of(response)
    assert [level for level, _text in shown] == ["error"] and "disabled" in shown[0][1]
    assert not Build.objects.exists()


def test_an_archive_offered_without_what_it_archives_is_not_shown_published(seed, metadata):
    metadata.capabilities = ["resourcelist", "resourcelist-archive", "changelist-archive"]
    metadata.save()
    seed(1)
    rebuild_set(metadata)
    states = {state.capability.name: state for state in overview.capability_states(metadata)}
    assert states["resourcelist-archive"].state == overview.PUBLISHED
    assert states["changelist-archive"].state == overview.NOT_BUILT and not states["changelist-archive"].served


def test_a_manager_may_delete_a_set_with_its_records(admin_client, seed, metadata):
    seed(1)
    build(metadata)
    page = admin_client.get(f"/admin/resourcesync/resourceset/{metadata.pk}/delete/")
    assert page.status_code == 200 and "Yes, I’m sure" in page.content.decode()
    admin_client.post(f"/admin/resourcesync/resourceset/{metadata.pk}/delete/", {"post": "yes"})
    assert not ResourceSet.objects.filter(pk=metadata.pk).exists() and not Build.objects.exists()


def test_the_sets_page_reads_a_bounded_number_of_queries_per_set(admin_client, django_assert_max_num_queries, db):
    from django_resourcesync import capabilities

    every = [capability.name for capability in capabilities.TABLE]
    ResourceSet.objects.bulk_create(
        ResourceSet(name=f"Set {n}", slug=f"set-{n}", source="bitstreams", capabilities=every) for n in range(20)
    )
    sets = ResourceSet.objects.count()
    with django_assert_max_num_queries(12 * sets + 20):
        assert admin_client.get("/admin/resourcesync/resourceset/").status_code == 200


def test_in_a_browser_a_manager_issues_a_partners_token_reads_it_once_and_sees_each_sets_last_audit(
    browser, live_admin, seed
):
    import urllib.error
    import urllib.request

    from django.core.management import call_command

    from .conftest import demo_set

    seed(3)
    partners, metadata = demo_set("all-records"), demo_set("metadata")
    build(partners)
    build(metadata)
    call_command("resourcesync_audit", "--set", "metadata", "--sample", "2", stdout=io.StringIO())
    browser.log_in(live_admin, "manager", "a-long-demo-password")
    browser.get(f"{live_admin}/admin/resourcesync/accesstoken/add/")
    browser.find("#id_name").send_keys("Partner Library")
    browser.driver.find_element("css selector", f"#id_sets option[value='{partners.pk}']").click()
    browser.find("input[name=_save]").click()
    browser.wait_for(lambda driver: driver.find_elements("css selector", "#issued-token"))
    token = browser.find("#issued-token").get_attribute("value")
    assert token.startswith("rs_") and "not shown again" in browser.text()
    browser.keep("issued")
    request = urllib.request.Request(f"{live_admin}/resourcesync/all-records/resourcelist.xml",
                                     headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{live_admin}/resourcesync/all-records/resourcelist.xml", timeout=30)
    assert refused.value.code == 401
    browser.get(f"{live_admin}/admin/resourcesync/accesstoken/")
    assert "Partner Library" in browser.text() and token not in browser.driver.page_source
    browser.get(f"{live_admin}/admin/resourcesync/resourceset/")
    assert "OK" in [element.text for element in browser.find_all(".resourcesync-state")]
    assert "never" in browser.text()  # the sets not audited yet
    browser.keep("sets")


def assert_the_list_fits(browser):
    """The admin scrolls a list too wide for its box inside the box: neither the page nor the
    box may scroll, and the last column's cells end inside both."""
    widths = browser.driver.execute_script(
        "const box = document.querySelector('#changelist-form .results');"
        "const cells = [...document.querySelectorAll('#result_list tr > :last-child, #result_list tr > :last-child *')];"
        "return {page: document.documentElement.scrollWidth, window: document.documentElement.clientWidth,"
        " table: box.scrollWidth, box: box.clientWidth, box_right: box.getBoundingClientRect().right,"
        " last: Math.max(...cells.map(cell => cell.getBoundingClientRect().right))};"
    )
    assert widths["page"] <= widths["window"] and widths["table"] <= widths["box"], widths
    assert widths["last"] <= widths["box_right"] <= widths["window"], widths


def test_in_a_browser_the_sets_page_fits_a_1400_pixel_window(browser, live_admin, seed, metadata, bitstreams):
    """The widest rows a manager meets: every capability, long ages, a failure, an audit with
    problems, pending changes: the last column is inside a 1400 px window, without scrolling."""
    from django_resourcesync import capabilities
    from django_resourcesync.models import AuditReport

    every = [capability.name for capability in capabilities.TABLE]
    ResourceSet.objects.filter(pk__in=[metadata.pk, bitstreams.pk]).update(capabilities=every)
    metadata.refresh_from_db()
    bitstreams.refresh_from_db()
    seed(3)
    rebuild_set(bitstreams)
    rebuild_set(metadata)
    seed(1)
    rebuild_set(bitstreams)
    long_ago = timezone.now() - datetime.timedelta(days=40, hours=5)
    Build.objects.update(finished=long_ago)
    Build.objects.create(resource_set=metadata, capability="resourcelist", status=Build.Status.FAILED, at=timezone.now(),
                         error="Traceback (most recent call last):\nOSError: [Errno 28] No space left on device: "
                               "'/srv/documents/resourcesync/metadata/resourcelist_000001_of_a_long_build.xml'")
    PendingChange.objects.create(source="metadata", object_pk="1")
    for resource_set in (metadata, bitstreams):
        AuditReport.objects.create(resource_set=resource_set, base=live_admin, finished=long_ago,
                                   problems=[["http://example.org/x", "length differs"]] * 12)
    browser.log_in(live_admin, "manager", "a-long-demo-password")
    browser.driver.set_window_size(1400, 900)
    browser.get(f"{live_admin}/admin/resourcesync/resourceset/")
    browser.keep("sets-1400")
    assert_the_list_fits(browser)


def test_in_a_browser_the_change_logs_dates_stay_on_one_line(browser, live_admin, seed, bitstreams):
    from example_project.repository.models import ItemFile

    seed(2)
    build(bitstreams)
    for file in ItemFile.objects.all():
        file.name = f"chapter-{file.pk}-of-a-thesis-with-its-appendices-tables-figures-and-the-data-behind-them.pdf"
        file.save()
    build(bitstreams)
    browser.log_in(live_admin, "manager", "a-long-demo-password")
    browser.driver.set_window_size(1400, 900)
    browser.get(f"{live_admin}/admin/resourcesync/changeevent/")
    lines = browser.driver.execute_script(
        "return [...document.querySelectorAll('#result_list td.field-datetime')].map(cell => {"
        "  const range = document.createRange(); range.selectNodeContents(cell);"
        "  return [cell.textContent, new Set([...range.getClientRects()].map(rect => Math.round(rect.top))).size];"
        "});"
    )
    browser.keep("changes")
    assert lines and all(DATE.fullmatch(text) for text, _count in lines), lines
    assert {count for _text, count in lines} == {1}, lines
    assert_the_list_fits(browser)  # the URIs cut to the room left


def add_listed_sets(up_to):
    """Sets up to ``up_to`` of them, each with what the list of sets shows: a published Resource
    List and Resource Dump with their documents, a failed build after them, an open Change List
    with changes over the last days, a Change Dump package (withdrawn in every other set),
    left-out objects and an audit."""
    from django_resourcesync.models import AuditReport, ChangeDumpPackage, ChangeList, Document, LeftOut

    now = timezone.now()
    for n in range(ResourceSet.objects.count(), up_to):
        resource_set = ResourceSet.objects.create(
            name=f"Set {n}", slug=f"set-{n:03d}", source="bitstreams",
            capabilities=["resourcelist", "changelist", "resourcedump", "changedump", "resourcelist-archive"],
        )
        for capability in ("resourcelist", "resourcedump"):
            built = Build.objects.create(resource_set=resource_set, capability=capability, status=Build.Status.PUBLISHED,
                                         at=now, finished=now, entries=5)
            Document.objects.create(build=built, resource_set=resource_set, name=f"{capability}.xml",
                                    storage_name=f"{n}/{capability}.xml", size=1000 + n, sha256="0" * 64)
        Build.objects.create(resource_set=resource_set, capability="resourcelist", status=Build.Status.FAILED, at=now,
                             finished=now, error="OSError: [Errno 28] No space left on device")
        changelist = ChangeList.objects.create(resource_set=resource_set, number=1, from_time=now - datetime.timedelta(days=5))
        ChangeEvent.objects.bulk_create([
            ChangeEvent(resource_set=resource_set, changelist=changelist, object_pk=str(k), uri=f"http://example.org/{n}/{k}",
                        change=("created", "updated", "deleted")[k % 3], datetime=now - datetime.timedelta(hours=9 * k),
                        entry_xml="<url/>")
            for k in range(12)
        ])
        ChangeDumpPackage.objects.create(
            resource_set=resource_set, number=1, from_time=now, until=now, first_event=1, last_event=2, entries=2,
            storage_name=f"{n}/p1.zip", size=500, sha256="0" * 64, manifest_storage_name=f"{n}/m1.xml", manifest_size=50,
            manifest_sha256="0" * 64, withdrawn=now if n % 2 else None,  # then dated by its builder
        )
        LeftOut.objects.create(resource_set=resource_set, object_pk="x", reason="ValueError: no title")
        AuditReport.objects.create(resource_set=resource_set, base="http://testserver",
                                   problems=[["http://example.org/x", "answers 404"]] if n % 2 else [])


def test_the_list_of_sets_makes_as_many_queries_for_20_sets_as_for_3(admin_client):
    """What each set publishes, its changes and its last audit are read for the page's sets at
    once: the list does not slow down with each set a site adds."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    ResourceSet.objects.all().delete()
    counted = {}
    for size in (3, 20):
        add_listed_sets(size)
        admin_client.get("/admin/resourcesync/resourceset/")
        with CaptureQueriesContext(connection) as queries:
            html = admin_client.get("/admin/resourcesync/resourceset/").content.decode()
        # Every row shows its columns read at once: the states, the failure, the chart, the audit.
        assert html.count('class="resourcesync-overview resourcesync-compact"') == size
        assert html.count(">OSError: [Errno 28] No space left on device</a>") == size
        assert html.count("12 in all") == size and html.count("1 left out") == size
        assert html.count("1 problem") == size // 2
        counted[size] = len(queries)
    assert counted[20] == counted[3], counted
