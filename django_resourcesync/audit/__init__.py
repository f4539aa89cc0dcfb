"""The self-audit: the deployed Source, checked over HTTP as a Destination sees it.

:func:`audit` starts where a Destination starts, at ``/.well-known/resourcesync`` of a base URL
(the site's ``BASE_URL``, or any other Source's), and walks what it finds: every Capability List,
every document they list (indexes and their parts, dumps and the manifests inside their
packages, archives), each checked against the spec's rules (:mod:`.rules`) and against the
official schemas (those the app ships, unless told otherwise). It then fetches resources (a sample of each Resource List, or all
of them) and the dump packages, and checks each hash and length a document gives against the
bytes served, and that a listed resource answers with its ``Link: rel="resourcesync"`` header
where the Source sends them. What the audit finds is a :class:`Report`: problems first, one line
each.

On the site's own Source it also compares each stored document served with what the app
published (its SHA-256 in the database): a document edited behind the app's back, or served
stale by a cache or proxy in front of the site, differs.

Nothing here knows how the app writes its documents: it reads them as any Destination would, so
it audits a Source built by another implementation just as well.
"""

import hashlib
import logging
import re
import tempfile
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from urllib.parse import urljoin, urlsplit

from .. import capabilities
from . import rules

logger = logging.getLogger(__name__)

#: A document the audit reads whole: at most this many bytes (a Sitemap's limit, with room).
MAX_DOCUMENT = rules.MAX_BYTES + 1024 * 1024
CHUNK = 1024 * 1024
TIMEOUT = 30
LINK_RE = re.compile(r'<([^>]*)>\s*;([^,]*)')
USER_AGENT = "django-resourcesync audit"


@dataclass
class Section:
    """What was found and checked below one Capability List."""

    problems: list = field(default_factory=list)
    documents: int = 0
    resources: int = 0
    packages: int = 0


@dataclass
class Report(Section):
    """What an audit found: ``problems`` as ``(uri, what)``, and what it checked; ``sections``,
    the same by Capability List (URI)."""

    base: str = ""
    notes: list = field(default_factory=list)
    sections: dict = field(default_factory=dict)
    within: str = None  # the Capability List being walked

    def problem(self, uri, what):
        self.problems.append((uri, what))
        if self.within is not None:
            self.sections[self.within].problems.append((uri, what))

    def count(self, what):
        setattr(self, what, getattr(self, what) + 1)
        if self.within is not None:
            section = self.sections[self.within]
            setattr(section, what, getattr(section, what) + 1)

    @property
    def ok(self):
        return not self.problems

    def lines(self):
        """The report as a person reads it: problems first, one line each, then what was checked."""
        out = [f"PROBLEM {uri}: {what}" for uri, what in self.problems]
        out += [f"note: {note}" for note in self.notes]
        out.append(
            f"{'OK' if self.ok else f'{len(self.problems)} problem(s)'}: {self.documents} document(s), "
            f"{self.resources} resource(s) and {self.packages} package(s) checked at {self.base}"
        )
        return out



class _Failed(Exception):
    """A fetch that did not give what was asked; the message says why."""


