"""Sources with a mistake in them, registered by a site's settings for the start-up tests
(``RESOURCESYNC["SOURCE_MODULES"]``): one whose items() names a field that does not exist, one
whose items() runs a query when called, and one that sets ``model`` beside a failing items()."""

from django_resourcesync import sources
from example_project.repository.models import Item


@sources.register
class MisspelledSource(sources.ResourceSource):
    name = "misspelled"

    def items(self):
        return Item.objects.filter(is_publik=True)


@sources.register
class EagerSource(sources.ResourceSource):
    name = "eager"

    def items(self):
        return Item.objects.filter(pk__in=list(Item.objects.values_list("pk", flat=True)))


@sources.register
class ModelSource(sources.ResourceSource):
    name = "with-model"
    model = Item

    def items(self):
        raise ConnectionError("the search backend is down")
