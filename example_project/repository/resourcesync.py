"""What the demo repository publishes over ResourceSync (autodiscovered by django_resourcesync):
the files of public items, a Dublin Core record per public item, and the items' landing pages."""

from django.urls import reverse

from django_resourcesync import links, sources

from .models import Collection, Item, ItemFile


@sources.register
class BitstreamSource(sources.ResourceSource):
    """Every file of every public item, with the bytes of the file itself."""

    name = "bitstreams"
    # A file leaves the set when its item is made private: changes to items concern it too
    # (the files of an item are those whose "item" is that item).
    related_models = {Item: "item"}
    # The fingerprint is made of what the entry shows: the URI (item, key, name), lastmod, links,
    # the declared type and the bytes (a file field stands for its file's name and size). It is
    # read in the database: reconciling builds only the files whose fingerprint changed.
    fingerprint_fields = ("item_id", "name", "media_type", "modified", "file")
    fingerprint_covers_entry = True

    def items(self):
        # The item is only filtered on: its links below need its key alone, so reconciling a
        # large set builds one model instance per file, not two.
        return ItemFile.objects.filter(item__is_public=True)

    def lastmod(self, obj):
        return obj.modified

    def file(self, obj):
        return obj.file

    def media_type(self, obj):
        return obj.media_type or None

    def links(self, obj):
        return [
            links.collection(reverse("repository:item", kwargs={"pk": obj.item_id})),
            links.describedby(reverse("repository:item-metadata", kwargs={"pk": obj.item_id}), type="application/xml"),
        ]


@sources.register
class MetadataRecordSource(sources.ViewSource):
    """A Dublin Core record per public item, rendered by the site's own view."""

    name = "metadata"
    # The record shows its collection's name.
    related_models = {Collection: "collection"}

    def items(self):
        return Item.objects.filter(is_public=True).select_related("collection")

    def location(self, obj):
        return obj.get_metadata_url()

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