class Auditor:
    """One walk of a Source. ``sample``: resources fetched per Resource List (``None``: all);
    ``token``: a bearer token sent with every request; ``schemas``: the folder of the official
    schemas (``None``: no validation against them); ``discovery``: whether listed resources must
    answer with their Link header (``None``: where the Source sends it for some of them);
    ``published``: ``(uri) -> sha256 or None``, the digest the Source published a document with
    (the app's own records)."""

    def __init__(self, base, *, sample=20, token=None, schemas=None, discovery=None, published=None, packages=2):
        self.base = base.rstrip("/")
        self.sample, self.token, self.schemas = sample, token, schemas
        self.discovery, self.published, self.package_sample = discovery, published, packages
        self.report = Report(base=self.base)

    # -- HTTP -----------------------------------------------------------------------------------

    def get(self, uri, limit=MAX_DOCUMENT, into=None):
        """``(body or size, headers)`` of a GET of ``uri``; the body is read into the binary file
        ``into`` if given (``size`` returned), else whole, up to ``limit`` bytes."""
        headers = {"User-Agent": USER_AGENT}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            with urllib.request.urlopen(urllib.request.Request(uri, headers=headers), timeout=TIMEOUT) as response:
                if into is not None:
                    size = 0
                    while chunk := response.read(CHUNK):
                        into.write(chunk)
                        size += len(chunk)
                    return size, response.headers
                body = response.read(limit + 1)
                if len(body) > limit:
                    raise _Failed(f"it is larger than {limit:,} bytes")
                return body, response.headers
        except urllib.error.HTTPError as exc:
            challenge = exc.headers.get("WWW-Authenticate", "")
            raise _Failed(f"answered {exc.code}" + (f" ({challenge})" if challenge else "")) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise _Failed(f"could not be fetched: {getattr(exc, 'reason', exc)}") from None

    # -- documents ------------------------------------------------------------------------------

    def document(self, uri, capability, *, up=None):
        """Fetch, read and check the document ``uri`` of ``capability``; its root (``None`` if it
        could not be read). ``up``: where its ``rel="up"`` link must point."""
        try:
            body, _headers = self.get(uri)
        except _Failed as exc:
            self.report.problem(uri, str(exc))
            return None
        return self.check_body(uri, body, capability, up=up)

    def check_body(self, uri, body, capability, *, up=None, published=True):
        self.report.count("documents")
        try:
            doc = rules.read(body)
        except rules.Unreadable as exc:
            self.report.problem(uri, str(exc))
            return None
        for problem in rules.problems(doc, capability, size=len(body)):
            self.report.problem(uri, problem)
        if self.schemas:
            for problem in rules.schema_problems(doc, self.schemas):
                self.report.problem(uri, problem)
        if up is not None and rules.hrefs(doc, "up") and rules.hrefs(doc, "up")[0] != up:
            self.report.problem(uri, f"its rel=\"up\" link points to {rules.hrefs(doc, 'up')[0]}, not {up}")
        recorded = self.published(uri) if (self.published and published) else None
        if recorded is not None and hashlib.sha256(body).hexdigest() != recorded:
            self.report.problem(uri, "the bytes served are not those the Source published (changed behind its back, or a "
                                     "stale copy from a cache or proxy in front of it)")
        return doc

    def with_parts(self, uri, capability, *, up=None, roots=None):
        """The entries of the document ``uri`` and, if it is an index, of each of its parts
        (and the root ``rs:md`` of ``uri`` appended to ``roots``, if given)."""
        doc = self.document(uri, capability, up=up)
        if doc is None:
            return []
        if roots is not None:
            roots.append(rules.md(doc) or {})
        if not rules.is_index(doc):
            return rules.entries(doc)
        found = []
        for part in rules.entries(doc):
            part_uri = rules.loc(part)
            part_doc = self.document(part_uri, capability, up=up)
            if part_doc is None:
                continue
            if rules.is_index(part_doc):
                self.report.problem(part_uri, "a part of an index is itself an index")
                continue
            index = rules.hrefs(part_doc, "index")
            if index and index[0] != uri:
                self.report.problem(part_uri, f"its rel=\"index\" link points to {index[0]}, not its index {uri}")
            found += rules.entries(part_doc)
        return found

    # -- the walk -------------------------------------------------------------------------------

    def run(self, capability_lists=None):
        """Walk the Source: the Capability Lists its Source Description lists (or those given,
        a set for partners' that the public one does not), and all they list."""
        description = f"{self.base}/.well-known/resourcesync"
        if capability_lists is None:
            capability_lists = [rules.loc(entry) for entry in self.with_parts(description, capabilities.DESCRIPTION)]
        for capability_list in capability_lists:
            self.report.within = capability_list
            self.report.sections.setdefault(capability_list, Section())
            self.capability_list(capability_list, description)
        self.report.within = None
        return self.report

    def capability_list(self, uri, description):
        doc = self.document(uri, capabilities.CAPABILITYLIST, up=description)
        if doc is None:
            return
        listed, changed = [], {}  # the Resource Lists (entries, at), and the latest change of each URI
        dumped = None  # the URIs of the Resource Dump's bitstreams, and its at, once every package is read
        for entry in rules.entries(doc):
            name, target = (rules.md(entry) or {}).get("capability"), rules.loc(entry)
            if not name or not target or name.endswith("-notification"):
                continue  # a notification channel is a topic, not a document to read
            roots = []
            found = self.with_parts(target, name, up=uri, roots=roots)
            if name == capabilities.RESOURCELIST:
                listed.append((found, roots[0].get("at") if roots else None))
            elif name == capabilities.CHANGELIST:
                for change in found:  # the latest of each URI, whatever order the lists give
                    where, meta = rules.loc(change), rules.md(change) or {}
                    before = changed.get(where)
                    if before is None or (_moment(meta.get("datetime")) or _EPOCH) >= (_moment(before.get("datetime")) or _EPOCH):
                        changed[where] = meta
            elif name in (capabilities.RESOURCEDUMP, capabilities.CHANGEDUMP):
                manifest = (capabilities.RESOURCEDUMP_MANIFEST if name == capabilities.RESOURCEDUMP
                            else capabilities.CHANGEDUMP_MANIFEST)
                sampled = found[: self.package_sample] if self.package_sample is not None else found
                packed = set()
                for package in sampled:
                    packed |= self.package(package, manifest)
                if name == capabilities.RESOURCEDUMP and len(sampled) == len(found):
                    dumped = (packed, roots[0].get("at") if roots else None)
        # As a Destination takes them: the Resource List, then what changed after its ``at``.
        for found, at in listed:
            self.resources(found, _since(changed, at))
            if dumped is not None:
                self.covered(found, _since(changed, at), *dumped, _since(changed, dumped[1]))

    #: How many resources missing from the Resource Dump the report names (it counts them all).
    NAMED = 10

    def covered(self, found, since_list, packed, dump_at, since_dump):
        """Section 9: "a given resource that appears in a Resource List must also appear in a
        Resource Dump". A resource deleted after the list's ``at``, changed after the dump's
        (the Change List brings it), or with no bytes to pack (no hash or length) is not
        looked for."""
        missing = [
            rules.loc(entry) for entry in found
            if rules.loc(entry) not in packed and rules.loc(entry) not in since_dump
            and (since_list.get(rules.loc(entry)) or {}).get("change") != "deleted"
            and {"hash", "length"} & set(rules.md(entry) or {})
        ]
        for uri in missing[: self.NAMED]:
            self.report.problem(uri, "in the Resource List, but in no package of the Resource Dump (section 9)")
        if len(missing) > self.NAMED:
            self.report.problem(self.report.within, f"{len(missing) - self.NAMED} more resources of the Resource List are "
                                                    "in no package of the Resource Dump (section 9)")

    def _sampled(self, found):
        if self.sample is None or len(found) <= self.sample:
            return found
        step = len(found) / self.sample
        return [found[int(number * step)] for number in range(self.sample)]

    def resources(self, found, changes=None):
        """Fetch a sample of the listed resources and compare their bytes with what is said of
        them: by the Resource List, or by the latest entry of the Change List after it
        (``changes``, ``{uri: rs:md}``); one deleted since is not fetched."""
        sampled = self._sampled(found)
        discovered = []
        changes = changes or {}
        for entry in sampled:
            uri, meta, said = rules.loc(entry), rules.md(entry) or {}, "listed"
            if uri in changes:
                meta, said = changes[uri], f"{changes[uri].get('change', 'changed')} since"
                if meta.get("change") == "deleted":
                    continue
            try:
                size, headers, digests = self.hashed(uri)
            except _Failed as exc:
                self.report.problem(uri, f"{said}, but {exc}")
                continue
            self.report.count("resources")
            self._compare(uri, meta, size, digests, said)
            discovered.append((uri, _resourcesync_links(headers.get_all("Link") or [])))
        wanted = self.discovery if self.discovery is not None else any(targets for _uri, targets in discovered)
        if wanted:
            for uri, targets in discovered:
                if not targets:
                    self.report.problem(uri, "no Link: <…>; rel=\"resourcesync\" header (discovery, section 6.3): a proxy "
                                             "or the site's middleware dropped it")

    def hashed(self, uri, sink=None):
        """``(size, headers, {algorithm: hex digest})`` of the bytes ``uri`` serves, hashed on
        the way (and written into the binary file ``sink``, if given)."""
        digests = {"md5": hashlib.md5(), "sha-256": hashlib.sha256()}
        size, headers = self.get(uri, into=_Hashing(sink, digests.values()))
        return size, headers, {name: value.hexdigest() for name, value in digests.items()}

    def _compare(self, uri, meta, size, digests, said):
        if "length" in meta and meta["length"].isdigit() and int(meta["length"]) != size:
            self.report.problem(uri, f"{said} with length {meta['length']}, served {size} bytes")
        for algorithm, value in rules.hashes(meta).items():
            if algorithm in digests and digests[algorithm] != value:
                self.report.problem(uri, f"{said} with {algorithm} {value}, the bytes served have {digests[algorithm]}")

    def package(self, entry, manifest_capability):
        """Check a dump's package; returns the URIs of the bitstreams its manifest gives."""
        uri, meta = rules.loc(entry), rules.md(entry) or {}
        with tempfile.TemporaryFile() as stored:
            try:
                size, _headers, digests = self.hashed(uri, stored)
            except _Failed as exc:
                self.report.problem(uri, f"a dump's package, but {exc}")
                return set()
            self.report.count("packages")
            self._compare(uri, meta, size, digests, "the dump gives it")
            stored.seek(0)
            try:
                with zipfile.ZipFile(stored) as package:
                    return self._package_contents(uri, package, manifest_capability, rules.hrefs(entry, "contents"))
            except (zipfile.BadZipFile, OSError, EOFError) as exc:
                self.report.problem(uri, f"not a readable ZIP package: {exc}")
                return set()

    def _package_contents(self, uri, package, manifest_capability, contents=()):
        names = package.namelist()
        if "manifest.xml" not in names:
            self.report.problem(uri, "the package has no manifest.xml (section 11.2)")
            return set()
        packed = package.read("manifest.xml")
        for copy in contents[:1]:
            try:
                published, _headers = self.get(copy)
            except _Failed as exc:
                self.report.problem(copy, f"the manifest of {uri} (rel=\"contents\"), but {exc}")
                continue
            if published != packed:
                self.report.problem(copy, f"not the manifest.xml packed in {uri}, byte for byte (section 13.1: the Source "
                                          "must ensure that the two match)")
        doc = self.check_body(f"{uri}#manifest.xml", packed, manifest_capability, published=False)
        if doc is None:
            return set()
        found = set()
        for entry in rules.entries(doc):
            meta = rules.md(entry) or {}
            path = meta.get("path", "")
            member = path.lstrip("/")
            if not member or ".." in member.split("/") or member not in names:
                if meta.get("change") != "deleted":
                    self.report.problem(uri, f"the manifest names {path!r}, which is not in the package")
                continue
            digests, size = {"md5": hashlib.md5(), "sha-256": hashlib.sha256()}, 0
            hashing = _Hashing(None, digests.values())
            with package.open(member) as bitstream:
                while chunk := bitstream.read(CHUNK):
                    size += hashing.write(chunk)
            self._compare(f"{uri}#{member}", meta, size, {name: value.hexdigest() for name, value in digests.items()},
                          "the manifest gives it")
            found.add(rules.loc(entry))
        for name in names:
            if name.startswith("/") or ".." in name.split("/") or "\\" in name:
                self.report.problem(uri, f"the package holds an unsafe path {name!r}")
        return found


