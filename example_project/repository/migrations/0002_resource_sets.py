"""The demo publishes two sets: the files of public items, and a metadata record per item."""

from django.db import migrations

SETS = [
    {"slug": "bitstreams", "name": "Files of public items", "source": "bitstreams", "position": 1},
    {"slug": "metadata", "name": "Metadata records", "source": "metadata", "position": 2},
]


def create_sets(apps, schema_editor):
    ResourceSet = apps.get_model("resourcesync", "ResourceSet")
    for values in SETS:
        values = dict(values)
        ResourceSet.objects.get_or_create(slug=values.pop("slug"), defaults={**values, "capabilities": ["resourcelist", "changelist"]})


def delete_sets(apps, schema_editor):
    apps.get_model("resourcesync", "ResourceSet").objects.filter(slug__in=[s["slug"] for s in SETS]).delete()


class Migration(migrations.Migration):
    dependencies = [("repository", "0001_initial"), ("resourcesync", "0001_initial")]
    operations = [migrations.RunPython(create_sets, delete_sets)]
