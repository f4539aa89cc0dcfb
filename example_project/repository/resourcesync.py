"""What the demo repository publishes over ResourceSync (autodiscovered by django_resourcesync):
the files of public items, a Dublin Core record per public item, and the items' landing pages."""

from django.db import DatabaseError

from django_resourcesync import bulk, links, sources

from . import uploads, views
from .models import Collection, Item, ItemFile, item_metadata_path, item_path


@sources.register
class BitstreamSource(sources.ResourceSource):
    """Every file of every public item, with the bytes of the file itself."""

    name = "bitstreams"
    # A file leaves the set when its item is made private: changes to items concern it too
    # (the files of an item are those whose "item" is that item).
    related_models = {Item: "item"}
    # The fingerprint is made of what the entry shows: the URI (item, key, name), lastmod, links,
    # the declared type and the bytes (the file's name, and its size as the row records it). It
    # is made in the database: reconciling builds only the files whose fingerprint changed, and
    # asks the storage nothing (no stat, no S3 listing).
    fingerprint_fields = ("item_id", "name", "media_type", "modified", "file")
    fingerprint_covers_entry = True
    # ItemFile.save() records the size of each file it is given (so do the seeding command and
    # the migration that added the field). Bytes changed through the model change the name (a
    # storage keeps a new file under a new name), "modified" and the size. The limit: bytes
    # replaced in place in the storage, behind the app's back under the same name, change none
    # of these, and reconciling does not see them (the storage's size saw them only when the
    # size differed); nor does it see a file deleted from the storage behind the app's back,
    # which stays listed until its row changes (a Resource Dump's build, reading the bytes, finds
    # it and hands it to change tracking). Whoever writes or deletes files that way saves the
    # row, or sets its size, after.
    fingerprint_file_sizes = {"file": "size"}

    def items(self):
        # The item is only filtered on: its links below need its key alone, so reconciling a
        # large set builds one model instance per file, not two.
        return ItemFile.objects.filter(item__is_public=True)

    def lastmod(self, obj):
        return obj.modified

    def file(self, obj):
        return obj.file

    def media_type(self, obj):
        # The type the file is served with (its view uses the same function).
        return uploads.served_type(obj)

    def links(self, obj):
        return [
            links.collection(item_path(pk=obj.item_id)),
            links.describedby(item_metadata_path(pk=obj.item_id), type="application/xml"),
        ]


@sources.register
class MetadataRecordSource(sources.ViewSource):
    """A Dublin Core record per public item, rendered by the site's own view."""

    name = "metadata"
    # The record shows its collection's name.
    related_models = {Collection: "collection"}

    def items(self):
        return views.record_items()

    def location(self, obj):
        return obj.get_metadata_url()

    def readable(self, objects):
        """Those of ``objects`` whose record the view shows the visitor this source renders for."""
        return [obj for obj in objects if obj.is_public]

    def contents(self, objects):
        """The records of many items at once, as their view renders each (``render_record``,
        the view's own function: the site's middleware changes none of the bytes), with no
        request handling. An item is rendered as it was read with its collection (``items()``
        reads them together), or else read again with the others in one query, as the view
        reads it (one the view would answer 404 for is not found, and left to ``content()``,
        which says so). A record that fails to render is left to ``content()`` too, as is, where
        ``location()`` is not this class's own, an object whose URI is not its record view's."""
        if type(self).location is not _RECORD_LOCATION:
            objects = [obj for obj in objects if self.location(obj) == obj.get_metadata_url()]
        ready = [obj for obj in self.readable(objects) if Item.collection.is_cached(obj)]
        unread = {obj.pk for obj in objects} - {obj.pk for obj in ready}
        if unread:
            ready += bulk.filter_in(self.items(), "pk", unread)
        found = {}
        for item in ready:
            try:
                found[item.pk] = (views.render_record(item), views.RECORD_CONTENT_TYPE)
            except DatabaseError:
                raise  # the transaction is broken: the batch fails, and is processed again
            except Exception:
                continue  # content() renders it through the view, and reports what is wrong
        return found

    def lastmod(self, obj):
        return obj.modified

    # Everything the record and its entry show (URI, lastmod, links): the record is rendered
    # again only when one of these changes, whichever way the change was made (a save,
    # queryset.update(), raw SQL), and reconciling builds only the items whose values changed.
    fingerprint_fields = ("title", "creator", "abstract", "collection__name", "modified")
    fingerprint_covers_entry = True

    def links(self, obj):
        return [
            links.describes(obj.get_absolute_url(), type="text/html"),
            # The kind of metadata (spec section 14.5): the format's namespace.
            links.profile("http://www.openarchives.org/OAI/2.0/oai_dc/"),
        ]


_RECORD_LOCATION = MetadataRecordSource.location


@sources.register
class PartnerRecordSource(MetadataRecordSource):
    """The record of every item, public or not, for the partners of the "all-records" set (its
    access: token). The site's record view serves them to a request with a token for that set;
    here they are rendered as that view renders them, never through it (it answers an anonymous
    request for a private item 404)."""

    name = "all-records"

    def items(self):
        return views.partner_record_items()

    def readable(self, objects):
        return list(objects)

    def content(self, obj):
        item = obj if Item.collection.is_cached(obj) else self.items().get(pk=obj.pk)
        return views.render_record(item), views.RECORD_CONTENT_TYPE


@sources.register
class ItemPageSource(sources.ViewSource):
    """The landing page of each public item, rendered by the site's own view: the HTML a person
    sees, which names its Capability List in a <link rel="resourcesync">."""

    name = "pages"
    # The page shows its collection's name and lists the item's files by name. A file's item is
    # known from the file itself, deleted ones included (see affected()).
    related_models = [Collection, ItemFile]

    def items(self):
        return Item.objects.filter(is_public=True).select_related("collection")

    def lastmod(self, obj):
        return obj.modified

    def affected(self, instance):
        if isinstance(instance, ItemFile):
            return [instance.item_id]
        return list(Item.objects.filter(collection=instance).values_list("pk", flat=True))

    def links(self, obj):
        return [links.describedby(obj.get_metadata_url(), type="application/xml")]
