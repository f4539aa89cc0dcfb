"""What the demo repository publishes over ResourceSync (autodiscovered by django_resourcesync)."""

import hashlib

from django.urls import reverse

from django_resourcesync import sources

from .models import Collection, Item, ItemFile


@sources.register
class BitstreamSource(sources.ResourceSource):
    """Every file of every public item, with the bytes of the file itself."""

    name = "bitstreams"
    # A file leaves the set when its item is made private: changes to items concern it too
    # (the files of an item are those whose "item" is that item).
    related_models = {Item: "item"}
    # The fingerprint below covers the URI (item, key, name), lastmod, links and the bytes.
    fingerprint_covers_entry = True

    def items(self):
        # The item is only filtered on: its links below need its key alone, so reconciling a
        # large set builds one model instance per file, not two.
        return ItemFile.objects.filter(item__is_public=True)

    def lastmod(self, obj):
        return obj.modified

    def fingerprint(self, obj):
        of_file = super().fingerprint(obj)  # the file's name, size and lastmod; None if unreadable
        return None if of_file is None else f"{obj.item_id}:{obj.pk}:{obj.name}:{obj.media_type}:{of_file}"

    def file(self, obj):
        return obj.file

    def media_type(self, obj):
        return obj.media_type or None

    def links(self, obj):
        return [
            {"rel": "collection", "href": reverse("repository:item", kwargs={"pk": obj.item_id})},
            {"rel": "describedby", "href": reverse("repository:item-metadata", kwargs={"pk": obj.item_id}), "type": "application/xml"},
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

    # The fingerprint below covers everything the entry shows (URI, lastmod, links) and the record.
    fingerprint_covers_entry = True

    def fingerprint(self, obj):
        # Everything the record shows: it is rendered again only when one of these changes,
        # whichever way the change was made (a save, queryset.update(), raw SQL).
        shown = (obj.pk, obj.title, obj.creator, obj.abstract, obj.collection.name, obj.modified)
        return hashlib.sha256(repr(shown).encode()).hexdigest()

    def links(self, obj):
        return [{"rel": "describes", "href": obj.get_absolute_url(), "type": "text/html"}]
