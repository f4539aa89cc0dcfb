from django_resourcesync import sources

from .models import Document


@sources.register
class DocumentSource(sources.ResourceSource):
    name = "documents"

    def items(self):
        # Only what the public may see: nothing else is ever published.
        return Document.objects.filter(is_public=True)

    def location(self, obj):
        return obj.get_absolute_url()  # a path: BASE_URL is put in front of it

    def lastmod(self, obj):
        return obj.modified

    def content(self, obj):
        # The bytes the document's view serves, and their type.
        return obj.text.encode(), "text/plain; charset=utf-8"