class _Hashing:
    """A binary file that hashes what is written into it, and keeps it in ``sink`` (if not ``None``)."""

    def __init__(self, sink, digests):
        self.sink, self.digests = sink, list(digests)

    def write(self, chunk):
        for digest in self.digests:
            digest.update(chunk)
        return self.sink.write(chunk) if self.sink is not None else len(chunk)


def _resourcesync_links(values):
    found = []
    for value in values:
        for target, params in LINK_RE.findall(value):
            if re.search(r'rel\s*=\s*"?([^";]*\s)?resourcesync(?=[\s";]|$)', params):
                found.append(target)
    return found


def audit(base=None, *, sets=None, sample=20, token=None, schemas=None, discovery=None, packages=2):
    """Audit the Source at ``base`` (default: this site's ``BASE_URL``). ``sets``: only the
    Capability Lists of these of this site's sets (slugs), listed publicly or not. ``schemas``:
    the folder of the official schemas to validate against (``None``: those the app ships;
    ``False``: none). Returns a :class:`Report`. On this site's own Source, each stored document
    served is compared with the one published."""
    from ..conf import app_settings
    from ..models import ResourceSet

    own = (app_settings.BASE_URL or "").rstrip("/")
    base = (base or own).rstrip("/")
    if not base:
        raise ValueError("no base URL: give one, or set RESOURCESYNC['BASE_URL']")
    capability_lists = None
    if sets:
        from .. import uris

        capability_lists = [
            urljoin(base + "/", urlsplit(uris.capability_list_uri(s)).path.lstrip("/"))
            for s in ResourceSet.objects.filter(slug__in=sets).order_by("position", "slug")
        ]
    if discovery is None and base == own:
        from django.conf import settings

        discovery = any(name.endswith("ResourceSyncLinkMiddleware") for name in settings.MIDDLEWARE)
    schemas = rules.schema_folder(schemas)
    auditor = Auditor(base, sample=sample, token=token, schemas=schemas, discovery=discovery,
                      published=_published_digests(base) if base == own else None, packages=packages)
    report = auditor.run(capability_lists)
    if schemas is None:
        report.notes.append("the documents were not checked against the official schemas (turned off)")
    return report


