"""A third set: the items' landing pages; and a page of the site describing each set."""

from django.db import migrations

PAGES = {"slug": "pages", "name": "Landing pages of public items", "source": "pages", "position": 3}
SLUGS = ("bitstreams", "metadata", "pages")


def about(slug):
    return f"/about/sets/{slug}/"


def create(apps, schema_editor):
    ResourceSet = apps.get_model("resourcesync", "ResourceSet")
    values = dict(PAGES)
    ResourceSet.objects.get_or_create(slug=values.pop("slug"), defaults={**values, "capabilities": ["resourcelist", "changelist"]})
    for slug in SLUGS:
        ResourceSet.objects.filter(slug=slug, describedby="").update(describedby=about(slug))


def delete(apps, schema_editor):
    ResourceSet = apps.get_model("resourcesync", "ResourceSet")
    ResourceSet.objects.filter(slug=PAGES["slug"]).delete()
    for slug in SLUGS:
        ResourceSet.objects.filter(slug=slug, describedby=about(slug)).update(describedby="")


class Migration(migrations.Migration):
    dependencies = [("repository", "0002_resource_sets"), ("resourcesync", "0003_discovery")]
    operations = [migrations.RunPython(create, delete)]
