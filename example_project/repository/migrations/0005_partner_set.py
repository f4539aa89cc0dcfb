"""A fourth set, for partners with a token: the record of every item, public or not."""

from django.db import migrations

SET = {
    "slug": "all-records", "name": "Records of all items (partners)", "source": "all-records", "position": 4,
    "access": "token", "describedby": "/about/sets/all-records/",
}


def create(apps, schema_editor):
    ResourceSet = apps.get_model("resourcesync", "ResourceSet")
    values = dict(SET)
    ResourceSet.objects.get_or_create(slug=values.pop("slug"), defaults={**values, "capabilities": ["resourcelist", "changelist"]})


def delete(apps, schema_editor):
    apps.get_model("resourcesync", "ResourceSet").objects.filter(slug=SET["slug"]).delete()


class Migration(migrations.Migration):
    dependencies = [("repository", "0004_itemfile_size"), ("resourcesync", "0010_access")]
    operations = [migrations.RunPython(create, delete)]