def _published_digests(base):
    """``uri -> sha256 or None``: the digest of the stored document of this site that ``uri``
    names, as it was published (``None`` for a document rendered live, or none at all)."""
    from django.urls import Resolver404, resolve

    from ..models import ResourceSet
    from ..served import GONE
    from ..views import find_document

    def published(uri):
        parts = urlsplit(uri)
        if f"{parts.scheme}://{parts.netloc}" != urlsplit(base)._replace(path="").geturl().rstrip("/"):
            return None
        try:
            match = resolve(parts.path)
        except Resolver404:
            return None
        if match.url_name != "document":
            return None
        resource_set = ResourceSet.objects.filter(slug=match.kwargs["slug"]).first()
        found = find_document(resource_set, match.kwargs["name"]) if resource_set is not None else None
        return None if found is None or found is GONE else found.sha256

    return published


def record(report):
    """Keep the part of ``report`` about each of this site's sets it walked (the admin shows the
    last one per set)."""
    from django.urls import Resolver404, resolve

    from ..models import AuditReport, ResourceSet

    for capability_list, section in report.sections.items():
        try:
            slug = resolve(urlsplit(capability_list).path).kwargs.get("slug")
        except Resolver404:
            continue
        resource_set = ResourceSet.objects.filter(slug=slug).first()
        if resource_set is None:
            continue
        AuditReport.objects.create(
            resource_set=resource_set, base=report.base, problems=[list(p) for p in section.problems],
            documents=section.documents, resources=section.resources, packages=section.packages,
        )
        # The last reports are what the admin shows: older ones go.
        older = AuditReport.objects.filter(resource_set=resource_set).order_by("-pk").values_list("pk", flat=True)[KEEP_REPORTS:]
        AuditReport.objects.filter(pk__in=list(older)).delete()


