"""What the demo repository publishes over ResourceSync (autodiscovered by django_resourcesync)."""

from django_resourcesync import sources

from .models import Item, ItemFile


@sources.register
class BitstreamSource(sources.ResourceSource):
    """Every file of every public item, with the bytes of the file itself."""

    name = "bitstreams"

    def items(self):
        return ItemFile.objects.filter(item__is_public=True).select_related("item")

    def lastmod(self, obj):
        return obj.modified

    def file(self, obj):
        return obj.file

    def media_type(self, obj):
        return obj.media_type or None

    def links(self, obj):
        return [
            {"rel": "collection", "href": obj.item.get_absolute_url()},
            {"rel": "describedby", "href": obj.item.get_metadata_url(), "type": "application/xml"},
        ]


@sources.register
class MetadataRecordSource(sources.ViewSource):
    """A Dublin Core record per public item, rendered by the site's own view."""

    name = "metadata"

    def items(self):
        return Item.objects.filter(is_public=True).select_related("collection")

    def location(self, obj):
        return obj.get_metadata_url()

    def lastmod(self, obj):
        return obj.modified

    def fingerprint(self, obj):
        # The record shows the item and its collection's name: re-render when either changes.
        return f"{obj.modified.isoformat()}|{obj.collection.name}"

    def links(self, obj):
        return [{"rel": "describes", "href": obj.get_absolute_url(), "type": "text/html"}]