#: Reports kept per set.
KEEP_REPORTS = 10


def audit_sets(*, sample=20, schemas=None):
    """The periodic self-audit (the task ``resourcesync.audit``): each enabled set of this site
    audited at ``BASE_URL``, its report kept. A set for partners is read with a token issued to
    the audit for ten minutes, revoked after. Returns ``{slug: problems}``."""
    import datetime

    from django.utils import timezone

    from .. import access
    from ..models import AccessToken, ResourceSet

    found = {}
    for resource_set in ResourceSet.objects.filter(enabled=True).exclude(capabilities=[]):
        token = record_ = None
        if not resource_set.is_public:
            record_, token = access.issue("self-audit", [resource_set], expires=timezone.now() + datetime.timedelta(minutes=10))
        try:
            report = audit(sets=[resource_set.slug], sample=sample, token=token, schemas=schemas)
        finally:
            if record_ is not None:
                access.revoke(AccessToken.objects.filter(pk=record_.pk))
                AccessToken.objects.filter(pk=record_.pk).delete()
        record(report)
        found[resource_set.slug] = len(report.problems)
        for line in report.lines():
            (logger.warning if line.startswith("PROBLEM") else logger.info)("%s: %s", resource_set.slug, line)
    return found


def _since(changed, at):
    """``{uri: rs:md}`` of the latest changes ``changed`` made after ``at`` (all of them when
    the Resource List gives no ``at``, and a change that gives no ``datetime``)."""
    moment = _moment(at)
    found = {}
    for uri, meta in changed.items():
        when = _moment(meta.get("datetime"))
        if moment is None or when is None or when > moment:
            found[uri] = meta
    return found


_EPOCH = datetime(1, 1, 1, tzinfo=timezone.utc)


def _moment(value):
    """A W3C datetime as an aware datetime (one without an offset, a date alone, taken as
    UTC); ``None`` if it is none."""
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None
    except ValueError:
        return None
    if moment is not None and moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment
